"""The schedule representation and the one executor that runs every hand-made collective.

An algorithm is a pure function ``(rank, size, count, ...) -> Schedule``. A schedule is a list of
rounds; in each round a rank posts its receives, posts its sends, waits for all of them, and then
applies its reductions in order. Regions are ``[start, stop)`` element ranges of one flat *work*
buffer (the output, in the accumulation dtype); a receive either lands directly in its region
(``reduce=False``, a copy) or in *scratch* and is then combined into its region with the op's ufunc
(``reduce=True``). Messages of zero elements are never scheduled: both sides derive the same sizes
from the same rule, so both skip them.

The same schedule drives blocking execution, the non-blocking :class:`Request`, byte and message
accounting, and the cost simulator in :mod:`collectives.cost`.
"""
import functools
import time

import numpy
from mpi4py import MPI

__all__ = ["Round", "Schedule", "CollectiveTimeout", "chunk_bounds", "execute", "Request"]


@functools.lru_cache(maxsize=1024)
def chunk_bounds(count, parts):
    """Return the ``parts + 1`` boundaries that split ``count`` elements as ``numpy.array_split`` does.

    The first ``count % parts`` chunks hold ``count // parts + 1`` elements, the rest
    ``count // parts``; for example 73 elements over 4 parts give chunks of 19, 18, 18, 18.

    Parameters
    ----------
    count : int
        Number of elements, >= 0.
    parts : int
        Number of chunks, >= 1.

    Returns
    -------
    tuple of int
        ``bounds`` with ``bounds[0] == 0`` and ``bounds[parts] == count``; chunk ``i`` is
        ``[bounds[i], bounds[i + 1])``.
    """
    q, r = divmod(count, parts)
    return tuple(i * q + min(i, r) for i in range(parts + 1))


class Round:
    """One round of a schedule: sends, receives and the reductions that follow them.

    Parameters
    ----------
    sends : sequence of (int, int, int)
        ``(peer, start, stop)``: send ``work[start:stop]`` to ``peer``.
    recvs : sequence of (int, int, int, bool)
        ``(peer, start, stop, reduce)``: receive ``stop - start`` elements from ``peer``; with
        ``reduce`` combine them into ``work[start:stop]`` with the op, else store them there.
    phase : str
        Name of the algorithm phase ("reduce-scatter", "all-gather", ...), for traces and errors.
    """

    __slots__ = ("sends", "recvs", "phase")

    def __init__(self, sends=(), recvs=(), phase=""):
        self.sends = tuple((p, a, b) for p, a, b in sends if b > a)
        self.recvs = tuple((p, a, b, bool(red)) for p, a, b, red in recvs if b > a)
        self.phase = phase

    def __repr__(self):
        return f"Round(phase={self.phase!r}, sends={self.sends}, recvs={self.recvs})"


