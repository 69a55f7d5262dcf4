"""Rank-side body of the reduce-scatter-v tests: ``python -m tests.mpi_counts``.

``collectives.reduce_scatter(x, counts=...)`` against mpi4py's own ``Comm.Reduce_scatter`` with the
same ``recvcounts`` (the oracle), for ``ring``, ``mpi`` and ``auto``, every op, float64/float32/
int32/int64/float16, uneven counts, zero counts (the first, the last, all but one, every one with an
empty vector), counts given as a list, a tuple or a NumPy array, and ``out=``. The data are small
integers, so every sum and product is exact in every dtype and the results must be equal bit for
bit; float16 accumulates in float32 and rounds once (oracle: float32 ``MPI_Reduce_scatter`` rounded
once), ``avg`` is the sum divided by P in the accumulation dtype. Then the refusals, each on a fresh
duplicate of the communicator (a mismatch fails the one it happened on): counts that differ between
ranks raise ``CollectiveMismatch`` on every rank; a rank whose counts do not add up raises
``ValueError`` there and the others ``CollectiveMismatch``; counts that are malformed alike on
every rank raise ``ValueError`` everywhere. Exits 0 when every case passes on every rank.
"""
import sys

import numpy as np
from mpi4py import MPI

import collectives
from collectives import CollectiveMismatch
from tests.mpicases import FAILS, check, report

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()
DTYPES = ("float64", "float32", "int32", "int64", "float16")
OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}


def patterns():
    """Count vectors every rank builds alike: uneven, zeros first / last / everywhere but one, empty."""
    g = np.random.default_rng([P, 11])
    out = [list(g.integers(0, 6, P)), list(g.integers(1, 4, P))]
    zeros_first = [0] + [int(c) for c in g.integers(1, 5, P - 1)]
    out += [zeros_first, zeros_first[::-1]]
    one = [0] * P
    one[P // 2] = 7
    out += [one, [0] * P, [5] * P]
    return [[int(c) for c in v] for v in out]


def oracle(x, counts, op, dtype):
    """MPI_Reduce_scatter of ``x`` with ``counts`` (float16 in float32, rounded once; avg = sum / P)."""
    acc = np.dtype(np.float32 if dtype == "float16" else dtype)
    send = x.astype(acc)
    recv = np.empty(counts[rank], acc)
    comm.Reduce_scatter(send, recv, counts, OPS["sum" if op == "avg" else op])
    if op == "avg":
        recv = recv / acc.type(P)
    return recv.astype(dtype)


def data(n, dtype, op, salt):
    g = np.random.default_rng([rank, n, salt])
    vals = g.choice([1, 2, -1], n) if op == "prod" else g.integers(-3, 4, n)
    return vals.astype(dtype)


def case_equal_to_mpi():
    ran = 0
    for ci, counts in enumerate(patterns()):
        n = sum(counts)
        for dtype in DTYPES:
            for op in ("sum", "prod", "min", "max", "avg"):
                if op == "avg" and dtype.startswith("int"):
                    continue
                x = data(n, dtype, op, ci)
                want = oracle(x, counts, op, dtype)
                for alg in ("ring", "mpi", "auto"):
                    given = (counts, tuple(counts), np.array(counts, np.int64))[ran % 3]
                    got = collectives.reduce_scatter(x, counts=given, op=op, algorithm=alg)
                    label = f"P={P} counts={counts} {dtype} {op} {alg}"
                    check(got.dtype == want.dtype and got.shape == want.shape, f"{label}: {got.dtype} {got.shape}")
                    check(np.array_equal(got, want), f"{label}: {got.tolist()} != MPI_Reduce_scatter {want.tolist()}")
                    ran += 1
    for alg in ("ring", "mpi"):  # out=, a 2-D input (flattened in C order)
        counts = patterns()[0]
        x = data(sum(counts), "float64", "sum", 99)
        out = np.full(counts[rank], np.nan)
        got = collectives.reduce_scatter(x.reshape(1, -1), counts=counts, algorithm=alg, out=out)
        check(got is out and np.array_equal(out, oracle(x, counts, "sum", "float64")), f"out= {alg}: {out}")
    if rank == 0:
        print(f"P={P}: {ran} reduce-scatter-v calls compared with MPI_Reduce_scatter", flush=True)


def expect(exc_type, fn, what):
    """Run ``fn``; record a failure unless it raises ``exc_type``."""
    try:
        fn()
    except exc_type:
        return
    except Exception as e:  # any other error is a failure of the check, with its text
        check(False, f"{what}: {type(e).__name__}: {e}")
        return
    check(False, f"{what}: no {exc_type.__name__}")


def case_refusals():
    n = 3 * P
    even = [3] * P
    for alg in ("ring", "mpi"):
        if P > 1:
            sub = comm.Dup()
            mine = list(even)
            mine[rank], mine[(rank + 1) % P] = 2, 4  # every rank another vector, each adding up to n
            expect(CollectiveMismatch, lambda: collectives.reduce_scatter(np.ones(n), counts=mine, comm=sub, algorithm=alg,
                                                                          timeout=30), f"{alg}: counts differ")
            sub.Free()
            sub = comm.Dup()
            wrong = even if rank else [4] + even[1:]  # rank 0's add up to n + 1
            expect(ValueError if rank == 0 else CollectiveMismatch,
                   lambda: collectives.reduce_scatter(np.ones(n), counts=wrong, comm=sub, algorithm=alg, timeout=30),
                   f"{alg}: rank 0's counts add up to {n + 1}")
            sub.Free()
        sub = comm.Dup()
        for bad in (even + [0], [3.0] * P, [-1] + [3] * (P - 1) if P > 1 else [-1], "abc"):
            expect(ValueError, lambda: collectives.reduce_scatter(np.ones(n), counts=bad, comm=sub, algorithm=alg,
                                                                  timeout=30), f"{alg}: counts {bad!r} on every rank")
        sub.Free()


def main():
    for case in (case_equal_to_mpi, case_refusals):
        try:
            case()
        except Exception as e:
            FAILS.append(f"{case.__name__}: {type(e).__name__}: {e}")
    sys.exit(report(comm, "reduce_scatter counts"))


if __name__ == "__main__":
    main()
