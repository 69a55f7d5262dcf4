"""All-reduce: the public entry point and its non-blocking form.

The rules every collective shares (chunking, float16 and bfloat16 accumulation, integer ``avg``,
NaN under ``min``/``max``, argument errors before any message) are written once, in
:mod:`collectives.calls`. Here: the order of one call -- the cached plan's one look-up
(:mod:`.signatures`), the argument checks (:func:`collectives.arguments.check_allreduce`), the
context, ``auto``'s resolution -- and the choice of one route: the library's ``MPI_Iallreduce``
(:mod:`collectives.library.mpi_allreduce`), a schedule run by the executor
(:mod:`collectives.engine.schedule_allreduce`), or the node's shared memory (:mod:`collectives.shm`).

Examples
--------
:data:`ALGORITHMS` names every all-reduce algorithm, ``algorithm=`` takes its keys:

>>> from collectives.calls.allreduce import ALGORITHMS
>>> list(ALGORITHMS)
['ring', 'tree', 'recursive_doubling', 'rabenseifner', '2d', 'torus', 'shm', 'mpi', 'auto']
>>> ALGORITHMS["mpi"]
"the MPI library's own collective (the oracle and baseline)"
"""
from dataclasses import dataclass

import numpy

from commlab.arrays import get_array_module
from collectives.backend import BFLOAT16
from collectives.calls.signatures import cached_plan
from collectives.arguments import check_allreduce
from collectives.engine.buffers import ACC, AdoptedRequest, adopt
from collectives.engine.context import get_context, refuse
from collectives.engine.schedule_allreduce import schedule_allreduce, schedule_iallreduce
from collectives.errors import CollectiveError
from collectives.library.mpi_allreduce import library_allreduce, library_iallreduce
from collectives.model.auto import model_choice, select_allreduce
from collectives.schedules.registry import AlgorithmTable
from collectives.schedules.torus import square_grid
from collectives.shm import algorithms as shm

__all__ = ["ALGORITHMS", "allreduce", "iallreduce", "AllreduceCall", "begin_allreduce"]

#: All-reduce algorithms: registry name -> one-line description (from :mod:`collectives.schedules.registry`),
#: live: an algorithm registered later (:func:`collectives.register_algorithm`) is in it at once.
ALGORITHMS = AlgorithmTable("allreduce")


@dataclass(frozen=True, slots=True)
class AllreduceCall:
    """One all-reduce, checked and resolved: what a route is handed (:func:`begin_allreduce` makes it)."""

    ctx: object  # the communicator's library context (collectives.engine.context.Context)
    key: tuple  # ("allreduce", algorithm resolved, count, dtype, op name, None, grid tuple or None)
    x: object  # the input, an array of its own module (NumPy or CuPy)
    timeout: object  # seconds any one round may wait (float), or None
    xp: object  # the array module, numpy or cupy
    grid: object  # the resolved grid (tuple) of 2d and torus, else as given

    @property
    def algorithm(self):
        """The algorithm that runs (``auto`` resolved)."""
        return self.key[1]

    @property
    def op(self):
        """The reduction's name."""
        return self.key[4]


def _resolve(ctx, algorithm, x, grid, accumulate, op):
    """Return ``(algorithm, grid)`` with ``auto`` chosen and the grid of ``2d`` / ``torus`` worked out."""
    if algorithm == "auto":
        nbytes = x.size * ACC[x.dtype].itemsize
        algorithm = select_allreduce(ctx.size, nbytes)
        native16 = accumulate == "native" and x.dtype in (numpy.float16, BFLOAT16)
        if algorithm == "mpi" and (type(x) is not numpy.ndarray or native16
                                   or (op in ("min", "max") and ACC[x.dtype].kind == "f")):
            # hand-made instead: device buffers, float16 and bfloat16 on the wire, and float min/max, whose signed
            # zeros MPICH's MPI_MIN/MPI_MAX order differently on each rank (auto's results stay
            # bitwise identical on every rank)
            algorithm = model_choice(ctx.size, nbytes)
    if algorithm in ("2d", "torus"):
        if grid in ("node", "topology") or grid is None:
            nodes, per = ctx.nodes()
            if grid in ("node", "topology") and not nodes:
                raise ValueError(f"grid={grid!r} needs the same number of ranks on every node")
            if algorithm == "torus":  # the job's levels: racks x nodes per rack x ranks per node (a flat ring on one node)
                levels = tuple(d for d in ctx.levels() if d > 1) if nodes else ()
                grid = levels or (ctx.size,)
            else:
                grid = (nodes, per) if (grid == "node" or 1 < nodes < ctx.size) else square_grid(ctx.size)
    return algorithm, grid


