"""The one executor: runs any :class:`~collectives.schedules.schedule.Schedule` with MPI point-to-point messages.

Blocking execution (:func:`execute`: a ``Sendrecv`` per round where a round has one send and one
receive, ``Isend``/``Irecv``/``Waitall`` otherwise), the same rounds with a timeout, device buffers
(direct or staged through host memory) or a progress callback, and the non-blocking
:class:`~collectives.engine.request.Request` built on the same round helpers. Every received message's size
is checked against the schedule (``MPI_Get_count``): a result never holds bytes no message wrote.
"""
import time

from mpi4py import MPI

from collectives.errors import CollectiveMismatch, CollectiveTimeout
from collectives.engine.fingerprint import checks_enabled, pending
from collectives.engine.waiting import wait_all

__all__ = ["CollectiveTimeout", "CollectiveMismatch", "execute", "run_schedule", "Run"]


class Run:
    """The state of one schedule's execution on one rank (what every round helper needs).

    Parameters
    ----------
    schedule : Schedule
    comm : mpi4py.MPI.Comm
        The library's duplicate communicator.
    work, scratch : ndarray
        Flat work buffer (result, accumulation dtype) and receive space for reducing receives.
    ufunc : ufunc or None
        The reduction.
    tag : int
        Tag of every message of this call (see :mod:`collectives.engine.fingerprint`).
    op : str
        Collective name, for errors.
    transport : DeviceTransport or None
        Stream synchronization and host staging for device buffers.
    inp : ndarray or None
        Separate read-only input (see :func:`execute`); ``prog`` must then be compiled for it.
    prog : list, optional
        The compiled rounds (default ``schedule.program()``).
    """

    __slots__ = ("schedule", "prog", "comm", "work", "scratch", "ufunc", "tag", "op", "transport", "staged", "inp",
                 "statuses")

    def __init__(self, schedule, comm, work, scratch, ufunc, tag, op, transport=None, inp=None, prog=None):
        self.schedule, self.prog = schedule, prog if prog is not None else schedule.program()
        self.comm, self.work, self.scratch, self.ufunc, self.tag, self.op = comm, work, scratch, ufunc, tag, op
        self.transport, self.inp = transport, inp
        self.staged = transport is not None and not transport.direct
        self.statuses = []

    def combine(self, buf, rsl, r_in, low):
        """Reduce the received ``buf`` into ``work[rsl]``; the lower rank's operand goes first.

        The fixed operand order makes both sides of an exchange compute bitwise the same value
        (``min``/``max`` of +0.0 and -0.0, NaN payloads).
        """
        target = self.work[rsl]
        mine = self.inp[rsl] if r_in else target
        if low:
            self.ufunc(buf, mine, out=target)
        else:
            self.ufunc(mine, buf, out=target)

    def send_buf(self, ssl, s_in):
        """Return the region a send reads: from the separate input when the schedule says so."""
        return self.inp[ssl] if s_in else self.work[ssl]

    def post(self, index):
        """Post round ``index``'s receives and sends; return (requests, peers, landing buffers)."""
        sends, recvs = self.prog[index]
        transport, staged = self.transport, self.staged
        if transport is not None:
            transport.sync()  # kernels writing the send regions must finish before MPI reads them
        reqs, peers, landing = [], [], []
        for i, (src, rsl, scr, _, _) in enumerate(recvs):
            dev = self.scratch[scr] if scr is not None else self.work[rsl]
            buf = transport.host_buffer(dev.dtype, dev.size, ("r", i)) if staged else dev
            reqs.append(self.comm.Irecv(buf, src, self.tag))
            peers.append(src)
            landing.append((buf, dev))
        for i, (dst, ssl, s_in) in enumerate(sends):
            region = self.send_buf(ssl, s_in)
            buf = transport.to_host(region, ("s", i)) if staged else region
            reqs.append(self.comm.Isend(buf, dst, self.tag))
            peers.append(-1 - dst)
        return reqs, peers, landing

    def status_list(self, n):
        """Return ``n`` reusable :class:`mpi4py.MPI.Status` objects."""
        while len(self.statuses) < n:
            self.statuses.append(MPI.Status())
        return self.statuses[:n]

    def finish(self, index, landing, statuses):
        """Check the received sizes, copy staged receives to the device and apply the reductions."""
        for (src, rsl, scr, r_in, low), (buf, dev), st in zip(self.prog[index][1], landing, statuses):
            check_received(st, buf, src, self.op)
            if self.staged:
                self.transport.to_device(buf, dev)
            if scr is not None:
                self.combine(dev, rsl, r_in, low)

    def wait_round(self, index, timeout, progress):
        """Post, wait for (under ``timeout`` seconds, with ``progress``) and finish round ``index``."""
        reqs, peers, landing = self.post(index)
        statuses = self.status_list(len(reqs))
        if timeout is None and progress is None:
            MPI.Request.Waitall(reqs, statuses)
        else:
            deadline = None if timeout is None else time.perf_counter() + timeout
            wait_all(reqs, peers, deadline, self.op, index, self.schedule.rounds[index].phase, timeout, progress,
                     statuses)
        self.finish(index, landing, statuses)


