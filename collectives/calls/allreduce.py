"""All-reduce: the public entry point and its non-blocking form.

The rules every collective shares (chunking, float16 and bfloat16 accumulation, integer ``avg``,
NaN under ``min``/``max``, argument errors before any message) are written once, in
:mod:`collectives.calls`. Here: the argument checks, ``auto``'s resolution, and the two routes (the
library's ``MPI_Iallreduce``, cached for repeated small calls, or a schedule).
"""
import numpy
from mpi4py import MPI

from collectives.backend import OPS, check_dtype, check_op, check_timeout, get_array_module, op_name
from collectives.calls.forms import keyword_form, positional
from collectives.library.call import CHECK_ELEMENTS, call, encode_check, key_code, mismatch, piggyback, verify_check
from collectives.schedules.registry import build_allreduce_schedule, check_algorithm, describe
from collectives.engine.buffers import ACC, MPI_OPS, AdoptedRequest, adopt, as_array, check_out, finish, nan_mask, prepare, restore_nan
from collectives.engine.context import check_comm, get_context
from collectives.errors import CollectiveError, CollectiveTimeout
from collectives.engine.executor import Run, run_schedule
from collectives.library.plans import fast_allreduce, library_plan, remember
from collectives.engine.request import Request
from collectives.schedules.schedule import segmented
from collectives.model.auto import model_choice, select_allreduce
from collectives.schedules.torus import check_grid, square_grid
from collectives.engine.waiting import Where, deadline_of, wait_all

__all__ = ["ALGORITHMS", "allreduce", "iallreduce", "build_allreduce_schedule", "MPI_OPS"]

