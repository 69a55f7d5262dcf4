"""The ctr model's three modes on emulated links: bytes per link per step, samples/s, AUC, and where hybrid overtakes dp.

Print the study's commands (4 workers + 2 servers, one rank per node; ``dp`` on the 4 workers' nodes)::

    python -m experiments.cluster.ctr commands --out results/cluster/ctr

and run them on a quiet machine, or let the study run them all and gather them (the load average is
checked before the first and recorded while they run)::

    python -m experiments.cluster.ctr run --out results/cluster/ctr --study results/cluster/ctr_study.json

Each command is one ``python -m training.emulator.emulate ... -- python -m
training.train --model ctr ...`` run writing ``results/cluster/ctr/NAME/summary.json``), then::

    python -m experiments.cluster.ctr report results/cluster/ctr --out results/cluster/ctr_study.json
    python -m plots.ctr results/cluster/ctr_study.json

Bytes per step, each direction, for ``n`` rows of ``d`` float32 elements, an MLP of ``m`` parameters, ``u(n)``
distinct rows in a worker's batch (counted from the data, :func:`unique_rows`), W workers and S servers:
``dp`` runs a ring all-reduce of the whole flat vector, ``2 (W - 1) / W x 4 (n d + m)`` on every worker link,
growing with the table; ``hybrid`` pulls and pushes the batch's rows, ``4 u d + 8 u`` per worker link (values
and ids), ``W / S`` times that on each server's link, and all-reduces the MLP among the workers,
``2 (W - 1) / W x 4 m``; ``ps`` moves the MLP through the servers as well. The step is bounded by its busiest
link (:func:`busiest_link_bytes`): a server's under ``hybrid``, every worker's under ``dp``. Since ``u(n) <= n``
and a batch touches nearly every row of a small table, ``dp`` moves fewer bytes on its busiest link only
below a table size :func:`predict` solves for; above it ``hybrid`` does.
"""
import glob
import json
import os
import re
import sys
from statistics import median

from experiments.cluster import study
from training.settings.options import INT32_MAX, Parser, infile, integer, outpath

__all__ = ["commands", "predict", "link_bytes", "report", "main"]

ROWS = (10 ** 3, 10 ** 4, 10 ** 5, 10 ** 6)
LINKS = ("100mbit", "1gbit")
_NAME = re.compile(r"^(dp|ps|hybrid)-(\w+)-n(\d+)-r\d+$")  # the run names of :func:`commands`
#: The model and run every command shares (AUC after ctr_train samples, one epoch).
COMMON = ("--model ctr --ctr-tables 8 --ctr-dim 16 --ctr-bag 2 --ctr-train 65536 --ctr-test 200000 "
          "--batch-size 1024 --epochs 1 --hidden 64,32 --optimizer adagrad --lr 0.05 --lr-schedule constant "
          "--no-progress")
DP_TRAIN_AT_1E6 = 4096  # dp at 10^6 rows is timed over 4 steps only (its all-reduce is 64 MB a step)
MLP = 8 * 16 * 64 + 64 + 64 * 32 + 32 + 33  # the study's MLP parameters (--hidden 64,32 over 8 pooled tables)


def commands(out, repeats=3, rows=ROWS, links=LINKS):
    """Return the study's shell commands (one per run), in the order to run them.

    Examples
    --------
    >>> cmd = commands("results/cluster/ctr", repeats=1, rows=(10000,), links=("100mbit",))
    >>> len(cmd), "--mode hybrid" in cmd[2]
    (3, True)
    """
    out_cmds = []
    for link in links:
        for n in rows:
            for r in range(1, repeats + 1):
                for mode in ("dp", "ps", "hybrid"):
                    nodes, servers = (4, "") if mode == "dp" else (6, " --servers 2")
                    train = f" --ctr-train {DP_TRAIN_AT_1E6}" if mode == "dp" and n >= 10 ** 6 else ""
                    name = f"{mode}-{link}-n{n}-r{r}"
                    out_cmds.append(f"python -m training.emulator.emulate --nodes {nodes} --ranks-per-node 1 "
                                    f"--link {link} -- python -m training.train {COMMON}{train} --mode {mode}{servers} "
                                    f"--ctr-rows {n} --run-dir {out} --name {name}")
    return out_cmds


