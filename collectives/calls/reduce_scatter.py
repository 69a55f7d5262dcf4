"""Reduce-scatter on the ring schedule or the library's call (broadcast and reduce:
:mod:`collectives.calls.rooted`; all-gather: :mod:`collectives.calls.allgather`).

Rules (chunking, float16, integer ``avg``) are those of :mod:`collectives.calls`. Copy-only
collectives (all-gather, broadcast) move raw bytes, so they also take the byte-sized and unsigned
types of :data:`collectives.backend.COPY_DTYPES` (uint8 blobs, bool masks), and float16 and bfloat16
travel as 2-byte elements there. Every collective takes DLPack tensors (PyTorch, JAX) and gives its
result back in the caller's type (:func:`collectives.engine.buffers.adopt`); ``op`` may be an mpi4py op.
"""
import numpy
from mpi4py import MPI

from collectives.backend import OPS, accumulation_dtype
from commlab.arrays import get_array_module
from collectives.arguments import check_collective, check_comm, check_out, check_timeout
from collectives.schedules.registry import OP_ALGORITHMS
from collectives.engine.buffers import adopt, finish
from collectives.engine.context import get_context, refuse
from collectives.engine.executor import Run, run_schedule
from collectives.engine.fingerprint import checks_enabled, counts_code, debug_enabled
from collectives.errors import CollectiveMismatch
from collectives.schedules.ring import ring_reduce_scatter
from collectives.library.call import settle
from collectives.library.scatter_plan import ScatterPlan, cached_scatter_plan
from collectives.schedules.schedule import chunk_bounds, segmented
from collectives.shm import algorithms as shm

__all__ = ["reduce_scatter"]



#: Largest reduce-scatter input (bytes) that ``auto`` gives to the MPI library (host arrays), at P = 2
#: and at P >= 3.
SCATTER_LIBRARY_MAX = {2: 16384, 3: 262144}


def _auto(x, size):
    """Return what ``auto`` runs for reduce-scatter.

    Reduce-scatter of a host array of at most :data:`SCATTER_LIBRARY_MAX` bytes (16 KiB on 2 ranks,
    256 KiB on more): ``mpi``, whose call is cached (:class:`~collectives.library.scatter_plan.ScatterPlan`);
    above, the ring. Measured through commlab (README
    "Benchmarks"): the library took 0.8x the ring's time at 16 KiB and 1.1-1.5x from 32 KiB on 2
    ranks, 0.55-0.95x from 16 KiB to 256 KiB and 1.2-1.6x from 512 KiB on 4, where the ring's P - 1
    rounds each pay Python's overhead. Otherwise the first hand-made algorithm.
    """
    if not hasattr(x, "__cuda_array_interface__") and x.nbytes <= SCATTER_LIBRARY_MAX[min(max(size, 2), 3)]:
        return "mpi"
    return OP_ALGORITHMS["reduce_scatter"][0]


def _repeated_scatter(x, comm, op, algorithm, timeout, out):
    """Run the cached :class:`~collectives.library.scatter_plan.ScatterPlan` of this call's signature on ``comm``
    (:func:`~collectives.library.scatter_plan.cached_scatter_plan`); None when there is none (the full path runs).

    A repeated call into ``out`` without a deadline, under the settings the plan was made with and
    with nothing in flight, runs the plan's one-frame form (:attr:`ScatterPlan.fast`).
    """
    plan = cached_scatter_plan(x, comm=comm, op=op, algorithm=algorithm, out=out)
    if plan is None:
        return None
    ctx, fast = plan.ctx, plan.fast
    if (fast is not None and out is not None and timeout is None and ctx.broken is None and not ctx.active
            and plan.current()):
        got = fast(x, out)
        if got is not None:
            return got
    return plan.run(ctx, x, None if timeout is None else check_timeout(timeout), out)


