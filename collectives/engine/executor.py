"""The one executor: runs any :class:`~collectives.schedules.schedule.Schedule` with MPI point-to-point messages.

One loop over rounds, :meth:`Run.advance`, serves every form; what differs is the primitive it is
handed to complete a round (as mpi4py's ``util/pkl5.py`` passes the primitive into one shared path):

* :func:`blocking`: ``Sendrecv`` for a host round of one send and one receive, else
  ``Isend``/``Irecv`` and ``Waitall`` (:func:`execute` without a deadline);
* :class:`Timed`: the round's messages posted, then a wait under a deadline, optionally advancing
  other requests in flight (:func:`execute` with ``timeout`` or ``progress``, and
  :meth:`~collectives.engine.request.Request.wait`);
* :func:`testing`: posted and tested once; the loop stops when a round is not complete yet
  (:meth:`~collectives.engine.request.Request.test`, the non-blocking form).

Every round then ends in :meth:`Run.finish`, the one receive -> check -> combine sequence: each
received message's size is checked against the schedule (``MPI_Get_count``), so a result never
holds bytes no message wrote; staged device receives are copied back; reducing receives are combined.
A round the MPI library fails (``MPI.Exception``) raises :class:`~collectives.errors.PeerLost` naming
the round's peer, or :class:`~collectives.errors.CollectiveMismatch` when the library says the
message did not fit (:meth:`Run.failed`).
"""
import time

from mpi4py import MPI

from collectives.backend import BFLOAT16
from collectives.engine.buffers import raw
from collectives.errors import CollectiveMismatch, CollectiveTimeout, PeerLost
from collectives.engine.failures import is_process_failure, process_failed
from collectives.engine.fingerprint import checks_enabled, pending
from collectives.engine import timeline
from collectives.engine.waiting import Where, library_failure, wait_all
from collectives.schedules.schedule import apply_receive

__all__ = ["Run", "execute", "run_schedule", "blocking", "testing", "Timed", "explain"]


