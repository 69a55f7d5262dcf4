"""Hot keys of the ctr model: the servers' load under range and hash sharding, with and without the hot-row split.

    python -m experiments.studies.hot_rows [--seeds 3] [--servers 4] [--workers 4] [--out results/ctr_hotkeys.json]

Run it with plain ``python``: it launches every training job under ``mpiexec`` itself, each under a
hard limit (:func:`experiments.faults.suite.launch`). For every seed and each of ``range`` and
``hash`` sharding it finds the smallest ``--ctr-hot K`` (doubling from 16) whose split brings the
busiest server's rows to at most ``--target`` times the mean (:func:`training.ctr.hotkeys.hot_for_balance`,
counted from the training ids without running anything), then trains the hybrid model
(``--mode hybrid``, BSP, Adagrad) twice, without and with that split, on ``--servers`` servers and
``--workers`` workers (once when the sharding is balanced without a split: ``K`` = 0, and the split's
figures of that sharding are None). Each run's load is the servers' own count of rows served per step
(``server_rows_per_step`` in its ``summary.json``: max / mean over the servers), and its quality the
test AUC. Under SGD and Adagrad an element's update depends on that element alone, so the split moves
load between servers without changing the trajectory: the AUC with and without it agree to the last bit
wherever the runs see the same samples (the study reports the difference).

The result (``--out``) holds every run, the per-sharding medians and ranges over the seeds, and the
provenance of :mod:`commlab.provenance` (nothing here is timed, so a busy machine does not change it).
"""
import json
import os
import statistics
import sys
import tempfile

from commlab import provenance as prov
from experiments.cluster.study import write_record
from commlab.provenance import unwritable
from experiments.faults.suite import launch
from training.settings.options import INT32_MAX, Parser, integer, outpath, real

__all__ = ["main", "run_flags", "study"]

_LIMIT = 600  # seconds a training job may run before it is killed (a hang)
#: The model every run shares: the ctr study's (experiments.cluster.ctr) at 10^5 rows.
COMMON = ["--model", "ctr", "--mode", "hybrid", "--ctr-rows", "100000", "--ctr-tables", "8", "--ctr-dim", "16",
          "--ctr-bag", "2", "--ctr-train", "65536", "--ctr-test", "200000", "--batch-size", "1024", "--epochs", "1",
          "--hidden", "64,32", "--optimizer", "adagrad", "--lr", "0.05", "--lr-schedule", "constant",
          "--no-progress", "--threads", "1"]


def run_flags(args, seed, sharding, hot, run_dir, name):
    """Return the trainer's flags of one hybrid run.

    Examples
    --------
    >>> a = argparse.Namespace(servers=4)
    >>> flags = run_flags(a, 1, "range", 64, "/tmp/r", "x")
    >>> flags[flags.index("--ctr-hot") + 1], flags[flags.index("--ctr-sharding") + 1]
    ('64', 'range')
    """
    return [*COMMON, "--servers", str(args.servers), "--seed", str(seed), "--ctr-sharding", sharding,
            "--ctr-hot", str(hot), "--run-dir", run_dir, "--name", name]


def _counted(args, seed, sharding):
    """The split size that balances ``sharding`` for ``seed``, and the counted loads without and with it."""
    from training.settings.config import Config
    from training.ctr.data import make_ctr_data
    from training.ctr.hotkeys import hot_for_balance, server_load

    cfg = Config(model="ctr", ctr_rows=100000, ctr_tables=8, ctr_dim=16, ctr_bag=2, ctr_train=65536, ctr_test=200000,
                 batch_size=1024, seed=seed, ctr_sharding=sharding)
    data = make_ctr_data(cfg)
    hot, balanced = hot_for_balance(cfg, data, args.servers, args.workers, sharding, target=args.target)
    plain = server_load(cfg, data, args.servers, args.workers, sharding)
    return hot, plain["max_over_mean"], balanced["max_over_mean"]


