"""Writing a collectives sweep: the printed table, the results dict, and PREFIX.json / PREFIX.csv.

The JSON carries the configuration, the MPI library version, P, host, date and the ratio summaries;
the CSV one row per (op, size, algorithm) in :data:`COLUMNS` order.
"""
import csv
import dataclasses
import datetime
import json
import os
import platform
import sys

import numpy as np
from mpi4py import MPI

from collectives.backend import mpi_library
from plots.bench import summarize

__all__ = ["COLUMNS", "HEAD", "line", "library", "header", "write"]

#: Row fields, in CSV column order (times in microseconds, bandwidths in GB/s = 1e9 bytes/s).
COLUMNS = ("op", "bytes", "count", "type", "redop", "algorithm", "resolved", "P", "iters", "time_us",
           "time_min_us", "time_mean_us", "time_median_us", "algbw_GBps", "busbw_GBps", "wrong", "time_s")

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


def header(cfg, comm, complete, rows):
    """Return the results dict: configuration, MPI library, P, host, date, rows and summaries."""
    return {"benchmark": "experiments.bench_collectives", "config": dataclasses.asdict(cfg),
            "P": comm.Get_size(), "mpi_library": library(),
            "mpi_standard": "%d.%d" % MPI.Get_version(), "mpi4py": sys.modules["mpi4py"].__version__,
            "numpy": np.__version__, "python": platform.python_version(), "host": platform.node(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "complete": complete, "rows": rows, "summary": summarize(rows),
            "summary_median": summarize(rows, "median")}


def write(cfg, results):
    """Write PREFIX.json (one row a line, floats to 6 significant digits) and PREFIX.csv."""
    os.makedirs(os.path.dirname(os.path.abspath(cfg.out)), exist_ok=True)
    rows = [{k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in r.items()} for r in results["rows"]]
    head = json.dumps({k: v for k, v in results.items() if k != "rows"}, indent=1)
    with open(cfg.out + ".json", "w", encoding="utf-8") as f:
        f.write(head[:-2] + ',\n "rows": [\n  ' + ",\n  ".join(map(json.dumps, rows)) + "\n ]\n}\n")
    with open(cfg.out + ".csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
