"""Reduce-scatter, all-gather(-v), broadcast and reduce, on the same schedules and executor.

Rules (chunking, float16, integer ``avg``) are those of :mod:`collectives.api`. Copy-only
collectives (all-gather, broadcast) move raw bytes, so they also take the byte-sized and unsigned
types of :data:`collectives.backend.COPY_DTYPES` (uint8 blobs, bool masks), and float16 travels as
2-byte elements there.
"""
import math
import time

import numpy
from mpi4py import MPI

from . import backend
from .api import MPI_OPS, _as_array, _finish, _nan_mask, _prepare, _restore_nan
from .context import check_comm, get_context
from .ring import ring_allgather, ring_reduce_scatter
from .executor import CollectiveTimeout, _wait, execute
from .schedule import chunk_bounds
from .tree import tree_broadcast, tree_reduce

__all__ = ["OP_ALGORITHMS", "reduce_scatter", "allgather", "broadcast", "reduce"]

#: Algorithms available to each collective besides all-reduce ("auto" picks the first).
OP_ALGORITHMS = {
    "reduce_scatter": ("ring", "mpi", "auto"),
    "allgather": ("ring", "mpi", "auto"),
    "broadcast": ("tree", "mpi", "auto"),
    "reduce": ("tree", "mpi", "auto"),
}
_SIG = 10  # int64 words in an all-gather signature: ndim, dtype code, then up to 8 dims


def _common(x, op, algorithm, name, timeout):
    backend.check_algorithm(algorithm, OP_ALGORITHMS[name], f"{name} algorithm")
    if op is not None:
        backend.check_op(op)
    x = _as_array(x)
    backend.check_dtype(x.dtype, allowed=backend.DTYPES if op is not None else backend.COPY_DTYPES)
    timeout = backend.check_timeout(timeout)
    return x, timeout, OP_ALGORITHMS[name][0] if algorithm == "auto" else algorithm


def _run(ctx, sched, work, scratch, ufunc, timeout, name, xp, inp=None, needed=None):
    try:
        execute(sched, ctx.comm, work, scratch, ufunc, ctx.next_tag(), timeout, name, ctx.transport(xp),
                inp=inp, needed=needed, progress=ctx.progress if ctx.active else None)
    except Exception as exc:
        ctx.broken = f"{name}: {exc}"
        raise


def _raw(a):
    """View a flat buffer as unsigned integers of the same width, for copy-only messages."""
    return a.view(f"u{a.dtype.itemsize}")