def _counts_bounds(counts, size, count):
    """Return ``(bounds, problem)``: the chunk boundaries of ``counts`` (None: ``numpy.array_split``'s) and
    what is wrong with ``counts`` (None when nothing is)."""
    if counts is None:
        return chunk_bounds(count, size), None
    try:
        values = [int(c) for c in counts]
        exact = all(isinstance(c, (int, numpy.integer)) and not isinstance(c, (bool, numpy.bool_)) for c in counts)
    except (TypeError, ValueError):
        return None, f"counts must be a sequence of {size} ints >= 0, got {counts!r}"
    if not exact or len(values) != size or min(values, default=0) < 0:
        return None, f"counts must be {size} ints >= 0 (one per rank), got {list(counts)!r}"
    if sum(values) != count:
        return None, f"counts add up to {sum(values)}, x has {count} elements"
    bounds = [0]
    for c in values:
        bounds.append(bounds[-1] + c)
    return tuple(bounds), None


def _agree_counts(ctx, key, acc, timeout, problem):
    """Compare the counts of every rank before any data moves (the 2-element fingerprint all-reduce of
    ``key``, whose last field carries them): :class:`CollectiveMismatch` on every rank when they differ;
    ``ValueError`` on a rank whose own counts are malformed (the others then see the mismatch)."""
    try:
        settle(ctx, key, acc, timeout, always=True)
    except CollectiveMismatch:
        if problem is not None:
            raise ValueError(problem) from None
        raise
    if problem is not None:
        raise ValueError(problem)


