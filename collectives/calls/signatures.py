"""The repeated all-reduce's look-up: the cached library plan of a call signature that passed the full
checks before, or None (and the full checks of :func:`collectives.allreduce` run).

A signature is the shape, dtype, op and algorithm as given; its entry on the communicator's context
(``Context.fast``, made by :func:`collectives.library.mpi_allreduce.library_allreduce`) holds the plan,
the decision table of ``auto`` and the checks settings it was made under. Anything that changed since
(the table, the checks or debug mode, a broken communicator, a plan still running, an ``out`` of
another shape or dtype, a timeout that is not a positive float) gives None.
"""
import numpy

from collectives.engine.context import existing_context
from collectives.engine.fingerprint import settings_token
from collectives.model.auto import table_token

__all__ = ["cached_plan"]


def cached_plan(x, *, comm=None, op="sum", algorithm="auto", out=None, timeout=None, grid=None, accumulate="float32"):
    """Return the cached library plan a blocking ``allreduce(x, ...)`` would run now, else None: the one look-up.

    :func:`collectives.allreduce` asks it first, before any check: a call whose signature (shape,
    dtype, op and algorithm as given) passed the full checks before on this communicator runs its
    plan (:meth:`~collectives.library.plans.LibraryPlan.allreduce`). The signature's entry holds the
    plan, the decision table of ``auto`` (:func:`~collectives.model.auto.table_token`) and the checks
    settings (:func:`~collectives.engine.fingerprint.settings_token`) it was made under; every change
    of the settings or the table, :func:`~collectives.model.auto.reset_table` included, replaces its
    token, so checking that nothing changed is a few identity comparisons. Anything else -- a new
    signature, a device or DLPack array, ``out`` that is not a writable NumPy array of ``x``'s shape
    and dtype, a timeout that is not a positive float, a ``grid`` or ``accumulate`` other than the
    default, an ``op`` or ``algorithm`` that cannot be a dictionary key, another communicator type, a
    broken communicator, a plan still running -- gives None, and the full checks run (and raise where
    they must). No message is sent.

    Parameters
    ----------
    x : ndarray
        An input of the call's shape and dtype.
    comm, op, algorithm, out, timeout, grid, accumulate
        As for :func:`collectives.allreduce`.

    Returns
    -------
    collectives.library.plans.LibraryPlan or None
        None before the signature's first call, or when it does not run the library's all-reduce.

    Examples
    --------
    >>> import numpy as np
    >>> import collectives
    >>> x = np.ones(4, np.float32)
    >>> _ = collectives.allreduce(x, algorithm="mpi")
    >>> cached_plan(x, algorithm="mpi").n
    4
    >>> cached_plan(np.ones(5, np.float32), algorithm="mpi") is None  # never called with this shape
    True
    >>> cached_plan(x, algorithm="mpi", timeout=-1.0) is None  # the full checks name what is wrong
    True
    """
    if (type(x) is not numpy.ndarray or grid is not None or accumulate != "float32" or type(op) is not str
            or (timeout is not None and (type(timeout) is not float or not 0.0 < timeout < float("inf")))):
        return None
    ctx = existing_context(comm)
    if ctx is None:
        return None
    shape, dtype = x.shape, x.dtype  # each read makes or fetches an object: once for the key and for out
    try:
        entry = ctx.fast.get((algorithm, op, dtype, shape))
    except TypeError:  # an unhashable algorithm: the full checks name it
        return None
    if entry is None:
        return None
    plan, table, settings = entry
    if (settings is not settings_token() or (table is not None and table is not table_token())
            or ctx.broken is not None or plan.active):
        return None
    if out is not None and (type(out) is not numpy.ndarray or out.shape != shape or out.dtype != dtype
                            or not out.flags.writeable):
        return None
    return plan
