"""Reduce-scatter, broadcast and reduce, on the same schedules and executor (all-gather:
:mod:`collectives.gather`).

Rules (chunking, float16, integer ``avg``) are those of :mod:`collectives.api`. Copy-only
collectives (all-gather, broadcast) move raw bytes, so they also take the byte-sized and unsigned
types of :data:`collectives.COPY_DTYPES` (uint8 blobs, bool masks), and float16 and bfloat16
travel as 2-byte elements there. Every collective takes DLPack tensors (PyTorch, JAX) and gives its
result back in the caller's type (:func:`collectives.buffers.adopt`); ``op`` may be an mpi4py op.
"""
import numpy
from mpi4py import MPI

from .backend import (COPY_DTYPES, DTYPES, OPS, accumulation_dtype, check_dtype, check_op, check_root, check_timeout,
                      get_array_module, op_name)
from .library import run_library
from .algorithms import check_algorithm, names
from .buffers import MPI_OPS, adopt, as_array, check_out, finish, nan_mask, prepare, raw, restore_nan
from .context import check_comm, existing_context, get_context
from .executor import run_schedule
from .fingerprint import checks_enabled
from .ring import ring_reduce_scatter
from .scatter import ScatterPlan
from .schedule import chunk_bounds, segmented
from .tree import tree_broadcast, tree_reduce

__all__ = ["OP_ALGORITHMS", "reduce_scatter", "broadcast", "reduce"]

#: Algorithms available to each collective besides all-reduce ("auto" picks the first), from the registry.
OP_ALGORITHMS = {name: names(name) for name in ("reduce_scatter", "allgather", "broadcast", "reduce")}


def _common(x, op, algorithm, name, timeout, size):
    check_algorithm(algorithm, name)
    if name != "broadcast":  # every reducing collective needs an op; None is not "no reduction"
        check_op(op)
    x = as_array(x)
    check_dtype(x.dtype, allowed=DTYPES if name != "broadcast" else COPY_DTYPES)
    timeout = check_timeout(timeout)
    return x, timeout, _auto(name, x, size) if algorithm == "auto" else algorithm


#: Largest reduce-scatter input (bytes) that ``auto`` gives to the MPI library (host arrays), at P = 2
#: and at P >= 3.
SCATTER_LIBRARY_MAX = {2: 16384, 3: 262144}


def _auto(name, x, size):
    """Return what ``auto`` runs for reduce-scatter, broadcast and reduce.

    Reduce-scatter of a host array of at most :data:`SCATTER_LIBRARY_MAX` bytes (16 KiB on 2 ranks,
    256 KiB on more): ``mpi``, whose call is cached (:class:`~collectives.scatter.ScatterPlan`);
    above, the ring. Measured through commlab (README
    "Benchmarks"): the library took 0.8x the ring's time at 16 KiB and 1.1-1.5x from 32 KiB on 2
    ranks, 0.55-0.95x from 16 KiB to 256 KiB and 1.2-1.6x from 512 KiB on 4, where the ring's P - 1
    rounds each pay Python's overhead. Otherwise the first hand-made algorithm.
    """
    if (name == "reduce_scatter" and not hasattr(x, "__cuda_array_interface__")
            and x.nbytes <= SCATTER_LIBRARY_MAX[min(max(size, 2), 3)]):
        return "mpi"
    return OP_ALGORITHMS[name][0]


def _repeated_scatter(x, comm, op, algorithm, timeout, out):
    """Run the cached :class:`~collectives.scatter.ScatterPlan` of this call's signature on ``comm``; None when there is none
    or ``out`` is not a plain writable array of the chunk's shape and ``x``'s dtype (the full path runs)."""
    ctx = existing_context(comm)
    if ctx is None:
        return None
    plan = ctx.fast.get(("reduce_scatter", algorithm, op, x.dtype, x.shape, checks_enabled()))
    if plan is None:
        return None
    if out is not None and (type(out) is not numpy.ndarray or out.shape != (plan.chunk,) or out.dtype != x.dtype
                            or not out.flags.writeable):
        return None
    return plan.run(ctx, x, check_timeout(timeout), out)


