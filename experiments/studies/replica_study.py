"""Replicated parameter-server shards: what a primary's crash costs, and what replication costs.

    python -m experiments.studies.replica_study [--crashes 20] [--repeats 3] [--out results/ps_replicas]

Run it with plain ``python``: it launches every job under ``mpiexec`` itself, each under a hard limit
(:func:`experiments.faults.suite.launch`). The trainer's digits model, BSP, SGD with momentum 0.9 and
``--lr`` 0.05, ``--workers`` workers (default 3):

``cost``
    Fault-free runs with unreplicated shards (``--servers 1``, ``R = 1``) and with every shard on a
    chain of two (``--servers 2 --ps-replicas 2``), ``--repeats`` each, interleaved: samples per
    second (the run's summary) and payload bytes per clock (every worker's push and pull of the
    whole vector, plus the pushes the primary forwarded to its backup, from the replicas' records),
    and their ratio R = 2 over R = 1.
``crashes``
    ``--crashes`` runs with ``--servers 2 --ps-replicas 2`` in which the primary (rank 0) dies at a
    random moment: before its K-th handled message, K drawn uniformly (``--seed``) from the messages
    of the second clock to those of the third-to-last. Under MPICH the rank exits with status 3
    (``mpiexec -disable-auto-cleanup`` keeps the others running), under Open MPI it is killed with
    SIGKILL (``--enable-recovery``) (:func:`experiments.faults.dead.vanish`; each row's ``death`` is
    what the dying rank printed it would do). Each crash run is read from its records
    (``summary.json``, ``ps_model.npz``), never from the launcher's status: the
    acknowledged clocks lost (``lost_acknowledged``), whether the final parameters equal the
    fault-free R = 1 run's bit for bit, the seconds from the crash (the time the dying rank printed)
    to the first update the backup applied as the new primary, and the test accuracy.

Targets (exit status 1 when one is missed): 0 acknowledged updates lost, every crash run bitwise
equal to the fault-free run, every recovery within ``--ps-timeout`` + 1 s. Results go to
``OUT/replicas.json`` with the provenance of :mod:`commlab.provenance` (a busy machine: refused, or
marked noisy with ``--allow-noisy``). ``--quick`` (1 repeat, 2 crashes, one epoch) checks the script.
"""
import json
import os
import random
import re
import statistics
import sys
import tempfile

import numpy as np

from experiments import harness
from experiments.faults.suite import launch
from training.settings.options import INT32_MAX, integer, real

__all__ = ["STUDY", "main", "trainer_flags", "crash_run"]

_LIMIT = 300  # seconds a job may run before it is killed (a hang)


def trainer_flags(args, replicas, run_dir, name):
    """Return the trainer's flags of one run (``replicas`` 1: one server; 2: two, one chain)."""
    return ["--data", "digits", "--hidden", str(args.hidden), "--epochs", str(args.epochs), "--batch-size",
            str(16 * args.workers), "--no-progress", "--threads", "1", "--mode", "ps", "--consistency", "bsp",
            "--servers", str(replicas), "--ps-replicas", str(replicas), "--ps-timeout", str(args.ps_timeout),
            "--optimizer", "sgd", "--momentum", "0.9", "--lr", str(args.lr), "--run-dir", run_dir, "--name", name]


