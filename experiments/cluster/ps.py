"""Parameter server against all-reduce on emulated 1 Gbit/s links: samples/s and bytes per link per step.

Measure (same model, data, global batch and epochs; one node per rank; servers on nodes of their own)::

    python -m experiments.cluster.emulate --nodes 4 --ranks-per-node 1 --link 1gbit -- python -m training.train \\
        --epochs 5 --algorithm ring --run-dir results/cluster/ps --name dp-ring-r1 --no-progress
    python -m experiments.cluster.emulate --nodes 6 --ranks-per-node 1 --link 1gbit -- python -m training.train \\
        --mode ps --servers 2 --consistency bsp --epochs 5 --run-dir results/cluster/ps --name ps-bsp-s2-r1 --no-progress

(``dp-ring-rR`` and ``ps-bsp-sS-rR`` for S = 1, 2, 4 and repeats R), then::

    python -m experiments.cluster.ps results/cluster/ps --out results/cluster/ps_vs_allreduce

Bytes per link per step follow from the protocols, for n parameters of 4 bytes and W workers, each
direction of a node's link: ring all-reduce (Patarasuk and Yuan 2009) sends 2 (W - 1) / W x 4n on
every link; BSP with S servers (M. Li et al., "Scaling Distributed Machine Learning with the
Parameter Server", OSDI 2014, section 3) sends 4n on a worker's link (push out, pull in) and
W x 4n / S on a server's (every worker's shard), so the server links carry W / S times a worker's:
the concentration BytePS (Y. Jiang et al., OSDI 2020, section 3) removes by adding servers. The
data-parallel run's own byte counter (``bytes_sent_per_rank``) checks the ring figure. Samples/s is
training throughput without evaluation: the parameter server's own (samples over the servers' job
time; it evaluates snapshots afterwards), and for data parallelism the global batch over the median
step time (:func:`experiments.cluster.compression.epoch_times`, evaluation excluded); median and
range over the repeats.
"""
import argparse
import csv
import glob
import json
import os
import re
import sys
from statistics import median

from tabulate import tabulate

from experiments.cluster.compression import epoch_times

__all__ = ["link_bytes", "report", "main"]


def link_bytes(kind, n, workers, servers=0, itemsize=4):
    """Return ``(busiest link, worker link)`` bytes per step in each direction.

    Parameters
    ----------
    kind : {"dp", "ps"}
        Ring all-reduce data parallelism or the BSP parameter server.
    n : int
        Parameters.
    workers, servers : int
        W worker ranks and S server ranks (one per node).
    itemsize : int
        Bytes per parameter.
    """
    if kind == "dp":
        b = 2 * (workers - 1) / workers * n * itemsize
        return b, b
    return max(n * itemsize, workers * n * itemsize / servers), n * itemsize


def report(root):
    """Return one row per configuration from the run directories under ``root``."""
    groups = {}
    for path in sorted(glob.glob(os.path.join(root, "*", "summary.json"))):
        m = re.fullmatch(r"(dp-ring|ps-bsp-s(\d+))-r\d+", os.path.basename(os.path.dirname(path)))
        if not m:
            continue
        with open(path, encoding="utf-8") as f:
            groups.setdefault(m.group(1), []).append(json.load(f))
    rows = []
    for name, runs in sorted(groups.items(), key=lambda kv: (kv[0] != "dp-ring", kv[0])):
        s0 = runs[0]
        if name == "dp-ring":
            with open(os.path.join(s0["run_dir"], "config.json"), encoding="utf-8") as f:
                batch = json.load(f).get("config", {}).get("batch_size", 64)
            rates = [batch / median(step for step, _, _ in epoch_times(r["run_dir"])) for r in runs]
            workers, servers, kind = s0["P"], 0, "dp"
            measured = median(r["bytes_sent_per_rank"] / r["steps"] for r in runs)
        else:
            rates = [r["samples_per_s"] for r in runs]
            workers, servers, kind = s0["workers"], s0["servers"], "ps"
            measured = None
        busiest, worker = link_bytes(kind, s0["parameters"], workers, servers)
        rows.append({"config": name, "nodes": workers + servers, "workers": workers, "servers": servers,
                     "samples_per_s": median(rates), "samples_min": min(rates), "samples_max": max(rates),
                     "repeats": len(runs), "final_test_acc": median(r["final_test_acc"] for r in runs),
                     "busiest_link_bytes": busiest, "worker_link_bytes": worker,
                     "measured_sent_per_rank_step": measured})
    base = next((r for r in rows if r["config"] == "dp-ring"), None)
    for r in rows:
        r["vs_allreduce"] = r["samples_per_s"] / base["samples_per_s"] if base else None
    return rows


def main(argv=None):
    """Read the runs, write PREFIX.json and PREFIX.csv, print the table; return the exit status."""
    p = argparse.ArgumentParser(prog="python -m experiments.cluster.ps", description=__doc__.split("\n")[0])
    p.add_argument("root", help="the --run-dir of the runs (dp-ring-rR, ps-bsp-sS-rR)")
    p.add_argument("--out", default="results/cluster/ps_vs_allreduce", help="path prefix of the .json and .csv")
    a = p.parse_args(argv)
    rows = report(a.root)
    if not rows:
        p.error(f"no dp-ring-rR or ps-bsp-sS-rR runs with a summary.json under {a.root}")
    with open(a.out + ".json", "w") as f:
        json.dump({"study": "experiments.cluster.ps", "root": a.root, "rows": rows}, f, indent=1)
    with open(a.out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    head = ("configuration", "nodes", "samples/s (range)", "vs all-reduce", "busiest link KB/step",
            "worker link KB/step", "test acc")
    print(tabulate([(r["config"], r["nodes"],
                     f"{r['samples_per_s']:,.0f} ({r['samples_min']:,.0f}-{r['samples_max']:,.0f})",
                     f"{r['vs_allreduce']:.2f}x", f"{r['busiest_link_bytes'] / 1e3:.0f}",
                     f"{r['worker_link_bytes'] / 1e3:.0f}", f"{r['final_test_acc']:.2%}") for r in rows],
                   head, tablefmt="pipe", disable_numparse=True, colalign=("left",) + ("right",) * 6))
    dp = next((r for r in rows if r["config"] == "dp-ring"), None)
    if dp and dp["measured_sent_per_rank_step"]:
        print(f"ring all-reduce: counted {dp['measured_sent_per_rank_step'] / 1e3:.1f} KB sent per rank per step, "
              f"protocol {dp['busiest_link_bytes'] / 1e3:.1f} KB")
    print(f"wrote {a.out}.json and {a.out}.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
