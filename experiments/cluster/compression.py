"""Compression where it pays: step time and time to accuracy of every compressor, per network.

Measure (the compression study, once per network; 4 nodes x 1 rank on the emulated links)::

    mpiexec -n 4 python -m experiments.studies.compression_sweep --seeds 0 --epochs 6 --out results/cluster/compression_shm
    python -m experiments.cluster.emulate --nodes 4 --ranks-per-node 1 --link 100mbit -- \\
        python -m experiments.studies.compression_sweep --seeds 0 --epochs 6 --out results/cluster/compression_100mbit

then report (one process)::

    python -m experiments.cluster.compression shm=results/cluster/compression_shm \\
        1gbit=results/cluster/compression_1gbit 100mbit=results/cluster/compression_100mbit \\
        --target 0.95 --out results/cluster/compression
    python -m plots.cluster results/cluster/compression.json

From each run's logs (:func:`epoch_times`): the step time of epoch e is the time between its first
and last step over the steps between them (evaluation excluded); a compressor's step time is the
median over epochs, with their range; its speedup over ``none`` on the same network is the median (and range) of
the per-epoch ratios ``step(none) / step(compressor)``; its time to ``--target`` test accuracy is the
wall time at the end of the first epoch that reaches it (evaluated once per epoch, so it is
quantized to epochs). The accuracy cost is the final test accuracy minus ``none``'s, in points.
GRACE (H. Xu et al., "GRACE: A Compressed Communication Framework for Distributed Machine
Learning", ICDCS 2021, section V) reports the same quantities against network bandwidth.
"""
import argparse
import csv
import json
import os
import sys
from statistics import median

from tabulate import tabulate

__all__ = ["epoch_times", "report", "main"]

_COLUMNS = ("network", "spec", "bytes_per_step", "step_ms", "step_min_ms", "step_max_ms", "speedup",
            "speedup_min", "speedup_max", "time_to_target_s", "final_test_acc", "acc_cost_points")


def epoch_times(run_dir):
    """Return ``[(step seconds, cumulative wall seconds, test accuracy)]`` per epoch of a training run.

    The step time of an epoch is the spread of its steps' wall clocks (``metrics.jsonl``) over the
    steps between them, so the evaluation at the end of each epoch is left out; the cumulative wall
    time (``epochs.jsonl``) keeps it, as the time to accuracy should.
    """
    clocks = {}
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            s = json.loads(line)
            clocks.setdefault(s["epoch"], []).append(s["wall_s"])
    out = []
    with open(os.path.join(run_dir, "epochs.jsonl"), encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            c = clocks.get(e["epoch"], [])
            step = (c[-1] - c[0]) / (len(c) - 1) if len(c) > 1 else float("nan")
            out.append((step, e["wall_s"], e["test_acc"]))
    return out


def report(sweeps, target):
    """Return the rows (keys :data:`_COLUMNS`) from ``{network: compression_sweep result}``."""
    rows = []
    for net, data in sweeps.items():
        runs = {r["spec"]: r for r in data["runs"] if r.get("seed", 0) == data["runs"][0].get("seed", 0)}
        base = epoch_times(runs["none"]["run_dir"]) if "none" in runs else None
        for spec, r in runs.items():
            ep = epoch_times(r["run_dir"])
            steps = [s for s, _, _ in ep]
            ratios = [b[0] / s for b, s in zip(base, steps)] if base else []
            reach = next((w for _, w, acc in ep if acc >= target), None)
            acc = r["final_test_acc"]
            rows.append({"network": net, "spec": spec, "bytes_per_step": r.get("bytes_per_step"),
                         "step_ms": median(steps) * 1e3, "step_min_ms": min(steps) * 1e3,
                         "step_max_ms": max(steps) * 1e3, "speedup": median(ratios) if ratios else None,
                         "speedup_min": min(ratios) if ratios else None, "speedup_max": max(ratios) if ratios else None,
                         "time_to_target_s": reach, "final_test_acc": acc,
                         "acc_cost_points": (acc - runs["none"]["final_test_acc"]) * 100 if "none" in runs else None})
    return rows


def _markdown(rows, nets, target):
    specs = list(dict.fromkeys(r["spec"] for r in rows))
    head = ["compressor", "bytes/step"] + [f"{n}: step ms (speedup) / to {target:.0%} s" for n in nets] + \
           [f"acc cost, {n}" for n in nets]
    table = []
    for spec in specs:
        cells = [spec, ""]
        for n in nets:
            r = next((x for x in rows if x["network"] == n and x["spec"] == spec), None)
            if r is None:
                cells.append("-")
                continue
            cells[1] = cells[1] or f"{r['bytes_per_step']:,.0f}"
            sp = "" if r["speedup"] is None else f" ({r['speedup']:.2f}x [{r['speedup_min']:.2f}-{r['speedup_max']:.2f}])"
            tt = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f}"
            cells.append(f"{r['step_ms']:.1f}{sp} / {tt}")
        for n in nets:
            r = next((x for x in rows if x["network"] == n and x["spec"] == spec), None)
            cells.append("-" if r is None or r["acc_cost_points"] is None else f"{r['acc_cost_points']:+.2f}")
        table.append(cells)
    return tabulate(table, head, tablefmt="pipe", disable_numparse=True)


def main(argv=None):
    """Read the sweeps, write PREFIX.json and PREFIX.csv, print the table; return the exit status."""
    p = argparse.ArgumentParser(prog="python -m experiments.cluster.compression", description=__doc__.split("\n")[0])
    p.add_argument("sweeps", nargs="+", help="NETWORK=DIR: a compression_sweep --out directory")
    p.add_argument("--target", type=float, default=0.95, help="test accuracy for the time to accuracy (0.95)")
    p.add_argument("--out", default="results/cluster/compression", help="path prefix of the .json and .csv")
    a = p.parse_args(argv)
    if not 0 < a.target < 1:
        p.error(f"--target must be a fraction between 0 and 1, not {a.target}")
    sweeps = {}
    for item in a.sweeps:
        net, _, path = item.partition("=")
        try:
            with open(os.path.join(path, "compression_sweep.json"), encoding="utf-8") as f:
                sweeps[net] = json.load(f)
        except (OSError, ValueError) as e:
            p.error(f"{item}: {e} (expected NETWORK=DIR)")
    rows = report(sweeps, a.target)
    info = {n: {k: d.get(k) for k in ("P", "host", "mpi_library", "config", "run")} for n, d in sweeps.items()}
    with open(a.out + ".json", "w") as f:
        json.dump({"study": "experiments.cluster.compression", "target": a.target, "networks": list(sweeps),
                   "sources": info, "rows": rows}, f, indent=1)
    with open(a.out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, _COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(_markdown(rows, list(sweeps), a.target))
    print(f"wrote {a.out}.json and {a.out}.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
