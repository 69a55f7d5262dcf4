"""Turn collectives sweeps into the decision table that ``algorithm="auto"`` reads.

    python -m experiments.bench.tune results/bench_p2.json results/bench_p4.json --out results/tuning.json
    COMMLAB_TUNING=tuning.json mpiexec -n 4 python -m experiments.demo    (or collectives.model.auto.load_table)

For each communicator size P in the sweeps (files of ``experiments.bench.collectives``) and each
measured all-reduce size, the winner is the algorithm with the lowest time among commlab's hand-made
ones and, up to ``--library-max-bytes`` (default 8 KiB, the messages whose repeated calls take the
cached path of :mod:`collectives.library.plans`), ``mpi``: where the library's own call is fastest,
``auto`` uses it. ``auto`` and the reference loops never win. When several files measured the same
P and size, the median of their times counts; rows with wrong results are ignored. Adjacent sizes with the same winner merge into one rule. As in
MPICH's JSON tuning files, rules are ranges: a rule covers messages up to the largest size it won
(``max_bytes``) and the last rule of each P has no upper limit. Sizes are counted the way ``auto``
counts them, in the accumulation dtype (float16 sweeps count 4 bytes an element). The table also
carries the alpha-beta-gamma parameters fitted to the sweeps' all-reduce rows of 64 KiB and more
(:func:`collectives.model.cost.fit`), which ``auto`` uses for the P the table lacks.
"""
import datetime
import json
import statistics

import numpy as np

import collectives
from collectives import backend
from training.settings.options import INT32_MAX, Parser, infile, integer, outpath, real

__all__ = ["HAND_MADE", "CHOICES", "LIBRARY_MAX_BYTES", "MODEL_MIN_BYTES", "build_table", "main"]

#: commlab's own all-reduce algorithms that a table may name (``shm`` is not among ``auto``'s candidates:
#: a table's (P, size) key does not say whether the ranks share one node).
HAND_MADE = tuple(a for a in collectives.ALGORITHMS if a not in ("mpi", "auto", "shm"))
#: Algorithms a tuned table may choose (``mpi`` only up to the library limit of :func:`build_table`).
CHOICES = HAND_MADE + ("mpi",)
#: Default largest message (bytes, accumulation dtype) for which ``mpi`` may win a range.
LIBRARY_MAX_BYTES = 8 << 10

#: Smallest all-reduce message (bytes) of the rows the table's cost model is fitted to.
MODEL_MIN_BYTES = 64 << 10


