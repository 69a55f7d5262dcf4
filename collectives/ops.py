"""Reduce-scatter, all-gather(-v), broadcast and reduce, on the same schedules and executor.

Rules (chunking, float16, integer ``avg``) are those of :mod:`collectives.api`. Copy-only
collectives (all-gather, broadcast) move raw bytes, so they also take the byte-sized and unsigned
types of :data:`collectives.COPY_DTYPES` (uint8 blobs, bool masks), and float16 and bfloat16
travel as 2-byte elements there. Every collective takes DLPack tensors (PyTorch, JAX) and gives its
result back in the caller's type (:func:`collectives.buffers.adopt`); ``op`` may be an mpi4py op.
"""
import math

import numpy
from mpi4py import MPI

from .backend import (COPY_DTYPES, DTYPES, OPS, accumulation_dtype, check_dtype, check_op, check_root, check_timeout,
                      get_array_module, op_name)
from .fingerprint import checks_enabled, key_code
from .library import call, mismatch
from .algorithms import check_algorithm, names
from .buffers import MPI_OPS, adopt, as_array, finish, nan_mask, prepare, raw, restore_nan
from .context import check_comm, get_context
from .executor import execute
from .ring import ring_allgather, ring_reduce_scatter
from .schedule import chunk_bounds, segmented
from .tree import tree_broadcast, tree_reduce

__all__ = ["OP_ALGORITHMS", "reduce_scatter", "allgather", "broadcast", "reduce"]

#: Algorithms available to each collective besides all-reduce ("auto" picks the first), from the registry.
OP_ALGORITHMS = {name: names(name) for name in ("reduce_scatter", "allgather", "broadcast", "reduce")}
_SIG = 10  # int64 words in an all-gather signature: ndim, dtype code, then up to 8 dims
_ROW = _SIG + 1  # a rank's row in the signature exchange: its signature, then its call fingerprint


def _common(x, op, algorithm, name, timeout):
    check_algorithm(algorithm, name)
    if name != "broadcast":  # every reducing collective needs an op; None is not "no reduction"
        check_op(op)
    x = as_array(x)
    check_dtype(x.dtype, allowed=DTYPES if name != "broadcast" else COPY_DTYPES)
    timeout = check_timeout(timeout)
    return x, timeout, _auto(name, x) if algorithm == "auto" else algorithm


def _auto(name, x):
    """Return what ``auto`` runs for the collectives other than all-reduce: the first hand-made algorithm.

    (Measured at P = 2 over 8 B-64 MiB, the ring reduce-scatter took 0.68x the time of the library's
    path through commlab, geometric mean, and the ring all-gather 1.02x: see README "Benchmarks".)
    """
    return OP_ALGORITHMS[name][0]


def _run(ctx, key, sched, work, scratch, ufunc, timeout, xp, inp=None, needed=None):
    name = key[0]
    try:
        execute(sched, ctx.comm, work, scratch, ufunc, ctx.begin(key, timeout), timeout, name, ctx.transport(xp),
                inp=inp, needed=needed, progress=ctx.progress if ctx.active else None)
    except Exception as exc:
        ctx.fail(f"{name}: {exc}")
        raise


