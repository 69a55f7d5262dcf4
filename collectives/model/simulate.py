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

__all__ = ["ScheduleDeadlock", "replay"]


def replay(schedules, data=None, ufunc=numpy.add, cost=None, reduce_cost=None):
    """Run ``schedules`` (one per rank, index = rank) to completion in one process.

    Parameters
    ----------
    schedules : list of Schedule
        ``schedules[r]`` is rank r's schedule; all for the same collective and P.
    data : list of ndarray, optional
        Rank r's flat work buffer (modified in place). Without data only the timing is replayed.
    ufunc : ufunc
        Reduction applied by reducing receives.
    cost : callable, optional
        ``cost(src, dst, elements) -> (send_seconds, arrival_delay_seconds)``: the sender is busy for
        ``send_seconds`` and the message arrives ``arrival_delay_seconds`` after the send starts.
    reduce_cost : callable, optional
        ``reduce_cost(elements) -> seconds`` added to a round for each reducing receive.

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
    progress, executed = True, 0
    while progress:
        progress = False
        for r in range(size):
            rounds = schedules[r].rounds
            while pos[r] < len(rounds):
                rd = rounds[pos[r]]
                if posted[r] is None:  # sends are posted first (non-blocking), as the executor does
                    start = clock[r]
                    for p, a, b in rd.sends:
                        payload = data[r][a:b].copy() if data is not None else None
                        send_s, delay = cost(r, p, b - a) if cost else (0.0, 0.0)
                        queues.setdefault((r, p), deque()).append((payload, b - a, start + delay))
                        start += send_s
                    posted[r] = start
                    progress = True
                need = {}
                for p, _, _, _ in rd.recvs:
                    need[p] = need.get(p, 0) + 1
                if any(len(queues.get((p, r), ())) < n for p, n in need.items()):
                    break
                end = posted[r]
                posted[r] = None
                for p, a, b, red in rd.recvs:
                    payload, n, arrival = queues[(p, r)].popleft()
                    if n != b - a:
                        raise ValueError(f"rank {r} round {pos[r]} expected {b - a} elements from {p}, got {n}")
                    end = max(end, arrival)
                    if red and reduce_cost is not None:
                        end += reduce_cost(n)
                    if data is not None:
                        target = data[r][a:b]
                        if red:
                            ufunc(target, payload, out=target)
                        else:
                            target[...] = payload
                clock[r] = end
                pos[r] += 1
                executed += 1
                progress = True
    stuck = [r for r in range(size) if pos[r] < len(schedules[r].rounds)]
    if stuck:
        r = stuck[0]
        raise ScheduleDeadlock(f"ranks {stuck} cannot progress; rank {r} waits in round {pos[r]}: "
                               f"{schedules[r].rounds[pos[r]]}")
    return {"clock": clock, "rounds": executed}