def unique_rows(n, workers=4, steps=8, seed=0):
    """Return the mean distinct rows in one worker's batch of the study's model with ``n`` rows in all tables.

    Counted from the synthetic training ids (:func:`training.ctr.hotkeys.server_load`, no training).

    Examples
    --------
    >>> 0 < unique_rows(400, steps=1) <= 400
    True
    """
    from training.settings.config import Config
    from training.ctr.data import make_ctr_data
    from training.ctr.hotkeys import server_load

    cfg = Config(model="ctr", ctr_rows=n, ctr_tables=8, ctr_dim=16, ctr_bag=2, ctr_train=1024 * steps,
                 ctr_test=64, batch_size=1024, seed=seed)
    return sum(server_load(cfg, make_ctr_data(cfg), 1, workers, "hash", steps=steps)["rows_per_step"]) / workers


def link_bytes(mode, n, unique, dim=16, mlp=MLP, workers=4):
    """Return the predicted bytes per worker link per step, each direction (see the module docstring).

    Examples
    --------
    >>> round(link_bytes("dp", 10 ** 6, 3000) / 1e6, 1)  # MB
    96.1
    """
    ring = 2 * (workers - 1) / workers
    if mode == "dp":
        return ring * 4 * (n * dim + mlp)
    rows = 4 * unique * dim + 8 * unique
    return rows + (4 * mlp if mode == "ps" else ring * 4 * mlp)


def busiest_link_bytes(mode, n, unique, dim=16, mlp=MLP, workers=4, servers=2):
    """Return the predicted bytes per step on the busiest link, each direction: every worker link under
    ``dp``, a server's link (``workers / servers`` workers' rows) or a worker's under ``ps`` and ``hybrid``.

    Examples
    --------
    >>> busiest_link_bytes("hybrid", 10 ** 6, 1000) == 2 * (4 * 1000 * 16 + 8 * 1000)
    True
    """
    worker = link_bytes(mode, n, unique, dim, mlp, workers)
    if mode == "dp":
        return worker
    server = workers / servers * (4 * unique * dim + 8 * unique + (4 * mlp if mode == "ps" else 0))
    return max(worker, server)


def predict(curve, dim=16, mlp=MLP, workers=4, servers=2):
    """Return the table size at which ``hybrid``'s busiest link carries as many bytes as ``dp``'s.

    Parameters
    ----------
    curve : dict
        ``{n: u(n)}``, distinct rows per worker batch for each table size (:func:`unique_rows`).

    Returns
    -------
    float or None
        Interpolated (log-linear) between the two sizes where the order changes; None if it never does.

    Examples
    --------
    >>> predict({100: 100, 10 ** 6: 1500}) is None  # the MLP's all-reduce is common to both, and u <= n
    True
    >>> round(predict({100: 100, 1000: 900, 10 ** 4: 1300}, mlp=0))  # without an MLP small tables favour dp
    1101
    """
    import math

    def gap(n):  # > 0 where dp's busiest link carries more than hybrid's
        return (busiest_link_bytes("dp", n, curve[n], dim, mlp, workers)
                - busiest_link_bytes("hybrid", n, curve[n], dim, mlp, workers, servers))

    ns = sorted(curve)
    for a, b in zip(ns, ns[1:]):
        ga, gb = gap(a), gap(b)
        if ga <= 0 < gb:
            t = -ga / (gb - ga)
            return math.exp(math.log(a) + t * (math.log(b) - math.log(a)))
    return None


CURVE = tuple(int(round(10 ** (k / 4))) for k in range(8, 25))  # 100 .. 10^6 rows, four per decade