def _train(args, seed, sharding, hot, run_dir):
    name = f"s{seed}-{sharding}-hot{hot}"
    code, secs, out = launch(args.servers + args.workers, "training.train",
                             run_flags(args, seed, sharding, hot, run_dir, name), {}, _LIMIT)
    if code != 0:
        raise RuntimeError(f"the run {name} failed (exit {code}):\n{out[-3000:]}")
    with open(os.path.join(run_dir, name, "summary.json"), encoding="utf-8") as f:
        s = json.load(f)
    rows = s["server_rows_per_step"]
    return {"seed": seed, "sharding": sharding, "hot": hot, "seconds": round(secs, 1),
            "rows_per_step": rows, "max_over_mean": max(rows) / statistics.mean(rows),
            "test_auc": s["test_auc"], "best_auc": s["best_auc"]}


def _spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def study(args, run_dir):
    """Run every seed and sharding; return the results dict (without provenance)."""
    runs = []
    for seed in range(args.seeds):
        for sharding in ("range", "hash"):
            hot, counted, counted_split = _counted(args, seed, sharding)
            plain = _train(args, seed, sharding, 0, run_dir)
            plain.update(counted_max_over_mean=counted, split=False, balancing_split=hot)
            runs.append(plain)
            if not hot:  # balanced without a split: nothing to compare
                print(f"seed {seed} {sharding}: max/mean rows served {plain['max_over_mean']:.3f}, no split needed; "
                      f"AUC {plain['test_auc']:.6f}", flush=True)
                continue
            split = _train(args, seed, sharding, hot, run_dir)
            split.update(counted_max_over_mean=counted_split, split=True)
            runs.append(split)
            print(f"seed {seed} {sharding}: max/mean rows served {plain['max_over_mean']:.3f} -> "
                  f"{split['max_over_mean']:.3f} with {hot} hot rows split; AUC {plain['test_auc']:.6f} -> "
                  f"{split['test_auc']:.6f}", flush=True)
    summary = {}
    for sharding in ("range", "hash"):
        plain = [r for r in runs if r["sharding"] == sharding and not r["split"]]
        split = {r["seed"]: r for r in runs if r["sharding"] == sharding and r["split"]}
        pairs = [(r, split[r["seed"]]) for r in plain if r["seed"] in split]
        summary[sharding] = {  # the split's figures over the seeds that needed one (None: none did)
            "max_over_mean": _spread([r["max_over_mean"] for r in plain]),
            "hot": _spread([r["balancing_split"] for r in plain]),
            "test_auc": _spread([r["test_auc"] for r in plain]),
            "max_over_mean_split": _spread([b["max_over_mean"] for _, b in pairs]) if pairs else None,
            "test_auc_split": _spread([b["test_auc"] for _, b in pairs]) if pairs else None,
            "auc_difference": _spread([b["test_auc"] - a["test_auc"] for a, b in pairs]) if pairs else None,
        }
    return {"servers": args.servers, "workers": args.workers, "target": args.target, "seeds": args.seeds,
            "summary": summary, "runs": runs}


def main(argv=None):
    """Command-line entry point: run the study and write ``--out``."""
    p = Parser(prog="python -m experiments.studies.hot_rows", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=integer(1, INT32_MAX), default=3, help="seeds 0 .. N-1 (default 3)")
    p.add_argument("--servers", type=integer(1, INT32_MAX), default=4, help="server ranks (default 4)")
    p.add_argument("--workers", type=integer(1, INT32_MAX), default=4, help="worker ranks (default 4)")
    p.add_argument("--target", type=real(0, 1e15, low_open=True), default=1.2, help="max / mean rows served the split aims at (default 1.2)")
    p.add_argument("--out", type=outpath(), default="results/ctr_hotkeys.json", help="result file (default results/ctr_hotkeys.json)")
    args = p.parse_args(argv)
    for flag, value, least in (("--seeds", args.seeds, 1), ("--servers", args.servers, 2),
                               ("--workers", args.workers, 1), ("--target", args.target, 1.0)):
        if value < least:
            p.error(f"{flag} must be at least {least:g}, got {value:g}")
    why = unwritable(args.out)  # before any run: a bad path would lose the study at its end
    if why:
        p.error(f"--out: {why}")
    with tempfile.TemporaryDirectory(prefix="commlab-hotkeys-") as run_dir:
        result = study(args, run_dir)
    # nothing here is timed: the machine's load changes no figure, so the file is never noisy
    result["provenance"] = {**prov.provenance(args.servers + args.workers), "timed": False, "noisy": False}
    write_record(result, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
