"""Check the ``torus`` all-reduce on every grid of P against MPI's own: ``mpiexec -n P python -m
experiments.bench.torus_grids [--max-dims 4]``.

Every ordered factorization of P into up to ``--max-dims`` dimensions (dimensions of 1 included), at
element counts 0, 1, P - 1, P + 1 and 1001, int64 (compared bit for bit with ``MPI_Allreduce``) and
float64 (within 1e-12 of it). Prints one line per failing grid and the totals; exit status 1 when any
grid fails. The test suite runs the same check for P up to 8 (``tests/mpi_collectives.py``); this
script is for larger P.
"""
import sys

import numpy as np
from mpi4py import MPI

import collectives as C
from training.settings.options import INT32_MAX, Parser, integer

__all__ = ["factorizations", "main"]


def factorizations(n, depth):
    """Return every ordered factorization of ``n`` into exactly ``depth`` positive factors.

    Examples
    --------
    >>> factorizations(4, 2)
    [(1, 4), (2, 2), (4, 1)]
    """
    if depth == 1:
        return [(n,)]
    return [(d,) + rest for d in range(1, n + 1) if n % d == 0 for rest in factorizations(n // d, depth - 1)]


def main(argv=None):
    """Run the check on COMM_WORLD; return the exit status."""
    p = Parser(prog="python -m experiments.bench.torus_grids", description=__doc__.split("\n\n")[0])
    p.add_argument("--max-dims", type=integer(1, INT32_MAX), default=4, help="largest number of grid dimensions (default 4)")
    args = p.parse_args(argv)
    if args.max_dims < 1:
        p.error("--max-dims must be at least 1")
    comm = MPI.COMM_WORLD
    P, rank = comm.Get_size(), comm.Get_rank()
    grids = sorted({f for depth in range(1, args.max_dims + 1) for f in factorizations(P, depth)})
    failed = 0
    for dims in grids:
        for n in sorted({0, 1, max(P - 1, 0), P + 1, 1001}):
            ints = ((np.arange(n) * (rank + 3)) % 11 - 5).astype(np.int64)
            floats = np.sin(np.arange(n) + rank).astype(np.float64)
            want_i, want_f = np.empty_like(ints), np.empty_like(floats)
            comm.Allreduce(ints, want_i, op=MPI.SUM)
            comm.Allreduce(floats, want_f, op=MPI.SUM)
            ok = (np.array_equal(C.allreduce(ints, algorithm="torus", grid=dims), want_i)
                  and np.allclose(C.allreduce(floats, algorithm="torus", grid=dims), want_f, rtol=1e-12, atol=1e-12))
            ok = comm.allreduce(int(ok), op=MPI.MIN)
            if not ok:
                failed += 1
                if rank == 0:
                    print(f"FAIL grid={dims} count={n}", flush=True)
    if rank == 0:
        print(f"torus on P = {P}: {len(grids)} grids x 5 counts, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