#: All-reduce algorithms: registry name -> one-line description (from :mod:`collectives.schedules.registry`).
ALGORITHMS = describe("allreduce")


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
    if grid is not None and grid != "node":
        grid = check_grid(grid, size)
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
    if algorithm == "2d":
        if grid == "node" or grid is None:
            nodes, per = ctx.nodes()
            if grid == "node" and not nodes:
                raise ValueError("grid='node' needs the same number of ranks on every node")
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
    grid : (int, int) or "node", optional
        For ``2d``: rows x cols (must multiply to P); ``"node"`` takes rows = nodes from
        ``Split_type(COMM_TYPE_SHARED)`` (the hierarchical all-reduce). Default: nodes when the
        ranks span several equal nodes, else the factorization of P closest to square.
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
    """
    if args:
        positional('allreduce', args)
    if type(x) is numpy.ndarray and (out is None or type(out) is numpy.ndarray):
        return _allreduce(x, op, comm, algorithm, out, timeout, grid, accumulate)
    x, out, wrap = adopt(x, out)  # a DLPack tensor (PyTorch, JAX) or a device array, read in place
    result = _allreduce(x, op, comm, algorithm, out, timeout, grid, accumulate)
    return result if wrap is None else wrap(result)


def _allreduce(x, op, comm, algorithm, out, timeout, grid, accumulate):
    """The all-reduce of an adopted ``x``: its cached plan, else check every argument, then one route.

    The routes: the library call (a cached plan, or a fresh ``MPI_Iallreduce``) or a schedule run by
    the executor.
    """
    if type(x) is numpy.ndarray and grid is None and accumulate == "float32" and type(op) is str:
        got = fast_allreduce(x, comm, op, algorithm, out, timeout)  # a repeated small call: its cache
        if got is not None:
            return got
    if type(op) is not str:
        op = op_name(op)
    given = algorithm
    x, timeout, grid, ctx, xp, algorithm = _begin(x, comm, op, algorithm, out, timeout, grid, accumulate)
    key = ("allreduce", algorithm, x.size, x.dtype, op, None, grid if isinstance(grid, tuple) else None)
    if algorithm == "mpi":
        if xp is numpy and grid is None and accumulate == "float32":
            plan = library_plan(ctx, key, x.shape, x.dtype, op)
            if plan is not None:
                remember(ctx, given, op, x, plan, given == "auto")
                plan.start(x)
                return plan.wait(numpy.empty(x.shape, x.dtype) if out is None else out, timeout)
        return _mpi_allreduce(ctx, key, x, op, out, timeout, xp)
    count = x.size
    sched = ctx.schedule(("allreduce", algorithm, count, grid),
                         lambda: segmented(build_allreduce_schedule(algorithm, ctx.rank, ctx.size, count, grid)))
    out, work, acc, direct, inp = prepare(x, out, ctx, xp, "work", accumulate, lazy=True)
    run = Run(sched, ctx.comm, work, scratch=ctx.buffer(xp, acc, sched.scratch), ufunc=getattr(xp, OPS[op]),
              name="allreduce").read_from(inp)
    run_schedule(ctx, key, run, timeout=timeout, xp=xp)
    ctx.record("allreduce", algorithm, count, acc, sched)
    return finish(out, work, op, ctx.size, xp, direct)


def _mpi_allreduce(ctx, key, x, op, out, timeout, xp):
    """Run the MPI library's own all-reduce under the same float16 / avg rules, fingerprint checked."""
    ctx.advance(key, timeout)  # keep the call sequence in step on every rank whatever the algorithm
    inline = piggyback(x.size)
    if not inline and xp is numpy and x.size and x.dtype == ACC[x.dtype] and x.flags.c_contiguous:
        res = numpy.empty(x.shape, x.dtype) if out is None else out
        if res is not x and res.flags.c_contiguous and not numpy.may_share_memory(x, res):
            return _mpi_out_of_place(ctx, key, x, op, res, timeout)
    extra = CHECK_ELEMENTS if inline else 0
    out, work, acc, direct, _ = prepare(x, out, ctx, xp, "work", extra=extra)
    if inline:
        encode_check(work[x.size:], key, ctx.size)
    transport = ctx.transport(xp)
    buf = work
    if transport is not None:
        transport.sync()
        if not transport.direct:
            buf = transport.to_host(work, "mpi")
    mask = nan_mask(buf, op)
    more = [("Iallreduce", (MPI.IN_PLACE, mask, MPI.MAX))] if mask is not None else []
    call(ctx, key, "Iallreduce", (MPI.IN_PLACE, buf, MPI_OPS[op]), timeout, check=not inline, extra=more)
    if inline:
        try:
            verify_check(buf[x.size:], key, ctx.size)
        except CollectiveError as exc:
            ctx.fail(f"allreduce: {exc}")
            raise
    restore_nan(buf, mask)
    if buf is not work:
        transport.to_device(buf, work)
    p = ctx.size
    ctx.record("allreduce", "mpi", x.size, acc, elements=2 * (p - 1) * x.size // p, estimated=True)
    return finish(out, work, op, p, xp, direct)


def _mpi_out_of_place(ctx, key, x, op, out, timeout):
    """``MPI_Iallreduce(x, out)``: the library reads ``x`` and writes ``out``, no copy of the input first."""
    send, buf = x.reshape(-1), out.reshape(-1)
    mask = nan_mask(send, op)  # NaN positions of this rank's input, reduced alongside
    more = [("Iallreduce", (MPI.IN_PLACE, mask, MPI.MAX))] if mask is not None else []
    call(ctx, key, "Iallreduce", (send, buf, MPI_OPS[op]), timeout, extra=more)
    restore_nan(buf, mask)
    p = ctx.size
    ctx.record("allreduce", "mpi", x.size, x.dtype, elements=2 * (p - 1) * x.size // p, estimated=True)
    return finish(out, buf, op, p, numpy, True)


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

        return _MPIRequest(reqs, done, ctx)
    sched = ctx.schedule(("allreduce", algorithm, x.size, grid),
                         lambda: segmented(build_allreduce_schedule(algorithm, ctx.rank, size, x.size, grid)))
    scratch = xp.empty(max(sched.scratch, 1), dtype=acc)
    ctx.record("allreduce", algorithm, x.size, acc, sched)
    run = Run(sched, ctx.comm, work, scratch=scratch, ufunc=getattr(xp, OPS[op]), tag=tag, name="allreduce",
              transport=ctx.transport(xp))
    return Request(run, finish=lambda: finish(out, work, op, size, xp, direct), active=ctx.active, on_fail=ctx.fail)


class _MPIRequest:
    """Adapter giving an ``MPI_Iallreduce`` request the :class:`Request` interface."""

    __slots__ = ("_req", "_finish", "_ctx", "_failed", "result", "done")

    def __init__(self, req, finish, ctx):
        self._req, self._finish, self._ctx, self._failed, self.result, self.done = req, finish, ctx, None, None, False

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
        if not self.done and MPI.Request.Testall(self._req):
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
            self._complete()
        return self.result
