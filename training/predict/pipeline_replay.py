"""Replay a pipeline schedule with each stage's operation times and the messages between stages."""
from training.model_parallel.pipeline import schedule

__all__ = ["replay_pipeline"]


def replay_pipeline(name, fwd, bwd, act, grad, micro_batches):
    """Return each stage's finish time and busy time for one step of ``name`` (``gpipe`` or ``1f1b``).

    An operation starts when its stage is free and its input has arrived: the forward of micro-batch i
    on stage s needs stage s - 1's forward of i plus ``act[s - 1]`` seconds of message; the backward
    on stage s < Q - 1 needs stage s + 1's backward of i plus ``grad[s]``; the last stage's backward
    follows its own forward (:func:`training.model_parallel.pipeline.simulate_bubble`, with costs).

    Parameters
    ----------
    name : {"gpipe", "1f1b"}
    fwd, bwd : sequence of float, length Q
        Seconds of one micro-batch's forward and backward on each stage.
    act, grad : sequence of float, length Q - 1
        Seconds of the activation message from stage s to s + 1, and of its gradient back.
    micro_batches : int

    Returns
    -------
    tuple of (list of float, list of float)
        Finish time and busy seconds per stage.

    Examples
    --------
    Two stages, two micro-batches, free messages: the 1F1B bubble is (Q - 1) / (m + Q - 1) = 1/3:

    >>> end, busy = replay_pipeline("1f1b", [1.0, 1.0], [2.0, 2.0], [0.0], [0.0], 2)
    >>> end, busy
    ([9.0, 7.0], [6.0, 6.0])
    """
    Q, m = len(fwd), micro_batches
    ops = [schedule(name, s, Q, m) for s in range(Q)]
    done, free, pos, busy = {}, [0.0] * Q, [0] * Q, [0.0] * Q
    while any(pos[s] < len(ops[s]) for s in range(Q)):
        before = sum(pos)
        for s in range(Q):
            while pos[s] < len(ops[s]):
                kind, i = ops[s][pos[s]]
                if kind == "F":
                    dep = None if s == 0 else done.get(("F", s - 1, i))
                    arrive = 0.0 if s == 0 else (None if dep is None else dep + act[s - 1])
                else:
                    dep = done.get(("F", s, i)) if s == Q - 1 else done.get(("B", s + 1, i))
                    arrive = None if dep is None else (dep if s == Q - 1 else dep + grad[s])
                if arrive is None:
                    break
                cost = fwd[s] if kind == "F" else bwd[s]
                free[s] = done[(kind, s, i)] = max(free[s], arrive) + cost
                busy[s] += cost
                pos[s] += 1
        if sum(pos) == before:
            raise RuntimeError(f"pipeline schedule {name!r} deadlocks at positions {pos}")
    return free, busy
