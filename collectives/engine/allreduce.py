"""The schedule route of the all-reduce: a hand-made algorithm's schedule run by the executor.

One entry per call, :func:`schedule_allreduce`, after :func:`collectives.allreduce` has checked
the arguments and resolved ``auto`` and the grid. The schedule (:mod:`collectives.schedules`) is
built once per (algorithm, count, grid) and cached on the context; the input is read into the
accumulation-dtype working buffer as the first round needs it (:mod:`.buffers`), the rounds run in
the executor's one loop (:mod:`.executor`), and the result is finished (``avg``'s division, the
copy into ``out``) under the rules every route shares.
"""
from collectives.backend import OPS
from collectives.engine.buffers import finish, prepare
from collectives.engine.executor import Run, run_schedule
from collectives.schedules.registry import build_allreduce_schedule
from collectives.schedules.schedule import segmented

__all__ = ["schedule_allreduce"]


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
        float16's accumulation (see :func:`collectives.allreduce`).

    Returns
    -------
    ndarray
        ``out``, or a new array of ``x``'s shape and dtype.
    """
    algorithm, count, op, grid = key[1], x.size, key[4], key[6]
    sched = ctx.schedule(("allreduce", algorithm, count, grid),
                         lambda: segmented(build_allreduce_schedule(algorithm, ctx.rank, ctx.size, count, grid)))
    out, work, acc, direct, inp = prepare(x, out, ctx, xp, "work", accumulate, lazy=True)
    run = Run(sched, ctx.comm, work, scratch=ctx.buffer(xp, acc, sched.scratch), ufunc=getattr(xp, OPS[op]),
              name="allreduce").read_from(inp)
    run_schedule(ctx, key, run, timeout=timeout, xp=xp)
    ctx.record("allreduce", algorithm, count, acc, sched)
    return finish(out, work, op, ctx.size, xp, direct)
