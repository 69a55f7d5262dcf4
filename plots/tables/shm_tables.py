"""The shared-memory algorithm's figures and their targets: ``shm`` against ``limit`` and MPI's own call.

:func:`figures` reads the rows of :mod:`experiments.bench.collectives` sweeps that hold ``shm``,
``shm-persistent``, ``limit`` and ``MPI_Allreduce`` (any subset; a figure whose rows are missing is
left out), each figure the median and range over the sweep's passes of one ratio of two rows' times
measured in the same pass; :func:`markdown` tabulates them beside their targets
(:data:`TARGETS`, those of ``docs/guide/shm.md``):

* all-reduce at each size from 256 KiB: ``shm`` / ``limit`` and ``shm-persistent`` / ``limit``
  (times), and ``shm``'s busbw / ``MPI_Allreduce``'s (the inverse ratio of times), with the
  busbw ratio's geometric mean over 256 KiB-16 MiB;
* all-reduce at each size up to 4 KiB: ``shm-persistent`` / ``MPI_Allreduce`` (times);
* reduce-scatter and all-gather at each size from 1 MiB: ``shm`` / ``limit`` (times).
"""
import math
import statistics

from tabulate import tabulate

__all__ = ["figures", "verdict", "markdown", "breakdown_markdown", "size_text", "TARGETS"]

#: Each figure's target: (bound, True when the figure must stay at or below it).
TARGETS = {"allreduce shm / limit": (2.0, True), "allreduce shm-persistent / limit": (1.5, True),
           "allreduce shm busbw / MPI_Allreduce busbw": (1.8, False),
           "allreduce shm busbw / MPI_Allreduce busbw, geomean 256 KiB-16 MiB": (1.8, False),
           "allreduce shm-persistent / MPI_Allreduce": (1.0, True),
           "reduce_scatter shm / limit": (1.5, True), "allgather shm / limit": (1.5, True)}

_KIB, _MIB = 1024, 1024 * 1024


def _passes(row):
    """Return the row's time of every pass (microseconds)."""
    return [float(t) for t in row.get("time_repeats_us") or [row["time_us"]]]


def _ratio(a, b, invert=False):
    """Return (median, min, max) over passes of a/b (b/a with ``invert``), passes paired by index."""
    pa, pb = _passes(a), _passes(b)
    rs = [(y / x if invert else x / y) for x, y in zip(pa, pb) if x > 0 and y > 0]
    return (statistics.median(rs), min(rs), max(rs)) if rs else None


def figures(rows):
    """Return the figures of the rows of sweeps, as dicts: figure, P, bytes, median, min, max.

    Examples
    --------
    >>> rows = [{"collective": "allreduce", "algorithm": a, "P": 2, "bytes": 1 << 20, "time_us": t, "time_repeats_us": [t, t]}
    ...         for a, t in (("shm", 300.0), ("limit", 200.0), ("MPI_Allreduce", 600.0))]
    >>> for f in figures(rows):
    ...     print(f["figure"], f["median"])
    allreduce shm / limit 1.5
    allreduce shm busbw / MPI_Allreduce busbw 2.0
    allreduce shm busbw / MPI_Allreduce busbw, geomean 256 KiB-16 MiB 2.0
    """
    at = {(r["collective"], r["algorithm"], r["P"], r["bytes"]): r for r in rows}
    out = []

    def add(name, op, alg, ref, P, n, invert=False):
        a, b = at.get((op, alg, P, n)), at.get((op, ref, P, n))
        got = _ratio(a, b, invert) if a and b else None
        if got:
            out.append({"figure": name, "P": P, "bytes": n, "median": got[0], "min": got[1], "max": got[2]})

    for P, n in sorted({(r["P"], r["bytes"]) for r in rows}):
        if n >= 256 * _KIB:
            add("allreduce shm / limit", "allreduce", "shm", "limit", P, n)
            add("allreduce shm-persistent / limit", "allreduce", "shm-persistent", "limit", P, n)
            add("allreduce shm busbw / MPI_Allreduce busbw", "allreduce", "shm", "MPI_Allreduce", P, n, invert=True)
        if n <= 4 * _KIB:
            add("allreduce shm-persistent / MPI_Allreduce", "allreduce", "shm-persistent", "MPI_Allreduce", P, n)
        if n >= _MIB:
            add("reduce_scatter shm / limit", "reduce_scatter", "shm", "limit", P, n)
            add("allgather shm / limit", "allgather", "shm", "limit", P, n)
    for P in sorted({f["P"] for f in out}):
        busbw = [f["median"] for f in out if f["P"] == P and f["figure"].startswith("allreduce shm busbw")
                 and 256 * _KIB <= f["bytes"] <= 16 * _MIB]
        if busbw:
            g = math.exp(sum(math.log(v) for v in busbw) / len(busbw))
            out.append({"figure": "allreduce shm busbw / MPI_Allreduce busbw, geomean 256 KiB-16 MiB", "P": P,
                        "bytes": None, "median": g, "min": None, "max": None})
    return out