class Run:
    """One schedule's execution on one rank: the call object every round helper reads.

    Parameters
    ----------
    schedule : Schedule
        This rank's schedule.
    comm : mpi4py.MPI.Comm
        The library's duplicate communicator; peers in the schedule are its ranks.
    work : ndarray, shape (schedule.count,)
        Flat buffer in the accumulation dtype: this rank's input (unless :meth:`read_from` gives a
        separate one) and, afterwards, the result.
    scratch : ndarray, shape (>= schedule.scratch,), optional
        Receive space for reducing receives, ``work``'s dtype.
    ufunc : ufunc or None
        The binary reduction (``add``, ``multiply``, ``minimum``, ``maximum``) of the array module.
    tag : int
        Tag of every message of this call (it carries the call fingerprint,
        :mod:`collectives.engine.fingerprint`).
    name : str
        The collective's name, for errors.
    transport : DeviceTransport or None
        Stream synchronization and host staging for device buffers.

    Notes
    -----
    A bfloat16 ``work`` (an all-reduce with ``accumulate="native"``) travels as its 16-bit patterns
    (:func:`~collectives.engine.buffers.raw`: mpi4py takes no ``ml_dtypes`` buffer) and is reduced
    as bfloat16.
    """

    __slots__ = ("schedule", "prog", "comm", "work", "scratch", "ufunc", "tag", "name", "transport", "staged", "inp",
                 "final", "statuses", "index", "posted", "clock", "bits")

    def __init__(self, schedule, comm, work, *, scratch=None, ufunc=None, tag=0, name="collective", transport=None):
        self.schedule, self.prog = schedule, schedule.program()
        self.comm, self.work, self.scratch, self.ufunc, self.tag, self.name = comm, work, scratch, ufunc, tag, name
        self.bits = work.dtype == BFLOAT16  # messages carry the bfloat16 buffers' raw bits
        self.use(transport)
        self.inp, self.final, self.statuses = None, (), []
        self.index, self.posted = 0, None  # the next round; its posted (requests, peers, landing) or None
        self.clock = None  # with a timeline recording (collectives.engine.timeline): [call, round start, posted]

    def use(self, transport):
        """Move device buffers through ``transport`` (None for host arrays): directly, or staged."""
        self.transport = transport
        self.staged = transport is not None and not transport.direct

    def read_from(self, inp, needed=None):
        """Read this rank's input from the separate read-only buffer ``inp`` (it may alias ``work``).

        Untouched regions are sent from ``inp`` and first reductions read it, which saves copying it
        into ``work`` (:meth:`Schedule.program` with ``from_input``). ``needed`` is the element range
        of ``work`` the caller reads afterwards (default all). When a region is partly written before
        it is read, ``inp`` is copied into ``work`` instead. Returns ``self``.
        """
        if inp is None:
            return self
        compiled = self.schedule.program(True, needed) if inp.dtype == self.work.dtype else None
        if compiled is None:
            if inp.size:
                self.work[...] = inp
            return self
        self.prog, self.final = compiled
        self.inp = inp
        return self

    @property
    def done(self):
        """True once every round has been finished."""
        return self.index >= len(self.prog)

    def advance(self, complete):
        """Run rounds from :attr:`index` on, each completed by ``complete(run, index)``: the one round loop.

        ``complete`` returns the round's statuses, or None when it is not complete yet (the loop
        stops there and a later call resumes it). Returns True once the final round is finished.
        """
        prog, rec = self.prog, timeline.active()
        while self.index < len(prog):
            if rec is not None:
                self.start_clock(rec)
            try:
                statuses = complete(self, self.index)
            except MPI.Exception as exc:
                raise self.failed(self.index, exc) from None
            if statuses is None:
                return False
            landing = self.posted[2]
            self.posted = None
            if rec is None:
                self.finish(self.index, landing, statuses)
            else:
                arrived = time.perf_counter()
                self.finish(self.index, landing, statuses)
                rec.add(self.clock[0], self.name, self.schedule.algorithm, self.index, self.schedule.rounds[self.index],
                        self.clock[1], self.clock[2], arrived, time.perf_counter())
                self.clock[1] = None
            self.index += 1
        for sl in self.final:
            self.work[sl] = self.inp[sl]
        self.final = ()
        return True

    def start_clock(self, rec):
        """Note the start of the next round for the timeline recorder ``rec`` (once per round)."""
        if self.clock is None:
            self.clock = [rec.new_call(), None, None]
        if self.clock[1] is None:
            self.clock[1], self.clock[2] = time.perf_counter(), None

    def post(self, index):
        """Post round ``index``'s receives and sends once; return (requests, peers, landing buffers).

        A negative peer ``-1 - p`` marks a send to ``p`` (for :func:`~collectives.engine.waiting.wait_all`).
        """
        if self.posted is not None:
            return self.posted
        sends, recvs = self.prog[index]
        transport, staged, work, scratch, tag, comm = self.transport, self.staged, self.work, self.scratch, self.tag, self.comm
        if transport is not None:
            transport.sync()  # kernels writing the send regions must finish before MPI reads them
        reqs, peers, landing = [], [], []
        for i, (src, rsl, scr, _, _, _) in enumerate(recvs):
            dev = scratch[scr] if scr is not None else work[rsl]
            buf = transport.host_buffer(dev.dtype, dev.size, ("r", i)) if staged else dev
            reqs.append(comm.Irecv(raw(buf) if self.bits else buf, src, tag))
            peers.append(src)
            landing.append((buf, dev))
        for i, (dst, ssl, s_in) in enumerate(sends):
            region = self.inp[ssl] if s_in else work[ssl]
            buf = transport.to_host(region, ("s", i)) if staged else region
            reqs.append(comm.Isend(raw(buf) if self.bits else buf, dst, tag))
            peers.append(-1 - dst)
        self.posted = (reqs, peers, landing)
        if self.clock is not None:
            self.clock[2] = time.perf_counter()
        return self.posted

    def status_list(self, n):
        """Return ``n`` reusable :class:`mpi4py.MPI.Status` objects."""
        while len(self.statuses) < n:
            self.statuses.append(MPI.Status())
        return self.statuses[:n]

    def finish(self, index, landing, statuses):
        """Check each received size, copy staged receives to the device and apply the receives in order.

        Every size is checked before any receive takes effect; then
        :func:`~collectives.schedules.schedule.apply_receive` applies them in the round's order (the
        one definition of a round the simulator shares). A reduction puts the lower rank's operand
        first, so both sides of an exchange compute bitwise the same value (``min``/``max`` of +0.0
        and -0.0, NaN payloads).
        """
        work, inp, ufunc, staged, recvs = self.work, self.inp, self.ufunc, self.staged, self.prog[index][1]
        for rv, (buf, dev), st in zip(recvs, landing, statuses):
            check_received(st, buf, rv[0], self.name)
            if staged:
                self.transport.to_device(buf, dev)
        for rv, (_, dev) in zip(recvs, landing):
            apply_receive(rv, dev, work, inp, ufunc)

    def failed(self, index, exc):
        """Return the error to raise after the MPI library failed round ``index`` with ``exc``.

        The peer is the one of the failed request (``MPI_ERR_IN_STATUS``), else the round's first
        receive's (else its first send's): :class:`~collectives.errors.PeerLost` naming it, or
        :class:`~collectives.errors.CollectiveMismatch` when the library reports a truncated message.
        Under ULFM a dead process (or a communicator a peer revoked) gives
        :class:`~collectives.errors.ProcessFailed`, after revoking the communicator
        (:func:`collectives.engine.failures.process_failed`).
        """
        sends, recvs = self.prog[index]
        peers = [r[0] for r in recvs] + [s[0] for s in sends]
        if self.posted is not None and self.posted[1] is not None:
            peers = [p if p >= 0 else -1 - p for p in self.posted[1]]  # the posted order, requests' statuses
        if is_process_failure(exc, self.statuses[:len(peers)]):  # ULFM: a dead process, the call revoked
            return process_failed(exc, self.comm, self.name, self.statuses[:len(peers)], index,
                                  self.schedule.rounds[index].phase)
        text, at, differ = library_failure(exc, self.statuses[:len(peers)])
        peer = peers[at] if at is not None and at < len(peers) else (peers[0] if peers else None)
        if differ:
            return CollectiveMismatch(self.name, "message size", f"the MPI library reported '{text}' in round {index} "
                                      f"with rank {peer}: the ranks disagree about the count, dtype or algorithm")
        return PeerLost(self.name, peer, index, text, self.schedule.rounds[index].phase)

    def where(self, index, timeout):
        """Return the :class:`~collectives.engine.waiting.Where` of round ``index`` for a timeout's error."""
        return Where(self.name, index, self.schedule.rounds[index].phase, timeout)


