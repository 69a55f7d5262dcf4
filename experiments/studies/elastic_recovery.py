"""Elastic training's recovery against a restart from the last checkpoint, over kills at random moments.

    .venv-openmpi/bin/python -m experiments.studies.elastic_recovery [--kills 20] [--ranks 4] [--out results/elastic.json]

Run it with the Open MPI venv's ``python`` (the ``openmpi`` extra; ``make test-ft`` builds it): it
launches every job under ``mpiexec --with-ft ulfm`` itself, each under a hard limit
(:func:`experiments.faults.suite.launch`). Each kill draws (``--seed``) a rank, a step (from the
second to the third-to-last of the run) and a moment: as the step begins, or inside its gradient
all-reduce once the first round is posted (:mod:`experiments.faults.kill`: SIGKILL). The job is the
trainer's synthetic data set, ``--epochs`` epochs, a checkpoint every epoch; every kill is run twice:

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

Targets (exit status 1 when one is missed): no hang, every elastic job finished with identical
replicas, median time to the next step <= 1 s and worst <= 3 s, and the elastic median at least 10x
faster than the restart's. Results go to ``OUT`` (JSON) with the provenance of
:mod:`commlab.provenance` (a busy machine: refused, or marked noisy with ``--allow-noisy``);
``--quick`` (2 kills, 2 epochs) checks the script.
"""
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time

from experiments import harness
from experiments.faults.suite import launch
from training.settings.options import INT32_MAX, integer

__all__ = ["STUDY", "main", "study", "job_flags", "elastic_kill", "restart_kill"]

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