def _read(run_dir, name):
    path = os.path.join(run_dir, name)
    with open(os.path.join(path, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    with np.load(os.path.join(path, "ps_model.npz"), allow_pickle=False) as z:
        summary["params"] = z["params"]
    return summary


def _bytes_per_clock(summary):
    """Payload bytes per clock: the workers' pushes and pulls, and the pushes forwarded down the chains."""
    W, n = summary["workers"], summary["parameters"]
    clocks = summary["pushes"] / W
    itemsize = np.dtype(summary["params"].dtype).itemsize
    records = [r for r in summary.get("replica_records") or [] if r]
    forwarded = sum(r["applied_forwards"] for r in records if r["position"] > 0) - W * len(
        [r for r in records if r["position"] > 0])  # less the W DONE forwards of each backup
    return itemsize * n * (2 * W + max(0, forwarded) / clocks)


def crash_run(args, run_dir, name, at):
    """Run one crash of the primary at its ``at``-th message; return the row read from its records."""
    P = 2 + args.workers
    code, secs, out = launch(P, "experiments.faults.crash", ["ps", "0", str(at), *trainer_flags(args, 2, run_dir, name)],
                             {}, _LIMIT, extra=("-disable-auto-cleanup",))
    crash = re.search(r"injected crash at ([0-9.]+)(?:, ([^)]+))?\)", out)
    row = {"name": name, "at": at, "exit": code, "seconds": round(secs, 2), "crashed": crash is not None,
           "death": crash.group(2) if crash else None}  # "SIGKILL" or "exit status 3", as the rank printed it
    try:
        summary = _read(run_dir, name)
    except OSError as e:
        return {**row, "error": f"no records: {e}", "output": out[-2000:]}
    backup = (summary.get("replica_records") or [None, None])[1] or {}
    first = backup.get("first_update_time", -1.0)
    row.update(lost_acknowledged=summary["lost_acknowledged"], servers_lost=summary["servers_lost"],
               test_acc=summary["final_test_acc"], params=summary["params"],
               recovery_s=(first - float(crash.group(1))) if crash and first > 0 else None)
    return row


def _cost(args, run_dir):
    rows = {1: [], 2: []}
    for k in range(args.repeats):
        for R in (1, 2):
            name = f"clean-r{R}-{k}"
            code, _, out = launch(R + args.workers, "training.train", trainer_flags(args, R, run_dir, name), {}, _LIMIT)
            if code != 0:
                raise RuntimeError(f"the fault-free run {name} failed:\n{out[-3000:]}")
            summary = _read(run_dir, name)
            rows[R].append({"samples_per_s": summary["samples_per_s"], "bytes_per_clock": _bytes_per_clock(summary),
                            "test_acc": summary["final_test_acc"], "params": summary["params"]})
    return rows


def _median(rows, key):
    return statistics.median(r[key] for r in rows)


def study(args, run_dir):
    """Run both parts; return the results dict (without provenance) and whether every target was met."""
    cost = _cost(args, run_dir)
    want = cost[1][0]["params"]
    clocks = _read(run_dir, "clean-r2-0")["pushes"] // args.workers
    rng = random.Random(args.seed)
    per_clock = 2 * args.workers  # a push and a pull of every worker
    crashes = []
    for i in range(args.crashes):
        at = rng.randint(2 * per_clock, max(2 * per_clock, (clocks - 2) * per_clock))
        row = crash_run(args, run_dir, f"crash-{i}", at)
        row["equal"] = bool("params" in row and np.array_equal(row.pop("params"), want))
        crashes.append(row)
        print(f"crash {i + 1}/{args.crashes} at message {at}: lost {row.get('lost_acknowledged')}, equal "
              f"{row['equal']}, recovery " + (f"{row['recovery_s']:.3f} s" if row.get("recovery_s") is not None
                                              else "not seen"), flush=True)
    bound = args.ps_timeout + 1.0
    recov = [r["recovery_s"] for r in crashes if r.get("recovery_s") is not None]
    met = (all(r.get("lost_acknowledged") == 0 for r in crashes) and all(r["equal"] for r in crashes)
           and len(recov) == len(crashes) and all(s <= bound for s in recov))
    summary = {
        "cost": {f"R{R}": {"samples_per_s": _median(rows, "samples_per_s"),
                           "bytes_per_clock": _median(rows, "bytes_per_clock"),
                           "runs": [{k: v for k, v in r.items() if k != "params"} for r in rows]}
                 for R, rows in cost.items()},
        "crashes": crashes, "targets_met": met, "recovery_bound_s": bound,
        "lost_acknowledged": sum(r.get("lost_acknowledged") or 0 for r in crashes),
        "bitwise_equal": sum(r["equal"] for r in crashes), "recovery_max_s": max(recov) if recov else None,
        "recovery_median_s": statistics.median(recov) if recov else None,
    }
    c1, c2 = summary["cost"]["R1"], summary["cost"]["R2"]
    summary["ratio_R2_over_R1"] = {"samples_per_s": c2["samples_per_s"] / c1["samples_per_s"],
                                   "bytes_per_clock": c2["bytes_per_clock"] / c1["bytes_per_clock"]}
    return summary, met


def _options(p):
    p.add_argument("--crashes", type=integer(1, INT32_MAX), default=20, help="crashes of the primary (runs; default 20)")
    p.add_argument("--workers", type=integer(1, INT32_MAX), default=3, help="worker ranks (the batch is 16 samples per worker; default 3)")
    p.add_argument("--epochs", type=integer(1, INT32_MAX), default=2, help="epochs of every run (default 2)")
    p.add_argument("--hidden", type=integer(1, INT32_MAX), default=64, help="hidden units of the digits model (default 64)")
    p.add_argument("--ps-timeout", type=real(0, 1e15, low_open=True), default=1.0, help="--ps-timeout of every run (seconds; default 1)")
    p.add_argument("--lr", type=real(0, 1e15, low_open=True), default=0.05, help="SGD's learning rate of every run (default 0.05)")
    p.add_argument("--seed", type=integer(0, INT32_MAX), default=0, help="seed of the crash moments (default 0)")
    p.add_argument("--quick", action="store_true", help="check the script: 1 repeat, 2 crashes, 1 epoch")


def _check(args, comm):
    """Apply ``--quick``'s sizes (1 repeat, 2 crashes, 1 epoch)."""
    if args.quick:
        args.repeats, args.crashes, args.epochs = 1, min(args.crashes, 2), 1


def _run(args, comm):
    """Run the cost part and every crash; return the record (``targets_met``: every bound held)."""
    with tempfile.TemporaryDirectory(prefix="replica_study-") as run_dir:
        summary, _ = study(args, run_dir)
    summary["settings"] = {k: v for k, v in vars(args).items() if k not in ("out",)}
    return summary


def _table(summary):
    r, worst = summary["ratio_R2_over_R1"], summary["recovery_max_s"]
    worst = f"{worst:.3f} s" if worst is not None else "not seen"
    return (f"crashes {len(summary['crashes'])}: acknowledged clocks lost {summary['lost_acknowledged']}, bitwise "
            f"equal {summary['bitwise_equal']}, recovery max {worst} (bound {summary['recovery_bound_s']:g} s) | "
            f"R=2/R=1: samples/s x{r['samples_per_s']:.3f}, bytes/clock x{r['bytes_per_clock']:.3f} | "
            f"{'every bound held' if summary['targets_met'] else 'A BOUND WAS NOT HELD'}")


#: The study as a unit of the harness; ``main(argv)`` returns 0 when every target is met, else 1 (2 for bad
#: arguments, an unwritable ``--out`` or a busy machine, before any run).
STUDY = harness.Study("experiments.studies.replica_study", __doc__.split("\n")[0], _options, _run,
                      out="results/ps_replicas", folder=True, what="folder of replicas.json", repeats=3, check=_check,
                      results=lambda args: os.path.join(args.out, "replicas.json"), table=_table,
                      ranks=lambda args, comm: 2 + args.workers, status=lambda s: 0 if s["targets_met"] else 1,
                      mpi=False)
main = STUDY.main


if __name__ == "__main__":
    sys.exit(main())
