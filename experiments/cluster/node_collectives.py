"""Collectives across emulated nodes: where the hierarchical all-reduce beats the flat ring.

Run the whole study as one command (one ``bench_collectives`` sweep per link rate on 4 nodes x 2 ranks
under :mod:`training.emulator.emulate`: ring, rabenseifner, 2d, tree and mpi, 64 KiB-16 MiB, 3 passes;
the load average checked before the first sweep and recorded while they run,
:mod:`experiments.cluster.study`)::

    python -m experiments.cluster.node_collectives run --out results/cluster/collectives \\
        --study results/cluster/collectives_study.json
    python -m plots.cluster results/cluster/collectives_study.json

``commands`` prints the sweeps (each writes ``DIR/collectives_RATE.json``); ``report
1gbit=FILE 100mbit=FILE --ranks-per-node 2`` gathers finished ones, carrying each sweep's provenance.

For every row, the bytes that leave the busiest node per call are counted from the algorithm's own
schedules (:meth:`collectives.schedules.schedule.Schedule.links`; rank r on node r // K, as hydra places
``-hosts node0:K,...``; ``2d`` on the (nodes, K) grid it takes there). The inter-node busbw is those
bytes over the measured time, and its fraction of the configured link rate is the link utilization
(nccl-tests' busbw, restricted to the slow level). Per-pass ratios ``time(ring) / time(alg)`` give
each algorithm's speedup over the flat ring as median and range over the sweep's passes, measured in
the same run. ``mpi`` has no schedule here (MPICH picks its own algorithm), so its bytes are not
counted. Writes one JSON record and prints it as Markdown (:func:`plots.tables.cluster_tables.collectives_markdown`).
"""
import json
import os
import sys
from statistics import median

from collectives.schedules.registry import build_allreduce_schedule
from experiments import harness
from experiments.cluster import study
from training.emulator.net import parse_rate
from plots.tables.cluster_tables import collectives_markdown
from training.settings.options import INT32_MAX, integer, text

__all__ = ["commands", "node_bytes", "report", "gather", "main"]

LINKS = ("1gbit", "100mbit")
ALGORITHMS = "ring,rabenseifner,2d,tree,mpi"


def commands(out, links=LINKS, load="", max_bytes="16M"):
    """Return the study's sweeps (shell lines), one per link rate, into ``OUT/collectives_RATE.json``.

    Examples
    --------
    >>> cmds = commands("results/cluster/collectives")
    >>> len(cmds), "--max-bytes 16M" in cmds[0], cmds[1].endswith("collectives_100mbit")
    (2, True, True)
    """
    return [f"python -m training.emulator.emulate --nodes 4 --ranks-per-node 2 --link {link} -- python -m "
            f"experiments.bench.collectives --ops allreduce --algorithms {ALGORITHMS} --min-bytes 64K --max-bytes {max_bytes} "
            f"--iters 5 --warmup 1 --max-time 3 --repeats 3{load} --out {out}/collectives_{link}" for link in links]


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
        got = {(r["bytes"], r["algorithm"]): r for r in data["rows"] if r["collective"] == "allreduce"}
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


def gather(files, per_node):
    """Return the study's record from ``{link: bench_collectives JSON path}`` (keys ``study``,
    ``ranks_per_node``, ``sources``: each sweep's file, date, MPI library, host, configuration and
    provenance, ``summary`` and ``rows``: :func:`report`'s)."""
    runs = {}
    for link, path in files.items():
        with open(path, encoding="utf-8") as f:
            runs[link] = json.load(f)
        if runs[link]["P"] % per_node:
            raise ValueError(f"{path}: P = {runs[link]['P']} is not a multiple of --ranks-per-node {per_node}")
    rows, summary = report(runs, per_node)
    sources = {k: {"file": files[k], "date": v.get("date"), "mpi_library": v.get("mpi_library"), "host": v.get("host"),
                   "config": v.get("config"), "provenance": v.get("provenance")} for k, v in runs.items()}
    return {"study": "experiments.cluster.node_collectives", "ranks_per_node": per_node, "sources": sources,
            "summary": summary, "rows": rows}


#: The top-level help's summary of the subcommands.
_EPILOG = ("run [--max-bytes N] --out DIR --study FILE [--max-load L] [--settle S] [--allow-noisy]: run "
            "the study and gather it; commands [--max-bytes N] --out DIR: print its sweeps; report "
            "RATE=FILE ... [--ranks-per-node K] --study FILE: gather finished sweeps. 'SUBCOMMAND --help' "
            "for each.")


def main(argv=None):
    """``run`` the study, print its ``commands``, or ``report`` finished sweeps; return the exit status."""
    p, parsers = study.subcommands("python -m experiments.cluster.node_collectives", __doc__.split("\n")[0], _EPILOG,
                                   "results/cluster/collectives", "results/cluster/collectives_study.json")
    for name in ("run", "commands"):
        parsers[name].add_argument("--max-bytes", type=text(), default="16M", help="the sweeps' largest size (default 16M; "
                                   "a smaller one tries the study out)")
    parsers["report"].add_argument("runs", type=text(), nargs="+", help="RATE=FILE: a bench_collectives JSON measured at link "
                                   "RATE (tc units)")
    parsers["report"].add_argument("--ranks-per-node", type=integer(0, INT32_MAX), default=2, help="ranks per node of those runs "
                                   "(default 2)")
    a = p.parse_args(argv)
    if a.what == "commands":
        print("\n".join(commands(a.out, max_bytes=a.max_bytes)))
        return 0
    if a.what == "run":
        files = {link: os.path.join(a.out, f"collectives_{link}.json") for link in LINKS}
        cmds = commands(a.out, load=harness.load_flags(a, 9), max_bytes=a.max_bytes)
        return study.run_study(a, cmds, lambda: gather(files, 2), P=9, label="collectives study",
                               show=collectives_markdown)
    files = {}
    for item in a.runs:
        link, _, path = item.partition("=")
        try:
            parse_rate(link)
        except ValueError as e:
            p.error(f"{item}: {e}")
        files[link] = path
    try:
        record = gather(files, a.ranks_per_node)
    except (OSError, ValueError, KeyError) as e:
        p.error(f"{e}")
    study.write_record(record, a.study, collectives_markdown)
    print(f"wrote {a.study}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
