"""All-reduce: the public entry point and its non-blocking form.

Rules shared by every collective (documented once here):

* **Chunking**: a flat vector of ``n`` elements is split over P ranks as ``numpy.array_split`` does:
  the first ``n % P`` chunks get ``n // P + 1`` elements, the rest ``n // P``.
* **float16** is accumulated in float32: the whole collective runs on a float32 copy (partial sums
  travel the wire in float32) and the result is rounded to float16 once at the end. So float16
  ``[60000] + [60000] + [-60000]`` on 3 ranks gives 60000 with every algorithm, not ``inf``.
* **avg** is ``sum / P``; on integer dtypes it is the floor of the mean, ``numpy.floor_divide(sum, P)``
  (so int32 ``[-3]`` and ``[0]`` on 2 ranks average to ``-2``). Integer sums wrap on overflow.
* **NaN** propagates through ``min`` and ``max`` (``numpy.minimum`` / ``numpy.maximum``).
* Errors in arguments are raised on every rank before any message is sent.
"""
import time

import numpy
from mpi4py import MPI

from . import backend
from .context import check_comm, get_context
from .recursive import rabenseifner_allreduce, recursive_doubling_allreduce
from .ring import ring_allreduce
from .executor import CollectiveTimeout, _wait, execute
from .request import Request
from .select import select_allreduce
from .torus import check_grid, square_grid, torus_allreduce
from .tree import tree_allreduce

__all__ = ["ALGORITHMS", "allreduce", "iallreduce", "build_allreduce_schedule", "MPI_OPS"]

#: All-reduce algorithms: registry name -> one-line description.
ALGORITHMS = {
    "ring": "ring reduce-scatter then ring all-gather (Patarasuk & Yuan 2009)",
    "tree": "binomial-tree reduce to rank 0 then binomial-tree broadcast (Thakur et al. 2005)",
    "recursive_doubling": "log2 P full-vector exchanges (Thakur et al. 2005, 4.5)",
    "rabenseifner": "recursive-halving reduce-scatter then recursive-doubling all-gather (Rabenseifner 2004)",
    "2d": "row reduce-scatter, column all-reduce, row all-gather on a grid (Mikami et al. 2018)",
    "mpi": "the MPI library's own MPI_Allreduce (the oracle and baseline)",
    "auto": "tuned (P, size) table from measured sweeps, else the alpha-beta-gamma model's fastest",
}

#: Op name -> MPI op, for the ``mpi`` algorithm (``avg`` is a SUM followed by the division).
MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.SUM}

_ACC = {d: backend.accumulation_dtype(d) for d in backend.DTYPES}  # dtype -> accumulation dtype
_BUILDERS = {"ring": ring_allreduce, "tree": tree_allreduce, "recursive_doubling": recursive_doubling_allreduce,
             "rabenseifner": rabenseifner_allreduce}


def build_allreduce_schedule(algorithm, rank, size, count, grid=None):
    """Return the all-reduce :class:`~collectives.schedule.Schedule` of a hand-made algorithm.

    Parameters
    ----------
    algorithm : str
        One of ``ring``, ``tree``, ``recursive_doubling``, ``rabenseifner``, ``2d``.
    rank, size, count : int
        This rank, P, and the number of elements.
    grid : (int, int), optional
        For ``2d``: rows and columns; default the factorization of P closest to square.
    """
    if algorithm == "2d":
        return torus_allreduce(rank, size, count, grid or square_grid(size))
    return _BUILDERS[algorithm](rank, size, count)


def _as_array(x, name="x"):
    if hasattr(x, "__cuda_array_interface__"):
        return x
    if isinstance(x, numpy.ndarray):  # subclasses such as numpy.matrix reshape differently: drop them
        return x if type(x) is numpy.ndarray else numpy.asarray(x)
    if hasattr(x, "__array__") or isinstance(x, (list, tuple, int, float)):
        return numpy.asarray(x)
    raise TypeError(f"{name} must be an array, not {type(x).__name__}")