def begin_allreduce(x, *, op, comm, algorithm, out, timeout, grid, accumulate):
    """Check every argument of an all-reduce (no message), then get the context and resolve ``auto`` and the grid.

    The one beginning of :func:`allreduce`, :func:`iallreduce` and :func:`collectives.allreduce_init`:
    :func:`collectives.arguments.check_allreduce` on every rank alike, then the communicator's context
    (its duplicate is made on the first call), then ``auto``'s choice. A rank whose checks fail takes
    part in the call's debug-mode fingerprint exchange, marked refused
    (:func:`collectives.engine.context.refuse`), before it raises.

    Parameters
    ----------
    x, op, comm, algorithm, out, timeout, grid, accumulate
        As for :func:`allreduce` (``x`` adopted: NumPy or CuPy).

    Returns
    -------
    AllreduceCall

    Raises
    ------
    ValueError, TypeError
        As for :func:`allreduce`, before any message.

    Examples
    --------
    >>> import numpy as np
    >>> call = begin_allreduce(np.ones(3), op="avg", comm=None, algorithm="ring", out=None, timeout=None,
    ...                        grid=None, accumulate="float32")
    >>> call.algorithm, call.op, call.key[2]
    ('ring', 'avg', 3)
    """
    try:
        comm, x, op, timeout, grid = check_allreduce(x, comm, op, algorithm, out, timeout, grid, accumulate)
    except (ValueError, TypeError) as exc:  # a rank refused alone: the others hear of it (debug mode)
        raise refuse("allreduce", exc, comm, timeout) from None
    ctx = get_context(comm, timeout)
    ctx.check_usable()
    try:
        algorithm, grid = _resolve(ctx, algorithm, x, grid, accumulate, op)
    except CollectiveError as exc:
        ctx.fail(f"allreduce: {exc}")
        raise
    key = ("allreduce", algorithm, x.size, x.dtype, op, None, grid if isinstance(grid, tuple) else None)
    return AllreduceCall(ctx, key, x, timeout, get_array_module(x), grid)