def blocking(run, index):
    """Complete round ``index`` with blocking calls: ``Sendrecv`` for one host send and one receive."""
    sends, recvs = run.prog[index]
    if run.posted is None and not run.staged and len(sends) == 1 and len(recvs) == 1:
        dst, ssl, s_in = sends[0]
        src, rsl, scr, _, _, _ = recvs[0]
        buf = run.work[rsl] if scr is None else run.scratch[scr]
        statuses = run.status_list(1)
        if run.transport is not None:
            run.transport.sync()
        send, into = run.inp[ssl] if s_in else run.work[ssl], buf
        if run.bits:
            send, into = raw(send), raw(buf)
        run.comm.Sendrecv(send, dst, run.tag, into, src, run.tag, statuses[0])
        run.posted = (None, None, ((buf, buf),))
        return statuses
    reqs = run.post(index)[0]
    statuses = run.status_list(len(reqs))
    MPI.Request.Waitall(reqs, statuses)
    return statuses


def testing(run, index):
    """Post round ``index`` (once) and test it; return its statuses, or None while it is in flight."""
    reqs = run.post(index)[0]
    statuses = run.status_list(len(reqs))
    return statuses if MPI.Request.Testall(reqs, statuses) else None


class Timed:
    """Complete a round within ``timeout`` seconds (None: no limit), calling ``progress`` while waiting.

    Raises :class:`CollectiveTimeout` naming the silent peer when the round is not complete in time.
    """

    __slots__ = ("timeout", "progress")

    def __init__(self, timeout, progress=None):
        self.timeout, self.progress = timeout, progress

    def __call__(self, run, index):
        reqs, peers, _ = run.post(index)
        statuses = run.status_list(len(reqs))
        if self.progress is None and MPI.Request.Testall(reqs, statuses):
            return statuses
        deadline = None if self.timeout is None else time.perf_counter() + self.timeout
        wait_all(reqs, peers, deadline, run.where(index, self.timeout), progress=self.progress, statuses=statuses)
        return statuses


