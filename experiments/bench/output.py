"""Writing a collectives sweep: the printed table, the results dict, and PREFIX.json / PREFIX.csv.

A sweep makes several passes (``--repeats``); :func:`combine` turns them into one row per (collective, size,
algorithm) holding the median pass's times, every pass's time (``time_repeats_us``), their spread
(max / min - 1) and an ``unstable`` flag above :data:`UNSTABLE`. The ratio summary is computed for
every pass and reported as median, min and max (``summary_repeats``), so that each figure carries its
range. The JSON carries the configuration, the MPI library version, P, host, date, the machine's load
average and the summaries; the CSV one row per (collective, size, algorithm) in :data:`COLUMNS` order.
"""
import csv
import dataclasses
import datetime
import json
import os
import platform
import statistics
import sys

import numpy as np
from mpi4py import MPI

import collectives
import collectives.schedules.registry
from commlab.provenance import mpi_library
from plots.bench import check_stat, markdown, row_seconds

__all__ = ["COLUMNS", "HEAD", "UNSTABLE", "bus_factor", "line", "library", "nccl_tests", "report", "summarize",
           "combine", "repeat_summary", "header", "write"]

# the hand-made algorithms: every registered name but the library's own and the selector
_HAND_MADE = tuple(a for a in collectives.ALGORITHMS if a not in ("mpi", "auto"))
_KIB, _MIB = 1 << 10, 1 << 20

#: Row fields, in CSV column order (times in microseconds, bandwidths in GB/s = 1e9 bytes/s).
COLUMNS = ("collective", "bytes", "count", "type", "redop", "algorithm", "resolved", "P", "iters", "time_us",
           "time_min_us", "time_mean_us", "time_median_us", "algbw_GBps", "busbw_GBps", "wrong", "time_s",
           "passes", "spread", "unstable", "inplace_time_us", "inplace_time_mean_us", "inplace_wrong")

#: Relative spread (max / min - 1) of a row's passes above which it is flagged unstable.
UNSTABLE = 0.20

#: Table heading printed above the rows.
HEAD = (f"{'collective':>14} {'size(B)':>10} {'count':>10} {'type':>8} {'redop':>5} {'algorithm':>19} {'time(us)':>10} "
         f"{'min(us)':>10} {'mean(us)':>10} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>6}")


def bus_factor(op, P):
    """Return nccl-tests' busbw / algbw factor of ``op`` on ``P`` ranks.

    2(P-1)/P for all-reduce, (P-1)/P for reduce-scatter and all-gather, 1 for broadcast: the
    fraction of the vector that crosses the busiest link of a bandwidth-optimal algorithm.
    """
    return {"allreduce": 2 * (P - 1) / P, "reduce_scatter": (P - 1) / P, "allgather": (P - 1) / P}.get(op, 1.0)


def line(w):
    """Return one table line (nccl-tests columns) for result row ``w``."""
    alg = w["algorithm"] if w["resolved"] == w["algorithm"] else f"{w['algorithm']}->{w['resolved']}"
    return (f"{w['collective']:>14} {w['bytes']:>10} {w['count']:>10} {w['type']:>8} {w['redop']:>5} {alg:>19} "
            f"{w['time_us']:>10.2f} {w['time_min_us']:>10.2f} {w['time_mean_us']:>10.2f} {w['algbw_GBps']:>11.3f} "
            f"{w['busbw_GBps']:>11.3f} {w['wrong']:>6}")


#: nccl-tests' names: of the collectives (its binaries, ``all_reduce_perf``...) and of the dtypes (``-d``).
_NCCL_OPS = {"allreduce": "all_reduce", "reduce_scatter": "reduce_scatter", "allgather": "all_gather",
             "broadcast": "broadcast"}
_NCCL_TYPES = {"float16": "half", "float32": "float", "float64": "double"}