def _library(ctx, key, xp, method, args, timeout, extra=(), check=True):
    """Run the MPI library's own collective (``algorithm="mpi"``) with the fingerprint check.

    Device buffers: the stream is synchronized first; without CUDA-aware MPI the call is refused.
    """
    transport = ctx.transport(xp)
    if transport is not None:
        transport.sync()
        if not transport.direct:
            raise ValueError("algorithm='mpi' on device arrays needs a CUDA-aware MPI; use a hand-made "
                             "algorithm, which stages through host memory")
    ctx.begin(key, timeout)
    call(ctx, key, method, args, timeout, check=check, extra=extra)


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
    op : {"sum", "prod", "min", "max", "avg"} or mpi4py.MPI.SUM/PROD/MIN/MAX
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
    x, _, wrap = adopt(x)
    if wrap is not None:
        return wrap(reduce_scatter(x, comm, op, algorithm, timeout))
    op = op_name(op)
    x, timeout, algorithm = _common(x, op, algorithm, "reduce_scatter", timeout)
    ctx = get_context(comm, timeout)
    ctx.check_usable()
    xp = get_array_module(x)
    count, size, rank = x.size, ctx.size, ctx.rank
    bounds = chunk_bounds(count, size)
    acc = accumulation_dtype(x.dtype)
    work = ctx.buffer(xp, acc, count, "rs-work")
    lo, hi = bounds[rank], bounds[rank + 1]
    inp = None
    if count and x.dtype == acc and x.flags.c_contiguous:
        inp = x.reshape(-1)  # read in place (by the executor or the library): no copy of the whole input
    elif count:
        xp.copyto(work.reshape(x.shape), x, casting="unsafe")
    key = ("reduce_scatter", algorithm, count, x.dtype, op, None, None)
    if algorithm == "mpi":
        counts = [bounds[i + 1] - bounds[i] for i in range(size)]
        mine = xp.empty(hi - lo, dtype=acc)
        send = inp if inp is not None else work[:count]
        mask = nan_mask(send, op)  # the library's MIN/MAX may drop NaN: restore NumPy's rule
        got = numpy.empty(hi - lo, numpy.uint8) if mask is not None else None
        if len(set(counts)) == 1:  # MPI_Reduce_scatter_block: no count vector to check, MPICH's faster form
            args = (send, mine, MPI_OPS[op])
            more = [("Ireduce_scatter_block", (mask, got, MPI.MAX))] if mask is not None else ()
            _library(ctx, key, xp, "Ireduce_scatter_block", args, timeout, more)
        else:
            _library(ctx, key, xp, "Ireduce_scatter", (send, mine, counts, MPI_OPS[op]), timeout,
                     [("Ireduce_scatter", (mask, got, counts, MPI.MAX))] if mask is not None else ())
        restore_nan(mine, got)
        ctx.record("reduce_scatter", "mpi", count, acc, elements=count - count // size, estimated=True)
        if acc == x.dtype:  # the library wrote the result itself: no copy into a new array
            return finish(mine, mine, op, size, xp, True)
        work, lo, hi = mine, 0, hi - lo
    else:
        sched = ctx.schedule(("reduce_scatter", algorithm, count),
                             lambda: segmented(ring_reduce_scatter(rank, size, count)))
        _run(ctx, key, sched, work, ctx.buffer(xp, acc, sched.scratch), getattr(xp, OPS[op]), timeout,
             xp, inp, (lo, hi))
        ctx.record("reduce_scatter", algorithm, count, acc, sched)
    return finish(xp.empty(hi - lo, dtype=x.dtype), work[lo:hi], op, size, xp)


def allgather(x, comm=None, algorithm="ring", timeout=None):
    """Concatenate every rank's ``x`` along axis 0, in rank order (all-gather-v).

    A first exchange of a small int64 signature (shape, dtype and the call fingerprint; one
    ``MPI_Iallreduce``) lets every rank check the inputs agree and size the result before any data
    moves. Steps (ring): P - 1 rounds, in round s rank r
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
    x, _, wrap = adopt(x)
    if wrap is not None:
        return wrap(allgather(x, comm, algorithm, timeout))
    check_algorithm(algorithm, "allgather")
    timeout = check_timeout(timeout)
    x, local_error = _gatherable(x)
    algorithm = _auto("allgather", x) if algorithm == "auto" else algorithm
    ctx = get_context(comm, timeout)
    ctx.check_usable()
    rows = _exchange_signatures(ctx, x, local_error, algorithm, timeout)
    if local_error is not None:
        raise local_error
    _check_signatures(rows, ctx.rank)
    return _gather_blocks(ctx, x, [row[2] for row in rows], algorithm, timeout)


def _gatherable(x):
    """Return ``(x as an array, None)``, or ``(empty array, the error)`` when ``x`` cannot be gathered.

    Checks of ``x`` itself travel in the signature exchange, so a bad array on one rank raises on
    every rank instead of leaving the others waiting for its data.
    """
    try:
        x = as_array(x)
    except TypeError as exc:
        return numpy.zeros(0, numpy.uint8), exc
    if x.dtype not in COPY_DTYPES:
        names = ", ".join(d.name for d in COPY_DTYPES)
        return x, TypeError(f"x has unsupported dtype {x.dtype.name}: expected one of {names}")
    if x.ndim == 0 or x.ndim > _SIG - 2:
        return x, ValueError(f"x must have 1 to {_SIG - 2} dimensions to be gathered along axis 0, not {x.ndim}")
    return x, None


def _exchange_signatures(ctx, x, local_error, algorithm, timeout):
    """All-gather every rank's ``(ndim, dtype index, *shape)`` (``-2`` marks an invalid ``x``).

    One ``MPI_Iallreduce`` (sum) of a P-row table, each rank filling its own row with its signature
    and call fingerprint: the fingerprint check every call pays doubles as the signature all-gather,
    so an all-gather makes two library calls (this and the data), not three. Returns one list per rank.

    Raises
    ------
    CollectiveMismatch
        A rank's call fingerprint differs (another collective, algorithm or call order).
    """
    size, rank = ctx.size, ctx.rank
    table = numpy.zeros(size * _ROW, dtype=numpy.int64)
    row = table[rank * _ROW:(rank + 1) * _ROW]
    row[:_SIG] = -1
    if local_error is None:
        row[:2] = x.ndim, COPY_DTYPES.index(x.dtype)
        row[2:2 + x.ndim] = x.shape
    else:
        row[:2] = -2, -2  # "this rank's x is invalid"
    sig_key = ("allgather-signature", algorithm, size * _ROW, table.dtype, "sum", None, None)
    ctx.begin(sig_key, timeout)
    code = key_code(sig_key) if checks_enabled() else 0
    row[_SIG] = code
    call(ctx, sig_key, "Iallreduce", (MPI.IN_PLACE, table, MPI.SUM), timeout, check=False)
    rows = table.reshape(size, _ROW).tolist()  # tiny: plain Python is faster than NumPy here
    if any(r[_SIG] != code for r in rows):
        err = mismatch(sig_key)
        ctx.fail(f"allgather: {err}")
        raise err
    return [r[:_SIG] for r in rows]


def _check_signatures(rows, rank):
    """Raise on every rank alike when a rank's ``x`` was invalid or the dtypes or trailing shapes differ."""
    bad = [i for i, row in enumerate(rows) if row[0] == -2]
    if bad:
        raise ValueError(f"allgather: rank(s) {', '.join(map(str, bad))} passed an invalid array "
                         "(unsupported dtype or dimensions); see the error on those ranks")
    mine = rows[rank]
    if any(row[1] != mine[1] for row in rows):
        names = sorted({COPY_DTYPES[row[1]].name for row in rows})
        raise TypeError(f"allgather: ranks passed different dtypes ({', '.join(names)})")
    if any(row[0] != mine[0] or row[3:] != mine[3:] for row in rows):
        raise ValueError("allgather: ranks' arrays differ beyond the first dimension: "
                         + "; ".join(f"rank {i} {tuple(row[2:2 + row[0]])}" for i, row in enumerate(rows)))


def _gather_blocks(ctx, x, firsts, algorithm, timeout):
    """Move the blocks (``firsts[r]`` rows from rank ``r``) into one new array, in rank order."""
    xp = get_array_module(x)
    size, rank = ctx.size, ctx.rank
    inner = math.prod(x.shape[1:])
    bounds = [0]
    for f in firsts:
        bounds.append(bounds[-1] + f * inner)
    out = xp.empty((sum(firsts),) + x.shape[1:], dtype=x.dtype)
    flat = out.reshape(-1)
    if x.size:
        xp.copyto(flat[bounds[rank]:bounds[rank + 1]].reshape(x.shape), x)
    key = ("allgather", algorithm, flat.size, x.dtype, None, None, None)
    if algorithm == "mpi":
        counts = [bounds[i + 1] - bounds[i] for i in range(size)]
        # (no second fingerprint: the signature exchange just checked that every rank makes this call)
        if len(set(counts)) == 1:  # MPI_Allgather: MPICH runs it several times faster than Allgatherv
            _library(ctx, key, xp, "Iallgather", (MPI.IN_PLACE, raw(flat)), timeout, check=False)
        else:
            _library(ctx, key, xp, "Iallgatherv", (MPI.IN_PLACE, [raw(flat), counts]), timeout, check=False)
        ctx.record("allgather", "mpi", flat.size, x.dtype, elements=x.size * (size - 1), estimated=True)
        return out
    sched = ctx.schedule(("allgather", algorithm, tuple(bounds)), lambda: segmented(ring_allgather(rank, size, bounds)))
    _run(ctx, key, sched, raw(flat), None, None, timeout, xp)
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
    x, _, wrap = adopt(x)
    if wrap is not None:
        return wrap(broadcast(x, root, comm, algorithm, timeout))
    x, timeout, algorithm = _common(x, None, algorithm, "broadcast", timeout)
    comm = check_comm(comm)
    check_root(root, comm.Get_size())
    if not getattr(getattr(x, "flags", None), "writeable", True) or (
            not hasattr(x, "__cuda_array_interface__") and not isinstance(x, numpy.ndarray)):
        raise ValueError("broadcast writes into x: it must be a writable array")
    ctx = get_context(comm, timeout)
    ctx.check_usable()
    xp = get_array_module(x)
    key = ("broadcast", algorithm, x.size, x.dtype, None, int(root), None)
    work = x.reshape(-1) if x.flags.c_contiguous else ctx.buffer(xp, x.dtype, x.size, "bcast")
    if work.size and not x.flags.c_contiguous and ctx.rank == root:
        xp.copyto(work.reshape(x.shape), x)
    if algorithm == "mpi":
        _library(ctx, key, xp, "Ibcast", (raw(work), root), timeout)
        ctx.record("broadcast", "mpi", x.size, x.dtype, elements=x.size if ctx.rank == root else 0, estimated=True)
    else:
        sched = ctx.schedule(("broadcast", algorithm, x.size, root),
                             lambda: tree_broadcast(ctx.rank, ctx.size, x.size, root))
        _run(ctx, key, sched, raw(work), None, None, timeout, xp)
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
    op : {"sum", "prod", "min", "max", "avg"} or mpi4py.MPI.SUM/PROD/MIN/MAX
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
    x, _, wrap = adopt(x)
    if wrap is not None:
        return wrap(reduce(x, root, comm, op, algorithm, timeout))
    op = op_name(op)
    x, timeout, algorithm = _common(x, op, algorithm, "reduce", timeout)
    comm = check_comm(comm)
    check_root(root, comm.Get_size())
    ctx = get_context(comm, timeout)
    ctx.check_usable()
    xp = get_array_module(x)
    key = ("reduce", algorithm, x.size, x.dtype, op, int(root), None)
    out, work, acc, direct, _ = prepare(x, None, ctx, xp, "work")
    if algorithm == "mpi":
        at_root = ctx.rank == root
        mask = nan_mask(work, op)  # the library's MIN/MAX may drop NaN: restore NumPy's rule
        more = [("Ireduce", (MPI.IN_PLACE if at_root else mask, mask if at_root else None, MPI.MAX, root))] \
            if mask is not None else ()
        _library(ctx, key, xp, "Ireduce", (MPI.IN_PLACE if at_root else work, work if at_root else None,
                                           MPI_OPS[op], root), timeout, more)
        if at_root:
            restore_nan(work, mask)
        ctx.record("reduce", "mpi", x.size, acc, elements=x.size if ctx.rank != root else 0, estimated=True)
    else:
        sched = ctx.schedule(("reduce", algorithm, x.size, root), lambda: tree_reduce(ctx.rank, ctx.size, x.size, root))
        _run(ctx, key, sched, work, ctx.buffer(xp, acc, sched.scratch), getattr(xp, OPS[op]), timeout, xp)
        ctx.record("reduce", algorithm, x.size, acc, sched)
    return finish(out, work, op, ctx.size, xp, direct) if ctx.rank == root else None