def reduce_scatter(x, comm=None, op="sum", algorithm="ring", timeout=None):
    """Reduce ``x`` across ranks and return this rank's chunk of the flattened result.

    Steps (ring): P - 1 rounds; in round s rank r sends chunk (r - s - 1) mod P to r + 1 and adds
    chunk (r - s - 2) mod P from r - 1. Cost: ``(P-1) alpha + (P-1)/P n (beta + gamma)``. Source:
    Patarasuk and Yuan 2009, section 3.

    Parameters
    ----------
    x : ndarray, any shape, supported dtype
        This rank's contribution; same size and dtype everywhere. It is flattened (C order).
    comm : mpi4py.MPI.Intracomm, optional
    op : {"sum", "prod", "min", "max", "avg"}
    algorithm : {"ring", "mpi", "auto"}
    timeout : float, optional
        Seconds per round before :class:`CollectiveTimeout`.

    Returns
    -------
    ndarray, shape (chunk_r,), x.dtype
        Chunk ``r`` of the ``numpy.array_split(result, P)`` chunks (73 elements on 4 ranks: 19, 18, 18, 18).

    Raises
    ------
    ValueError, TypeError
        As for :func:`collectives.allreduce`.
    """
    x, timeout, algorithm = _common(x, op, algorithm, "reduce_scatter", timeout)
    ctx = get_context(comm)
    ctx.check_usable()
    xp = backend.get_array_module(x)
    count, size, rank = x.size, ctx.size, ctx.rank
    bounds = chunk_bounds(count, size)
    acc = backend.accumulation_dtype(x.dtype)
    work = ctx.buffer(xp, acc, count, "rs-work")
    lo, hi = bounds[rank], bounds[rank + 1]
    inp = None
    if count and algorithm != "mpi" and x.dtype == acc and x.flags.c_contiguous:
        inp = x.reshape(-1)  # read by the executor in place: no copy of the whole input
    elif count:
        xp.copyto(work.reshape(x.shape), x, casting="unsafe")
    if algorithm == "mpi":
        counts = [bounds[i + 1] - bounds[i] for i in range(size)]
        mine = xp.empty(hi - lo, dtype=acc)
        _host_call(ctx, xp, "Reduce_scatter", (work, mine, counts, MPI_OPS[op]), timeout, "reduce_scatter")
        mask = _nan_mask(work, op)
        if mask is not None:  # the library's MIN/MAX may drop NaN: restore NumPy's rule
            got = numpy.empty(hi - lo, numpy.uint8)
            _host_call(ctx, numpy, "Reduce_scatter", (mask, got, counts, MPI.MAX), timeout, "reduce_scatter")
            _restore_nan(mine, got)
        ctx.record("reduce_scatter", "mpi", count, acc, elements=count - count // size, estimated=True)
        work, lo, hi = mine, 0, hi - lo
    else:
        sched = ctx.schedule(("reduce_scatter", algorithm, count), lambda: ring_reduce_scatter(rank, size, count))
        _run(ctx, sched, work, ctx.buffer(xp, acc, sched.scratch), getattr(xp, backend.OPS[op]), timeout,
             "reduce_scatter", xp, inp, (lo, hi))
        ctx.record("reduce_scatter", algorithm, count, acc, sched)
    return _finish(xp.empty(hi - lo, dtype=x.dtype), work[lo:hi], op, size, xp)


def _host_call(ctx, xp, method, args, timeout, name):
    """Run the MPI library's own collective ``method`` (e.g. "Bcast") with ``args`` on ``ctx.comm``.

    Device buffers: the stream is synchronized first; without CUDA-aware MPI the call is refused.
    The non-blocking form (``Ibcast``, ...) is always used -- MPI never matches a blocking collective
    with a non-blocking one, and whether a rank passes a timeout or has requests in flight is its own
    business -- and waited on with the timeout and progress rules of the hand-made algorithms.
    """
    transport = ctx.transport(xp)
    if transport is not None:
        transport.sync()
        if not transport.direct:
            raise ValueError("algorithm='mpi' on device arrays needs a CUDA-aware MPI; use a hand-made "
                             "algorithm, which stages through host memory")
    req = getattr(ctx.comm, "I" + method[0].lower() + method[1:])(*args)
    if timeout is None and not ctx.active:
        req.Wait()
        return
    deadline = None if timeout is None else time.perf_counter() + timeout
    try:
        _wait([req], [None], deadline, name, 0, f"MPI_{method}", timeout, ctx.progress if ctx.active else None)
    except CollectiveTimeout as exc:
        ctx.broken = f"{name}: {exc}"
        raise


def allgather(x, comm=None, algorithm="ring", timeout=None):
    """Concatenate every rank's ``x`` along axis 0, in rank order (all-gather-v).

    A first exchange of a small int64 signature (shape and dtype) lets every rank check the inputs
    agree and size the result before any data moves. Steps (ring): P - 1 rounds, in round s rank r
    forwards block (r - s) mod P to r + 1. Cost: ``(P-1) alpha + (P-1)/P n beta``. Source: Thakur,
    Rabenseifner and Gropp 2005, section 4.

    Parameters
    ----------
    x : ndarray, shape (n_r, ...), supported dtype
        This rank's block; ``n_r`` may differ between ranks, other dimensions and dtype must agree.
    comm : mpi4py.MPI.Intracomm, optional
    algorithm : {"ring", "mpi", "auto"}
    timeout : float, optional

    Returns
    -------
    ndarray, shape (sum of n_r, ...), x.dtype

    Raises
    ------
    ValueError
        ``x`` is 0-d or has more than 8 dimensions, another rank's ``x`` is invalid, or the ranks'
        trailing dimensions differ. These checks ride on the signature exchange, so they are raised
        on every rank even when only one rank's ``x`` is at fault.
    TypeError
        Unsupported dtype, or the ranks' dtypes differ.
    """
    backend.check_algorithm(algorithm, OP_ALGORITHMS["allgather"], "allgather algorithm")
    timeout = backend.check_timeout(timeout)
    algorithm = "ring" if algorithm == "auto" else algorithm
    # Checks of x itself travel in the signature exchange, so a bad array on one rank only raises
    # on every rank instead of leaving the others waiting for its data.
    local_error = None
    try:
        x = _as_array(x)
    except TypeError as exc:
        local_error, x = exc, numpy.zeros(0, numpy.uint8)
    if local_error is not None:
        pass
    elif x.dtype not in backend.COPY_DTYPES:
        names = ", ".join(d.name for d in backend.COPY_DTYPES)
        local_error = TypeError(f"x has unsupported dtype {x.dtype.name}: expected one of {names}")
    elif x.ndim == 0 or x.ndim > _SIG - 2:
        local_error = ValueError(f"x must have 1 to {_SIG - 2} dimensions to be gathered along axis 0, "
                                 f"not {x.ndim}")
    ctx = get_context(comm)
    ctx.check_usable()
    xp = backend.get_array_module(x)
    size, rank = ctx.size, ctx.rank
    sig = numpy.full(size * _SIG, -1, dtype=numpy.int64)
    if local_error is None:
        sig[rank * _SIG: rank * _SIG + 2] = x.ndim, backend.COPY_DTYPES.index(x.dtype)
        sig[rank * _SIG + 2: rank * _SIG + 2 + x.ndim] = x.shape
    else:
        sig[rank * _SIG: rank * _SIG + 2] = -2, -2  # "this rank's x is invalid"
    sig_sched = ctx.schedule(("allgather-sig", size), lambda: ring_allgather(rank, size, chunk_bounds(size * _SIG, size)))
    _run(ctx, sig_sched, sig, sig[:0], None, timeout, "allgather", numpy)
    rows = sig.reshape(size, _SIG).tolist()  # tiny: plain Python is faster than NumPy here
    if local_error is not None:
        raise local_error
    bad = [i for i, row in enumerate(rows) if row[0] == -2]
    if bad:
        raise ValueError(f"allgather: rank(s) {', '.join(map(str, bad))} passed an invalid array "
                         "(unsupported dtype or dimensions); see the error on those ranks")
    mine = rows[rank]
    if any(row[1] != mine[1] for row in rows):
        names = sorted({backend.COPY_DTYPES[row[1]].name for row in rows})
        raise TypeError(f"allgather: ranks passed different dtypes ({', '.join(names)})")
    if any(row[0] != mine[0] or row[3:] != mine[3:] for row in rows):
        raise ValueError("allgather: ranks' arrays differ beyond the first dimension: "
                         + "; ".join(f"rank {i} {tuple(row[2:2 + row[0]])}" for i, row in enumerate(rows)))
    inner = math.prod(x.shape[1:])
    firsts = [row[2] for row in rows]
    bounds = [0]
    for f in firsts:
        bounds.append(bounds[-1] + f * inner)
    out = xp.empty((sum(firsts),) + x.shape[1:], dtype=x.dtype)
    flat = out.reshape(-1)
    if x.size:
        xp.copyto(flat[bounds[rank]:bounds[rank + 1]].reshape(x.shape), x)
    if algorithm == "mpi":
        counts = [bounds[i + 1] - bounds[i] for i in range(size)]
        if len(set(counts)) == 1:  # MPI_Allgather: MPICH runs it several times faster than Allgatherv
            _host_call(ctx, xp, "Allgather", (MPI.IN_PLACE, _raw(flat)), timeout, "allgather")
        else:
            _host_call(ctx, xp, "Allgatherv", (MPI.IN_PLACE, [_raw(flat), counts]), timeout, "allgather")
        ctx.record("allgather", "mpi", flat.size, x.dtype, elements=x.size * (size - 1), estimated=True)
        return out
    sched = ctx.schedule(("allgather", algorithm, tuple(bounds)), lambda: ring_allgather(rank, size, bounds))
    _run(ctx, sched, _raw(flat), None, None, timeout, "allgather", xp)
    ctx.record("allgather", algorithm, flat.size, x.dtype, sched)
    return out


def broadcast(x, root=0, comm=None, algorithm="tree", timeout=None):
    """Copy ``x`` from ``root`` into ``x`` on every rank, in place, and return it.

    Steps (tree): binomial tree rooted at ``root``; each rank receives once from its parent then sends
    to its children. Cost: ``ceil(log2 P) (alpha + n beta)``. Source: Thakur et al. 2005, section 4.1.

    Parameters
    ----------
    x : ndarray, any shape, supported dtype, writable
        The data on ``root``; a buffer of the same shape and dtype elsewhere.
    root : int
    comm : mpi4py.MPI.Intracomm, optional
    algorithm : {"tree", "mpi", "auto"}
    timeout : float, optional

    Returns
    -------
    ndarray
        ``x``, now holding root's data.

    Raises
    ------
    ValueError
        ``root`` out of range, unknown algorithm.
    TypeError
        Unsupported dtype.
    """
    x, timeout, algorithm = _common(x, None, algorithm, "broadcast", timeout)
    comm = check_comm(comm)
    backend.check_root(root, comm.Get_size())
    if not getattr(getattr(x, "flags", None), "writeable", True) or (
            not hasattr(x, "__cuda_array_interface__") and not isinstance(x, numpy.ndarray)):
        raise ValueError("broadcast writes into x: it must be a writable array")
    ctx = get_context(comm)
    ctx.check_usable()
    xp = backend.get_array_module(x)
    work = x.reshape(-1) if x.flags.c_contiguous else ctx.buffer(xp, x.dtype, x.size, "bcast")
    if work.size and not x.flags.c_contiguous and ctx.rank == root:
        xp.copyto(work.reshape(x.shape), x)
    if algorithm == "mpi":
        _host_call(ctx, xp, "Bcast", (_raw(work), root), timeout, "broadcast")
        ctx.record("broadcast", "mpi", x.size, x.dtype, elements=x.size if ctx.rank == root else 0, estimated=True)
    else:
        sched = ctx.schedule(("broadcast", algorithm, x.size, root),
                             lambda: tree_broadcast(ctx.rank, ctx.size, x.size, root))
        _run(ctx, sched, _raw(work), None, None, timeout, "broadcast", xp)
        ctx.record("broadcast", algorithm, x.size, x.dtype, sched)
    if work.size and not x.flags.c_contiguous:
        xp.copyto(x, work.reshape(x.shape))
    return x


def reduce(x, root=0, comm=None, op="sum", algorithm="tree", timeout=None):
    """Combine ``x`` across ranks onto ``root``.

    Steps (tree): binomial tree rooted at ``root``; a rank adds its children's partial results, then
    sends to its parent. Cost: ``ceil(log2 P) (alpha + n beta + n gamma)``. Source: Thakur et al.
    2005, section 4.4.

    Parameters
    ----------
    x : ndarray, any shape, supported dtype
    root : int
    comm : mpi4py.MPI.Intracomm, optional
    op : {"sum", "prod", "min", "max", "avg"}
    algorithm : {"tree", "mpi", "auto"}
    timeout : float, optional

    Returns
    -------
    ndarray or None
        The result (new array, ``x``'s shape and dtype) on ``root``; None on the other ranks.

    Raises
    ------
    ValueError, TypeError
        As for :func:`collectives.allreduce`; ``root`` out of range.
    """
    x, timeout, algorithm = _common(x, op, algorithm, "reduce", timeout)
    comm = check_comm(comm)
    backend.check_root(root, comm.Get_size())
    ctx = get_context(comm)
    ctx.check_usable()
    xp = backend.get_array_module(x)
    out, work, acc, direct, _ = _prepare(x, None, ctx, xp, "work")
    if algorithm == "mpi":
        recv = work if ctx.rank == root else None
        mask = _nan_mask(work, op)
        _host_call(ctx, xp, "Reduce", (MPI.IN_PLACE if ctx.rank == root else work, recv, MPI_OPS[op], root),
                   timeout, "reduce")
        if mask is not None:  # the library's MIN/MAX may drop NaN: restore NumPy's rule
            _host_call(ctx, numpy, "Reduce", (MPI.IN_PLACE if ctx.rank == root else mask,
                                              mask if ctx.rank == root else None, MPI.MAX, root), timeout, "reduce")
            if ctx.rank == root:
                _restore_nan(work, mask)
        ctx.record("reduce", "mpi", x.size, acc, elements=x.size if ctx.rank != root else 0, estimated=True)
    else:
        sched = ctx.schedule(("reduce", algorithm, x.size, root), lambda: tree_reduce(ctx.rank, ctx.size, x.size, root))
        _run(ctx, sched, work, ctx.buffer(xp, acc, sched.scratch), getattr(xp, backend.OPS[op]), timeout,
             "reduce", xp)
        ctx.record("reduce", algorithm, x.size, acc, sched)
    return _finish(out, work, op, ctx.size, xp, direct) if ctx.rank == root else None