def _check_out(out, x):
    if out is None:
        return
    if not hasattr(out, "shape") or not hasattr(out, "dtype"):
        raise TypeError(f"out must be an array, not {type(out).__name__}")
    if out.shape != x.shape:
        raise ValueError(f"out has shape {getattr(out, 'shape', None)}, expected {x.shape}")
    if out.dtype != x.dtype:
        raise TypeError(f"out has dtype {out.dtype}, expected {x.dtype}")
    if not getattr(getattr(out, "flags", None), "writeable", False):
        raise ValueError("out is read-only")


def _prepare(x, out, ctx, xp, slot, accumulate="float32", lazy=False):
    """Return (out, work, acc dtype, direct, inp): ``work`` is the flat accumulation-dtype buffer.

    ``direct`` is True when ``work`` is ``out``'s own memory (no copy back needed at the end). With
    ``lazy`` and a contiguous ``x`` of the accumulation dtype, ``x`` is not copied into ``work``:
    ``inp`` is its flat view, for the executor to read (``execute(..., inp=inp)``); otherwise ``work``
    holds a copy of ``x`` and ``inp`` is None.
    """
    acc = _ACC[x.dtype] if accumulate == "float32" else x.dtype
    if out is None:
        out = xp.empty(x.shape, dtype=x.dtype)
    direct = out.dtype == acc and out.flags.c_contiguous
    if direct:
        work = out.reshape(-1)
    else:
        work = ctx.buffer(xp, acc, x.size, slot) if slot else xp.empty(x.size, dtype=acc)
    inp = None
    if x.size and not (direct and out is x):
        if lazy and x.dtype == acc and x.flags.c_contiguous and not _may_overlap(xp, x, out):
            inp = x.reshape(-1)
        else:
            xp.copyto(work.reshape(x.shape), x, casting="unsafe")
    return out, work, acc, direct, inp


def _may_overlap(xp, a, b):
    """Return True unless ``a`` and ``b`` certainly use disjoint memory (bounds check only)."""
    may = getattr(xp, "may_share_memory", None)
    return True if may is None else bool(may(a, b))


def _finish(out, work, op, size, xp, direct=False):
    """Apply ``avg``'s division and move ``work`` into ``out`` unless it is ``out``'s memory."""
    if op == "avg" and size > 1 and work.size:
        if work.dtype.kind == "f":
            xp.true_divide(work, size, out=work)
        else:
            xp.floor_divide(work, size, out=work)
    if work.size and not direct:
        xp.copyto(out, work.reshape(out.shape), casting="unsafe")
    return out


def _validate(x, op, algorithm, out, timeout, grid, size, accumulate="float32"):
    if accumulate not in ("float32", "native"):
        raise ValueError(f"accumulate={accumulate!r} must be 'float32' or 'native'")
    if algorithm not in ALGORITHMS:
        backend.check_algorithm(algorithm, ALGORITHMS)
    if op not in backend.OPS:
        backend.check_op(op)
    if type(x) is not numpy.ndarray:
        x = _as_array(x)
    if x.dtype not in _ACC:
        backend.check_dtype(x.dtype)
    if out is not None:
        _check_out(out, x)
    if timeout is not None:
        timeout = backend.check_timeout(timeout)
    if grid is not None and grid != "node":
        grid = check_grid(grid, size)
    return x, timeout, grid


def _resolve(ctx, algorithm, x, grid):
    if algorithm == "auto":
        algorithm = select_allreduce(ctx.size, x.size * _ACC[x.dtype].itemsize)
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
    ctx = get_context(comm)
    ctx.check_usable()
    xp = backend.get_array_module(x)
    algorithm, grid = _resolve(ctx, algorithm, x, grid)
    return x, timeout, grid, ctx, xp, algorithm