def size_text(n):
    """Return ``n`` bytes as the sweeps print it: ``4 MiB``, ``256 KiB``, ``8 B``; ``-`` for None."""
    if n is None:
        return "-"
    return f"{n // _MIB} MiB" if n >= _MIB else f"{n // _KIB} KiB" if n >= _KIB else f"{n} B"


def verdict(fig):
    """Return a figure's target as text and whether its median meets it.

    Examples
    --------
    >>> verdict({"figure": "allreduce shm / limit", "median": 2.4})
    ('<= 2.0', False)
    """
    bound, at_most = TARGETS[fig["figure"]]
    return f"{'<=' if at_most else '>='} {bound}", fig["median"] <= bound if at_most else fig["median"] >= bound


def markdown(figs):
    """Return the figures as a Markdown table: figure, P, size, median (range), target, met.

    Examples
    --------
    >>> print(markdown([{"figure": "allreduce shm / limit", "P": 2, "bytes": 1 << 20, "median": 1.5, "min": 1.4,
    ...                  "max": 1.6}]).splitlines()[2])
    | allreduce shm / limit |   2 | 1 MiB  | 1.50 (1.40-1.60) | <= 2.0   | yes   |
    """
    cells = []
    for f in figs:
        spread = "" if f["min"] is None else f" ({f['min']:.2f}-{f['max']:.2f})"
        target, met = verdict(f)
        cells.append([f["figure"], f["P"], size_text(f["bytes"]), f"{f['median']:.2f}{spread}", target,
                      "yes" if met else "no"])
    return tabulate(cells, ["figure", "P", "size", "median (range)", "target", "met"], tablefmt="pipe",
                    disable_numparse=True, colalign=("left", "right", "left", "right", "left", "left"))


def breakdown_markdown(record):
    """Return :mod:`experiments.bench.shm_breakdown`'s record as a Markdown table: one row per step of a
    call, one column per size, rank 0's microseconds per call, median (range) over the passes.

    Examples
    --------
    >>> rec = {"sizes": {"262144": {"call": [182.0, 175.0, 212.6], "limit": [27.2, 25.7, 31.0]}}}
    >>> print(breakdown_markdown(rec).splitlines()[2])
    | call                 | 182.0 (175.0-212.6) |
    """
    sizes = sorted(record["sizes"], key=int)
    rows = list(dict.fromkeys(row for n in sizes for row in record["sizes"][n]))
    cells = [[row] + [("%.1f (%.1f-%.1f)" % tuple(record["sizes"][n][row])) if row in record["sizes"][n] else "-"
                      for n in sizes] for row in rows]
    return tabulate(cells, ["step (us per call)"] + [size_text(int(n)) for n in sizes], tablefmt="pipe",
                    disable_numparse=True, colalign=("left", *["right"] * len(sizes)))