def elastic_kill(args, run_dir, name, victim, at, where):
    """Run one elastic job with ``victim`` killed at step ``at``; return its row."""
    code, secs, out = launch(args.ranks, "experiments.faults.kill", [str(victim), str(at), where, "--elastic",
                                                                     *job_flags(args, run_dir, name)],
                             {}, _LIMIT, extra=_ULFM)
    died = _killed_at(out)
    row = {"victim": victim, "at": at, "where": where, "exit": code, "seconds": round(secs, 2), "hang": code is None}
    try:
        with open(os.path.join(run_dir, name, "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        return {**row, "error": f"no summary: {e}", "output": out[-2000:]}
    after = [r["unix_s"] for r in _records(os.path.join(run_dir, name, "metrics.jsonl"))
             if r.get("P") == args.ranks - 1 and died is not None and r["unix_s"] > died]
    row.update(finished=summary["epochs"] == args.epochs, identical=summary["replicas_identical"],
               steps_redone=summary["elastic"]["steps_redone"], lost=summary["elastic"]["lost"],
               next_step_s=round(min(after) - died, 4) if after else None)
    return row


def restart_kill(args, run_dir, name, victim, at, where):
    """Run the same job without ``--elastic``, killed alike, then restart it with ``--resume``; return its row."""
    code, secs, out = launch(args.ranks, "experiments.faults.kill", [str(victim), str(at), where,
                                                                     *job_flags(args, run_dir, name)],
                             {}, _LIMIT)
    died = _killed_at(out)
    row = {"victim": victim, "at": at, "where": where, "first_exit": code, "hang": code is None}
    code2, secs2, out2 = launch(args.ranks, "experiments.faults.kill", ["-", "1", "step", "--resume",
                                                                        os.path.join(run_dir, name), "--no-progress"],
                                {}, _LIMIT)
    first = re.search(r"first step done at ([0-9.]+)", out2)
    per_epoch = steps_per_epoch(args)
    saved = (at - 1) // per_epoch * per_epoch  # the steps of the last checkpoint (one every epoch)
    row.update(exit=code2, hang=row["hang"] or code2 is None,
               restart_s=round(float(first.group(1)) - died, 4) if first and died is not None else None,
               steps_redone=at - 1 - saved)
    return row


def study(args, run_dir):
    """Run every kill both ways; return the results dict (without provenance) and whether the targets were met."""
    rng = random.Random(args.seed)
    total = args.epochs * steps_per_epoch(args)
    rows = []
    for i in range(args.kills):
        victim, at, where = rng.randrange(args.ranks), rng.randint(2, max(2, total - 2)), rng.choice(["step", "inside"])
        e = elastic_kill(args, run_dir, f"elastic-{i}", victim, at, where)
        r = restart_kill(args, run_dir, f"restart-{i}", victim, at, where)
        rows.append({"elastic": e, "restart": r})
        print(f"kill {i + 1}/{args.kills}: rank {victim} at step {at} ({where}): elastic next step "
              f"{e.get('next_step_s')} s, {e.get('steps_redone')} redone | restart {r.get('restart_s')} s, "
              f"{r.get('steps_redone')} redone", flush=True)
    el = [r["elastic"]["next_step_s"] for r in rows if r["elastic"].get("next_step_s") is not None]
    rs = [r["restart"]["restart_s"] for r in rows if r["restart"].get("restart_s") is not None]
    hangs = sum(r["elastic"]["hang"] + r["restart"]["hang"] for r in rows)
    wrong = sum(not (r["elastic"].get("finished") and r["elastic"].get("identical")) for r in rows)
    summary = {"kills": rows, "hangs": hangs, "elastic_not_finished_or_diverged": wrong,
               "elastic_next_step_median_s": statistics.median(el) if el else None,
               "elastic_next_step_max_s": max(el) if el else None,
               "restart_median_s": statistics.median(rs) if rs else None,
               "elastic_steps_redone": sum(r["elastic"].get("steps_redone") or 0 for r in rows),
               "restart_steps_redone": sum(r["restart"].get("steps_redone") or 0 for r in rows)}
    speedup = (summary["restart_median_s"] / summary["elastic_next_step_median_s"]
               if el and rs and summary["elastic_next_step_median_s"] > 0 else None)
    summary["speedup_median"] = speedup
    met = (hangs == 0 and wrong == 0 and len(el) == len(rows) and statistics.median(el) <= 1.0 and max(el) <= 3.0
           and speedup is not None and speedup >= 10)
    summary["targets_met"] = met
    return summary, met


def _options(p):
    p.add_argument("--kills", type=integer(1, INT32_MAX), default=20, help="kills, each run elastic and as a restart (default 20)")
    p.add_argument("--ranks", type=integer(2, 4096), default=4, help="ranks of every job, P (default 4)")
    p.add_argument("--epochs", type=integer(1, INT32_MAX), default=4, help="epochs of every job (default 4)")
    p.add_argument("--samples", type=integer(1, INT32_MAX), default=4000, help="synthetic samples, 80 %% of them for training (default 4000)")
    p.add_argument("--seed", type=integer(0, INT32_MAX), default=0, help="seed of the kills' ranks, steps and moments (default 0)")
    p.add_argument("--quick", action="store_true", help="check the script: 2 kills, 2 epochs, 800 samples")


def _check(args, comm):
    """Apply ``--quick``'s sizes; raise ValueError when the jobs are too small for their ranks."""
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
    return (f"kills {len(s['kills'])} at P={s['settings']['ranks']}: hangs {s['hangs']}, elastic jobs not finished "
            f"or diverged {s['elastic_not_finished_or_diverged']} | to the next step: elastic median "
            f"{s['elastic_next_step_median_s']} s (max {s['elastic_next_step_max_s']} s), restart median "
            f"{s['restart_median_s']} s | {'every target met' if s['targets_met'] else 'A TARGET WAS MISSED'}")


#: The study as a unit of the harness; ``main(argv)`` returns 0 when every target is met, else 1 (2 for bad
#: arguments, an unwritable ``--out`` or a busy machine, before any run).
STUDY = harness.Study("experiments.studies.elastic_recovery", __doc__.split("\n")[0], _options, _run,
                      out="results/elastic.json", check=_check, table=_table, ranks=lambda args, comm: args.ranks,
                      status=lambda s: 0 if s["targets_met"] else 1, mpi=False)
main = STUDY.main


if __name__ == "__main__":
    sys.exit(main())