def build_table(results, tolerance=0.0, stat="mean", library_max_bytes=LIBRARY_MAX_BYTES):
    """Return the decision table of sweeps ``results``.

    Parameters
    ----------
    results : list of dict
        Results files of ``experiments.bench.collectives``, already parsed.
    tolerance : float
        Relative slack, >= 0: at a new size the previous rule's algorithm is kept while its time is
        within ``(1 + tolerance)`` of the winner's, so noise does not split ranges (0: strict).
    stat : {"mean", "median"}
        Time compared: the slowest rank's mean (``time_s``) or median (``time_median_us``).
    library_max_bytes : int
        Largest message (bytes, accumulation dtype) at which ``mpi`` competes (0: never).

    Returns
    -------
    dict
        ``{"allreduce": [{"size": P, "max_bytes": int or None, "algorithm": name, "min_bytes": int},
        ...], "model": {"alpha", "beta", "gamma"}, "sources": [...]}``, the format of
        :func:`collectives.model.auto.load_table`; rules are sorted by P, then size (``min_bytes``, the
        smallest size the rule won, is informational). ``model`` holds the alpha-beta-gamma
        parameters (seconds, seconds/byte) of :func:`collectives.model.cost.fit` on every all-reduce row
        of at least :data:`MODEL_MIN_BYTES`, which ``auto`` uses for P the table lacks; it is
        left out when there are too few such rows.

    Raises
    ------
    ValueError
        No hand-made all-reduce row with a correct result, a negative ``tolerance``, an unknown
        ``stat``, or rows without median times for ``stat="median"``.
    """
    if not tolerance >= 0:
        raise ValueError(f"tolerance={tolerance!r} must be >= 0")
    if stat not in ("mean", "median"):
        raise ValueError(f"stat={stat!r} must be 'mean' or 'median'")
    times = {}  # (P, bytes) -> {algorithm: [seconds, ...]}
    for res in results:
        for r in res.get("rows", []):
            if r["collective"] != "allreduce" or r["algorithm"] not in CHOICES or r["wrong"]:
                continue
            if stat == "median" and "time_median_us" not in r:
                raise ValueError("these sweeps have no median times: use the mean")
            seconds = r["time_s"] if stat == "mean" else r["time_median_us"] * 1e-6
            if seconds > 0:
                nbytes = r["count"] * backend.accumulation_dtype(np.dtype(r["type"])).itemsize
                if r["algorithm"] == "mpi" and nbytes > library_max_bytes:
                    continue
                times.setdefault((r["P"], nbytes), {}).setdefault(r["algorithm"], []).append(seconds)
    if not times:
        raise ValueError("no all-reduce rows of the algorithms auto may choose, with correct results, in the sweeps")
    rules = []
    for P in sorted({p for p, _ in times}):
        current = None
        for nbytes in sorted(n for p, n in times if p == P):
            med = {a: statistics.median(ts) for a, ts in times[(P, nbytes)].items()}
            best = min(med, key=med.get)
            if current is not None and current["algorithm"] in med and \
                    med[current["algorithm"]] <= (1 + tolerance) * med[best]:
                best = current["algorithm"]
            if current is not None and best == current["algorithm"]:
                current["max_bytes"] = nbytes
                continue
            current = {"size": P, "max_bytes": nbytes, "algorithm": best, "min_bytes": nbytes}
            rules.append(current)
        current["max_bytes"] = None if current["algorithm"] != "mpi" else current["max_bytes"]
        # (a last range won by mpi keeps its limit: above it the model picks a hand-made algorithm)
    model = _fit_model([r for res in results for r in res.get("rows", [])])
    sources = [{"P": res.get("P"), "date": res.get("date"), "host": res.get("host"),
                "mpi_library": res.get("mpi_library"), "dtype": res.get("config", {}).get("dtype")}
               for res in results]
    return {"allreduce": rules, **({"model": model} if model else {}), "tolerance": tolerance, "stat": stat,
            "sources": sources,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _fit_model(rows):
    """Return alpha, beta, gamma fitted to all-reduce rows of 64 KiB and more, or None if too few."""
    from collectives.model import cost

    try:
        params = cost.fit([r for r in rows if not r.get("wrong")], min_bytes=MODEL_MIN_BYTES)
    except ValueError:
        return None
    return {k: params[k] for k in ("alpha", "beta", "gamma")}


#: Row fields the table reads (``time_median_us`` only for ``--stat median``).
_ROW_KEYS = ("collective", "algorithm", "wrong", "P", "count", "bytes", "type", "time_s")


def _not_a_sweep(data):
    """Return why parsed JSON ``data`` is not a results file of bench_collectives, or None."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        return "not an experiments.bench.collectives results file (expected an object with a list of rows)"
    for i, r in enumerate(data["rows"]):
        missing = [k for k in _ROW_KEYS if k not in r] if isinstance(r, dict) else ["every field"]
        if missing:
            return f"not an experiments.bench.collectives results file (row {i} lacks {', '.join(missing)})"
        if bad := [k for k in ("P", "count", "bytes", "time_s")
                   if isinstance(r[k], bool) or not isinstance(r[k], (int, float))]:
            return f"not an experiments.bench.collectives results file (row {i}: {', '.join(bad)} not a number)"
    return None


def _describe(table):
    lines = []
    for r in table["allreduce"]:
        upto = "and above" if r["max_bytes"] is None else f"to {r['max_bytes']} B"
        lines.append(f"P={r['size']:<4} {r['min_bytes']:>10} B {upto:<15} -> {r['algorithm']}")
    return "\n".join(lines)


def main(argv=None):
    """Read sweeps, write the decision table as JSON and print it."""
    p = Parser(description=__doc__.split("\n\n")[0], prog="python -m experiments.bench.tune")
    p.add_argument("results", type=infile(), nargs="+", help="JSON files written by experiments.bench.collectives")
    p.add_argument("--out", type=outpath(), default="results/tuning.json", help="decision table to write (default results/tuning.json)")
    p.add_argument("--tolerance", type=real(0, 1e15), default=0.0,
                   help="keep the previous range's algorithm while within this relative slack (default 0)")
    p.add_argument("--library-max-bytes", type=integer(0, INT32_MAX), default=LIBRARY_MAX_BYTES,
                   help=f"largest message (bytes) at which mpi may win a range; 0: never (default {LIBRARY_MAX_BYTES})")
    p.add_argument("--stat", choices=["mean", "median"], default="mean",
                   help="time compared: the slowest rank's mean (default) or median (steadier on a shared machine)")
    a = p.parse_args(argv)
    if not a.tolerance >= 0 or a.tolerance == float("inf"):
        p.error(f"--tolerance must be a finite number >= 0, got {a.tolerance}")
    results = []
    for path in a.results:
        try:
            with open(path, encoding="utf-8") as f:
                results.append(json.load(f))
        except OSError as exc:
            p.error(f"{path}: {exc.strerror or exc}")
        except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError
            p.error(f"{path}: not JSON ({exc})")
        if why := _not_a_sweep(results[-1]):
            p.error(f"{path}: {why}")
    try:
        table = build_table(results, a.tolerance, a.stat, a.library_max_bytes)
    except (ValueError, TypeError) as exc:  # TypeError: a field of the wrong type in a row
        p.error(str(exc))
    try:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(table, f, indent=1)
    except OSError as exc:
        p.error(f"cannot write --out {a.out!r}: {exc.strerror or exc}")
    print(_describe(table))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