def reduce_scatter(x, comm=None, op="sum", algorithm="ring", timeout=None, out=None):
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
    out : ndarray or DLPack tensor, optional
        Result buffer of shape (chunk_r,) and ``x``'s dtype, written and returned (the library writes
        into it directly when it is contiguous and needs no cast); default: a new array per call.

    Returns
    -------
    ndarray, shape (chunk_r,), x.dtype
        Chunk ``r`` of the ``numpy.array_split(result, P)`` chunks (73 elements on 4 ranks: 19, 18, 18, 18).

    Raises
    ------
    ValueError, TypeError
        As for :func:`collectives.allreduce`.
    """
    if type(x) is numpy.ndarray and type(op) is str:
        got = _repeated_scatter(x, comm, op, algorithm, timeout, out)  # a repeated call: its cached plan
        if got is not None:
            return got
    x, out, wrap = adopt(x, out)
    if wrap is not None:
        return wrap(reduce_scatter(x, comm, op, algorithm, timeout, out))
    op = op_name(op)
    given = algorithm
    comm = check_comm(comm)
    x, timeout, algorithm = _common(x, op, algorithm, "reduce_scatter", timeout, comm.Get_size())
    chunks = chunk_bounds(x.size, comm.Get_size())
    check_out(out, x, (chunks[comm.Get_rank() + 1] - chunks[comm.Get_rank()],))
    ctx = get_context(comm, timeout)
    ctx.check_usable()
    xp = get_array_module(x)
    count, size, rank = x.size, ctx.size, ctx.rank
    key = ("reduce_scatter", algorithm, count, x.dtype, op, None, None)
    if algorithm == "mpi":  # planned once; host plans are run again by later calls of this signature
        plan = ScatterPlan(ctx, x, op, key)
        if xp is numpy:
            ctx.keep(("reduce_scatter", given, op, x.dtype, x.shape, checks_enabled()), plan)
        return plan.run(ctx, x, timeout, out)
    bounds = chunk_bounds(count, size)
    acc = accumulation_dtype(x.dtype)
    work = ctx.buffer(xp, acc, count, "rs-work")
    lo, hi = bounds[rank], bounds[rank + 1]
    inp = None
    if count and x.dtype == acc and x.flags.c_contiguous:
        inp = x.reshape(-1)  # read in place (by the executor or the library): no copy of the whole input
    elif count:
        xp.copyto(work.reshape(x.shape), x, casting="unsafe")
    sched = ctx.schedule(("reduce_scatter", algorithm, count), lambda: segmented(ring_reduce_scatter(rank, size, count)))
    run_schedule(ctx, key, sched, work, ctx.buffer(xp, acc, sched.scratch), getattr(xp, OPS[op]), timeout, xp, inp,
                 (lo, hi))
    ctx.record("reduce_scatter", algorithm, count, acc, sched)
    return finish(xp.empty(hi - lo, dtype=x.dtype) if out is None else out, work[lo:hi], op, size, xp)


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
    x, timeout, algorithm = _common(x, None, algorithm, "broadcast", timeout, 0)
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
        run_library(ctx, key, xp, "Ibcast", (raw(work), root), timeout)
        ctx.record("broadcast", "mpi", x.size, x.dtype, elements=x.size if ctx.rank == root else 0, estimated=True)
    else:
        sched = ctx.schedule(("broadcast", algorithm, x.size, root),
                             lambda: tree_broadcast(ctx.rank, ctx.size, x.size, root))
        run_schedule(ctx, key, sched, raw(work), None, None, timeout, xp)
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
    x, timeout, algorithm = _common(x, op, algorithm, "reduce", timeout, 0)
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
        run_library(ctx, key, xp, "Ireduce", (MPI.IN_PLACE if at_root else work, work if at_root else None,
                                           MPI_OPS[op], root), timeout, more)
        if at_root:
            restore_nan(work, mask)
        ctx.record("reduce", "mpi", x.size, acc, elements=x.size if ctx.rank != root else 0, estimated=True)
    else:
        sched = ctx.schedule(("reduce", algorithm, x.size, root), lambda: tree_reduce(ctx.rank, ctx.size, x.size, root))
        run_schedule(ctx, key, sched, work, ctx.buffer(xp, acc, sched.scratch), getattr(xp, OPS[op]), timeout, xp)
        ctx.record("reduce", algorithm, x.size, acc, sched)
    return finish(out, work, op, ctx.size, xp, direct) if ctx.rank == root else None
