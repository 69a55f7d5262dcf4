"""The one executor: runs any :class:`~collectives.schedule.Schedule` with MPI point-to-point messages.

Blocking execution (:func:`execute`: a ``Sendrecv`` per round where a round has one send and one
receive, ``Isend``/``Irecv``/``Waitall`` otherwise), the same rounds with a timeout, device buffers
(direct or staged through host memory) or a progress callback, and the non-blocking
:class:`~collectives.request.Request` built on the same round helpers.
"""
import time

from mpi4py import MPI

__all__ = ["CollectiveTimeout", "execute"]


class CollectiveTimeout(RuntimeError):
    """A peer did not answer within the collective's ``timeout``.

    Attributes
    ----------
    op : str
        The collective ("allreduce", "reduce_scatter", ...).
    peer : int
        Rank (in the caller's communicator) whose message never completed.
    round : int
        Index of the schedule round that was waiting.
    timeout : float
        The limit, in seconds.
    """

    def __init__(self, op, peer, round, timeout, phase=""):
        self.op, self.peer, self.round, self.timeout = op, peer, round, timeout
        where = f"round {round}" + (f" ({phase})" if phase else "")
        who = f"rank {peer}" if peer is not None else "a peer (inside the MPI library)"
        super().__init__(f"{op} timed out after {timeout:g} s in {where}: no answer from {who}")


def _wait(reqs, peers, deadline, op, index, phase, timeout, progress=None):
    """Wait for ``reqs`` until ``deadline`` (seconds, perf_counter); raise CollectiveTimeout then.

    ``peers[i]`` is the peer of ``reqs[i]``; a negative peer ``-1 - p`` marks a send to ``p``. The
    peer named in the error is the first receive still pending (else the first send), and pending
    receives are cancelled so their buffers are released. ``deadline`` None waits forever;
    ``progress`` (callable) is called while waiting, to advance other non-blocking collectives.
    """
    spins = 0
    while not MPI.Request.Testall(reqs):
        if progress is not None:
            progress()
        spins += 1
        if spins > 200:
            if deadline is not None and time.perf_counter() > deadline:
                pending = [(p, r) for p, r in zip(peers, reqs) if not r.Test()]
                recvs = [p for p, r in pending if p is not None and p >= 0]
                sends = [-1 - p for p, r in pending if p is not None and p < 0]
                peer = (recvs or sends or [None])[0]
                for p, r in pending:
                    if p is not None and p >= 0:
                        r.Cancel()
                raise CollectiveTimeout(op, peer, index, timeout, phase)
            time.sleep(5e-5)


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
        Message tag for every message of this call.
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
        A round did not complete within ``timeout`` seconds.
    """
    prog, inp, final = _resolve_input(schedule, work, inp, needed)
    staged = transport is not None and not transport.direct
    if transport is not None or timeout is not None or progress is not None:
        _execute_general(schedule, prog, comm, work, scratch, ufunc, tag, timeout, op, transport, staged, inp,
                         progress)
    else:
        _execute_host(prog, comm, work, scratch, ufunc, tag, inp)
    for sl in final:
        work[sl] = inp[sl]
    return work


def _execute_host(prog, comm, work, scratch, ufunc, tag, inp):
    """The host fast path: as lean as a hand-written loop of Sendrecv calls."""
    for sends, recvs in prog:
        if len(sends) == 1 and len(recvs) == 1:
            dst, ssl, s_in = sends[0]
            src, rsl, scr, r_in, low = recvs[0]
            sbuf = inp[ssl] if s_in else work[ssl]
            if scr is None:
                comm.Sendrecv(sbuf, dst, tag, work[rsl], src, tag)
            else:
                buf = scratch[scr]
                comm.Sendrecv(sbuf, dst, tag, buf, src, tag)
                target = work[rsl]
                mine = inp[rsl] if r_in else target
                ufunc(buf, mine, out=target) if low else ufunc(mine, buf, out=target)
        elif not sends and len(recvs) == 1:
            src, rsl, scr, r_in, low = recvs[0]
            if scr is None:
                comm.Recv(work[rsl], src, tag)
            else:
                buf = scratch[scr]
                comm.Recv(buf, src, tag)
                target = work[rsl]
                mine = inp[rsl] if r_in else target
                ufunc(buf, mine, out=target) if low else ufunc(mine, buf, out=target)
        elif not recvs and len(sends) == 1:
            dst, ssl, s_in = sends[0]
            comm.Send(inp[ssl] if s_in else work[ssl], dst, tag)
        else:
            reqs = [comm.Irecv(scratch[scr] if scr is not None else work[rsl], src, tag)
                    for src, rsl, scr, _, _ in recvs]
            reqs += [comm.Isend(inp[ssl] if s_in else work[ssl], dst, tag) for dst, ssl, s_in in sends]
            MPI.Request.Waitall(reqs)
            for src, rsl, scr, r_in, low in recvs:
                if scr is not None:
                    target, buf = work[rsl], scratch[scr]
                    mine = inp[rsl] if r_in else target
                    ufunc(buf, mine, out=target) if low else ufunc(mine, buf, out=target)


def _execute_general(schedule, prog, comm, work, scratch, ufunc, tag, timeout, op, transport, staged, inp=None,
                     progress=None):
    """Execute with device buffers, a timeout or a progress callback; see :func:`execute`."""
    for index in range(len(prog)):
        _run_round(schedule, prog, index, comm, work, scratch, ufunc, tag, timeout, op, transport, staged, inp,
                   progress)
    return work


def _post_round(prog, index, comm, work, scratch, tag, transport, staged, inp=None):
    """Post round ``index``'s receives and sends; return (requests, peers, landing buffers)."""
    sends, recvs = prog[index]
    if transport is not None:
        transport.sync()  # kernels writing the send regions must finish before MPI reads them
    reqs, peers, landing = [], [], []
    for i, (src, rsl, scr, _, _) in enumerate(recvs):
        dev = scratch[scr] if scr is not None else work[rsl]
        buf = transport.host_buffer(dev.dtype, dev.size, ("r", i)) if staged else dev
        reqs.append(comm.Irecv(buf, src, tag))
        peers.append(src)
        landing.append((buf, dev))
    for i, (dst, ssl, s_in) in enumerate(sends):
        region = inp[ssl] if s_in else work[ssl]
        buf = transport.to_host(region, ("s", i)) if staged else region
        reqs.append(comm.Isend(buf, dst, tag))
        peers.append(-1 - dst)
    return reqs, peers, landing


def _finish_round(prog, index, work, ufunc, landing, transport, staged, inp=None):
    """Copy staged receives to the device and apply round ``index``'s reductions in order."""
    for (src, rsl, scr, r_in, low), (buf, dev) in zip(prog[index][1], landing):
        if staged:
            transport.to_device(buf, dev)
        if scr is not None:
            target = work[rsl]
            mine = inp[rsl] if r_in else target
            ufunc(dev, mine, out=target) if low else ufunc(mine, dev, out=target)


def _run_round(schedule, prog, index, comm, work, scratch, ufunc, tag, timeout, op, transport, staged, inp=None,
               progress=None):
    reqs, peers, landing = _post_round(prog, index, comm, work, scratch, tag, transport, staged, inp)
    if timeout is None and progress is None:
        MPI.Request.Waitall(reqs)
    else:
        deadline = None if timeout is None else time.perf_counter() + timeout
        _wait(reqs, peers, deadline, op, index, schedule.rounds[index].phase, timeout, progress)
    _finish_round(prog, index, work, ufunc, landing, transport, staged, inp)