def allreduce(x, *, op="sum", comm=None, algorithm="auto", out=None, timeout=None, grid=None, accumulate="float32"):
    """Combine ``x`` element-wise across all ranks and return the result on every rank.

    Parameters
    ----------
    x : ndarray or DLPack tensor, any shape, float16/bfloat16/float32/float64/int32/int64
        This rank's contribution (NumPy, CuPy, or any DLPack tensor such as a PyTorch or JAX CPU
        tensor, read zero-copy; see :func:`collectives.engine.buffers.adopt`). Same shape and dtype on every
        rank. bfloat16 accumulates in float32, as float16 does.
    comm : mpi4py.MPI.Intracomm, optional
        Communicator (default ``COMM_WORLD``); the library works on its own duplicate.
    op : {"sum", "prod", "min", "max", "avg"} or mpi4py.MPI.SUM/PROD/MIN/MAX
        Reduction; ``avg`` on integers is the floor of the mean.
    algorithm : str
        A key of :data:`ALGORITHMS`.
    out : ndarray or DLPack tensor, optional
        Result array with ``x``'s shape and dtype; ``out=x`` reduces in place. A PyTorch tensor is
        written in its own memory.
    timeout : float, optional
        Seconds any one round may wait for a peer before :class:`CollectiveTimeout` is raised.
    grid : tuple of int, "node" or "topology", optional
        For ``2d``: rows x cols (must multiply to P); ``"node"`` takes rows = nodes from
        ``Split_type(COMM_TYPE_SHARED)`` (the hierarchical all-reduce). Default: nodes when the
        ranks span several equal nodes, else the factorization of P closest to square. For
        ``torus``: any number of dimensions ``(a, b, c, ...)`` multiplying to P; ``"topology"`` (and
        the default) takes the job's levels, racks x nodes per rack x ranks per node (racks from
        ``COMMLAB_RACKS``, see :meth:`collectives.engine.context.Context.levels`; a flat ring on one node).
    accumulate : {"float32", "native"}
        float16 and bfloat16 only: ``"float32"`` (default) promotes the whole collective to float32,
        so partial sums travel as float32; ``"native"`` keeps the 16-bit dtype on the wire (each
        addition is computed in float32 and rounded back, as NumPy's float16 and ``ml_dtypes``'
        bfloat16 ufuncs do): half the bytes, a rounding per hop, float16's overflow above 65504.
        The ``mpi`` and ``shm`` algorithms always accumulate in float32.

    Returns
    -------
    ndarray or tensor
        ``out`` (or a new array of ``x``'s type: a PyTorch tensor for PyTorch input), identical on
        every rank for the hand-made algorithms.

    Raises
    ------
    ValueError
        Unknown ``algorithm`` or ``op``, ``out`` of the wrong shape, a bad ``grid`` or ``timeout``.
    TypeError
        Unsupported dtype, or ``out`` of another dtype.
    CollectiveTimeout
        A peer did not answer within ``timeout``.

    Notes
    -----
    The steps: the one look-up of a cached plan (:func:`collectives.calls.signatures.cached_plan`),
    else the checks of every argument (:func:`collectives.arguments.check_allreduce`, on every rank
    before any message), the communicator's context, ``auto``'s and the grid's resolution, and one
    route: the library's (:mod:`collectives.library.mpi_allreduce`), a schedule's
    (:mod:`collectives.engine.schedule_allreduce`) or shared memory's (:mod:`collectives.shm`). A
    repeated call of at most 2,048 elements that runs the ``mpi`` algorithm (given, or chosen by
    ``auto``) reuses the buffers, check elements and resolved choices cached for its call signature
    (:mod:`collectives.library.plans`) and posts one ``MPI_Iallreduce``, with the same fingerprint check.
    What the call sent is its record (:func:`collectives.engine.context.last_stats`). For a plan made
    once and started many times, see :func:`collectives.allreduce_init`.

    Examples
    --------
    On one rank (``mpiexec -n 1``) the sum over ranks is ``x`` itself:

    >>> import numpy as np
    >>> import collectives
    >>> collectives.allreduce(np.arange(4.0), algorithm="ring")
    array([0., 1., 2., 3.])
    >>> x = np.array([3, 1, 2])
    >>> collectives.allreduce(x, op="max", out=x) is x  # in place
    True
    >>> collectives.allreduce(x, algorithm="butterfly")
    Traceback (most recent call last):
    ...
    ValueError: unknown algorithm 'butterfly': expected one of ring, tree, ...
    """
    wrap = None
    if type(x) is not numpy.ndarray or (out is not None and type(out) is not numpy.ndarray):
        x, out, wrap = adopt(x, out)  # a DLPack tensor (PyTorch, JAX) or a device array, read in place
    plan = cached_plan(x, comm=comm, op=op, algorithm=algorithm, out=out, timeout=timeout, grid=grid,
                       accumulate=accumulate)  # None unless this signature passed the checks before
    if plan is not None:
        result = plan.allreduce(x, out, timeout)  # the library route's cached call
    else:
        call = begin_allreduce(x, op=op, comm=comm, algorithm=algorithm, out=out, timeout=timeout, grid=grid,
                               accumulate=accumulate)
        ctx, key, x, timeout, xp = call.ctx, call.key, call.x, call.timeout, call.xp
        if call.algorithm == "shm":
            result = shm.allreduce(ctx, key, x, out, timeout)
        elif call.algorithm == "mpi":
            cacheable = xp is numpy and grid is None and accumulate == "float32"
            result = library_allreduce(ctx, key, x, out, timeout, xp, given=algorithm if cacheable else None)
        else:
            result = schedule_allreduce(ctx, key, x, out, timeout, xp, accumulate)
    return result if wrap is None else wrap(result)


def iallreduce(x, *, op="sum", comm=None, algorithm="auto", out=None, grid=None, accumulate="float32"):
    """Start a non-blocking all-reduce and return its :class:`~collectives.engine.request.Request`.

    Same arguments and rules as :func:`allreduce` (``mpi`` included, through ``MPI_Iallreduce``).
    The request owns private buffers, so several may be in flight at once; ``x`` may be reused at
    once (unless ``out=x``: then ``x`` is the working buffer), ``out`` must not be read before
    ``wait()`` returns it.

    Returns
    -------
    Request
        ``test()`` advances it without blocking; ``wait()`` completes it and returns the result
        (in the caller's tensor type for DLPack input); ``record`` is the call's own record of what
        it sends (:class:`collectives.engine.context.CallRecord`).

    Examples
    --------
    >>> import numpy as np
    >>> import collectives
    >>> req = collectives.iallreduce(np.arange(3.0), op="avg", algorithm="ring")
    >>> req.test()  # one rank: nothing to wait for
    True
    >>> req.wait()
    array([0., 1., 2.])
    """
    if type(x) is not numpy.ndarray or (out is not None and type(out) is not numpy.ndarray):
        x, out, wrap = adopt(x, out)
        if wrap is not None:
            return AdoptedRequest(iallreduce(x, comm=comm, op=op, algorithm=algorithm, out=out, grid=grid,
                                             accumulate=accumulate), wrap)
    call = begin_allreduce(x, op=op, comm=comm, algorithm=algorithm, out=out, timeout=None, grid=grid,
                           accumulate=accumulate)
    if call.algorithm == "shm":
        return shm.iallreduce(call.ctx, call.key, call.x, out)
    if call.algorithm == "mpi":
        return library_iallreduce(call.ctx, call.key, call.x, out, call.xp)
    return schedule_iallreduce(call.ctx, call.key, call.x, out, call.xp, accumulate)
