"""The schedule route of the all-reduce: a hand-made algorithm's schedule run by the executor.

One entry per call, :func:`schedule_allreduce` (blocking) or :func:`schedule_iallreduce` (a
:class:`~collectives.engine.request.Request`), after :func:`collectives.allreduce` has checked the
arguments (:func:`collectives.arguments.check_allreduce`) and resolved ``auto`` and the grid. The
schedule (:mod:`collectives.schedules`) is built once per (algorithm, count, grid) and cached on the
context; the input is read into the accumulation-dtype working buffer as the first round needs it
(:func:`collectives.engine.buffers.prepare`), the rounds run in the executor's one loop
(:mod:`.executor`), and the result is finished (``avg``'s division, the copy into ``out``) under the
rules every route shares. The call's :class:`~collectives.engine.context.CallRecord` counts the
bytes and messages of the schedule as executed.
"""
from collectives.backend import OPS
from collectives.engine.buffers import finish, prepare
from collectives.engine.executor import Run, run_schedule
from collectives.engine.request import Request
from collectives.schedules.registry import build_allreduce_schedule
from collectives.schedules.schedule import segmented

__all__ = ["schedule_allreduce", "schedule_iallreduce"]


def _schedule(ctx, algorithm, count, grid):
    """Return this rank's segmented schedule of ``algorithm`` for ``count`` elements (cached on ``ctx``)."""
    return ctx.schedule(("allreduce", algorithm, count, grid),
                        lambda: segmented(build_allreduce_schedule(algorithm, ctx.rank, ctx.size, count, grid)))


def schedule_allreduce(ctx, key, x, out, timeout, xp, accumulate="float32"):
    """Run the all-reduce of checked arguments by its schedule; return the result.

    Parameters
    ----------
    ctx : Context
        The communicator's library context (:mod:`collectives.engine.context`).
    key : tuple
        The call key: ``("allreduce", algorithm, count, dtype, op, None, grid)``
        (:mod:`collectives.engine.fingerprint`).
    x : ndarray
        The input, checked (NumPy or CuPy).
    out : ndarray or None
        Checked result array, or None for a new one.
    timeout : float or None
        Seconds any one round may wait for a peer.
    xp : module
        ``numpy`` or ``cupy``.
    accumulate : {"float32", "native"}
        float16's and bfloat16's accumulation (see :func:`collectives.allreduce`).

    Returns
    -------
    ndarray
        ``out``, or a new array of ``x``'s shape and dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from collectives.engine.context import get_context
    >>> ctx = get_context()
    >>> key = ("allreduce", "ring", 3, np.dtype("float64"), "sum", None, None)
    >>> schedule_allreduce(ctx, key, np.arange(3.0), None, None, np)  # one rank: x itself
    array([0., 1., 2.])
    """
    algorithm, count, op, grid = key[1], x.size, key[4], key[6]
    sched = _schedule(ctx, algorithm, count, grid)
    out, work, acc, direct, inp = prepare(x, out, ctx, xp, "work", accumulate, lazy=True)
    run = Run(sched, ctx.comm, work, scratch=ctx.buffer(xp, acc, sched.scratch), ufunc=getattr(xp, OPS[op]),
              name="allreduce").read_from(inp)
    run_schedule(ctx, key, run, timeout=timeout, xp=xp)
    ctx.record("allreduce", algorithm, count, acc, sched)
    return finish(out, work, op, ctx.size, xp, direct)


def schedule_iallreduce(ctx, key, x, out, xp, accumulate="float32"):
    """Start the all-reduce of checked arguments by its schedule; return its :class:`Request`.

    The request owns a private working buffer and scratch, so several may be in flight; its
    :attr:`~collectives.engine.request.Request.record` is the call's record. Parameters as for
    :func:`schedule_allreduce` (no timeout: ``wait(timeout)`` takes it).

    Examples
    --------
    >>> import numpy as np
    >>> from collectives.engine.context import get_context
    >>> key = ("allreduce", "ring", 2, np.dtype("float64"), "avg", None, None)
    >>> req = schedule_iallreduce(get_context(), key, np.ones(2), None, np)
    >>> req.wait(), req.record.algorithm
    (array([1., 1.]), 'ring')
    """
    algorithm, count, op, grid = key[1], x.size, key[4], key[6]
    sched = _schedule(ctx, algorithm, count, grid)
    out, work, acc, direct, _ = prepare(x, out, ctx, xp, None, accumulate)
    tag = ctx.begin(key)
    scratch = xp.empty(max(sched.scratch, 1), dtype=acc)
    record = ctx.record("allreduce", algorithm, count, acc, sched)
    size = ctx.size
    run = Run(sched, ctx.comm, work, scratch=scratch, ufunc=getattr(xp, OPS[op]), tag=tag, name="allreduce",
              transport=ctx.transport(xp))
    return Request(run, finish=lambda: finish(out, work, op, size, xp, direct), active=ctx.active, on_fail=ctx.fail,
                   record=record)
