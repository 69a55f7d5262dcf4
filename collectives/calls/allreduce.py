"""All-reduce: the public entry point and its non-blocking form.

The rules every collective shares (chunking, float16 and bfloat16 accumulation, integer ``avg``,
NaN under ``min``/``max``, argument errors before any message) are written once, in
:mod:`collectives.calls`. Here: the argument checks, ``auto``'s resolution, and the two routes (the
library's ``MPI_Iallreduce``, cached for repeated small calls, or a schedule).

Examples
--------
:data:`ALGORITHMS` names every all-reduce algorithm, ``algorithm=`` takes its keys:

>>> from collectives.calls.allreduce import ALGORITHMS
>>> list(ALGORITHMS)
['ring', 'tree', 'recursive_doubling', 'rabenseifner', '2d', 'torus', 'shm', 'mpi', 'auto']
>>> ALGORITHMS["mpi"]
"the MPI library's own collective (the oracle and baseline)"
"""
import numpy
from mpi4py import MPI

from collectives.backend import OPS, check_dtype, check_op, check_timeout, op_name
from commlab.arrays import get_array_module
from collectives.calls.forms import keyword_form, positional
from collectives.engine.fingerprint import key_code
from collectives.library.call import library_error, mismatch
from collectives.schedules.registry import AlgorithmTable, build_allreduce_schedule, check_algorithm
from collectives.engine.buffers import ACC, MPI_OPS, AdoptedRequest, adopt, as_array, check_out, finish, nan_mask, prepare, restore_nan
from collectives.engine.context import check_comm, get_context
from collectives.calls.signatures import known_plan, repeated_plan
from collectives.errors import CollectiveError, CollectiveTimeout
from collectives.engine.allreduce import schedule_allreduce
from collectives.engine.executor import Run
from collectives.library.allreduce import library_allreduce, run_plan
from collectives.engine.request import Request
from collectives.schedules.schedule import segmented
from collectives.shm import algorithms as shm
from collectives.model.auto import model_choice, select_allreduce
from collectives.schedules.torus import check_dims, check_grid, square_grid
from collectives.engine.waiting import Where, deadline_of, wait_all

__all__ = ["ALGORITHMS", "allreduce", "iallreduce"]

#: All-reduce algorithms: registry name -> one-line description (from :mod:`collectives.schedules.registry`),
#: live: an algorithm registered later (:func:`collectives.register_algorithm`) is in it at once.
ALGORITHMS = AlgorithmTable("allreduce")


def _validate(x, op, algorithm, out, timeout, grid, size, accumulate="float32"):
    if accumulate not in ("float32", "native"):
        raise ValueError(f"accumulate={accumulate!r} must be 'float32' or 'native'")
    if type(algorithm) is not str or algorithm not in ALGORITHMS:
        check_algorithm(algorithm, "allreduce")
    if type(op) is not str or op not in OPS:
        check_op(op)
    if type(x) is not numpy.ndarray:
        x = as_array(x)
    if x.dtype not in ACC:
        check_dtype(x.dtype)
    if out is not None:
        check_out(out, x)
    if timeout is not None:
        timeout = check_timeout(timeout)
    named = isinstance(grid, str) and grid in ("node", "topology")
    if isinstance(grid, str) and grid == "topology" and algorithm != "torus":
        raise ValueError("grid='topology' is for algorithm='torus'")
    if grid is not None and not named:
        grid = check_dims(grid, size) if algorithm == "torus" else check_grid(grid, size)
    return x, timeout, grid


def _resolve(ctx, algorithm, x, grid, timeout, accumulate="float32", op="sum"):
    if algorithm == "auto":
        nbytes = x.size * ACC[x.dtype].itemsize
        algorithm = select_allreduce(ctx.size, nbytes)
        if algorithm == "mpi" and (type(x) is not numpy.ndarray or (accumulate == "native" and x.dtype == numpy.float16)
                                   or (op in ("min", "max") and ACC[x.dtype].kind == "f")):
            # hand-made instead: device buffers, float16 on the wire, and float min/max, whose signed
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


def _begin(x, comm, op, algorithm, out, timeout, grid, accumulate):
    """Check every argument (no message), then get the context and resolve ``auto`` and the grid."""
    comm = check_comm(comm)
    x, timeout, grid = _validate(x, op, algorithm, out, timeout, grid, comm.Get_size(), accumulate)
    ctx = get_context(comm, timeout)
    ctx.check_usable()
    xp = get_array_module(x)
    try:
        algorithm, grid = _resolve(ctx, algorithm, x, grid, timeout, accumulate, op)
    except CollectiveError as exc:
        ctx.fail(f"allreduce: {exc}")
        raise
    return x, timeout, grid, ctx, xp, algorithm


