"""The sweep's correctness oracle: exact test data and MPI's own collective under commlab's rules.

Every size of every algorithm is checked against these (the ``#wrong`` column): integer-valued data
makes sums exact in any order, so a correct result has no wrong element at all.
"""
import numpy as np
from mpi4py import MPI

from collectives import backend
from collectives.engine.buffers import MPI_OPS

__all__ = ["RTOL", "check_data", "count_wrong", "first_wrong", "raw", "oracle_allreduce"]

#: Relative (and absolute) tolerance per float dtype when counting wrong elements.
RTOL = {"float16": 1e-3, "float32": 1e-5, "float64": 1e-12}


def check_data(rank, count, dtype, redop):
    """Integer-valued data, so sums are exact in every order and #wrong is exactly 0 when correct."""
    rng = np.random.default_rng([rank, count])
    lo, hi = (1, 3) if redop == "prod" else (-4, 5)
    return rng.integers(lo, hi, count).astype(dtype)


def count_wrong(result, ref):
    """Return the number of elements of ``result`` that differ from ``ref`` (all of them if shapes differ)."""
    result, ref = np.asarray(result), np.asarray(ref)
    if result.shape != ref.shape:
        return int(max(result.size, ref.size))
    if ref.dtype.kind != "f":
        return int(np.count_nonzero(result != ref))
    tol = RTOL[ref.dtype.name]
    return int(np.count_nonzero(~np.isclose(result.astype(np.float64), ref.astype(np.float64),
                                            rtol=tol, atol=tol)))


def first_wrong(result, ref):
    """Return ``(index, expected, got)`` of the first element of ``result`` that differs from ``ref``, or None.

    The same test as :func:`count_wrong` (floats within :data:`RTOL`); a result of another shape is
    wrong at index -1 with its size as ``got`` and the expected size as ``expected``.

    Examples
    --------
    >>> first_wrong(np.array([300, 202, 306]), np.array([300, 303, 306]))
    (1, 303.0, 202.0)
    >>> first_wrong(np.zeros(2), np.zeros(2)) is None
    True
    """
    result, ref = np.asarray(result), np.asarray(ref)
    if result.shape != ref.shape:
        return -1, float(ref.size), float(result.size)
    if ref.dtype.kind != "f":
        bad = np.flatnonzero(result.reshape(-1) != ref.reshape(-1))
    else:
        tol = RTOL[ref.dtype.name]
        bad = np.flatnonzero(~np.isclose(result.reshape(-1).astype(np.float64), ref.reshape(-1).astype(np.float64),
                                         rtol=tol, atol=tol))
    if not bad.size:
        return None
    i = int(bad[0])
    return i, float(ref.reshape(-1)[i]), float(result.reshape(-1)[i])


def raw(a):
    """View ``a`` flat as unsigned integers of its width, for MPI calls that only move bytes."""
    return a.reshape(-1).view(f"u{a.dtype.itemsize}")


def oracle_allreduce(comm, x, redop):
    """MPI's own all-reduce of ``x`` under commlab's rules (float16 summed in float32, integer avg floored)."""
    acc = x.astype(backend.accumulation_dtype(x.dtype))
    comm.Allreduce(MPI.IN_PLACE, acc, MPI_OPS[redop])
    if redop == "avg":
        acc = acc / comm.Get_size() if acc.dtype.kind == "f" else np.floor_divide(acc, comm.Get_size())
    return acc.astype(x.dtype)