def _nccl_time(us):
    """Format a time in microseconds as nccl-tests does: 2 decimals below 100, 1 below 10^4, else none."""
    return f"{us:7.0f}" if us >= 1e4 else f"{us:7.1f}" if us >= 100 else f"{us:7.2f}"


def _nccl_bw(v):
    """Format a bandwidth (GB/s) in 6 characters as nccl-tests does: fewer decimals as it grows."""
    digits = len(str(int(v))) if v >= 1 else 0
    return f"{v:6.2f}" if digits < 4 else f"{v:6.1f}" if digits < 5 else f"{v:6.0f}" if digits < 7 else f"{v:6.1e}"


def _nccl_group(nbytes, factor, time_us, wrong):
    """Return one group of columns (time, algbw, busbw, #wrong) and its busbw, or N/A and None."""
    if time_us is None:
        return f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>6}", None
    algbw = nbytes / time_us / 1e3 if time_us > 0 else 0.0  # bytes / us = MB/s; / 1e3 = GB/s
    return f"  {_nccl_time(time_us)}  {_nccl_bw(algbw)}  {_nccl_bw(algbw * factor)}  {wrong:>6}", algbw * factor


def nccl_tests(results):
    """Return a sweep's rows as nccl-tests prints them: one table per (op, algorithm).

    nccl-tests' conventions (``all_reduce_perf`` and its siblings, ``doc/PERFORMANCE.md``): size in
    bytes (the whole vector: all-gather's output, reduce-scatter's input); count in elements of the
    collective's own argument (per rank for all-gather and reduce-scatter: size / P elements; the
    smallest rank's where commlab's uneven reduce-scatter chunks differ); type in nccl-tests' names
    (``float``, ``half``, ``double``); redop (``none`` for all-gather and broadcast); root (-1, 0 for
    broadcast); then for the out-of-place and the in-place call: time, the mean over ranks of each
    rank's mean time per call (us), algbw = size / time and busbw = algbw x :func:`bus_factor`
    (GB/s), and #wrong (elements differing from MPI's own collective, summed over ranks). A group
    that commlab has no call for reads N/A: in-place for reduce-scatter, all-gather and the reference
    loops (or when the sweep ran without ``--format nccl-tests``), out-of-place for broadcast, which
    commlab (like MPI) only has in place. Each table ends with ``# Avg bus bandwidth``, the mean busbw
    over its measured groups, as nccl-tests computes it.

    Unlike nccl-tests, which times back-to-back calls, each call here is timed on its own after a
    barrier (OSU), and the rows hold the median of the sweep's passes.

    Parameters
    ----------
    results : dict
        As returned by ``experiments.bench.collectives.run_sweep`` (``P``, ``mpi_library``, ``rows``).

    Returns
    -------
    str
    """
    P, blocks = results["P"], {}
    for r in results["rows"]:
        blocks.setdefault((r["collective"], r["algorithm"]), []).append(r)
    out = []
    for (op, alg), rows in blocks.items():
        resolved = {r["resolved"] for r in rows} - {alg}
        out += [f"# {_NCCL_OPS[op]}: commlab algorithm {alg}" + (f" (-> {', '.join(sorted(resolved))})" if resolved
                                                                  else "") + f", P = {P}, {results['mpi_library']}",
                "#", f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}  {'out-of-place':^31}  "
                     f"{'in-place':^31}".rstrip(),
                f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}"
                + f"  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}" * 2,
                (f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}"
                 + f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}" * 2).rstrip()]
        bus = []
        for r in sorted(rows, key=lambda r: r["bytes"]):
            factor = bus_factor(op, P)
            own = (None, None) if op == "broadcast" else (r["time_mean_us"], r["wrong"])
            inplace = (r["time_mean_us"], r["wrong"]) if op == "broadcast" else \
                (r.get("inplace_time_mean_us"), r.get("inplace_wrong"))
            count = r["count"] // P if op in ("allgather", "reduce_scatter") else r["count"]
            text, busbw = zip(*(_nccl_group(r["bytes"], factor, *g) for g in (own, inplace)))
            bus += [b for b in busbw if b is not None]
            out.append(f"{r['bytes']:>12}  {count:>12}  {_NCCL_TYPES.get(r['type'], r['type']):>8}  {r['redop']:>6}  "
                       f"{0 if op == 'broadcast' else -1:>6}" + "".join(text))
        out += [f"# {'Avg bus bandwidth':<20} : {statistics.fmean(bus) if bus else 0.0:g}", "#"]
    return "\n".join(out)