def check_received(status, buf, peer, op):
    """Raise :class:`CollectiveMismatch` unless the message in ``status`` filled ``buf`` exactly."""
    got = status.Get_count(MPI.BYTE)
    if got != buf.nbytes and checks_enabled():
        raise CollectiveMismatch(op, "message size", f"rank {peer} sent {got} bytes where this rank's schedule "
                                 f"expects {buf.nbytes}: the ranks disagree about the count, dtype or algorithm")


def _resolve_input(schedule, work, inp, needed):
    """Return (program, inp, final copies): compile for a separate input buffer when possible."""
    if inp is None:
        return schedule.program(), None, ()
    compiled = schedule.program(True, needed) if inp.dtype == work.dtype else None
    if compiled is None:  # a region is partly written before it is read: copy the input in first
        if inp.size:
            work[...] = inp
        return schedule.program(), None, ()
    return compiled[0], inp, compiled[1]


def execute(schedule, comm, work, scratch, ufunc, tag=0, timeout=None, op="collective", transport=None,
            inp=None, needed=None, progress=None):
    """Run ``schedule`` on ``comm`` over the flat ``work`` buffer, in place.

    Parameters
    ----------
    schedule : Schedule
        This rank's schedule.
    comm : mpi4py.MPI.Comm
        The (duplicated) communicator; peers in the schedule are its ranks.
    work : ndarray, shape (schedule.count,)
        Flat buffer in the accumulation dtype; holds this rank's input (unless ``inp`` is given) and
        receives the result.
    scratch : ndarray, shape (>= schedule.scratch,)
        Receive space for reducing receives, same dtype as ``work``.
    ufunc : ufunc or None
        Binary reduction (``add``, ``multiply``, ``minimum``, ``maximum``) of the array module.
    tag : int
        Message tag for every message of this call (it carries the call fingerprint).
    timeout : float or None
        Seconds to wait for any one round before raising :class:`CollectiveTimeout`.
    op : str
        Collective name for error messages.
    transport : DeviceTransport or None
        For device buffers: stream synchronization and host staging (see ``collectives.backend``).
    inp : ndarray, shape (schedule.count,), optional
        This rank's input as a separate read-only buffer (it may alias ``work``): untouched regions
        are sent from it and first reductions read it, which saves copying it into ``work``
        (:meth:`Schedule.program` with ``from_input``).
    needed : (int, int), optional
        With ``inp``: the element range of ``work`` the caller reads afterwards (default all).
    progress : callable, optional
        Called while waiting, to advance non-blocking collectives in flight on the same communicator
        (a peer may be waiting in one of them before it joins this call).

    Raises
    ------
    CollectiveTimeout
        A round did not complete within ``timeout`` seconds; the message says what the silent peer
        sent instead, when it sent a message of another call.
    CollectiveMismatch
        A received message's size differs from the schedule's.
    """
    prog, inp, final = _resolve_input(schedule, work, inp, needed)
    run = Run(schedule, comm, work, scratch, ufunc, tag, op, transport, inp, prog)
    if transport is not None or progress is not None:
        try:
            for index in range(len(prog)):
                run.wait_round(index, timeout, progress)
        except CollectiveTimeout as exc:
            why = pending(comm, exc.peer, tag)
            if why:
                raise CollectiveTimeout(exc.op, exc.peer, exc.round, exc.timeout, exc.phase, why) from None
            raise
    elif timeout is not None:
        try:
            _execute_host_deadline(run, timeout)
        except CollectiveTimeout as exc:
            why = pending(comm, exc.peer, tag)
            if why:
                raise CollectiveTimeout(exc.op, exc.peer, exc.round, exc.timeout, exc.phase, why) from None
            raise
    else:
        _execute_host(run)
    for sl in final:
        work[sl] = inp[sl]
    return work


