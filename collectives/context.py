"""Per-communicator library context: duplicated communicator, caches, message tags and statistics.

The first collective called on a communicator duplicates it (``Comm.Dup``, itself collective), so
commlab's messages never match the user's. Schedules are cached by (collective, algorithm, P, count,
...), scratch buffers by dtype, and every call records what it sent in :func:`last_stats`.
"""
import numpy
from mpi4py import MPI

from .backend import DeviceTransport, cuda_aware

__all__ = ["get_context", "check_comm", "has_context", "last_stats", "total_stats", "free_context", "Context"]

_KEYVAL = [None]  # MPI attribute key, created on first use


class Context:
    """Library state for one user communicator.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The user's communicator; it is duplicated, the duplicate carries every message.

    Attributes
    ----------
    comm : mpi4py.MPI.Comm
        The duplicate.
    rank, size : int
    last : tuple or None
        Statistics of the most recent collective (see :func:`last_stats`).
    calls, bytes_sent, messages : int
        Running totals (see :func:`total_stats`).
    """

    __slots__ = ("comm", "rank", "size", "_seq", "_tag_ub", "active", "_schedules", "_buffers", "_transports", "_nodes",
                 "broken", "last", "calls", "bytes_sent", "messages")

    def __init__(self, comm):
        self.comm = comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._seq = 0
        self.active = set()  # non-blocking requests in flight on this communicator
        self._tag_ub = int(self.comm.Get_attr(MPI.TAG_UB) or 32767)
        self._schedules = {}
        self._buffers = {}
        self._transports = {}
        self._nodes = None
        self.broken = None
        self.last = None
        self.calls = self.bytes_sent = self.messages = 0

    def check_usable(self):
        """Raise ``RuntimeError`` when an earlier timeout left this context with messages in flight."""
        if self.broken is not None:
            raise RuntimeError(f"this communicator's collectives are unusable after an earlier failure "
                               f"({self.broken}); abort the job or call collectives.free_context(comm)")

    def progress(self):
        """Advance every non-blocking request in flight here (called while a blocking call waits)."""
        for req in list(self.active):
            req._advance()

    def fail(self, message):
        """Mark the context unusable after a timeout left messages in flight."""
        self.broken = message

    def next_tag(self):
        """Return the tag for the next collective; every rank calls collectives in the same order.

        Tags cycle through ``1 .. MPI_TAG_UB`` (536,870,911 with MPICH), so a non-blocking collective
        would have to stay in flight across that many later calls to meet its own tag again.
        """
        self._seq = self._seq % self._tag_ub + 1
        return self._seq

    def schedule(self, key, build):
        """Return the cached schedule for ``key``, building it with ``build()`` the first time."""
        sched = self._schedules.get(key)
        if sched is None:
            if len(self._schedules) > 4096:
                self._schedules.clear()
            sched = self._schedules[key] = build()
        return sched

    def buffer(self, xp, dtype, n, slot="scratch"):
        """Return a cached 1-D buffer view of ``n`` elements (contents undefined), grown as needed."""
        key = (xp.__name__, numpy.dtype(dtype), slot)
        buf = self._buffers.get(key)
        if buf is None or buf.size < n:
            buf = self._buffers[key] = xp.empty(max(n, 1), dtype=dtype)
        return buf[:n]

    def transport(self, xp):
        """Return the :class:`DeviceTransport` for array module ``xp`` (None for NumPy)."""
        if xp is numpy:
            return None
        t = self._transports.get(xp.__name__)
        if t is None:
            t = self._transports[xp.__name__] = DeviceTransport(xp, cuda_aware())
        return t

    def nodes(self):
        """Return (number of nodes, ranks per node or 0 when uneven) from ``Split_type(COMM_TYPE_SHARED)``.

        Collective on first use (all ranks call it from the same collective).
        """
        if self._nodes is None:
            local = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
            per = local.Get_size()
            local.Free()
            low, high = numpy.array([per], numpy.int64), numpy.array([per], numpy.int64)
            self.comm.Allreduce(MPI.IN_PLACE, low, MPI.MIN)
            self.comm.Allreduce(MPI.IN_PLACE, high, MPI.MAX)
            even = low[0] == high[0] and self.size % per == 0
            self._nodes = (self.size // per, per) if even else (0, 0)
        return self._nodes

    def record(self, op, algorithm, count, dtype, schedule=None, elements=None, estimated=False):
        """Store the statistics of the collective that just ran (cheap: the dict is built on demand)."""
        if schedule is not None:
            elements, messages, rounds = schedule.elements_sent, schedule.messages, len(schedule.rounds)
        else:
            messages, rounds = None, None
        nbytes = elements * dtype.itemsize
        self.last = (op, algorithm, count, dtype, nbytes, messages, rounds, estimated)
        self.calls += 1
        self.bytes_sent += nbytes
        self.messages += messages or 0


def check_comm(comm):
    """Return ``comm`` (``COMM_WORLD`` for None); ``TypeError`` unless it is an mpi4py intracommunicator."""
    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"comm must be an mpi4py intracommunicator, not {type(comm).__name__}"
                        + (" (COMM_NULL)" if isinstance(comm, MPI.Comm) else ""))
    return comm