def report(cfg, results):
    """Print the end of a sweep (rank 0): the Markdown summary or nccl-tests' tables, the unstable rows, the files."""
    nccl = cfg.format == "nccl-tests"
    print("\n" + (nccl_tests(results) if nccl else markdown(results)), flush=True)
    shaky = [f"{r['collective']} {r['algorithm']} {r['bytes']} B ({r['spread']:.0%})" for r in results["rows"] if r["unstable"]]
    load = f" (load average {results['load_average'][0]:.1f} on {results['cpus']} CPUs)"
    if cfg.repeats < 2:
        print(("# " if nccl else "") + "stability not checked: one pass of the sweep (--repeats 3 compares passes)"
              + load, flush=True)
    else:
        print(("# " if nccl else "") + f"{len(shaky)} of {len(results['rows'])} rows whose passes differ by more than "
              f"{UNSTABLE:.0%}" + (": " + "; ".join(shaky[:12]) + ("; ..." if len(shaky) > 12 else "") if shaky else "")
              + load, flush=True)
    print(("# " if nccl else "") + f"wrote {cfg.out}.csv and {cfg.out}.json", flush=True)


def library():
    """Return the MPI library version on one line, spaces collapsed."""
    return mpi_library()


def _geomean(values):
    """Return ``statistics.geometric_mean`` of the positive ``values`` (ratios), None when there is none."""
    values = [v for v in values if v and v > 0]
    return statistics.geometric_mean(values) if values else None


def summarize(rows, stat="mean"):
    """Return the ratios of a sweep against ``mpi`` and of the executor against hand-written loops.

    Parameters
    ----------
    rows : list of dict
        Result rows (``op``, ``algorithm``, ``bytes``, ``time_s``, ``time_median_us``, ``wrong``);
        rows with wrong results are left out.
    stat : {"mean", "median"}
        Which time to compare: the slowest rank's mean (``time_s``, nccl-tests' time) or median.

    Returns
    -------
    dict
        ``sizes``: one dict per size with, where measured: ``allreduce_best`` (fastest hand-made
        all-reduce) and ``allreduce_best_vs_mpi`` (its busbw / mpi's busbw = mpi time / its time);
        ``reduce_scatter_vs_mpi`` and ``allgather_vs_mpi`` (fastest hand-made time / mpi time) and
        ``..._vs_raw`` (the same over MPI's own call made directly, ``MPI_Reduce_scatter`` /
        ``MPI_Allgather``); ``mpi_vs_raw`` (commlab's ``mpi`` all-reduce / ``MPI_Allreduce``);
        ``auto_vs_mpi`` (all-reduce ``auto`` time / mpi time); ``ring_vs_direct`` and
        ``execute_vs_direct`` (``ring`` through the API, and ``ring-execute``, over ``ring-direct``).
        ``aggregates``: geometric means and extremes of those over the size ranges of the targets
        (64 KiB-64 MiB for busbw, 8 B-4 KiB for ``auto``, all sizes otherwise).

    Raises
    ------
    ValueError
        Unknown ``stat``, or ``"median"`` for rows without median times.
    """
    check_stat(rows, stat)
    t = {(r["collective"], r["algorithm"], r["bytes"]): row_seconds(r, stat) for r in rows
         if not r.get("wrong") and row_seconds(r, stat) > 0}
    sizes = [e for e in (_size_ratios(t, n) for n in sorted({r["bytes"] for r in rows})) if len(e) > 1]
    return {"sizes": sizes, "aggregates": _aggregates(sizes)}


