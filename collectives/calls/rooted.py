"""Broadcast and reduce: the rooted collectives, on the binomial-tree schedules or the library's calls.

Argument rules are those of :mod:`collectives.calls.reduce_scatter` (:func:`collectives.arguments.check_collective`); copy-only
broadcast moves raw bytes, so it also takes the types of :data:`collectives.backend.COPY_DTYPES`.
"""
import numpy
from mpi4py import MPI

from collectives.backend import OPS
from commlab.arrays import get_array_module
from collectives.arguments import check_collective, check_comm, check_root
from collectives.schedules.registry import OP_ALGORITHMS
from collectives.engine.buffers import MPI_OPS, adopt, finish, nan_mask, prepare, raw, restore_nan
from collectives.engine.context import get_context, refuse
from collectives.engine.executor import Run, run_schedule
from collectives.library.call import run_library
from collectives.schedules.tree import tree_broadcast, tree_reduce
from collectives.shm import algorithms as shm

__all__ = ["broadcast", "reduce"]


def broadcast(x, *, root=0, comm=None, algorithm="tree", timeout=None):
    """Copy ``x`` from ``root`` into ``x`` on every rank, in place, and return it.

    Steps (tree): binomial tree rooted at ``root``; each rank receives once from its parent then sends
    to its children. Cost: ``ceil(log2 P) (alpha + n beta)``. Source: Thakur et al. 2005, section 4.1.

    Parameters
    ----------
    x : ndarray, any shape, supported dtype, writable
        The data on ``root``; a buffer of the same shape and dtype elsewhere.
    root : int
    comm : mpi4py.MPI.Intracomm, optional
    algorithm : {"tree", "shm", "mpi", "auto"}
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

    Examples
    --------
    >>> import numpy as np
    >>> import collectives
    >>> x = np.array([1.0, 2.0, 3.0])
    >>> collectives.broadcast(x, root=0, algorithm="tree") is x  # written in place
    True
    >>> collectives.broadcast(x, root=1)  # one rank: only root 0 exists
    Traceback (most recent call last):
    ...
    ValueError: root=1 is out of range for a communicator of size 1
    """
    x, _, wrap = adopt(x)
    if wrap is not None:
        return wrap(broadcast(x, root=root, comm=comm, algorithm=algorithm, timeout=timeout))
    try:
        x, _, timeout = check_collective(x, None, algorithm, "broadcast", timeout)
        if algorithm == "auto":
            algorithm = OP_ALGORITHMS["broadcast"][0]
        comm = check_comm(comm)
        check_root(root, comm.Get_size())
        if not getattr(getattr(x, "flags", None), "writeable", True) or (
                not hasattr(x, "__cuda_array_interface__") and not isinstance(x, numpy.ndarray)):
            raise ValueError("broadcast writes into x: it must be a writable array")
    except (ValueError, TypeError) as exc:  # a rank refused alone: the others hear of it in the exchange
        raise refuse("broadcast", exc, comm, timeout) from None
    ctx = get_context(comm, timeout)
    ctx.check_usable()
    xp = get_array_module(x)
    key = ("broadcast", algorithm, x.size, x.dtype, None, int(root), None)
    if algorithm == "shm":
        return shm.broadcast(ctx, key, x, int(root), timeout)
    work = x.reshape(-1) if x.flags.c_contiguous else ctx.buffer(xp, x.dtype, x.size, "bcast")
    if work.size and not x.flags.c_contiguous and ctx.rank == root:
        xp.copyto(work.reshape(x.shape), x)
    if algorithm == "mpi":
        run_library(ctx, key, xp, "Ibcast", (raw(work), root), timeout)
        ctx.record("broadcast", "mpi", x.size, x.dtype, elements=x.size if ctx.rank == root else 0, estimated=True)
    else:
        sched = ctx.schedule(("broadcast", algorithm, x.size, root),
                             lambda: tree_broadcast(ctx.rank, ctx.size, x.size, root))
        run_schedule(ctx, key, Run(sched, ctx.comm, raw(work), name="broadcast"), timeout=timeout, xp=xp)
        ctx.record("broadcast", algorithm, x.size, x.dtype, sched)
    if work.size and not x.flags.c_contiguous:
        xp.copyto(x, work.reshape(x.shape))
    return x


def reduce(x, *, op="sum", root=0, comm=None, algorithm="tree", timeout=None):
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
    algorithm : {"tree", "shm", "mpi", "auto"}
        ``shm``: through shared memory among the ranks of one node (:mod:`collectives.shm`).
    timeout : float, optional

    Returns
    -------
    ndarray or None
        The result (new array, ``x``'s shape and dtype) on ``root``; None on the other ranks.

    Raises
    ------
    ValueError, TypeError
        As for :func:`collectives.allreduce`; ``root`` out of range.

    Examples
    --------
    >>> import numpy as np
    >>> import collectives
    >>> collectives.reduce(np.array([3, 1, 2]), op="min", root=0)
    array([3, 1, 2])
    >>> collectives.reduce(np.array([3, 1, 2]), op="mean")
    Traceback (most recent call last):
    ...
    ValueError: unknown op 'mean': expected one of ...
    """
    x, _, wrap = adopt(x)
    if wrap is not None:
        return wrap(reduce(x, root=root, comm=comm, op=op, algorithm=algorithm, timeout=timeout))
    try:
        x, op, timeout = check_collective(x, op, algorithm, "reduce", timeout)
        if algorithm == "auto":
            algorithm = OP_ALGORITHMS["reduce"][0]
        comm = check_comm(comm)
        check_root(root, comm.Get_size())
    except (ValueError, TypeError) as exc:  # a rank refused alone: the others hear of it in the exchange
        raise refuse("reduce", exc, comm, timeout) from None
    ctx = get_context(comm, timeout)
    ctx.check_usable()
    xp = get_array_module(x)
    key = ("reduce", algorithm, x.size, x.dtype, op, int(root), None)
    if algorithm == "shm":
        return shm.reduce(ctx, key, x, int(root), timeout)
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
        run = Run(sched, ctx.comm, work, scratch=ctx.buffer(xp, acc, sched.scratch), ufunc=getattr(xp, OPS[op]),
                  name="reduce")
        run_schedule(ctx, key, run, timeout=timeout, xp=xp)
        ctx.record("reduce", algorithm, x.size, acc, sched)
    return finish(out, work, op, ctx.size, xp, direct) if ctx.rank == root else None
