"""What the collectives sweep calls at one (op, size): the check data, MPI's answer and every timed call.

:func:`case` builds, for one collective and message size, the integer-valued check data, the oracle
(MPI's own collective called directly, :mod:`experiments.bench.oracle`) and one zero-argument call
per algorithm: commlab's collectives, the reference rows of :mod:`experiments.bench.references` and
MPI's own call made directly (``MPI_Allreduce``, ``MPI_Reduce_scatter``, ``MPI_Allgather``,
``MPI_Bcast``) and its non-blocking form posted and waited at once (``MPI_Iallreduce``,
``MPI_Ireduce_scatter_block``, ``MPI_Iallgather``). Out-of-place calls write a separate output buffer, which is poisoned before each check
(:func:`poison`) so that an algorithm leaving elements unwritten is counted wrong.

In-place calls (nccl-tests' second group of columns) are built where commlab has a separate
in-place form: all-reduce with ``out=x`` for every algorithm of ``collectives.ALGORITHMS``, and
``MPI_Allreduce`` with ``MPI_IN_PLACE``. Broadcast (commlab's and ``MPI_Bcast``) only exists in
place, so its ordinary calls are already in-place ones. Reduce-scatter, all-gather and the other
reference rows have no in-place form here.
"""
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

import collectives
import collectives.engine.context
from collectives.schedules.schedule import chunk_bounds
from experiments.bench.oracle import check_data, oracle_allreduce, raw
from experiments.bench.references import (auto_timeout, finish, gloo, limit, limit_allgather, limit_reduce_scatter,
                                         mpi_persistent, persistent, ring_direct, ring_execute, shm_persistent)

__all__ = ["Case", "MPI_OPS", "case", "poison"]

#: MPI's reduction of each commlab op (``avg`` is MPI's sum, divided afterwards).
MPI_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}

_SPECIAL = {"ring-direct": ring_direct, "ring-execute": ring_execute, "gloo": gloo, "persistent": persistent,
            "auto-timeout": auto_timeout, "MPI_Allreduce_init": mpi_persistent, "limit": limit,
            "shm-persistent": shm_persistent}


@dataclass
class Case:
    """One (op, size) of the sweep on this rank.

    Attributes
    ----------
    count : int
        Elements of the whole vector (all-reduce and reduce-scatter input, all-gather output,
        broadcast buffer).
    ref : ndarray
        MPI's answer on this rank (the oracle).
    calls : dict
        Algorithm -> zero-argument out-of-place call returning its result.
    poisoned : ndarray or None
        The output buffer the out-of-place calls write (None when they return fresh arrays).
    in_place : dict
        Algorithm -> zero-argument in-place call working on ``buffer`` and returning it.
    x : ndarray
        This rank's input (broadcast: the buffer the calls broadcast into, in place).
    buffer : ndarray or None
        The in-place calls' buffer; :meth:`reset` fills it with ``x`` before a check.
    """

    count: int
    ref: np.ndarray
    calls: dict
    poisoned: object
    x: np.ndarray
    in_place: dict = field(default_factory=dict)
    buffer: object = None

    def reset(self):
        """Refill the in-place buffer with this rank's input (before checking an in-place call)."""
        if self.buffer is not None:
            np.copyto(self.buffer, self.x)


def poison(a):
    """Fill ``a`` (when not None) with NaN, or the most negative integer, so unwritten elements show."""
    if a is not None:
        a.fill(np.iinfo(a.dtype).min if a.dtype.kind == "i" else np.nan)


def _names(op, dt, cfg, algorithms):
    names = [a for a in algorithms(op) if (not cfg.algorithms or a in cfg.algorithms)
             and not (a.startswith("MPI_") and dt == np.float16)]
    return names + ([cfg.baseline] if op == "allreduce" and cfg.baseline else [])


def _allreduce(comm, x, names, cfg, P, in_place):
    mop, redop = MPI_OPS[cfg.redop], cfg.redop
    ref, out = oracle_allreduce(comm, x, redop), np.empty_like(x)
    calls = {a: _SPECIAL[a](comm, x, out, redop) if a in _SPECIAL else
             (lambda a=a: collectives.allreduce(x, comm=comm, op=redop, algorithm=a, out=out)) for a in names}

    # the reference rows are the bare library calls: avg's division only where the op needs it
    def direct():
        comm.Allreduce(x, out, mop)
        return finish(out, out, redop, P) if redop == "avg" else out
    def nonblocking():
        comm.Iallreduce(x, out, mop).Wait()
        return finish(out, out, redop, P) if redop == "avg" else out
    calls.update({a: direct for a in names if a == "MPI_Allreduce"})
    calls.update({a: nonblocking for a in names if a == "MPI_Iallreduce"})
    c = Case(x.size, ref, calls, out, x)
    if in_place:
        buf = c.buffer = x.copy()

        def direct_in_place():
            comm.Allreduce(MPI.IN_PLACE, buf, mop)
            return finish(buf, buf, redop, P)
        c.in_place = {a: (lambda a=a: collectives.allreduce(buf, comm=comm, op=redop, algorithm=a, out=buf))
                      for a in names if a in collectives.ALGORITHMS}
        c.in_place.update({a: direct_in_place for a in names if a == "MPI_Allreduce"})
    return c