def allreduce(x, comm=None, op="sum", algorithm="auto", out=None, timeout=None, grid=None, accumulate="float32"):
    """Combine ``x`` element-wise across all ranks and return the result on every rank.

    Parameters
    ----------
    x : ndarray, any shape, float16/float32/float64/int32/int64
        This rank's contribution (NumPy or CuPy). Same shape and dtype on every rank.
    comm : mpi4py.MPI.Intracomm, optional
        Communicator (default ``COMM_WORLD``); the library works on its own duplicate.
    op : {"sum", "prod", "min", "max", "avg"}
        Reduction; ``avg`` on integers is the floor of the mean.
    algorithm : str
        A key of :data:`ALGORITHMS`.
    out : ndarray, optional
        Result array with ``x``'s shape and dtype; ``out=x`` reduces in place.
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
    ndarray
        ``out`` (or a new array), identical on every rank for the hand-made algorithms.

    Raises
    ------
    ValueError
        Unknown ``algorithm`` or ``op``, ``out`` of the wrong shape, a bad ``grid`` or ``timeout``.
    TypeError
        Unsupported dtype, or ``out`` of another dtype.
    CollectiveTimeout
        A peer did not answer within ``timeout``.
    """
    x, timeout, grid, ctx, xp, algorithm = _begin(x, comm, op, algorithm, out, timeout, grid, accumulate)
    if algorithm == "mpi":
        return _mpi_allreduce(ctx, x, op, out, timeout, xp)
    count = x.size
    sched = ctx.schedule(("allreduce", algorithm, count, grid),
                         lambda: build_allreduce_schedule(algorithm, ctx.rank, ctx.size, count, grid))
    out, work, acc, direct, inp = _prepare(x, out, ctx, xp, "work", accumulate, lazy=True)
    scratch = ctx.buffer(xp, acc, sched.scratch)
    ufunc = getattr(xp, backend.OPS[op])
    try:
        execute(sched, ctx.comm, work, scratch, ufunc, ctx.next_tag(), timeout, "allreduce",
                None if xp is numpy else ctx.transport(xp), inp=inp, progress=ctx.progress if ctx.active else None)
    except Exception as exc:
        ctx.broken = f"allreduce: {exc}"
        raise
    ctx.record("allreduce", algorithm, count, acc, sched)
    return _finish(out, work, op, ctx.size, xp, direct)