class Schedule:
    """A per-rank schedule: the rounds one rank executes for one collective.

    Parameters
    ----------
    algorithm : str
        Registry name of the algorithm that built it.
    rank, size : int
        This rank and the communicator size.
    count : int
        Elements in the flat work buffer.
    rounds : list of Round
        Empty rounds are dropped.

    Attributes
    ----------
    scratch : int
        Elements of scratch space needed (the largest total of reducing receives in one round).
    elements_sent, messages : int
        Totals over all rounds, for byte accounting (multiply by the item size for bytes).
    """

    __slots__ = ("algorithm", "rank", "size", "count", "rounds", "scratch", "elements_sent",
                 "messages", "_program")

    def __init__(self, algorithm, rank, size, count, rounds):
        self.algorithm = algorithm
        self.rank = rank
        self.size = size
        self.count = count
        self.rounds = [r for r in rounds if r.sends or r.recvs]
        self.scratch = max([sum(b - a for _, a, b, red in r.recvs if red) for r in self.rounds] or [0])
        self.elements_sent = sum(b - a for r in self.rounds for _, a, b in r.sends)
        self.messages = sum(len(r.sends) for r in self.rounds)
        self._program = None

    def links(self):
        """Return ``{(src, dst): elements}`` summed over this rank's sends."""
        out = {}
        for r in self.rounds:
            for p, a, b in r.sends:
                out[(self.rank, p)] = out.get((self.rank, p), 0) + b - a
        return out

    def program(self, from_input=False, needed=None):
        """Return the rounds compiled into slices (cached): the executor's input.

        Each round is ``(sends, recvs)`` with sends ``(peer, slice, from_input)`` and receives
        ``(peer, slice, scratch slice or None, from_input, low)``; ``low`` (the peer's rank is below this
        rank's) puts the received operand first, so both sides of an exchange combine in the same
        order: ``min``/``max`` of +0.0 and -0.0 (and of two NaN payloads) then agree bitwise.

        Parameters
        ----------
        from_input : bool
            Compile for a separate, read-only *input* buffer: a region the schedule has not written
            yet is sent straight from the input, and its first reduction reads the input
            (``ufunc(input, received, out=work)``), so the input never has to be copied into the work
            buffer first. Regions still unwritten at the end are copied over (``final`` below).
        needed : (int, int), optional
            With ``from_input``: only this element range of the result is wanted (default all).

        Returns
        -------
        list, or (list, list of slice) with ``from_input``
            The rounds; with ``from_input`` also the ``final`` slices to copy from the input, or None
            when some region is partly written before it is read (use a copied input instead).
        """
        key = (from_input, needed)
        if self._program is None:
            self._program = {}
        if key not in self._program:
            self._program[key] = self._compile(from_input, needed)
        return self._program[key]

    def _compile(self, from_input, needed):
        written = []  # disjoint [a, b) intervals of the work buffer that hold schedule results

        def state(a, b):  # 0: untouched, 1: written, None: partly written
            if not from_input:
                return 1
            cover = sum(max(0, min(b, wb) - max(a, wa)) for wa, wb in written)
            return 0 if cover == 0 else (1 if cover == b - a else None)

        def mark(a, b):  # add [a, b) to the disjoint, sorted intervals in ``written``
            if not from_input:
                return
            keep = [(wa, wb) for wa, wb in written if wb < a or wa > b]
            for wa, wb in written:
                if not (wb < a or wa > b):
                    a, b = min(a, wa), max(b, wb)
            written[:] = sorted(keep + [(a, b)])

        prog = []
        for r in self.rounds:
            sends = []
            for p, a, b in r.sends:
                st = state(a, b)
                if st is None:
                    return None
                sends.append((p, slice(a, b), st == 0))
            recvs, off, after = [], 0, []
            for p, a, b, red in r.recvs:
                scr, first = None, False
                if red:
                    scr = slice(off, off + b - a)
                    off += b - a
                    st = state(a, b)
                    if st is None:
                        return None
                    first = st == 0
                recvs.append((p, slice(a, b), scr, first, p < self.rank))
                after.append((a, b))
            for a, b in after:
                mark(a, b)
            prog.append((tuple(sends), tuple(recvs)))
        if not from_input:
            return prog
        lo, hi = needed if needed is not None else (0, self.count)
        final, pos = [], lo
        for wa, wb in sorted(written) + [(hi, hi)]:
            if wa > pos:
                final.append(slice(pos, min(wa, hi)))
            pos = max(pos, wb)
            if pos >= hi:
                break
        return prog, [f for f in final if f.stop > f.start]

    def __repr__(self):
        return (f"Schedule({self.algorithm!r}, rank={self.rank}, size={self.size}, count={self.count}, "
                f"rounds={len(self.rounds)}, messages={self.messages}, elements_sent={self.elements_sent})")


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