def _reduce_scatter(comm, x, names, cfg, P, r):
    b = chunk_bounds(x.size, P)
    counts = [b[i + 1] - b[i] for i in range(P)]
    ref, out = oracle_allreduce(comm, x, cfg.redop)[b[r]:b[r + 1]], np.empty(b[r + 1] - b[r], x.dtype)
    calls = {a: (lambda a=a: collectives.reduce_scatter(x, comm=comm, op=cfg.redop, algorithm=a, out=out)) for a in names}

    mop, avg = MPI_OPS[cfg.redop], cfg.redop == "avg"  # the reference rows: the bare library calls

    def direct():
        comm.Reduce_scatter(x, out, counts, mop)
        return finish(out, out, cfg.redop, P) if avg else out

    if x.size % P:  # the block form where the chunks are equal (commlab's library call), else the v form
        def nonblocking():
            comm.Ireduce_scatter(x, out, counts, mop).Wait()
            return finish(out, out, cfg.redop, P) if avg else out
    else:
        def nonblocking():
            comm.Ireduce_scatter_block(x, out, mop).Wait()
            return finish(out, out, cfg.redop, P) if avg else out
    calls.update({a: direct for a in names if a == "MPI_Reduce_scatter"})
    calls.update({a: nonblocking for a in names if a == "MPI_Ireduce_scatter_block"})
    calls.update({a: limit_reduce_scatter(comm, x, out, cfg.redop) for a in names if a == "limit"})
    return Case(x.size, ref, calls, out, x)


def _allgather(comm, x, names, P):
    ref, out = np.empty(x.size * P, x.dtype), np.empty(x.size * P, x.dtype)
    comm.Allgather(raw(x), raw(ref))
    calls = {a: (lambda a=a: collectives.allgather(x, comm=comm, algorithm=a, out=out)) for a in names}

    def direct():
        comm.Allgather(raw(x), raw(out))
        return out

    def nonblocking():
        comm.Iallgather(raw(x), raw(out)).Wait()
        return out
    calls.update({a: direct for a in names if a == "MPI_Allgather"})
    calls.update({a: nonblocking for a in names if a == "MPI_Iallgather"})
    calls.update({a: limit_allgather(comm, x, out) for a in names if a == "limit"})
    return Case(x.size * P, ref, calls, out, x)


def _broadcast(comm, x, names, r):
    ref = x.copy()
    comm.Bcast(raw(ref), 0)
    calls = {a: (lambda a=a: collectives.broadcast(x, root=0, comm=comm, algorithm=a)) for a in names}

    def direct():
        comm.Bcast(raw(x), 0)
        return x
    calls.update({a: direct for a in names if a.startswith("MPI_")})
    return Case(x.size, ref, calls, x if r else None, x)  # the root keeps its data, the others receive into x


def case(op, nbytes, cfg, comm, algorithms, in_place=False):
    """Return the :class:`Case` of ``op`` at ``nbytes`` on this rank, or None when it holds no element.

    Parameters
    ----------
    op : {"allreduce", "reduce_scatter", "allgather", "broadcast"}
    nbytes : int
        Message size in bytes (all-gather's rounded down to P blocks).
    cfg : experiments.bench.sweep_options.BenchConfig
        Its ``dtype``, ``redop``, ``algorithms`` and ``baseline``.
    comm : mpi4py.MPI.Comm
    algorithms : callable
        ``op -> names`` of every algorithm the sweep runs by default for ``op``.
    in_place : bool
        Also build the all-reduce in-place calls.
    """
    P, r, dt = comm.Get_size(), comm.Get_rank(), np.dtype(cfg.dtype)
    count = nbytes // dt.itemsize
    count -= count % P if op == "allgather" else 0
    if count == 0:
        return None
    names = _names(op, dt, cfg, algorithms)
    if not cfg.algorithms and collectives.engine.context.get_context(comm).nodes()[0] != 1:
        names = [a for a in names if a not in ("shm", "shm-persistent")]  # (by default: shm serves one node only)
    x = check_data(0 if op == "broadcast" else r, count // P if op == "allgather" else count, dt, cfg.redop)
    if op == "allreduce":
        return _allreduce(comm, x, names, cfg, P, in_place)
    if op == "reduce_scatter":
        return _reduce_scatter(comm, x, names, cfg, P, r)
    if op == "allgather":
        return _allgather(comm, x, names, P)
    return _broadcast(comm, x, names, r)