def report(run_dir, out):
    """Gather every ``NAME/summary.json`` under ``run_dir`` into ``out``: median and range per (mode, link, rows).

    Returns
    -------
    dict
        ``{"rows": [...], "points": [{"mode", "link", "rows", "samples_per_s": [median, lo, hi], "test_auc",
        "bytes_per_step", "predicted_bytes", "busiest_bytes", "load_max_over_mean"}], "curve": {n: u(n)},
        "predicted_crossing_rows": ... (None when hybrid's busiest link never carries more than dp's),
        "busiest_ratio_dp_over_hybrid": {n: ...}}``.
    """
    groups = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "*", "summary.json"))):
        name = os.path.basename(os.path.dirname(path))
        match = _NAME.match(name)
        if not match or os.path.islink(os.path.dirname(path)):  # the trainer's ``latest`` link, other runs
            continue
        mode, link, n = match.groups()
        with open(path) as f:
            groups.setdefault((mode, link, int(n)), []).append(json.load(f))
    points, uniques = [], []
    for (mode, link, n), runs in sorted(groups.items()):
        rate = [r["samples_per_s"] for r in runs]
        per_step = [r.get("allreduce_bytes_per_step", 0) + r.get("pull_bytes_per_step", 0) for r in runs]
        if mode == "hybrid":  # the values pulled: 4 bytes x 16 per distinct row
            uniques += [r["pull_bytes_per_step"] / (4 * 16) for r in runs]
        points.append({"mode": mode, "link": link, "rows": n, "runs": len(runs),
                       "samples_per_s": [median(rate), min(rate), max(rate)],
                       "test_auc": median(r["test_auc"] for r in runs), "best_auc": runs[0]["best_auc"],
                       "bytes_per_step": median(per_step),
                       "load_max_over_mean": median(r.get("load_max_over_mean", 1.0) for r in runs)})
    curve = {n: unique_rows(n) for n in sorted(set(CURVE) | {p["rows"] for p in points})}
    for p in points:
        p["predicted_bytes"] = link_bytes(p["mode"], p["rows"], curve[p["rows"]])
        p["busiest_bytes"] = busiest_link_bytes(p["mode"], p["rows"], curve[p["rows"]])
    record = {"rows": sorted({p["rows"] for p in points}), "points": points,
              "unique_rows_per_step": median(uniques) if uniques else 0.0, "curve": curve,
              "predicted_crossing_rows": predict(curve),
              "busiest_ratio_dp_over_hybrid": {n: busiest_link_bytes("dp", n, u) / busiest_link_bytes("hybrid", n, u)
                                               for n, u in curve.items()},
              "command": " ".join(sys.argv)}
    if out:
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        with open(out, "w") as f:
            json.dump(record, f, indent=1)
    return record


def main(argv=None):
    """``commands`` prints the runs; ``run`` runs them and gathers them; ``report DIR`` gathers finished runs."""
    p = Parser(prog="python -m experiments.cluster.ctr", description=__doc__.splitlines()[0],
                                epilog="run --out DIR --study FILE [--repeats R] [--max-load L] [--settle S] "
                                       "[--allow-noisy]: run the study and gather it; commands --out DIR "
                                       "[--repeats R]: print its runs; report RUN_DIR --out FILE: gather finished "
                                       "runs. 'SUBCOMMAND --help' for each.")
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("commands")
    c.add_argument("--out", type=outpath(), default="results/cluster/ctr")
    c.add_argument("--repeats", type=integer(1, INT32_MAX), default=3)
    r = sub.add_parser("report")
    r.add_argument("run_dir", type=infile())
    r.add_argument("--out", type=outpath(), default="results/cluster/ctr_study.json")
    g = sub.add_parser("run")
    study.add_options(g, "results/cluster/ctr", "results/cluster/ctr_study.json")
    g.add_argument("--repeats", type=integer(1, INT32_MAX), default=3)
    args = p.parse_args(argv)
    if args.what == "commands":
        print("\n".join(commands(args.out, args.repeats)))
    elif args.what == "run":
        # each run's own 4-6 ranks and one unit more: the emulator's launch proxies and the kernel's work
        # on the shaped links (a study alone on the machine lifted the 1-minute load to 6.56, mean 5.19)
        return study.run_study(args, commands(args.out, args.repeats), lambda: report(args.out, None), P=7,
                               label="ctr study")
    else:
        rec = report(args.run_dir, args.out)
        print(f"{len(rec['points'])} points -> {args.out}; predicted crossing at {rec['predicted_crossing_rows']} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