def _execute_host(run):
    """The host fast path: as lean as a hand-written loop of Sendrecv calls."""
    comm, work, scratch, tag, op = run.comm, run.work, run.scratch, run.tag, run.op
    status = MPI.Status()
    for sends, recvs in run.prog:
        if len(sends) == 1 and len(recvs) == 1:
            dst, ssl, s_in = sends[0]
            src, rsl, scr, r_in, low = recvs[0]
            buf = work[rsl] if scr is None else scratch[scr]
            comm.Sendrecv(run.send_buf(ssl, s_in), dst, tag, buf, src, tag, status)
            check_received(status, buf, src, op)
            if scr is not None:
                run.combine(buf, rsl, r_in, low)
        elif not sends and len(recvs) == 1:
            src, rsl, scr, r_in, low = recvs[0]
            buf = work[rsl] if scr is None else scratch[scr]
            comm.Recv(buf, src, tag, status)
            check_received(status, buf, src, op)
            if scr is not None:
                run.combine(buf, rsl, r_in, low)
        elif not recvs and len(sends) == 1:
            dst, ssl, s_in = sends[0]
            comm.Send(run.send_buf(ssl, s_in), dst, tag)
        else:
            reqs = [comm.Irecv(scratch[scr] if scr is not None else work[rsl], src, tag)
                    for src, rsl, scr, _, _ in recvs]
            reqs += [comm.Isend(run.send_buf(ssl, s_in), dst, tag) for dst, ssl, s_in in sends]
            statuses = run.status_list(len(reqs))
            MPI.Request.Waitall(reqs, statuses)
            for (src, rsl, scr, r_in, low), st in zip(recvs, statuses):
                buf = scratch[scr] if scr is not None else work[rsl]
                check_received(st, buf, src, op)
                if scr is not None:
                    run.combine(buf, rsl, r_in, low)


def _execute_host_deadline(run, timeout):
    """The host path under a deadline: each round's messages posted directly, then one wait loop.

    The same work as :func:`_execute_host`, with ``Irecv``/``Isend`` and :func:`wait_all` in place of
    the blocking calls (MPI has no timed wait), and none of the device or progress machinery of
    :meth:`Run.wait_round`.
    """
    comm, work, scratch, tag, op, rounds = run.comm, run.work, run.scratch, run.tag, run.op, run.schedule.rounds
    for index, (sends, recvs) in enumerate(run.prog):
        reqs = [comm.Irecv(scratch[scr] if scr is not None else work[rsl], src, tag) for src, rsl, scr, _, _ in recvs]
        reqs += [comm.Isend(run.send_buf(ssl, s_in), dst, tag) for dst, ssl, s_in in sends]
        statuses = run.status_list(len(reqs))
        if not MPI.Request.Testall(reqs, statuses):
            peers = [src for src, _, _, _, _ in recvs] + [-1 - dst for dst, _, _ in sends]
            wait_all(reqs, peers, time.perf_counter() + timeout, op, index, rounds[index].phase, timeout, None,
                     statuses)
        for (src, rsl, scr, r_in, low), st in zip(recvs, statuses):
            buf = scratch[scr] if scr is not None else work[rsl]
            check_received(st, buf, src, op)
            if scr is not None:
                run.combine(buf, rsl, r_in, low)


def run_schedule(ctx, key, sched, work, scratch, ufunc, timeout, xp, inp=None, needed=None):
    """Begin the call ``key`` on ``ctx`` and :func:`execute` ``sched`` on its communicator.

    The arguments after ``sched`` are :func:`execute`'s; ``xp`` selects the device transport. Any
    failure marks ``ctx`` unusable (:meth:`~collectives.engine.context.Context.fail`) and is raised again.
    """
    name = key[0]
    try:
        execute(sched, ctx.comm, work, scratch, ufunc, ctx.begin(key, timeout), timeout, name, ctx.transport(xp),
                inp=inp, needed=needed, progress=ctx.progress if ctx.active else None)
    except Exception as exc:
        ctx.fail(f"{name}: {exc}")
        raise
