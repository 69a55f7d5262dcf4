"""Why a hand-made all-reduce can beat the MPI library's own algorithms: the local reduction.

``python -m experiments.bench.reduce_local [--sizes 64K,1M,4M,16M] [--repeats 7]``

Every all-reduce algorithm adds a received vector into the rank's own; MPICH's algorithms do it
with the library's reduction loop (``MPI_Reduce_local``), commlab's schedules with NumPy's ufunc
(``numpy.add(..., out=...)``, SIMD-vectorized). This benchmark times both, and a plain copy of the
same size as the memory reference, in one process, interleaved within each repeat, and prints the
median time of each and the median [range] of the per-repeat ratio MPI / NumPy. One process, no
message: it needs no ``mpiexec``.
"""
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

from commlab.provenance import mpi_library
from commlab.byte_sizes import format_bytes, parse_bytes
from training.settings.options import INT32_MAX, Parser, integer, text

__all__ = ["main", "measure"]

_DTYPES = {"float32": np.float32, "float64": np.float64, "int32": np.int32}


def _timed(fn, calls):
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls


def measure(nbytes, dtype, repeats, budget=0.02):
    """Return the per-repeat times (s) of ``MPI_Reduce_local``, ``numpy.add`` and ``numpy.copyto`` at ``nbytes``.

    Parameters
    ----------
    nbytes : int
        Vector size in bytes (rounded down to whole elements, at least one).
    dtype : str
        ``float32``, ``float64`` or ``int32``.
    repeats : int
        Interleaved repeats.
    budget : float
        Seconds each timed loop aims at (at least 3 calls).

    Returns
    -------
    dict
        ``{"mpi": [...], "numpy": [...], "copy": [...]}``, seconds per call, one entry per repeat.

    Raises
    ------
    RuntimeError
        The two reductions give different sums (they would not be timing the same work).
    """
    dt = np.dtype(_DTYPES[dtype])
    n = max(1, nbytes // dt.itemsize)
    a, b = np.ones(n, dt), np.ones(n, dt)
    calls = {"mpi": lambda: MPI.SUM.Reduce_local(a, b), "numpy": lambda: np.add(a, b, out=b),
             "copy": lambda: np.copyto(b, a)}
    want = a + b
    calls["mpi"]()
    if not np.array_equal(b, want):  # the two must compute the same sum for the times to compare
        raise RuntimeError(f"MPI_Reduce_local and numpy.add disagree at {n} {dtype} elements")
    for fn in calls.values():
        fn()  # touch the pages and warm the code paths
    probe = _timed(calls["numpy"], 3)
    count = max(3, int(budget / max(probe, 1e-7)))
    times = {k: [] for k in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            times[name].append(_timed(fn, count))
            b.fill(1)  # keep the values from growing
    return times


def main(argv=None):
    """Print the table; return the exit status."""
    ap = Parser(prog="python -m experiments.bench.reduce_local",
                                 description="MPI_Reduce_local (the MPI library's reduction loop) against numpy.add, "
                                             "in one process.")
    ap.add_argument("--sizes", type=text(), default="64K,1M,4M,16M", help="comma-separated vector sizes (default 64K,1M,4M,16M)")
    ap.add_argument("--dtype", choices=sorted(_DTYPES), default="float32", help="element type (default float32)")
    ap.add_argument("--repeats", type=integer(1, INT32_MAX), default=7, help="interleaved repeats (median and range; default 7)")
    args = ap.parse_args(argv)
    try:
        sizes = [parse_bytes(s, minimum=1) for s in args.sizes.split(",")]
    except ValueError as exc:
        ap.error(f"--sizes: {exc}")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    print(f"{mpi_library()}, {args.dtype}, numpy {np.__version__}; "
          f"median of {args.repeats} interleaved repeats")
    print(f"{'size':>10}  {'MPI_Reduce_local':>16}  {'numpy.add':>10}  {'copy':>10}  MPI / numpy [range]")
    for nbytes in sizes:
        t = measure(nbytes, args.dtype, args.repeats)
        ratios = [m / n for m, n in zip(t["mpi"], t["numpy"])]
        med = {k: statistics.median(v) * 1e6 for k, v in t.items()}
        print(f"{format_bytes(nbytes):>10}  {med['mpi']:>13.1f} us  {med['numpy']:>7.1f} us  {med['copy']:>7.1f} us  "
              f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
