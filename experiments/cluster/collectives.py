"""Collectives across emulated nodes: where the hierarchical all-reduce beats the flat ring.

Measure (one ``bench_collectives`` sweep per link rate, under :mod:`experiments.cluster.emulate`)::

    python -m experiments.cluster.emulate --nodes 4 --ranks-per-node 2 --link 1gbit -- \\
        python -m experiments.bench.collectives --ops allreduce --algorithms ring,rabenseifner,2d,tree,mpi \\
        --min-bytes 64K --max-bytes 64M --iters 5 --warmup 1 --max-time 3 --repeats 3 \\
        --out results/cluster/collectives_1gbit

then report (one process, no MPI launch)::

    python -m experiments.cluster.collectives 1gbit=results/cluster/collectives_1gbit.json \\
        100mbit=results/cluster/collectives_100mbit.json --ranks-per-node 2 --out results/cluster/collectives
    python -m plots.cluster results/cluster/collectives.json

For every row, the bytes that leave the busiest node per call are counted from the algorithm's own
schedules (:meth:`collectives.schedules.schedule.Schedule.links`; rank r on node r // K, as hydra places
``-hosts node0:K,...``; ``2d`` on the (nodes, K) grid it takes there). The inter-node busbw is those
bytes over the measured time, and its fraction of the configured link rate is the link utilization
(nccl-tests' busbw, restricted to the slow level). Per-pass ratios ``time(ring) / time(alg)`` give
each algorithm's speedup over the flat ring as median and range over the sweep's passes, measured in
the same run. ``mpi`` has no schedule here (MPICH picks its own algorithm), so its bytes are not
counted. Writes PREFIX.json and PREFIX.csv and prints a Markdown table.
"""
import argparse
import csv
import json
import sys
from statistics import median

from tabulate import tabulate

from collectives.schedules.registry import build_allreduce_schedule
from experiments.cluster.net import parse_rate

__all__ = ["node_bytes", "report", "main"]

_COLUMNS = ("link", "bytes", "algorithm", "time_s", "time_min_s", "time_max_s", "node_inter_bytes",
            "inter_busbw_GBps", "utilization", "speedup_vs_ring", "speedup_min", "speedup_max")


