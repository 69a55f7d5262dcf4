"""Writing a collectives sweep: the printed table, the results dict, and PREFIX.json / PREFIX.csv.

A sweep makes several passes (``--repeats``); :func:`combine` turns them into one row per (op, size,
algorithm) holding the median pass's times, every pass's time (``time_repeats_us``), their spread
(max / min - 1) and an ``unstable`` flag above :data:`UNSTABLE`. The ratio summary is computed for
every pass and reported as median, min and max (``summary_repeats``), so that each figure carries its
range. The JSON carries the configuration, the MPI library version, P, host, date, the machine's load
average and the summaries; the CSV one row per (op, size, algorithm) in :data:`COLUMNS` order.
"""
import csv
import dataclasses
import datetime
import json
import os
import os
import platform
import statistics
import sys

import numpy as np
from mpi4py import MPI

from collectives.backend import mpi_library
from plots.bench import summarize

__all__ = ["COLUMNS", "HEAD", "UNSTABLE", "line", "library", "combine", "repeat_summary", "header", "write"]

#: Row fields, in CSV column order (times in microseconds, bandwidths in GB/s = 1e9 bytes/s).
COLUMNS = ("op", "bytes", "count", "type", "redop", "algorithm", "resolved", "P", "iters", "time_us",
           "time_min_us", "time_mean_us", "time_median_us", "algbw_GBps", "busbw_GBps", "wrong", "time_s",
           "passes", "spread", "unstable")

#: Relative spread (max / min - 1) of a row's passes above which it is flagged unstable.
UNSTABLE = 0.20

#: Table heading printed above the rows.
HEAD = (f"{'op':>14} {'size(B)':>10} {'count':>10} {'type':>8} {'redop':>5} {'algorithm':>19} {'time(us)':>10} "
         f"{'min(us)':>10} {'mean(us)':>10} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>6}")


def line(w):
    """Return one table line (nccl-tests columns) for result row ``w``."""
    alg = w["algorithm"] if w["resolved"] == w["algorithm"] else f"{w['algorithm']}->{w['resolved']}"
    return (f"{w['op']:>14} {w['bytes']:>10} {w['count']:>10} {w['type']:>8} {w['redop']:>5} {alg:>19} "
            f"{w['time_us']:>10.2f} {w['time_min_us']:>10.2f} {w['time_mean_us']:>10.2f} {w['algbw_GBps']:>11.3f} "
            f"{w['busbw_GBps']:>11.3f} {w['wrong']:>6}")


def library():
    """Return the MPI library version on one line, spaces collapsed."""
    return mpi_library()


def combine(passes):
    """Return one row per (op, bytes, algorithm) from the rows of several passes of a sweep.

    Times are the medians over the passes, bandwidths those of the median time; ``time_repeats_us`` lists every pass's
    time (slowest rank's mean), ``spread`` is their max / min - 1, ``unstable`` is spread >
    :data:`UNSTABLE`, ``wrong`` the most any pass counted.
    """
    groups = {}
    for rows in passes:
        for r in rows:
            groups.setdefault((r["op"], r["bytes"], r["algorithm"]), []).append(r)
    out = []
    for group in groups.values():
        row = {k: v for k, v in group[0].items() if k != "pass"}
        for k in ("time_us", "time_min_us", "time_mean_us", "time_median_us", "time_s"):
            row[k] = float(statistics.median(r[k] for r in group))
        factor = group[0]["busbw_GBps"] / group[0]["algbw_GBps"] if group[0]["algbw_GBps"] else 0.0
        row["algbw_GBps"] = row["bytes"] / row["time_s"] / 1e9 if row["time_s"] > 0 else 0.0
        row["busbw_GBps"] = row["algbw_GBps"] * factor
        reps = [float(r["time_us"]) for r in group]
        row["time_repeats_us"] = reps
        row["passes"] = len(reps)
        row["spread"] = max(reps) / min(reps) - 1 if min(reps) > 0 else 0.0
        row["unstable"] = bool(row["spread"] > UNSTABLE)
        row["wrong"] = max(r["wrong"] for r in group)
        out.append(row)
    return out


def repeat_summary(passes, stat="mean"):
    """Return ``{figure: {"median", "min", "max", "passes"}}`` of :func:`summarize`'s aggregates over passes."""
    per = [summarize(rows, stat)["aggregates"] for rows in passes if rows]
    out = {}
    for key in (per[0] if per else {}):
        vals = [a[key] for a in per if a.get(key) is not None]
        if vals:
            out[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "passes": len(vals)}
    return out


def header(cfg, comm, complete, passes):
    """Return the results dict: configuration, MPI library, P, host, date, load, rows and summaries.

    ``passes`` is the list of each pass's rows (a single list of rows counts as one pass).
    """
    if passes and isinstance(passes[0], dict):
        passes = [passes]
    rows = combine(passes)
    return {"benchmark": "experiments.bench_collectives", "config": dataclasses.asdict(cfg),
            "P": comm.Get_size(), "mpi_library": library(),
            "mpi_standard": "%d.%d" % MPI.Get_version(), "mpi4py": sys.modules["mpi4py"].__version__,
            "numpy": np.__version__, "python": platform.python_version(), "host": platform.node(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "load_average": list(os.getloadavg()), "cpus": os.cpu_count(),
            "complete": complete, "rows": rows, "summary": summarize(rows),
            "summary_median": summarize(rows, "median"), "summary_repeats": repeat_summary(passes)}


def _round(v):
    """Return floats (and lists of them) to 6 significant digits."""
    if isinstance(v, list):
        return [_round(u) for u in v]
    return float(f"{v:.6g}") if isinstance(v, float) else v


def write(cfg, results):
    """Write PREFIX.json (one row a line, floats to 6 significant digits) and PREFIX.csv."""
    os.makedirs(os.path.dirname(os.path.abspath(cfg.out)), exist_ok=True)
    rows = [{k: _round(v) for k, v in r.items()} for r in results["rows"]]
    head = json.dumps({k: v for k, v in results.items() if k != "rows"}, indent=1)
    with open(cfg.out + ".json", "w", encoding="utf-8") as f:
        f.write(head[:-2] + ',\n "rows": [\n  ' + ",\n  ".join(map(json.dumps, rows)) + "\n ]\n}\n")
    with open(cfg.out + ".csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