def _fastest(t, n):
    """Return the fastest hand-made all-reduce at ``n`` bytes in times ``t`` (None when none was measured)."""
    return min((a for a in _HAND_MADE if ("allreduce", a, n) in t), key=lambda a: t[("allreduce", a, n)], default=None)


def _size_ratios(t, n):
    """Return the ratios of one size: ``t`` maps (op, algorithm, bytes) to seconds."""
    e = {"bytes": n}
    _against_mpi(e, t, n)
    _against_raw(e, t, n)
    _against_loops(e, t, n)
    return e


def _against_mpi(e, t, n):
    """Fill the ratios to commlab's ``mpi`` algorithm: best all-reduce, ``auto``, reduce-scatter, all-gather."""
    mpi, best = t.get(("allreduce", "mpi", n)), _fastest(t, n)
    if mpi and best:
        e["allreduce_best"], e["allreduce_best_vs_mpi"] = best, mpi / t[("allreduce", best, n)]
    if mpi and ("allreduce", "auto", n) in t:
        e["auto_vs_mpi"] = t[("allreduce", "auto", n)] / mpi
    if mpi and ("allreduce", "MPI_Allreduce", n) in t:
        e["mpi_vs_raw"] = mpi / t[("allreduce", "MPI_Allreduce", n)]
    for op, raw in (("reduce_scatter", "MPI_Reduce_scatter"), ("allgather", "MPI_Allgather")):
        own = [t[(op, a, n)] for a in collectives.schedules.registry.OP_ALGORITHMS[op] if a not in ("mpi", "auto") and (op, a, n) in t]
        for key, base in ((f"{op}_vs_mpi", "mpi"), (f"{op}_vs_raw", raw)):
            if own and (op, base, n) in t:
                e[key] = min(own) / t[(op, base, n)]


def _against_raw(e, t, n):
    """Fill the ratios to MPI's own calls made directly, and of a deadline's cost."""
    raw = t.get(("allreduce", "MPI_Allreduce", n))
    for key, alg in (("auto_vs_raw", "auto"), ("persistent_vs_raw", "persistent"),
                     ("mpi_init_vs_raw", "MPI_Allreduce_init")):
        if raw and ("allreduce", alg, n) in t:
            e[key] = t[("allreduce", alg, n)] / raw
    nonblocking = t.get(("allreduce", "MPI_Iallreduce", n))
    if nonblocking and ("allreduce", "auto", n) in t:
        e["auto_vs_iraw"] = t[("allreduce", "auto", n)] / nonblocking
    if raw and nonblocking:
        e["iraw_vs_raw"] = nonblocking / raw
    for op, base in (("reduce_scatter", "MPI_Ireduce_scatter_block"), ("allgather", "MPI_Iallgather")):
        if (op, "auto", n) in t and (op, base, n) in t:
            e[f"{op}_auto_vs_iraw"] = t[(op, "auto", n)] / t[(op, base, n)]
    if ("allreduce", "auto", n) in t and ("allreduce", "auto-timeout", n) in t:
        e["timeout_vs_auto"] = t[("allreduce", "auto-timeout", n)] / t[("allreduce", "auto", n)]
    for op, base in (("reduce_scatter", "MPI_Reduce_scatter"), ("allgather", "MPI_Allgather")):
        if (op, "auto", n) in t and (op, base, n) in t:
            e[f"{op}_auto_vs_raw"] = t[(op, "auto", n)] / t[(op, base, n)]


def _against_loops(e, t, n):
    """Fill the ratios to the hand-written loops: the memory limit, ``ring-direct``."""
    limit, best = t.get(("allreduce", "limit", n)), e.get("allreduce_best") or _fastest(t, n)
    if limit and best:
        e["best_vs_limit"] = t[("allreduce", best, n)] / limit
    direct = t.get(("allreduce", "ring-direct", n))
    for key, alg in (("ring_vs_direct", "ring"), ("execute_vs_direct", "ring-execute")):
        if direct and ("allreduce", alg, n) in t:
            e[key] = t[("allreduce", alg, n)] / direct