class Request:
    """A non-blocking collective in progress, advanced by :meth:`test` and completed by :meth:`wait`.

    Progress happens only inside library calls (no background thread): ``test()`` completes whatever
    rounds have arrived and posts the next ones, so computation placed between calls overlaps with
    communication. While waiting -- in ``wait()`` or in a blocking collective on the same
    communicator -- every request in flight there is advanced, so requests may be completed in any
    order on different ranks without deadlock.

    Parameters
    ----------
    schedule, comm, work, scratch, ufunc, tag, op, transport
        As for :func:`execute`.
    finish : callable or None
        Called once with no arguments after the last round (final division for ``avg``, casting
        into the output); its return value becomes :attr:`result`.
    active : set or None
        The communicator's set of requests in flight (this request adds and removes itself).
    on_fail : callable or None
        Called with the error message when a wait times out (marks the communicator unusable).
    """

    __slots__ = ("_schedule", "_prog", "_comm", "_work", "_scratch", "_ufunc", "_tag", "_op",
                 "_transport", "_staged", "_index", "_pending", "_finish", "_active", "_on_fail",
                 "_failed", "result", "done")

    def __init__(self, schedule, comm, work, scratch, ufunc, tag, op, transport=None, finish=None,
                 active=None, on_fail=None):
        self._schedule, self._prog = schedule, schedule.program()
        self._comm, self._work, self._scratch, self._ufunc = comm, work, scratch, ufunc
        self._tag, self._op, self._transport = tag, op, transport
        self._staged = transport is not None and not transport.direct
        self._index, self._pending, self._finish = 0, None, finish
        self._active, self._on_fail, self._failed = active, on_fail, None
        self.result, self.done = None, False
        if active is not None:
            active.add(self)
        self._advance()

    def _advance(self):
        if self.done or self._failed is not None:
            return
        while self._index < len(self._prog):
            if self._pending is None:
                self._pending = _post_round(self._prog, self._index, self._comm, self._work,
                                            self._scratch, self._tag, self._transport, self._staged)
            reqs, _, landing = self._pending
            if not MPI.Request.Testall(reqs):
                return
            _finish_round(self._prog, self._index, self._work, self._ufunc, landing,
                          self._transport, self._staged)
            self._pending = None
            self._index += 1
        self.done = True
        if self._active is not None:
            self._active.discard(self)
        self.result = self._finish() if self._finish is not None else self._work

    def _check(self):
        if self._failed is not None:
            raise RuntimeError(f"this request failed earlier ({self._failed}); its result is lost")

    def _progress_others(self):
        for other in list(self._active or ()):
            if other is not self:
                other._advance()

    def test(self):
        """Advance the collective without blocking; return True once it has completed.

        Raises
        ------
        RuntimeError
            An earlier ``wait`` timed out: the result is lost.
        """
        self._check()
        self._advance()
        return self.done

    def wait(self, timeout=None):
        """Block until the collective completes and return its result.

        Parameters
        ----------
        timeout : float or None
            Seconds to wait for any one round before raising :class:`CollectiveTimeout`; the request
            (and its communicator) is unusable afterwards.

        Raises
        ------
        ValueError
            ``timeout`` is not None or a positive number.
        CollectiveTimeout, RuntimeError
            A round timed out now, or did earlier.
        """
        from .backend import check_timeout  # late import: backend does not depend on schedules

        timeout = check_timeout(timeout)
        self._check()
        while not self.done:
            if self._pending is None:
                self._advance()
                continue
            reqs, peers, _ = self._pending
            deadline = None if timeout is None else time.perf_counter() + timeout
            try:
                _wait(reqs, peers, deadline, self._op, self._index, self._schedule.rounds[self._index].phase,
                      timeout, self._progress_others if self._active else None)
            except CollectiveTimeout as exc:
                self._failed = str(exc)
                if self._active is not None:
                    self._active.discard(self)
                if self._on_fail is not None:
                    self._on_fail(f"{self._op}: {exc}")
                raise
            self._advance()
        return self.result
