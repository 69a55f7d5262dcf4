"""Replay every rank's schedule in one process: data (for checking) and per-rank clocks (for timing).

The replay delivers messages through per-link FIFO queues, exactly as MPI's non-overtaking rule
matches them on one communicator and tag. A rank executes its next round once every receive of that
round has a message waiting (sends are eager). If no rank can move while some have rounds left, the
schedules deadlock and :class:`ScheduleDeadlock` is raised. With ``data`` the rounds also move and
reduce real arrays, so a schedule can be checked against NumPy for any P without MPI; with a
``cost`` function each rank keeps a clock, and a round ends at
``max(own clock, arrival of every message) + cost``.
"""
from collections import deque

import numpy

from collectives.errors import ScheduleDeadlock
from collectives.schedules.schedule import apply_receive

__all__ = ["replay"]


def replay(schedules, data=None, ufunc=numpy.add, cost=None, reduce_cost=None, from_input=False):
    """Run ``schedules`` (one per rank, index = rank) to completion in one process.

    With ``data``, each rank runs its schedule's compiled program
    (:meth:`~collectives.schedules.schedule.Schedule.program`), the executor's own, and applies its
    receives with the executor's :func:`~collectives.schedules.schedule.apply_receive`, so a schedule
    computes here what it computes under MPI. Timing alone reads the rounds' peers and lengths, which
    the program carries unchanged (and saves compiling thousands of ranks' programs).

    Parameters
    ----------
    schedules : list of Schedule
        ``schedules[r]`` is rank r's schedule; all for the same collective and P.
    data : list of ndarray, optional
        Rank r's flat work buffer (modified in place: it ends holding the result). Without data only
        the timing is replayed.
    ufunc : ufunc
        Reduction applied by reducing receives.
    cost : callable, optional
        ``cost(src, dst, elements) -> (send_seconds, arrival_delay_seconds)``: the sender is busy for
        ``send_seconds`` and the message arrives ``arrival_delay_seconds`` after the send starts.
    reduce_cost : callable, optional
        ``reduce_cost(elements) -> seconds`` added to a round for each reducing receive.
    from_input : bool
        Run the program the executor runs out of place: ``data[r]`` is read as a separate input and
        the result is computed in a fresh work buffer (filled with a marker value first, so a region
        read before anything wrote it shows), then copied into ``data[r]``.

    Returns
    -------
    dict
        ``clock`` (list of float: each rank's finish time in seconds, zeros without ``cost``) and
        ``rounds`` (total rounds executed).

    Raises
    ------
    ScheduleDeadlock
        A receive can never be matched.
    ValueError
        A received message does not have the length the receiving round expects.

    Examples
    --------
    Three ranks' ring all-reduce in one process, checked against NumPy's sum:

    >>> from collectives.schedules.registry import build_allreduce_schedule
    >>> data = [numpy.arange(5.0) * (r + 1) for r in range(3)]
    >>> scheds = [build_allreduce_schedule("ring", r, 3, 5) for r in range(3)]
    >>> replay(scheds, data)["rounds"]
    12
    >>> data[2]
    array([ 0.,  6., 12., 18., 24.])
    >>> replay(scheds, cost=lambda src, dst, n: (0.0, 1.0))["clock"]  # 1 s per message
    [4.0, 4.0, 4.0]
    """
    size = len(schedules)
    queues = {}
    pos = [0] * size
    clock = [0.0] * size
    posted = [None] * size  # time the current round's sends finished, once posted
    progs, finals, works, inputs, scratch = [], [], [], [], []
    for r, sched in enumerate(schedules):
        compiled = sched.program(True) if from_input and data is not None else None
        if compiled is not None:
            prog, final = compiled
            inp = data[r].copy()
            work = numpy.empty_like(inp)
            work[...] = 77 if inp.dtype.kind in "iub" else numpy.nan
        elif data is not None:
            prog, final, inp, work = sched.program(), [], None, data[r]
        else:  # timing only: the rounds' peers and lengths, all the compiled program adds being slices
            prog, final, inp, work = [(rd.sends, rd.recvs) for rd in sched.rounds], [], None, None
        progs.append(prog)
        finals.append(final)
        works.append(work)
        inputs.append(inp)
        scratch.append(numpy.empty(sched.scratch, work.dtype) if work is not None else None)
    progress, executed = True, 0
    while progress:
        progress = False
        for r in range(size):
            prog, work, inp = progs[r], works[r], inputs[r]
            while pos[r] < len(prog):
                sends, recvs = prog[pos[r]]
                if posted[r] is None:  # sends are posted first (non-blocking), as the executor does
                    start = clock[r]
                    for snd in sends:
                        if work is None:
                            p, n, payload = snd[0], snd[2] - snd[1], None
                        else:
                            p, sl, s_in = snd
                            n, payload = sl.stop - sl.start, (inp if s_in else work)[sl].copy()
                        send_s, delay = cost(r, p, n) if cost else (0.0, 0.0)
                        queues.setdefault((r, p), deque()).append((payload, n, start + delay))
                        start += send_s
                    posted[r] = start
                    progress = True
                need = {}
                for rv in recvs:
                    need[rv[0]] = need.get(rv[0], 0) + 1
                if any(len(queues.get((p, r), ())) < n for p, n in need.items()):
                    break
                end = posted[r]
                posted[r] = None
                landed = []
                for rv in recvs:
                    if work is None:
                        p, want, red = rv[0], rv[2] - rv[1], rv[3]
                    else:
                        p, sl, scr, red = rv[0], rv[1], rv[2], rv[5]
                        want = sl.stop - sl.start
                    payload, n, arrival = queues[(p, r)].popleft()
                    if n != want:
                        raise ValueError(f"rank {r} round {pos[r]} expected {want} elements from {p}, got {n}")
                    end = max(end, arrival)
                    if red and reduce_cost is not None:
                        end += reduce_cost(n)
                    if work is not None:
                        landing = work[sl] if scr is None else scratch[r][scr]
                        landing[...] = payload
                        landed.append(landing)
                for rv, message in zip(recvs, landed):
                    apply_receive(rv, message, work, inp, ufunc)
                clock[r] = end
                pos[r] += 1
                executed += 1
                progress = True
    stuck = [r for r in range(size) if pos[r] < len(progs[r])]
    if stuck:
        r = stuck[0]
        raise ScheduleDeadlock(f"ranks {stuck} cannot progress; rank {r} waits in round {pos[r]}: "
                               f"{schedules[r].rounds[pos[r]]}")
    for r in range(size):
        if inputs[r] is not None:
            for sl in finals[r]:
                works[r][sl] = inputs[r][sl]
            data[r][...] = works[r]
    return {"clock": clock, "rounds": executed}
