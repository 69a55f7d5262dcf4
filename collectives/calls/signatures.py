"""The repeated all-reduce's look-up: the cached library plan of a call signature that passed the full
checks before, or None (and the full checks of :func:`collectives.allreduce` run).

A signature is the shape, dtype, op and algorithm as given; its entry on the communicator's context
(``Context.fast``, made by :func:`collectives.library.allreduce.library_allreduce`) holds the plan,
the decision table of ``auto`` and the checks settings it was made under. Anything that changed since
(the table, the checks or debug mode, a broken communicator, a plan still running, an ``out`` of
another shape or dtype, a timeout that is not a positive float) gives None.
"""
import numpy
from mpi4py import MPI

from collectives.engine.context import _LAST, existing_context
from collectives.engine.fingerprint import _SETTINGS
from collectives.model.auto import _STATE

__all__ = ["repeated_plan", "known_plan", "cached_plan"]


def repeated_plan(x, comm, op, algorithm, out):
    """Return the cached plan of a repeated call without a deadline that passed the full checks before, else None.

    The lean form of :func:`known_plan` for the commonest repeated call, in one Python frame: the
    signature's entry holds the plan, the decision table of ``auto`` and the checks settings
    (:func:`~collectives.engine.fingerprint.settings_token`) it was made under, so checking that
    nothing changed is a few identity comparisons. The communicator of the previous cached call and
    the two tokens are read where :func:`~collectives.engine.context.existing_context`,
    :func:`~collectives.engine.fingerprint.settings_token` and
    :func:`~collectives.model.auto.table_token` keep them, without calling those functions (a call
    costs about as much as the comparison it serves); every change of the settings or the table,
    :func:`~collectives.model.auto.reset_table` included, replaces its token. ``out``, when given,
    must be a writable NumPy array of ``x``'s shape and dtype; anything else -- another communicator
    type, an ``algorithm`` or ``op`` that cannot be a dictionary key -- gives None and the full checks
    run (and raise where they must).
    """
    ctx = _LAST[1] if (MPI.COMM_WORLD if comm is None else comm) is _LAST[0] else existing_context(comm)
    if ctx is None:
        return None
    shape, dtype = x.shape, x.dtype  # each read makes or fetches an object: once for the key and for out
    try:
        entry = ctx.fast.get((algorithm, op, dtype, shape))
    except TypeError:  # an unhashable algorithm or op: the full checks name it
        return None
    if entry is None:
        return None
    plan, table, settings = entry
    if (settings is not _SETTINGS[0] or (table is not None and table is not _STATE["cache"])
            or ctx.broken is not None or plan.active):
        return None
    if out is not None and (type(out) is not numpy.ndarray or out.shape != shape or out.dtype != dtype
                            or not out.flags.writeable):
        return None
    return plan


def cached_plan(x, *, comm=None, op="sum", algorithm="auto"):
    """Return the cached library plan a repeated blocking ``allreduce(x, ...)`` would run now, else None.

    For measurement and tests (``experiments/bench/breakdown.py`` times the plan's steps): the
    same look-up as the call itself, no message.

    Parameters
    ----------
    x : ndarray
        An input of the call's shape and dtype.
    comm, op, algorithm
        As for :func:`allreduce` (``op`` a string).

    Returns
    -------
    collectives.library.plans.LibraryPlan or None
        None before the signature's first call, or when it does not run the library's all-reduce.

    Examples
    --------
    >>> import numpy as np
    >>> import collectives
    >>> from collectives.calls.signatures import cached_plan
    >>> x = np.ones(4, np.float32)
    >>> _ = collectives.allreduce(x, algorithm="mpi")
    >>> cached_plan(x, algorithm="mpi").n
    4
    >>> cached_plan(np.ones(5, np.float32), algorithm="mpi") is None  # never called with this shape
    True
    """
    return repeated_plan(x, comm, op, algorithm, None)


def known_plan(x, comm, op, algorithm, out, timeout):
    """Return the cached library plan of a call whose signature passed the full checks before, else None.

    The signature is the shape, dtype, op and algorithm as given and, for ``auto``, the decision
    table in force (:func:`collectives.model.auto.table_token`). Anything else -- a new signature,
    ``out`` of another shape or dtype or read-only, a timeout that is not a positive float, debug
    mode, a change of the checks setting, a broken communicator, a plan still running -- gives None,
    and the full checks run (and raise where they must).
    """
    plan = repeated_plan(x, comm, op, algorithm, out)
    if plan is None or (timeout is not None and (type(timeout) is not float or not 0.0 < timeout < float("inf"))):
        return None
    return plan