def _on_free(comm, keyval, ctx):
    """Free a context's duplicate when the user's communicator is freed (attribute delete callback)."""
    if ctx is not None and ctx.broken is None and ctx.comm != MPI.COMM_NULL:
        ctx.comm.Free()
    return MPI.SUCCESS


def _keyval():
    """Return the MPI attribute key under which each communicator caches its context."""
    if _KEYVAL[0] is None:
        _KEYVAL[0] = MPI.Comm.Create_keyval(delete_fn=_on_free)
    return _KEYVAL[0]


def get_context(comm=None):
    """Return the :class:`Context` of ``comm`` (default ``COMM_WORLD``), creating it on first use.

    The context is cached on the communicator itself as an MPI attribute (``MPI_Comm_set_attr``), the
    standard place for a library's per-communicator state: it disappears with ``comm.Free()``, so a new
    communicator that happens to reuse a freed handle never inherits a stale context, and ``Dup`` of
    the user's communicator does not copy it.
    """
    comm = check_comm(comm)
    key = _keyval()
    ctx = comm.Get_attr(key)
    if ctx is None:
        ctx = Context(comm)
        comm.Set_attr(key, ctx)
    return ctx


def free_context(comm=None):
    """Drop the cached context of ``comm`` (its duplicate is freed locally, without messages)."""
    comm = check_comm(comm)
    if comm.Get_attr(_keyval()) is not None:
        comm.Delete_attr(_keyval())  # the delete callback frees the duplicate


def has_context(comm):
    """Return True when ``comm`` already carries a commlab context (no message is sent)."""
    return check_comm(comm).Get_attr(_keyval()) is not None


def last_stats(comm=None):
    """Return statistics of the most recent collective on ``comm`` by this rank.

    Returns
    -------
    dict
        ``op``, ``algorithm`` (resolved, never "auto"), ``count`` (elements), ``dtype`` (on the wire),
        ``bytes_sent`` (bytes this rank sent, counted from the schedule as executed), ``messages``,
        ``rounds`` and ``estimated`` (True for ``mpi``, whose internal traffic is not visible: its
        bytes are the ring algorithm's ``2 (P-1)/P n``). Empty before the first call.
    """
    last = get_context(comm).last
    if last is None:
        return {}
    keys = ("op", "algorithm", "count", "dtype", "bytes_sent", "messages", "rounds", "estimated")
    out = dict(zip(keys, last))
    out["dtype"], out["bytes_sent"] = numpy.dtype(out["dtype"]).name, int(out["bytes_sent"])
    return out


def total_stats(comm=None):
    """Return running totals (``calls``, ``bytes_sent``, ``messages``) of this rank's collectives."""
    ctx = get_context(comm)
    return {"calls": ctx.calls, "bytes_sent": int(ctx.bytes_sent), "messages": ctx.messages}