def reduce_scatter(x, *, counts=None, op="sum", comm=None, algorithm="ring", out=None, timeout=None):
    """Reduce ``x`` across ranks and return this rank's chunk of the flattened result.

    Steps (ring): P - 1 rounds; in round s rank r sends chunk (r - s - 1) mod P to r + 1 and adds
    chunk (r - s - 2) mod P from r - 1. Cost: ``(P-1) alpha + (P-1)/P n (beta + gamma)``. Source:
    Patarasuk and Yuan 2009, section 3. With ``counts`` (reduce-scatter-v, MPI's
    ``MPI_Reduce_scatter`` with ``recvcounts``) chunk r holds ``counts[r]`` elements instead.

    Parameters
    ----------
    x : ndarray, any shape, supported dtype
        This rank's contribution; same size and dtype everywhere. It is flattened (C order).
    counts : sequence of int, optional
        Elements of each rank's chunk, ``P`` ints >= 0 adding up to ``x.size`` (zeros allowed), the
        same on every rank; default: the ``numpy.array_split`` chunks. The ranks compare their counts
        (one 2-element all-reduce; in debug mode, the fingerprint exchange) before any data moves. ``ring`` and ``mpi`` (and ``auto``) take them.
    comm : mpi4py.MPI.Intracomm, optional
    op : {"sum", "prod", "min", "max", "avg"} or mpi4py.MPI.SUM/PROD/MIN/MAX
    algorithm : {"ring", "shm", "mpi", "auto"}
        ``shm``: through shared memory among the ranks of one node (:mod:`collectives.shm`).
    timeout : float, optional
        Seconds per round before :class:`CollectiveTimeout`.
    out : ndarray or DLPack tensor, optional
        Result buffer of shape (chunk_r,) and ``x``'s dtype, written and returned (the library writes
        into it directly when it is contiguous and needs no cast); default: a new array per call.

    Returns
    -------
    ndarray, shape (chunk_r,), x.dtype
        Chunk ``r`` of the ``numpy.array_split(result, P)`` chunks (73 elements on 4 ranks: 19, 18, 18, 18),
        or elements ``sum(counts[:r])`` to ``sum(counts[:r + 1])`` of the result with ``counts``.

    Raises
    ------
    ValueError, TypeError
        As for :func:`collectives.allreduce`; ``ValueError`` for ``counts`` that are not P ints >= 0
        adding up to ``x.size``, or with an algorithm that does not take them.
    CollectiveMismatch
        On every rank, when the ranks' ``counts`` differ (before any data moves).

    Examples
    --------
    On one rank the only chunk is the whole flattened sum:

    >>> import numpy as np
    >>> import collectives
    >>> collectives.reduce_scatter(np.arange(6.0).reshape(2, 3), op="sum")
    array([0., 1., 2., 3., 4., 5.])
    >>> out = np.empty(4, dtype=np.int64)
    >>> collectives.reduce_scatter(np.ones(4, dtype=np.int64), algorithm="mpi", out=out) is out
    True
    >>> collectives.reduce_scatter(np.ones(4), out=np.empty(3))
    Traceback (most recent call last):
    ...
    ValueError: out has shape (3,), expected (4,)
    >>> collectives.reduce_scatter(np.arange(3.0), counts=[3])  # reduce-scatter-v: one rank, all of it
    array([0., 1., 2.])
    """
    if type(x) is numpy.ndarray and type(op) is str and counts is None:
        got = _repeated_scatter(x, comm, op, algorithm, timeout, out)  # a repeated call: its cached plan
        if got is not None:
            return got
    x, out, wrap = adopt(x, out)
    if wrap is not None:
        return wrap(reduce_scatter(x, counts=counts, comm=comm, op=op, algorithm=algorithm, timeout=timeout,
                                   out=out))
    given = algorithm
    try:
        comm = check_comm(comm)
        x, op, timeout = check_collective(x, op, algorithm, "reduce_scatter", timeout)
        if algorithm == "auto":
            algorithm = _auto(x, comm.Get_size())
        if counts is not None and algorithm not in ("ring", "mpi"):
            raise ValueError(f"counts: algorithm {algorithm!r} does not take counts; ring and mpi do")
        chunks, problem = _counts_bounds(counts, comm.Get_size(), x.size)
        if problem is not None and debug_enabled():  # the fingerprint exchange compares the counts
            raise ValueError(problem)
        if problem is None:
            check_out(out, x, (chunks[comm.Get_rank() + 1] - chunks[comm.Get_rank()],))
    except (ValueError, TypeError) as exc:  # a rank refused alone: the others hear of it (debug mode)
        raise refuse("reduce_scatter", exc, comm, timeout) from None
    ctx = get_context(comm, timeout)
    ctx.check_usable()
    xp = get_array_module(x)
    count, size, rank = x.size, ctx.size, ctx.rank
    key = ("reduce_scatter", algorithm, count, x.dtype, op, None, None if counts is None else counts_code(counts))
    if counts is not None and not debug_enabled():  # (debug mode: the call's fingerprint exchange compares them first)
        _agree_counts(ctx, key, accumulation_dtype(x.dtype), timeout, problem)
    if algorithm == "shm":
        return shm.reduce_scatter(ctx, key, x, out, timeout)
    if algorithm == "mpi":  # planned once; host plans are run again by later calls of this signature
        plan = ScatterPlan(ctx, x, op, key, None if counts is None else chunks)
        if xp is numpy and counts is None:
            ctx.keep(("reduce_scatter", given, op, x.dtype, x.shape, checks_enabled()), plan)
        return plan.run(ctx, x, timeout, out)
    bounds = chunks
    acc = accumulation_dtype(x.dtype)
    work = ctx.buffer(xp, acc, count, "rs-work")
    lo, hi = bounds[rank], bounds[rank + 1]
    inp = None
    if count and x.dtype == acc and x.flags.c_contiguous:
        inp = x.reshape(-1)  # read in place (by the executor or the library): no copy of the whole input
    elif count:
        xp.copyto(work.reshape(x.shape), x, casting="unsafe")
    sched = ctx.schedule(("reduce_scatter", algorithm, count) + (() if counts is None else (bounds,)),
                         lambda: segmented(ring_reduce_scatter(rank, size, count, None if counts is None else bounds)))
    run = Run(sched, ctx.comm, work, scratch=ctx.buffer(xp, acc, sched.scratch), ufunc=getattr(xp, OPS[op]),
              name="reduce_scatter").read_from(inp, (lo, hi))
    run_schedule(ctx, key, run, timeout=timeout, xp=xp)
    ctx.record("reduce_scatter", algorithm, count, acc, sched)
    return finish(xp.empty(hi - lo, dtype=x.dtype) if out is None else out, work[lo:hi], op, size, xp)