def check_received(status, buf, peer, name):
    """Raise :class:`CollectiveMismatch` unless the message in ``status`` filled ``buf`` exactly."""
    got = status.Get_count(MPI.BYTE)
    if got != buf.nbytes and checks_enabled():
        raise CollectiveMismatch(name, "message size", f"rank {peer} sent {got} bytes where this rank's schedule "
                                 f"expects {buf.nbytes}: the ranks disagree about the count, dtype or algorithm")


def explain(exc, comm, tag):
    """Return ``exc`` (a :class:`CollectiveTimeout`) with what the silent peer sent instead, when it sent anything
    (a :class:`~collectives.errors.PeerLost` as it is: that peer is gone)."""
    if isinstance(exc, PeerLost):
        return exc
    why = pending(comm, exc.peer, tag)
    if not why:
        return exc
    return CollectiveTimeout(exc.collective, exc.peer, exc.round, exc.timeout, exc.phase, why)


def execute(run, *, timeout=None, progress=None):
    """Run every round of ``run`` (a :class:`Run`) on its communicator, in place, and return ``run.work``.

    Parameters
    ----------
    run : Run
        The schedule, communicator, buffers, reduction and tag of this call.
    timeout : float or None
        Seconds to wait for any one round before raising :class:`CollectiveTimeout`.
    progress : callable, optional
        Called while waiting, to advance non-blocking collectives in flight on the same communicator
        (a peer may be waiting in one of them before it joins this call).

    Returns
    -------
    ndarray
        ``run.work``, which holds the result.

    Raises
    ------
    CollectiveTimeout
        A round did not complete within ``timeout`` seconds; the message says what the silent peer
        sent instead, when it sent a message of another call.
    CollectiveMismatch
        A received message's size differs from the schedule's.

    Examples
    --------
    >>> import numpy as np
    >>> from mpi4py import MPI
    >>> from collectives.schedules.ring import ring_allreduce
    >>> x = np.arange(4.0)
    >>> execute(Run(ring_allreduce(0, 1, 4), MPI.COMM_SELF, x, scratch=np.empty(4), ufunc=np.add))
    array([0., 1., 2., 3.])
    """
    if timeout is None and progress is None:
        run.advance(blocking)
        return run.work
    try:
        run.advance(Timed(timeout, progress))
    except CollectiveTimeout as exc:
        raise explain(exc, run.comm, run.tag) from None
    return run.work


def run_schedule(ctx, key, run, *, timeout=None, xp=None):
    """Begin the call ``key`` on ``ctx`` and :func:`execute` ``run`` on its communicator.

    ``run`` is built on ``ctx.comm`` without a tag or transport: this sets the call's tag (from
    :meth:`~collectives.engine.context.Context.begin`) and the device transport of ``xp``. Any failure
    marks ``ctx`` unusable (:meth:`~collectives.engine.context.Context.fail`) and is raised again.
    """
    try:
        run.tag = ctx.begin(key, timeout)
        run.use(ctx.transport(xp))
        execute(run, timeout=timeout, progress=ctx.progress if ctx.active else None)
    except Exception as exc:
        ctx.fail(f"{key[0]}: {exc}")
        raise