@keyword_form
def allreduce(x, *args, op="sum", comm=None, algorithm="auto", out=None, timeout=None, grid=None, accumulate="float32"):
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
        float16 only: ``"float32"`` (default) promotes the whole collective to float32, so partial
        sums travel as float32; ``"native"`` keeps float16 on the wire (each addition is computed in
        float32 and rounded to float16, as NumPy's float16 ufuncs do): half the bytes, a rounding per
        hop, overflow above 65504. The ``mpi`` algorithm always accumulates in float32.

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
    A repeated call of at most 2,048 elements that runs the ``mpi`` algorithm (given, or chosen by
    ``auto``) reuses the buffers, check elements and resolved choices cached for its call signature
    (:mod:`collectives.library.plans`) and posts one ``MPI_Iallreduce``, with the same fingerprint check.
    For a plan made once and started many times, see :func:`collectives.allreduce_init`.

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
    if (type(x) is numpy.ndarray and timeout is None and grid is None and type(op) is str and accumulate == "float32"
            and not args):
        plan = repeated_plan(x, comm, op, algorithm, out)  # None unless this signature passed the checks before
        if plan is not None:
            return run_plan(plan, x, out, None)  # the library route, entered once (tests/test_house.py)
    if args:
        positional('allreduce', args)
    if type(x) is numpy.ndarray and (out is None or type(out) is numpy.ndarray):
        return _allreduce(x, op, comm, algorithm, out, timeout, grid, accumulate)
    x, out, wrap = adopt(x, out)  # a DLPack tensor (PyTorch, JAX) or a device array, read in place
    result = _allreduce(x, op, comm, algorithm, out, timeout, grid, accumulate)
    return result if wrap is None else wrap(result)


def _allreduce(x, op, comm, algorithm, out, timeout, grid, accumulate):
    """The all-reduce of an adopted ``x``: check the arguments once, then take one route.

    The check of a repeated small call is its signature: one that passed the full checks before
    on this communicator (:func:`collectives.calls.signatures.known_plan`) goes straight to its cached library plan. Any other
    call is checked in full (:func:`_begin`). Then one of two routes, entered once: the library's
    all-reduce (:func:`collectives.library.allreduce.library_allreduce`) or a schedule run by the
    executor (:func:`collectives.engine.allreduce.schedule_allreduce`).
    """
    if type(x) is numpy.ndarray and grid is None and accumulate == "float32" and type(op) is str:
        plan = known_plan(x, comm, op, algorithm, out, timeout)
        if plan is not None:
            return run_plan(plan, x, out, timeout)
    if type(op) is not str:
        op = op_name(op)
    given = algorithm
    x, timeout, grid, ctx, xp, algorithm = _begin(x, comm, op, algorithm, out, timeout, grid, accumulate)
    key = ("allreduce", algorithm, x.size, x.dtype, op, None, grid if isinstance(grid, tuple) else None)
    if algorithm == "shm":
        return shm.allreduce(ctx, key, x, out, timeout)
    if algorithm == "mpi":
        cacheable = xp is numpy and grid is None and accumulate == "float32"
        return library_allreduce(ctx, key, x, out, timeout, xp, given=given if cacheable else None)
    return schedule_allreduce(ctx, key, x, out, timeout, xp, accumulate)


@keyword_form
def iallreduce(x, *args, op="sum", comm=None, algorithm="auto", out=None, grid=None, accumulate="float32"):
    """Start a non-blocking all-reduce and return its :class:`~collectives.engine.request.Request`.

    Same arguments and rules as :func:`allreduce` (``mpi`` included, through ``MPI_Iallreduce``).
    The request owns private buffers, so several may be in flight at once; ``x`` may be reused at
    once (unless ``out=x``: then ``x`` is the working buffer), ``out`` must not be read before
    ``wait()`` returns it.

    Returns
    -------
    Request
        ``test()`` advances it without blocking; ``wait()`` completes it and returns the result
        (in the caller's tensor type for DLPack input).

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
    if args:
        positional('iallreduce', args)
    if type(x) is not numpy.ndarray or (out is not None and type(out) is not numpy.ndarray):
        x, out, wrap = adopt(x, out)
        if wrap is not None:
            return AdoptedRequest(iallreduce(x, comm=comm, op=op, algorithm=algorithm, out=out, grid=grid, accumulate=accumulate), wrap)
    if type(op) is not str:
        op = op_name(op)
    x, _, grid, ctx, xp, algorithm = _begin(x, comm, op, algorithm, out, None, grid, accumulate)
    key = ("allreduce", algorithm, x.size, x.dtype, op, None, grid if isinstance(grid, tuple) else None)
    if algorithm == "shm":
        return shm.iallreduce(ctx, key, x, out)
    out, work, acc, direct, _ = prepare(x, out, ctx, xp, None, "float32" if algorithm == "mpi" else accumulate)
    tag = ctx.begin(key)
    size = ctx.size
    if algorithm == "mpi":
        if ctx.transport(xp) is not None and not ctx.transport(xp).direct:
            raise ValueError("iallreduce with algorithm='mpi' needs a CUDA-aware MPI for device arrays")
        ctx.record("allreduce", "mpi", x.size, acc, elements=2 * (size - 1) * x.size // size, estimated=True)
        mask = nan_mask(work, op)
        code = key_code(key)
        fp = numpy.array([code, -code], numpy.int64)  # the fingerprint check (collectives.library.call)
        reqs = [ctx.comm.Iallreduce(MPI.IN_PLACE, fp, MPI.MAX), ctx.comm.Iallreduce(MPI.IN_PLACE, work, MPI_OPS[op])]
        if mask is not None:
            reqs.append(ctx.comm.Iallreduce(MPI.IN_PLACE, mask, MPI.MAX))

        def done():
            if int(fp[0]) != code or int(fp[1]) != -code:
                raise mismatch(key)
            restore_nan(work, mask)
            return finish(out, work, op, size, xp, direct)

        return _MPIRequest(reqs, done, ctx, key)
    sched = ctx.schedule(("allreduce", algorithm, x.size, grid),
                         lambda: segmented(build_allreduce_schedule(algorithm, ctx.rank, size, x.size, grid)))
    scratch = xp.empty(max(sched.scratch, 1), dtype=acc)
    ctx.record("allreduce", algorithm, x.size, acc, sched)
    run = Run(sched, ctx.comm, work, scratch=scratch, ufunc=getattr(xp, OPS[op]), tag=tag, name="allreduce",
              transport=ctx.transport(xp))
    return Request(run, finish=lambda: finish(out, work, op, size, xp, direct), active=ctx.active, on_fail=ctx.fail)


class _MPIRequest:
    """Adapter giving an ``MPI_Iallreduce`` request the :class:`Request` interface."""

    __slots__ = ("_req", "_finish", "_ctx", "_key", "_failed", "result", "done")

    def __init__(self, req, finish, ctx, key):
        self._req, self._finish, self._ctx, self._key = req, finish, ctx, key
        self._failed, self.result, self.done = None, None, False

    def _lost(self, exc):
        """Mark the request failed after the MPI library reported ``exc``; return the error to raise."""
        err = library_error(self._key, exc, (), "MPI_Iallreduce", self._ctx.comm)
        self._failed = str(err)
        self._ctx.fail(f"allreduce: {err}")
        return err

    def _check(self):
        if self._failed is not None:
            raise RuntimeError(f"this request failed earlier ({self._failed}); its result is lost")

    def _complete(self):
        try:
            self.result = self._finish()
        except CollectiveError as exc:
            self._failed = str(exc)
            self._ctx.fail(f"allreduce: {exc}")
            raise
        self.done = True

    def test(self):
        """Return True once the library's all-reduce has completed (finishing it then)."""
        self._check()
        try:
            complete = not self.done and MPI.Request.Testall(self._req)
        except MPI.Exception as exc:
            raise self._lost(exc) from None
        if complete:
            self._complete()
        elif not self.done:
            self._ctx.progress()
        return self.done

    def wait(self, timeout=None):
        """Block until complete and return the result (``timeout`` as for :meth:`Request.wait`)."""
        timeout = check_timeout(timeout)
        self._check()
        if not self.done:
            try:
                wait_all(self._req, [None] * len(self._req), deadline_of(timeout), Where("allreduce", 0, "MPI_Iallreduce", timeout), progress=self._ctx.progress if self._ctx.active else None)
            except CollectiveTimeout as exc:
                self._failed = str(exc)
                self._ctx.fail(f"allreduce: {exc}")
                raise
            except MPI.Exception as exc:
                raise self._lost(exc) from None
            self._complete()
        return self.result