def _mpi_allreduce(ctx, x, op, out, timeout, xp):
    """Run the MPI library's own all-reduce under the same float16 / avg rules."""
    out, work, acc, direct, _ = _prepare(x, out, ctx, xp, "work")
    transport = ctx.transport(xp)
    buf = work
    if transport is not None:
        transport.sync()
        if not transport.direct:
            buf = transport.to_host(work, "mpi")
    ctx.next_tag()  # keep tags in step on every rank whatever the algorithm
    nan_mask = _nan_mask(buf, op)
    # Always the non-blocking form: whether a rank has a timeout or requests in flight is its own
    # business, and MPI never matches a blocking collective with a non-blocking one.
    reqs = [ctx.comm.Iallreduce(MPI.IN_PLACE, buf, MPI_OPS[op])]
    if nan_mask is not None:
        reqs.append(ctx.comm.Iallreduce(MPI.IN_PLACE, nan_mask, MPI.MAX))
    if timeout is None and not ctx.active:
        MPI.Request.Waitall(reqs)
    else:
        try:
            _wait(reqs, [None] * len(reqs), None if timeout is None else _deadline(timeout), "allreduce", 0,
                  "MPI_Iallreduce", timeout, ctx.progress if ctx.active else None)
        except Exception as exc:
            ctx.broken = f"allreduce: {exc}"
            raise
    _restore_nan(buf, nan_mask)
    if buf is not work:
        transport.to_device(buf, work)
    p = ctx.size
    ctx.record("allreduce", "mpi", x.size, acc, elements=2 * (p - 1) * x.size // p, estimated=True)
    return _finish(out, work, op, p, xp, direct)


def _nan_mask(buf, op):
    """Return a uint8 NaN mask of ``buf`` for float min/max, else None.

    MPICH's ``MPI_MIN`` / ``MPI_MAX`` compare with ``<`` and so keep or drop a NaN depending on where it
    sits in the reduction order; commlab's rule is NumPy's (NaN propagates). The ``mpi`` algorithm
    therefore reduces this mask with ``MPI_MAX`` alongside and writes NaN back where any rank had one.
    """
    if op not in ("min", "max") or buf.dtype.kind != "f":
        return None
    xp = backend.get_array_module(buf)
    return xp.isnan(buf).view(numpy.uint8)


def _restore_nan(buf, mask):
    if mask is not None and buf.size:
        buf[mask.view(bool)] = numpy.nan


def _deadline(timeout):
    return time.perf_counter() + timeout


def iallreduce(x, comm=None, op="sum", algorithm="auto", out=None, grid=None, accumulate="float32"):
    """Start a non-blocking all-reduce and return its :class:`~collectives.request.Request`.

    Same arguments and rules as :func:`allreduce` (``mpi`` included, through ``MPI_Iallreduce``).
    The request owns private buffers, so several may be in flight at once; ``x`` may be reused at
    once (unless ``out=x``: then ``x`` is the working buffer), ``out`` must not be read before
    ``wait()`` returns it.

    Returns
    -------
    Request
        ``test()`` advances it without blocking; ``wait()`` completes it and returns the result.
    """
    x, _, grid, ctx, xp, algorithm = _begin(x, comm, op, algorithm, out, None, grid, accumulate)
    out, work, acc, direct, _ = _prepare(x, out, ctx, xp, None, "float32" if algorithm == "mpi" else accumulate)
    tag = ctx.next_tag()
    size = ctx.size
    if algorithm == "mpi":
        if ctx.transport(xp) is not None and not ctx.transport(xp).direct:
            raise ValueError("iallreduce with algorithm='mpi' needs a CUDA-aware MPI for device arrays")
        ctx.record("allreduce", "mpi", x.size, acc, elements=2 * (size - 1) * x.size // size, estimated=True)
        mask = _nan_mask(work, op)
        reqs = [ctx.comm.Iallreduce(MPI.IN_PLACE, work, MPI_OPS[op])]
        if mask is not None:
            reqs.append(ctx.comm.Iallreduce(MPI.IN_PLACE, mask, MPI.MAX))

        def finish():
            _restore_nan(work, mask)
            return _finish(out, work, op, size, xp, direct)

        return _MPIRequest(reqs, finish, ctx)
    sched = ctx.schedule(("allreduce", algorithm, x.size, grid),
                         lambda: build_allreduce_schedule(algorithm, ctx.rank, size, x.size, grid))
    scratch = xp.empty(max(sched.scratch, 1), dtype=acc)
    ctx.record("allreduce", algorithm, x.size, acc, sched)
    return Request(sched, ctx.comm, work, scratch, getattr(xp, backend.OPS[op]), tag, "allreduce",
                   ctx.transport(xp), finish=lambda: _finish(out, work, op, size, xp, direct),
                   active=ctx.active, on_fail=ctx.fail)


class _MPIRequest:
    """Adapter giving an ``MPI_Iallreduce`` request the :class:`Request` interface."""

    __slots__ = ("_req", "_finish", "_ctx", "_failed", "result", "done")

    def __init__(self, req, finish, ctx):
        self._req, self._finish, self._ctx, self._failed, self.result, self.done = req, finish, ctx, None, None, False

    def _check(self):
        if self._failed is not None:
            raise RuntimeError(f"this request failed earlier ({self._failed}); its result is lost")

    def test(self):
        """Return True once the library's all-reduce has completed (finishing it then)."""
        self._check()
        if not self.done and MPI.Request.Testall(self._req):
            self.done, self.result = True, self._finish()
        elif not self.done:
            self._ctx.progress()
        return self.done

    def wait(self, timeout=None):
        """Block until complete and return the result (``timeout`` as for :meth:`Request.wait`)."""
        timeout = backend.check_timeout(timeout)
        self._check()
        if not self.done:
            try:
                _wait(self._req, [None] * len(self._req), None if timeout is None else _deadline(timeout),
                      "allreduce", 0, "MPI_Iallreduce", timeout, self._ctx.progress if self._ctx.active else None)
            except CollectiveTimeout as exc:
                self._failed = str(exc)
                self._ctx.fail(f"allreduce: {exc}")
                raise
            self.done, self.result = True, self._finish()
        return self.result