def _aggregates(sizes):
    """Return the geometric means and extremes of the per-size ratios over the targets' size ranges."""
    def pick(key, lo=0, hi=float("inf")):
        return [e[key] for e in sizes if key in e and lo <= e["bytes"] <= hi]

    big = pick("allreduce_best_vs_mpi", 64 * _KIB, 64 * _MIB)
    agg = {"allreduce_best_vs_mpi_geomean_64K_64M": _geomean(big),
           "allreduce_best_vs_mpi_min_64K_64M": min(big, default=None),
           "auto_vs_mpi_max_8_4K": max(pick("auto_vs_mpi", 8, 4 * _KIB), default=None),
           "auto_vs_mpi_geomean_8_4K": _geomean(pick("auto_vs_mpi", 8, 4 * _KIB))}
    for key in ("reduce_scatter_vs_mpi", "reduce_scatter_vs_raw", "allgather_vs_mpi", "allgather_vs_raw",
                "ring_vs_direct", "execute_vs_direct", "mpi_vs_raw", "reduce_scatter_auto_vs_raw",
                "allgather_auto_vs_raw"):
        agg[f"{key}_geomean"], agg[f"{key}_max"] = _geomean(pick(key)), max(pick(key), default=None)
    for key in ("auto_vs_raw", "persistent_vs_raw", "mpi_init_vs_raw", "mpi_vs_raw", "auto_vs_iraw", "iraw_vs_raw",
                "reduce_scatter_auto_vs_iraw", "allgather_auto_vs_iraw"):
        agg[f"{key}_geomean_8_4K"] = _geomean(pick(key, 8, 4 * _KIB))
        agg[f"{key}_max_8_4K"] = max(pick(key, 8, 4 * _KIB), default=None)
    for key in ("reduce_scatter_auto_vs_raw", "allgather_auto_vs_raw", "mpi_vs_raw", "best_vs_limit"):
        agg[f"{key}_max_1M_up"] = max(pick(key, _MIB), default=None)
    agg["best_vs_limit_geomean_1M_up"] = _geomean(pick("best_vs_limit", _MIB))
    agg["timeout_vs_auto_8"] = (pick("timeout_vs_auto", 8, 8) or [None])[0]
    agg["timeout_vs_auto_4M"] = (pick("timeout_vs_auto", 4 * _MIB, 4 * _MIB) or [None])[0]
    agg["timeout_vs_auto_max"] = max(pick("timeout_vs_auto"), default=None)
    return agg


def combine(passes):
    """Return one row per (collective, bytes, algorithm) from the rows of several passes of a sweep.

    Times (in-place ones too, when measured, with ``inplace_time_repeats_us``) are the medians over the
    passes, bandwidths those of the median time; ``time_repeats_us`` lists every pass's
    time (slowest rank's mean), ``spread`` is their max / min - 1, ``unstable`` is spread >
    :data:`UNSTABLE`, ``wrong`` the most any pass counted, ``wrong_at`` every pass's wrong ranks
    (rank, first wrong element, expected, got).
    """
    groups = {}
    for rows in passes:
        for r in rows:
            groups.setdefault((r["collective"], r["bytes"], r["algorithm"]), []).append(r)
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
        at = [w for r in group for w in r.get("wrong_at", ())]  # where each pass found it wrong
        if at:
            row["wrong_at"] = at
        if "inplace_time_us" in row:  # measured with --format nccl-tests
            for k in ("inplace_time_us", "inplace_time_mean_us"):
                row[k] = float(statistics.median(r[k] for r in group))
            row["inplace_time_repeats_us"] = [float(r["inplace_time_us"]) for r in group]
            row["inplace_wrong"] = max(r["inplace_wrong"] for r in group)
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
    return {"benchmark": "experiments.bench.collectives", "config": dataclasses.asdict(cfg),
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
