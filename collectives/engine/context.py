"""Per-communicator library context: duplicated communicator, caches, message tags and statistics.

The first collective called on a communicator duplicates it (``Comm.Dup``, itself collective), so
commlab's messages never match the user's. Schedules are cached by (collective, algorithm, P, count,
...), scratch buffers by dtype, and every call records what it sent in :func:`last_stats`.
"""
import os
from dataclasses import dataclass

import numpy
from mpi4py import MPI

from collectives.engine.fingerprint import TagSpace, debug_enabled, exchange
from collectives.backend import DeviceTransport, cuda_aware, mpi_library_key
from collectives.engine.failures import process_failed, revoke, ulfm_enabled
from collectives.arguments import check_comm, check_timeout
from collectives.errors import CollectiveError
from collectives.engine.waiting import Where, deadline_of, wait_all

__all__ = ["get_context", "has_context", "CallRecord", "last_stats", "total_stats", "free_context", "Context",
           "context_keyval", "existing_context", "refuse"]

#: Collectives whose fingerprint is all-gathered before every call, in every mode.
_ROOTED = frozenset(("broadcast", "reduce"))

_KEYVAL = [None]  # MPI attribute key, created on first use
_LAST = [None, None]  # (communicator object, its context) of the last existing_context hit


class Context:
    """Library state for one user communicator.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The user's communicator; it is duplicated, the duplicate carries every message.
    timeout : float, optional
        Seconds the duplication may wait for the other ranks.

    Attributes
    ----------
    comm : mpi4py.MPI.Comm
        The duplicate.
    rank, size : int
    last : CallRecord or None
        The record of the most recent collective (see :func:`last_stats`).
    calls, bytes_sent, messages : int
        Running totals (see :func:`total_stats`).
    plans, fast : dict
        Persistent library plans of repeated small all-reduces and the call signatures that reuse
        them (see :mod:`collectives.library.plans`).
    agreed : numpy.dtype or None
        Element type of the last library call every rank made alike (see
        :func:`collectives.library.call.settle`).
    """

    __slots__ = ("comm", "rank", "size", "_seq", "tags", "active", "_schedules", "_buffers", "_transports", "_nodes",
                 "broken", "last", "calls", "bytes_sent", "messages", "plans", "fast", "fp", "agreed", "parent")

    def __init__(self, comm, timeout=None):
        dup, req = comm.Idup()  # non-blocking, so a first call with a timeout cannot hang here
        # (after a timeout the pending duplicate must not be touched, not even freed, until it completes)
        try:
            wait_all([req], [None], deadline_of(timeout), Where("collective", 0, "duplicating the communicator",
                                                                  timeout))
        except MPI.Exception as exc:  # under ULFM, a member already dead (Open MPI 5 says MPI_ERR_INTERN)
            if ulfm_enabled():
                raise process_failed(exc, comm, "collective", phase="duplicating the communicator") from None
            raise
        self.comm, self.parent = dup, comm  # the parent is revoked with the duplicate (collectives.engine.failures)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._seq = 0
        self.active = set()  # non-blocking requests in flight on this communicator
        self.tags = TagSpace(self.comm.Get_attr(MPI.TAG_UB) or 32767)
        self._schedules = {}
        self._buffers = {}
        self._transports = {}
        self._nodes = self._find_nodes(timeout)
        self.broken = None
        self.last = None
        self.calls = self.bytes_sent = self.messages = 0
        self.plans = {}  # (call key, shape) -> persistent library plan (collectives.library.plans)
        self.fast = {}  # call signature as given -> (plan, tuning table in force), for repeated calls
        self.fp = numpy.zeros(2, numpy.int64)  # the fingerprint pair of a blocking library call (one at a time)
        # element type of the last library call every rank was seen to make alike: only data of this
        # type are posted beside their check (collectives.library.call.settle); None before the first
        self.agreed = None

    def keep(self, signature, entry):
        """Cache ``entry`` (a plan) under a call ``signature`` for the repeated calls of :attr:`fast`,
        emptying the cache first past 1,024 signatures; return ``entry``."""
        if len(self.fast) > 1024:
            self.fast.clear()
        self.fast[signature] = entry
        return entry

    def check_usable(self):
        """Raise ``RuntimeError`` when an earlier failure left this context with messages in flight."""
        if self.broken is not None:
            raise RuntimeError(f"this communicator's collectives are unusable after an earlier failure "
                               f"({self.broken}); messages of that call may still arrive and the ranks no "
                               f"longer agree on the call order: end the job (collectives.engine.policy.abort_on_failure)")

    def progress(self):
        """Advance every non-blocking request in flight here (called while a blocking call waits)."""
        for req in list(self.active):
            req._advance()

    def fail(self, message):
        """Mark the context unusable after a timeout left messages in flight.

        Under ULFM, when the failure revoked the duplicate (a dead process:
        :func:`collectives.engine.failures.process_failed`), the user's communicator is revoked too,
        so that a rank waiting in a call of its own on it fails as well instead of waiting forever.
        """
        self.broken = message
        if ulfm_enabled() and self.comm.Is_revoked():
            revoke(self.parent)

    def begin(self, key, timeout=None):
        """Start the next call, described by ``key``, and return the tag of its messages.

        The tag carries the call's fingerprint and sequence number (:mod:`collectives.engine.fingerprint`),
        so messages of calls that differ never match. In debug mode (``COMMLAB_DEBUG=detail``) the
        full fingerprint is first all-gathered and compared.

        Parameters
        ----------
        key : tuple
            ``(collective, algorithm, count, dtype, op, root, grid)``, algorithm resolved.
        timeout : float, optional
            Seconds the debug-mode exchange may wait.

        Raises
        ------
        CollectiveMismatch
            Debug mode, or a rooted call (broadcast, reduce, whose fingerprint is always exchanged):
            the ranks' fingerprints differ (raised on every rank).
        """
        self.advance(key, timeout)
        return self.tags.tag(key, self._seq)

    def advance(self, key, timeout=None):
        """Start the next call, described by ``key``, without a message tag (the library path: MPI
        matches its own collectives in call order, and the fingerprint travels with the data).

        Raises
        ------
        CollectiveMismatch
            Debug mode, or a rooted call (broadcast, reduce), as for :meth:`begin`.
        """
        self._seq += 1
        # rooted calls always exchange their fingerprint: ranks that each take themselves for the
        # root only send, so no message would ever reveal the disagreement (a silent wrong answer)
        if self.size > 1 and (key[0] in _ROOTED or debug_enabled()):
            try:
                exchange(self.comm, key, self._seq, timeout, self.progress if self.active else None)
            except Exception as exc:
                self.fail(f"{key[0]}: {exc}")
                raise

    def refused(self, collective, reason, timeout=None):
        """Count a call this rank refused (its arguments failed their checks) in debug mode, joining its
        fingerprint exchange marked refused with ``reason``, so that the other ranks raise
        :class:`~collectives.errors.CollectiveMismatch` naming this rank instead of waiting for it.

        Nothing is raised here: the caller raises its own error next. When some rank did not
        refuse (its call raises the mismatch and fails its context), or the exchange failed, this
        context is failed too, as theirs are; when every rank refused, nothing changes.
        """
        self._seq += 1
        if self.size > 1:
            try:
                exchange(self.comm, (collective,), self._seq, timeout, self.progress if self.active else None,
                         refused=reason)
            except (CollectiveError, MPI.Exception) as exc:
                self.fail(f"{collective}: refused on this rank ({reason}); {exc}")

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
        """Return (number of nodes, ranks per node or 0 when uneven), found when the context was made."""
        return self._nodes

    def levels(self):
        """Return the job's three levels: (racks, nodes per rack, ranks per node).

        Nodes and ranks per node are :meth:`nodes`; racks come from ``COMMLAB_RACKS`` (set by the
        emulated cluster's ``--racks``, or by a user who knows the machine room), 1 without it.
        ``(0, 0, 0)`` when the nodes hold different numbers of ranks.

        Raises
        ------
        ValueError
            ``COMMLAB_RACKS`` is not a positive integer that divides the number of nodes (the same
            environment on every rank: raised on every rank alike).
        """
        nodes, per = self._nodes
        text = os.environ.get("COMMLAB_RACKS", "1").strip() or "1"
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"COMMLAB_RACKS={text!r}: expected a positive number of racks")
        if not nodes:
            return (0, 0, 0)
        racks = int(text)
        if nodes % racks:
            raise ValueError(f"COMMLAB_RACKS={racks} does not divide the job's {nodes} nodes")
        return racks, nodes // racks, per

    def _find_nodes(self, timeout):
        """Count the nodes with ``Split_type(COMM_TYPE_SHARED)`` right after the duplication.

        ``MPI_Comm_split_type`` has no non-blocking form, so it runs here, where the completed
        ``MPI_Comm_idup`` has just shown that every rank is in the same call; the agreement on the
        count is a non-blocking all-reduce waited under ``timeout``.
        """
        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        per = local.Get_size()
        local.Free()
        both = numpy.array([per, -per], numpy.int64)  # max(per) and -min(per) in one call
        req = self.comm.Iallreduce(MPI.IN_PLACE, both, MPI.MAX)
        wait_all([req], [None], deadline_of(timeout), Where("collective", 0, "finding the nodes", timeout))
        high, low = int(both[0]), -int(both[1])
        even = low == high and self.size % per == 0
        return (self.size // per, per) if even else (0, 0)

    def record(self, collective, algorithm, count, dtype, schedule=None, elements=None, estimated=False):
        """Count the collective that just ran: make its :class:`CallRecord`, keep it as :attr:`last`, add it to
        the running totals, and return it (the call's own record of what it sent).

        Parameters
        ----------
        collective : str
            ``"allreduce"``, ``"reduce_scatter"``, ``"allgather"``, ``"broadcast"`` or ``"reduce"``.
        algorithm : str
            The algorithm that ran (resolved, never ``"auto"``).
        count : int
            Elements of the call's input.
        dtype : numpy.dtype
            Element type on the wire.
        schedule : Schedule, optional
            The schedule as executed: its elements sent, messages and rounds are counted.
        elements : int, optional
            Elements this rank sent, without a schedule (the library's, the shared-memory algorithm's).
        estimated : bool
            True when ``elements`` is an estimate (the MPI library's internal traffic is not visible).
        """
        if schedule is not None:
            elements, messages, rounds = schedule.elements_sent, schedule.messages, len(schedule.rounds)
        else:
            messages, rounds = None, None
        record = CallRecord(collective, algorithm, count, dtype, int(elements * dtype.itemsize), messages, rounds,
                            estimated)
        self.count(record)
        return record

    def count(self, record):
        """Keep ``record`` (a :class:`CallRecord`, made once by a cached plan) as :attr:`last` and add it to the totals."""
        self.last = record
        self.calls += 1
        self.bytes_sent += record.bytes_sent
        self.messages += record.messages or 0


@dataclass(frozen=True, slots=True)
class CallRecord:
    """What one collective call sent, as this rank executed it: the call's own record.

    :meth:`Context.record` makes it; :func:`last_stats` gives the last one as a dict.

    Examples
    --------
    >>> r = CallRecord("allreduce", "ring", 8, numpy.dtype("float32"), 32, 2, 2, False)
    >>> r.collective, r.bytes_sent, r.as_dict()["dtype"]
    ('allreduce', 32, 'float32')
    """

    collective: str  # the collective's name: "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce"
    algorithm: str  # the algorithm that ran (resolved, never "auto")
    count: int  # elements of the input
    dtype: numpy.dtype  # element type on the wire
    bytes_sent: int  # bytes this rank sent (counted from the schedule as executed, or estimated)
    messages: object = None  # messages this rank sent (int), None where the library's are not visible
    rounds: object = None  # the schedule's rounds (int), None without a schedule
    estimated: bool = False  # True for the library's and shm's traffic, whose bytes are estimated

    def as_dict(self):
        """Return the record as :func:`last_stats` gives it: the dtype by name, every field by name."""
        return {"collective": self.collective, "algorithm": self.algorithm, "count": self.count,
                "dtype": numpy.dtype(self.dtype).name, "bytes_sent": int(self.bytes_sent), "messages": self.messages,
                "rounds": self.rounds, "estimated": self.estimated}


def _on_free(comm, keyval, ctx):
    """Free a context's duplicate when the user's communicator is freed (attribute delete callback).

    Under MPICH a broken context's duplicate is freed too: ``MPI_Comm_free`` only marks it, and MPI
    releases it once the operations still pending on it end, so repeated failures do not exhaust
    MPI's communicator ids. Under Open MPI it is kept, unfreed, to the end of the job: a failed call
    can leave a non-blocking collective that never ends (a mismatch whose other ranks' schedules
    wait for data that never comes), and Open MPI 5.0's ``libnbc`` goes on progressing it after the
    communicator's free and crashes the process (SIGSEGV in ``mca_pml_ob1_isend`` under
    ``NBC_Progress``, seen in one run in three of ``tests.mpi_repeated`` at P = 3). One
    communicator per failure is the price.
    """
    if _LAST[1] is ctx:
        _LAST[0] = _LAST[1] = None
    if ctx is not None and ctx.comm != MPI.COMM_NULL:
        if ctx.broken and mpi_library_key()[0] == "Open MPI":
            _KEPT.append(ctx.comm)
        else:
            ctx.comm.Free()
    return MPI.SUCCESS


_KEPT = []  # broken contexts' duplicates under Open MPI (_on_free): never freed


def context_keyval():
    """Return the MPI attribute key under which each communicator caches its context."""
    if _KEYVAL[0] is None:
        _KEYVAL[0] = MPI.Comm.Create_keyval(delete_fn=_on_free)
    return _KEYVAL[0]


def existing_context(comm):
    """Return the context ``comm`` (None: ``COMM_WORLD``) already carries, else None; never creates one.

    The first look of the cached paths of repeated calls (:mod:`collectives.library.plans`): anything
    but a plain intracommunicator with a context -- another type, a freed communicator -- gives None,
    and the full path then checks the arguments and says what is wrong. The last communicator
    object found and its context are remembered (an attribute look-up costs about as much as the
    rest of a cached call's Python); freeing the communicator or its context forgets them
    (:func:`_on_free`, the attribute's delete callback).
    """
    if comm is None:
        comm = MPI.COMM_WORLD
    if comm is _LAST[0]:  # the communicator of the previous cached call: no attribute look-up
        return _LAST[1]
    if type(comm) is not MPI.Intracomm:
        return None
    try:
        ctx = comm.Get_attr(context_keyval())
    except MPI.Exception:  # a freed communicator
        return None
    if ctx is not None:
        _LAST[0], _LAST[1] = comm, ctx
    return ctx


def refuse(collective, error, comm=None, timeout=None):
    """Take part, in debug mode, in a call this rank refused; return ``error``.

    The one path of every public collective whose argument checks fail on this rank
    (:mod:`collectives.arguments`): in debug mode (``COMMLAB_DEBUG=detail`` or ``strict``) the other
    ranks begin the call with its fingerprint exchange, so this rank joins it, marked refused with
    ``error``'s first line (:meth:`Context.refused`), and every other rank raises
    :class:`~collectives.errors.CollectiveMismatch` naming it; the caller then raises ``error``
    itself. Outside debug mode nothing is sent (a bad call sends no message; the others, if their
    call passed, wait as for any silent peer: ``timeout=`` turns that into
    :class:`~collectives.errors.CollectiveTimeout`). A ``comm`` that is no intracommunicator, a
    size-1 or unusable communicator, or a bad ``COMMLAB_DEBUG`` sends nothing either.

    Parameters
    ----------
    collective : str
        ``"allreduce"``, ``"reduce_scatter"``, ``"allgather"``, ``"broadcast"`` or ``"reduce"``.
    error : ValueError or TypeError
        The error this rank is about to raise.
    comm : mpi4py.MPI.Intracomm, optional
        The call's communicator as given (default ``COMM_WORLD``).
    timeout : float, optional
        The call's timeout as given (ignored when it is itself invalid).

    Returns
    -------
    Exception
        ``error``, for ``raise refuse(...) from None`` or a bare ``raise`` after the call.

    Examples
    --------
    >>> err = refuse("allreduce", ValueError("unknown op 'mean'"))  # one rank: nothing to join
    >>> err
    ValueError("unknown op 'mean'")
    """
    try:
        if not debug_enabled():
            return error
        comm = check_comm(comm)
        if comm.Get_size() == 1:
            return error
        try:
            timeout = check_timeout(timeout)
        except ValueError:
            timeout = None
        ctx = get_context(comm, timeout)
    except (ValueError, TypeError, CollectiveError, MPI.Exception):
        return error
    if ctx.broken is None:
        reason = f"{type(error).__name__}: {error}".splitlines()[0]
        ctx.refused(collective, reason, timeout)
    return error


def get_context(comm=None, timeout=None):
    """Return the :class:`Context` of ``comm`` (default ``COMM_WORLD``), creating it on first use.

    The context is cached on the communicator itself as an MPI attribute (``MPI_Comm_set_attr``), the
    standard place for a library's per-communicator state: it disappears with ``comm.Free()``, so a new
    communicator that happens to reuse a freed handle never inherits a stale context, and ``Dup`` of
    the user's communicator does not copy it. Creating it duplicates ``comm`` with ``MPI_Comm_idup``,
    waited under ``timeout`` seconds (:class:`~collectives.errors.CollectiveTimeout` after that).
    """
    comm = check_comm(comm)
    key = context_keyval()
    ctx = comm.Get_attr(key)
    if ctx is None:
        ctx = Context(comm, timeout)
        comm.Set_attr(key, ctx)
    return ctx


def free_context(comm=None):
    """Drop the cached context of ``comm`` (its duplicate is freed locally, without messages)."""
    comm = check_comm(comm)
    if comm.Get_attr(context_keyval()) is not None:
        comm.Delete_attr(context_keyval())  # the delete callback frees the duplicate


def has_context(comm):
    """Return True when ``comm`` already carries a commlab context (no message is sent)."""
    return check_comm(comm).Get_attr(context_keyval()) is not None


def last_stats(comm=None):
    """Return statistics of the most recent collective on ``comm`` by this rank.

    Returns
    -------
    dict
        ``collective`` (its name), ``algorithm`` (resolved, never "auto"), ``count`` (elements),
        ``dtype`` (on the wire), ``bytes_sent`` (bytes this rank sent, counted from the schedule as
        executed), ``messages``, ``rounds`` and ``estimated`` (True for ``mpi``, whose internal traffic
        is not visible: its bytes are the ring algorithm's ``2 (P-1)/P n``): the call's
        :class:`CallRecord` as a dict. Empty before the first call.
    """
    last = get_context(comm).last
    return {} if last is None else last.as_dict()


def total_stats(comm=None):
    """Return running totals (``calls``, ``bytes_sent``, ``messages``) of this rank's collectives."""
    ctx = get_context(comm)
    return {"calls": ctx.calls, "bytes_sent": int(ctx.bytes_sent), "messages": ctx.messages}
