"""The shared-memory algorithm's figures from collectives sweeps: ``shm`` against ``limit`` and MPI's own call.

    python -m experiments.bench.shm_targets results/bench_shm_p2.json [MORE.json ...] [--out FILE.json]

Reads sweeps of :mod:`experiments.bench.collectives` that hold the rows ``shm``, ``shm-persistent``,
``limit`` and ``MPI_Allreduce`` (any subset; a figure whose rows are missing is left out) and prints,
for each P, one line per figure with its median and range over the sweep's passes (each pass's
ratio of the two rows' times, both measured in that pass):

* all-reduce at each size from 256 KiB: ``shm`` / ``limit`` and ``shm-persistent`` / ``limit``
  (times), and ``shm``'s busbw / ``MPI_Allreduce``'s (the inverse ratio of times), with the
  busbw ratio's geometric mean over 256 KiB-16 MiB;
* all-reduce at each size up to 4 KiB: ``shm-persistent`` / ``MPI_Allreduce`` (times);
* reduce-scatter and all-gather at each size from 1 MiB: ``shm`` / ``limit`` (times).

Columns: figure, P, size, median, min, max (ratios); ``--out`` writes the same as JSON.
"""
import json
import math
import statistics
from training.settings.options import Parser, infile, outpath

__all__ = ["figures", "main"]

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


def _size(n):
    if n is None:
        return "-"
    return f"{n // _MIB} MiB" if n >= _MIB else f"{n // _KIB} KiB" if n >= _KIB else f"{n} B"


def main(argv=None):
    """Print (and with ``--out`` write) the figures of the sweeps named on the command line."""
    p = Parser(prog="python -m experiments.bench.shm_targets", description=__doc__.split("\n")[0])
    p.add_argument("sweeps", type=infile(), nargs="+", help="JSON files of experiments.bench.collectives")
    p.add_argument("--out", type=outpath(empty=True), help="write the figures to this JSON file")
    a = p.parse_args(argv)
    rows = []
    for path in a.sweeps:
        with open(path, encoding="utf-8") as f:
            rows += json.load(f)["rows"]
    got = figures(rows)
    print(f"{'figure':<66} {'P':>2} {'size':>8} {'median':>7} {'min':>7} {'max':>7}")
    for f in got:
        lo = "-" if f["min"] is None else f"{f['min']:.2f}"
        hi = "-" if f["max"] is None else f"{f['max']:.2f}"
        print(f"{f['figure']:<66} {f['P']:>2} {_size(f['bytes']):>8} {f['median']:>7.2f} {lo:>7} {hi:>7}")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump({"sources": a.sweeps, "figures": got}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