def node_bytes(algorithm, P, per_node, count, itemsize=4):
    """Return the bytes that leave the busiest node in one all-reduce, from the schedules.

    Parameters
    ----------
    algorithm : str
        ``ring``, ``tree``, ``recursive_doubling``, ``rabenseifner`` or ``2d``.
    P, per_node, count : int
        Ranks, ranks per node (rank r on node r // per_node), elements.
    itemsize : int
        Bytes per element.

    Returns
    -------
    int
        Bytes sent from the ranks of the busiest node to ranks of other nodes.
    """
    grid = (P // per_node, per_node) if algorithm == "2d" else None
    out = [0] * (P // per_node)
    for r in range(P):
        links = build_allreduce_schedule(algorithm, r, P, count, grid).links()
        out[r // per_node] += sum(n for (src, dst), n in links.items() if dst // per_node != src // per_node)
    return max(out) * itemsize


def _passes(row):
    return [t * 1e-6 for t in row.get("time_repeats_us") or [row["time_us"]]]


def report(runs, per_node):
    """Return the study's rows and summary from ``{link: bench_collectives result}``.

    Returns
    -------
    (list of dict, dict)
        Rows with the :data:`_COLUMNS` keys; per link, the sizes where ``2d`` beats ``ring`` and the
        smallest size from which it stays faster.
    """
    rows, summary, cache = [], {}, {}
    for link, data in runs.items():
        rate = parse_rate(link)
        got = {(r["bytes"], r["algorithm"]): r for r in data["rows"] if r["op"] == "allreduce"}
        P = int(data["P"])
        for (size, alg), r in sorted(got.items()):
            t = _passes(r)
            ring = got.get((size, "ring"))
            ratios = [a / b for a, b in zip(_passes(ring), t)] if ring else []
            nb = None
            if alg != "mpi":
                key = (alg, P, r["count"])
                nb = cache[key] = cache.get(key) or node_bytes(alg, P, per_node, r["count"], size // r["count"])
            busbw = nb / r["time_s"] / 1e9 if nb else None
            rows.append({"link": link, "bytes": size, "algorithm": alg, "time_s": r["time_s"],
                         "time_min_s": min(t), "time_max_s": max(t), "node_inter_bytes": nb,
                         "inter_busbw_GBps": busbw, "utilization": busbw * 8e9 / rate if busbw and rate else None,
                         "speedup_vs_ring": median(ratios) if ratios else None,
                         "speedup_min": min(ratios) if ratios else None, "speedup_max": max(ratios) if ratios else None})
        mine = [x for x in rows if x["link"] == link and x["algorithm"] == "2d" and x["speedup_vs_ring"]]
        wins = [x["bytes"] for x in mine if x["speedup_vs_ring"] > 1]
        stays = next((x["bytes"] for i, x in enumerate(mine) if all(y["speedup_vs_ring"] > 1 for y in mine[i:])), None)
        summary[link] = {"P": P, "ranks_per_node": per_node, "passes": data["config"].get("repeats"),
                         "2d_faster_than_ring_at": wins, "2d_faster_from_bytes": stays}
    return rows, summary


def _markdown(rows):
    algs = sorted({r["algorithm"] for r in rows}, key=("ring", "rabenseifner", "2d", "tree", "mpi").index)
    lines = []
    for link in dict.fromkeys(r["link"] for r in rows):
        lines += [f"\n{link}: time ms (speedup over ring, median [range] of passes; inter-node busbw GB/s)\n",
                  ]
        table = []
        for size in sorted({r["bytes"] for r in rows if r["link"] == link}):
            cells = []
            for a in algs:
                r = next((x for x in rows if x["link"] == link and x["bytes"] == size and x["algorithm"] == a), None)
                if r is None:
                    cells.append("-")
                    continue
                c = f"{r['time_s'] * 1e3:.1f}"
                if a != "ring" and r["speedup_vs_ring"]:
                    c += f" ({r['speedup_vs_ring']:.2f}x [{r['speedup_min']:.2f}-{r['speedup_max']:.2f}])"
                if r["inter_busbw_GBps"]:
                    c += f"; {r['inter_busbw_GBps']:.3f}"
                cells.append(c)
            table.append([f"{size >> 10} KiB"] + cells)
        lines.append(tabulate(table, ["size"] + algs, tablefmt="pipe", disable_numparse=True))
    return "\n".join(lines)


def main(argv=None):
    """Read the sweeps, write PREFIX.json and PREFIX.csv, print the table; return the exit status."""
    p = argparse.ArgumentParser(prog="python -m experiments.cluster.collectives", description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="RATE=FILE: a bench_collectives JSON measured at link RATE (tc units)")
    p.add_argument("--ranks-per-node", type=int, default=2, help="ranks per node of those runs (default 2)")
    p.add_argument("--out", default="results/cluster/collectives", help="path prefix of the .json and .csv")
    a = p.parse_args(argv)
    runs = {}
    for item in a.runs:
        link, _, path = item.partition("=")
        try:
            parse_rate(link)
            with open(path, encoding="utf-8") as f:
                runs[link] = json.load(f)
        except (ValueError, OSError) as e:
            p.error(f"{item}: {e}")
        if runs[link]["P"] % a.ranks_per_node:
            p.error(f"{item}: P = {runs[link]['P']} is not a multiple of --ranks-per-node {a.ranks_per_node}")
    rows, summary = report(runs, a.ranks_per_node)
    sources = {k: {"file": v.get("config", {}).get("out"), "date": v.get("date"), "mpi_library": v.get("mpi_library"),
                   "host": v.get("host"), "load_average": v.get("load_average"), "config": v.get("config")}
               for k, v in runs.items()}
    with open(a.out + ".json", "w") as f:
        json.dump({"study": "experiments.cluster.collectives", "ranks_per_node": a.ranks_per_node,
                   "sources": sources, "summary": summary, "rows": rows}, f, indent=1)
    with open(a.out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, _COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(_markdown(rows))
    for link, s in summary.items():
        print(f"{link}: 2d faster than ring at {[b >> 10 for b in s['2d_faster_than_ring_at']]} KiB; "
              f"from {None if s['2d_faster_from_bytes'] is None else s['2d_faster_from_bytes'] >> 10} KiB up")
    print(f"wrote {a.out}.json and {a.out}.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
