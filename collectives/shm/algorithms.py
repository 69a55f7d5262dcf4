"""The ``shm`` algorithm: the five collectives among the ranks of one node, through shared memory.

Every rank reads its peers' data where it lies in an MPI-3 shared window (:mod:`collectives.shm.node`)
instead of passing messages: the approach of NCCL's intra-node rings over peer memory, Open MPI's
XHC component (Katevenis et al., "A framework for hierarchical single-copy MPI collectives on
multicore nodes", EuroMPI 2023) and MPICH's ``release_gather`` (Zhou et al., "MPI collectives for
multi-core clusters", 2022), written here on ``MPI_Win_allocate_shared`` and ``MPI_Win_sync``.

All-reduce of ``n`` elements on P ranks (rank ``r`` owns elements ``lo_r:hi_r`` of the
``numpy.array_split`` chunks):

1. **Copy in.** ``x`` is copied into this call's half of the rank's stage (skipped when ``x`` lies
   in a shared buffer and the call is in place: :func:`collectives.shm.node.shared_empty`).
2. **Arrival.** The rank posts its flag (the call's fingerprint) and waits until every rank's flag
   shows the same call: a rank in another call raises ``CollectiveMismatch`` everywhere.
3. **Reduce and push.** Rank ``r`` reduces ``lo_r:hi_r``, chunk by chunk (``CHUNK_BYTES``: a chunk
   and its partial result stay in the cache), reading every rank's input in place in rank order
   ``0, 1, ..., P-1`` (the same order every run, so results are bitwise reproducible and, each
   element being reduced by one rank only, bitwise identical on every rank), and writes each reduced
   chunk into every rank's stage (or shared buffer) at the same place.
4. **Done.** Flags again: every slice has been written.
5. **Copy out** of the rank's own stage into ``out`` (skipped in place on a shared buffer).

Cost: two synchronisation points; each rank reads ``n`` elements and writes ``n`` (plus ``2n`` of
copies in and out), where a message-passing ring moves ``2 (P-1)/P n`` through the MPI library's
buffers, copied twice each. Up to :data:`SMALL_BYTES` the all-reduce takes one synchronisation
point: every rank reduces the whole vector from every stage itself (in the same order, so the
results are still bitwise identical). No exit synchronisation is needed: a rank writes its stage
again only after every rank arrived at a later call, and one-point calls alternate between the two
halves of the stage, so no rank overwrites what a slower one still reads.

Reduce-scatter: copy in, arrival, each rank reduces its own chunk into ``out`` (one point).
All-gather: copy in, arrival, each rank copies every block (one point; the all-gather-v form first
publishes the blocks' lengths in the flags' spare words). Broadcast: the root copies in, arrival,
the others copy out (one point). Reduce: as the all-reduce, pushing to the root only (one point up to
:data:`SMALL_BYTES`, where the root reduces everything).

:func:`collectives.engine.context.last_stats` counts, as ``bytes_sent`` (``estimated``), the bytes a
rank reads from or writes into the other ranks' memory (no message is sent).

The rules of :mod:`collectives.calls` hold: float16 and bfloat16 accumulate in float32 (each chunk's
partial result is float32, rounded once when written), integer ``avg`` is the floor of the mean,
integer sums wrap, NaN propagates through ``min``/``max`` (NumPy's ``minimum``/``maximum``), counts 0
and below P work. The ranks synchronise only through the flags, so a call with ``timeout=`` raises
:class:`~collectives.errors.CollectiveTimeout` naming a rank that did not arrive, and nothing is
returned that no rank wrote.

Non-blocking (:class:`ShmRequest`) and persistent (:class:`ShmPlan`) forms run the same steps, written
once as generators that yield at each synchronisation point.

Imports: :mod:`collectives.shm.node`, :mod:`collectives.engine`, :mod:`collectives.schedules`,
:mod:`collectives.backend`, :mod:`collectives.errors`.
"""
import math
import time
import zlib
from dataclasses import dataclass

import numpy

from collectives.backend import OPS
from collectives.arguments import check_timeout
from commlab.arrays import get_array_module
from collectives.engine.buffers import ACC
from collectives.engine.fingerprint import block_code, key_code
from collectives.errors import CollectiveError, CollectiveTimeout
from collectives.schedules.schedule import chunk_bounds
from collectives.shm.node import existing_node, node_of, refuse_nodes, shared_views

__all__ = ["SMALL_BYTES", "CHUNK_BYTES", "Reduction", "fold", "allreduce", "iallreduce", "reduce_scatter", "allgather", "broadcast",
           "reduce", "refuse", "ShmRequest", "ShmPlan", "plan"]

#: Largest all-reduce or reduce (bytes) run with one synchronisation point, each rank reading every stage.
SMALL_BYTES = 16384
#: Elements of one reduction step, in bytes of the accumulation dtype: a chunk and its partial result
#: stay in a core's L2 cache while the P inputs stream through.
CHUNK_BYTES = 131072


def _deadline(timeout):
    return None if timeout is None else time.perf_counter() + timeout


def _enter(ctx, key, timeout, collective):
    """Return the node of ``ctx`` for a new call ``key``: made on the first call, earlier requests completed.

    On the first call the call's fingerprint exchange (debug mode; broadcast and reduce always)
    comes before the windows' collective allocation, as it comes first in every other call, so a
    rank that refused its arguments (:func:`collectives.engine.context.refuse`) meets it there.
    """
    if existing_node(ctx) is None:
        refuse_nodes(ctx, collective)
        ctx.advance(key, timeout)
        return node_of(ctx, key, timeout, collective)
    node = node_of(ctx, key, timeout, collective)
    while node.pending:  # calls complete in the order they began (their points are numbered in that order)
        node.pending[0].complete(timeout)
    ctx.advance(key, timeout)  # the call sequence, and the debug mode's fingerprint exchange
    return node


def _drive(gen, node, ctx, key, timeout):
    """Run a call's steps to the end, waiting at each synchronisation point it yields."""
    deadline = _deadline(timeout)
    for step, (word, phase) in enumerate(gen):
        node.wait(word, key, ctx, deadline, timeout, step, phase)


def fold(srcs, lo, hi, reduction, dsts, node, base=0):
    """Reduce ``srcs[p][lo:hi]`` over the ranks p in rank order, chunk by chunk, into every array of ``dsts``.

    Parameters
    ----------
    srcs : list of ndarray, shape (n,)
        Every rank's input (rank order), read in place.
    lo, hi : int
        The elements reduced.
    reduction : Reduction
        The op's ufunc, the accumulation dtype, and ``avg``'s divider.
    dsts : list of ndarray
        Each written at ``[a - base:b - base]`` for the elements ``a:b`` of each chunk (cast to its dtype,
        rounded once), after the chunk was read from every rank.
    node : Node
        Gives the chunk's scratch (:data:`CHUNK_BYTES` of the accumulation dtype).
    base : int
        Offset of the destinations' first element (``lo`` for a reduce-scatter's own chunk).
    """
    if hi <= lo:
        return
    ufunc, acc, avg = reduction.ufunc, reduction.acc, reduction.avg
    step = max(CHUNK_BYTES // acc.itemsize, 1)
    tmp = node.scratch(acc, min(step, hi - lo))
    size = len(srcs)
    for a in range(lo, hi, step):
        b = min(a + step, hi)
        t = tmp[:b - a]
        if size == 1:
            numpy.copyto(t, srcs[0][a:b], casting="unsafe")
        else:
            ufunc(srcs[0][a:b], srcs[1][a:b], out=t, dtype=acc)
            for s in srcs[2:]:
                ufunc(t, s[a:b], out=t, dtype=acc)
        if avg is not None:
            avg(t, size, out=t)
        for d in dsts:
            numpy.copyto(d[a - base:b - base], t, casting="unsafe")


@dataclass(frozen=True, slots=True)
class Reduction:
    """The reduction of a call, as :func:`fold` applies it: three values made together and read together."""

    ufunc: numpy.ufunc  # the op's binary ufunc (``add`` for sum and avg)
    acc: numpy.dtype  # the accumulation dtype (float32 for float16 and bfloat16)
    avg: object = None  # avg's divider (``true_divide`` or ``floor_divide`` by P), None for the other ops

    @classmethod
    def of(cls, op, dtype, size):
        """Return the reduction of ``op`` on ``dtype`` over ``size`` ranks.

        Examples
        --------
        >>> r = Reduction.of("avg", numpy.dtype("float16"), 4)
        >>> r.ufunc is numpy.add, r.acc, r.avg is numpy.true_divide
        (True, dtype('float32'), True)
        """
        acc = ACC[numpy.dtype(dtype)]
        avg = None
        if op == "avg" and size > 1:
            avg = numpy.true_divide if acc.kind == "f" else numpy.floor_divide
        return cls(getattr(numpy, OPS[op]), acc, avg)


def _host(x, collective):
    if type(x) is not numpy.ndarray:
        raise ValueError(f"{collective} with algorithm='shm' takes host (NumPy) arrays here; the blocking "
                         "collectives stage device arrays through host memory")


def _staged_device(ctx, x):
    """Return ``(host copy of device array x, its transport)``, or ``(x, None)`` for a host array.

    Device arrays (CuPy, or a module registered with :func:`commlab.arrays.register_device_module`)
    are staged through host memory, as the hand-made algorithms do without a CUDA-aware MPI: the
    stream is synchronised, ``x`` copied to a (pinned) host buffer, the collective run there, and
    the result copied back (:func:`_to_device`). Peers' device memory is not mapped (no CUDA IPC).
    """
    xp = get_array_module(x)
    if xp is numpy:
        return x, None
    t = ctx.transport(xp)
    t.sync()
    if not x.flags.c_contiguous:
        dense = xp.empty(x.shape, x.dtype)
        xp.copyto(dense, x)
        x = dense
    host = numpy.empty(x.shape, x.dtype)  # (the algorithm's own copy in, not MPI's staging: not counted there)
    if x.size:
        if hasattr(x, "get"):
            x.get(out=host)
        else:
            numpy.copyto(host, numpy.asarray(x))
    return host, t


def _to_device(t, host, out):
    """Copy the host result ``host`` into device array ``out`` (None: a new one of the transport's module); return it."""
    xp = t.xp
    if out is None:
        out = xp.empty(host.shape, host.dtype)
    dense = out if out.flags.c_contiguous else xp.empty(host.shape, host.dtype)
    if host.size:
        if hasattr(dense, "set"):
            dense.set(host)
        else:
            numpy.copyto(numpy.asarray(dense), host)
    if dense is not out:
        xp.copyto(out, dense)
    return out


def _code(key, shared=None):
    """Return the 32-bit flag code of call ``key`` (and of the shared buffer region it runs on in place)."""
    code = key_code(key)
    if shared is not None:
        code = zlib.crc32(numpy.array([code, shared[0], shared[1]], numpy.int64).tobytes())
    return code


# ------------------------------------------------------------------------------------------ all-reduce
def _allreduce_steps(node, ctx, key, code, x, out, zero):
    """The all-reduce's steps (module docstring); yields ``(flag word, phase)`` at each point."""
    node.calls += 1
    size, rank = node.size, node.rank
    n, dtype, op = x.size, x.dtype, key[4]
    red = Reduction.of(op, dtype, size)
    bounds = chunk_bounds(n, size)
    lo, hi = bounds[rank], bounds[rank + 1]
    if zero is not None:  # in place on shared buffers: every rank's x is read and written where it lies
        yield node.post(code), "arrival"
        fold(zero, lo, hi, red, zero, node)
        yield node.post(code), "reduced slices"
        ctx.record("allreduce", "shm", n, dtype, elements=2 * (n - (hi - lo)), estimated=True)
        return
    nbytes = n * dtype.itemsize
    if not node.fits(nbytes):
        yield node.post(code), "arrival (the stage grows)"  # every rank makes this call before it allocates
    views = node.stage(nbytes)
    mine = views[rank].view(dtype)
    if n:
        numpy.copyto(mine.reshape(x.shape), x)
    yield node.post(code), "arrival"
    peers = [v.view(dtype) for v in views]
    if nbytes <= SMALL_BYTES:  # one point: every rank reduces everything, in the same order
        contiguous = out.flags.c_contiguous
        flat = out.reshape(-1) if contiguous else numpy.empty(n, dtype)
        fold(peers, 0, n, red, [flat], node)
        if not contiguous:
            numpy.copyto(out, flat.reshape(out.shape))
        ctx.record("allreduce", "shm", n, dtype, elements=(size - 1) * n, estimated=True)
        return
    fold(peers, lo, hi, red, peers, node)
    yield node.post(code), "reduced slices"
    numpy.copyto(out, mine.reshape(out.shape))
    ctx.record("allreduce", "shm", n, dtype, elements=2 * (n - (hi - lo)), estimated=True)


def _allreduce_call(node, ctx, key, x, out):
    """Return ``(code, zero-copy views or None, steps)`` of an all-reduce of checked ``x`` into ``out``."""
    zero = None
    if out is x and x.nbytes > SMALL_BYTES:
        shared = shared_views(node, x)
        if shared is not None:
            zero, shared = shared[2], shared[:2]
    code = _code(key, shared if zero is not None else None)
    return code, _allreduce_steps(node, ctx, key, code, x, out, zero)


def allreduce(ctx, key, x, out, timeout):
    """Run the all-reduce of checked ``x`` (NumPy) into ``out`` (None: a new array); return the result.

    Parameters
    ----------
    ctx : Context
        The communicator's library context.
    key : tuple
        The call key ``("allreduce", "shm", count, dtype, op, None, None)``.
    x : ndarray, any shape, a dtype of :data:`collectives.backend.DTYPES`
    out : ndarray or None
        ``x`` itself reduces in place (zero-copy when ``x`` lies in a shared buffer).
    timeout : float or None
        Seconds the call may wait for a rank.

    Raises
    ------
    ValueError
        Device arrays, or a communicator spanning several nodes.
    CollectiveMismatch, CollectiveTimeout
        As for every algorithm.
    """
    x, t = _staged_device(ctx, x)
    if t is not None:
        return _to_device(t, allreduce(ctx, key, x, None, timeout), out)
    node = _enter(ctx, key, timeout, "allreduce")
    out = numpy.empty(x.shape, x.dtype) if out is None else out
    _, steps = _allreduce_call(node, ctx, key, x, out)
    _drive(steps, node, ctx, key, timeout)
    return out


class ShmRequest:
    """A shared-memory call in flight: ``test()`` advances it without blocking, ``wait()`` completes it.

    The request is advanced whenever this rank waits in another collective on the communicator, and
    completed before the next shared-memory call begins (calls complete in the order they began).

    Parameters
    ----------
    node : Node
    ctx : Context
    key : tuple
        The call key (errors name it).
    steps : generator
        The call's steps (yielding ``(flag word, phase)`` at each synchronisation point).
    result : object
        What :meth:`wait` returns once the steps ended.
    """

    __slots__ = ("_node", "_ctx", "_key", "_steps", "_word", "_phase", "_step", "_busy", "_failed", "_result",
                 "result", "done")

    def __init__(self, node, ctx, key, steps, result):
        self._node, self._ctx, self._key, self._steps, self._result = node, ctx, key, steps, result
        self._step, self._busy, self._failed, self.result, self.done = 0, False, None, None, False
        self._word, self._phase = next(steps)  # the call's first steps run now (copy in, arrival posted)
        node.pending.append(self)
        ctx.active.add(self)

    def _finish(self):
        self.done, self.result = True, self._result
        self._node.pending.remove(self)
        self._ctx.active.discard(self)

    def _run(self, block, deadline, timeout):
        """Advance through every point that all ranks have reached (all of them with ``block``)."""
        node, key, ctx = self._node, self._key, self._ctx
        self._busy = True
        try:
            while True:
                if block:
                    node.wait(self._word, key, ctx, deadline, timeout, self._step, self._phase)
                elif node.missing(self._word, key, ctx) >= 0:
                    return False
                try:
                    self._word, self._phase = next(self._steps)
                    self._step += 1
                except StopIteration:
                    self._finish()
                    return True
        except CollectiveError as exc:
            self._failed = exc
            node.pending.remove(self)
            ctx.active.discard(self)
            raise
        finally:
            self._busy = False

    def _advance(self):
        """Progress made while this rank waits elsewhere: never blocks, keeps an error for :meth:`wait`."""
        if self._busy or self.done or self._failed is not None:
            return
        try:
            self._run(False, None, None)
        except CollectiveError:
            pass

    def _check(self):
        if self._failed is not None:
            raise RuntimeError(f"this request failed earlier ({self._failed}); its result is lost")

    def complete(self, timeout=None):
        """Complete the call (before a later shared-memory call begins); as :meth:`wait`."""
        self.wait(timeout)

    def test(self):
        """Return True once the call has completed (advancing it through every point all ranks reached)."""
        self._check()
        return self.done or self._run(False, None, None)

    def wait(self, timeout=None):
        """Complete the call and return its result.

        Raises
        ------
        CollectiveTimeout
            A rank did not arrive within ``timeout`` seconds.
        CollectiveMismatch
            A rank made another call.
        """
        timeout = check_timeout(timeout)
        self._check()
        if not self.done:
            self._run(True, _deadline(timeout), timeout)
        return self.result


def iallreduce(ctx, key, x, out):
    """Start the all-reduce of checked ``x`` into ``out`` (None: a new array); return its :class:`ShmRequest`.

    ``x`` is copied in now (unless reduced in place on a shared buffer), so it may be reused at once.
    """
    _host(x, "iallreduce")
    node = _enter(ctx, key, None, "allreduce")
    out = numpy.empty(x.shape, x.dtype) if out is None else out
    _, steps = _allreduce_call(node, ctx, key, x, out)
    return ShmRequest(node, ctx, key, steps, out)


class ShmPlan:
    """The persistent all-reduce of :func:`collectives.allreduce_init` with ``algorithm="shm"``.

    Checked once; every :meth:`start` copies ``x`` in (nothing when ``x`` is ``out`` and lies in a
    shared buffer above :data:`SMALL_BYTES`: the zero-copy plan) and posts the arrival, :meth:`wait`
    reduces and completes. Up to :data:`SMALL_BYTES` the plan runs a lean form of the one-point
    all-reduce: the stage views, the flag code, the reduction and the scratch are worked out once
    (the stage made large enough when the plan is made, at a synchronisation point of its own), so
    a start is one copy and a flag store, and a wait is the polling and P ufunc calls.

    Attributes
    ----------
    zero_copy : bool
        True when the plan reduces in place on shared buffers (no copy in, no copy out).
    """

    __slots__ = ("ctx", "_node", "_key", "_x", "_out", "_request", "zero_copy", "_lean", "_gen", "_stages", "_word",
                 "_half", "_deadline")
    active = False  # (the interface of collectives.library.plans.LibraryPlan: no MPI requests to free)
    reqs = ()

    def __init__(self, ctx, key, x, out):
        _host(x, "allreduce_init")
        self.ctx, self._key, self._x, self._out = ctx, key, x, out
        self._node = node = node_of(ctx, key, None, "allreduce_init")
        self._request, self._word, self._half, self._gen, self._stages = None, None, 0, -1, None
        self.zero_copy = out is x and x.nbytes > SMALL_BYTES and shared_views(node, x) is not None
        self._lean = None
        if x.nbytes <= SMALL_BYTES and node.size > 1:
            while node.pending:
                node.pending[0].complete(None)
            code = _code(key)
            if not node.fits(x.nbytes):  # grown now, at a point of the plan's own (every rank makes it)
                node.wait(node.post(code), key, ctx, None, None, 0, "plan (the stage grows)")
                node.stage(x.nbytes)
            flat = out.reshape(-1) if out.flags.c_contiguous and out.size else None
            self._lean = (code, Reduction.of(key[4], x.dtype, node.size), flat)

    def _views(self):
        """Work out every rank's stage, both halves, as arrays of ``x``'s dtype (again after the window grew)."""
        node, n, dtype = self._node, self._x.size, self._x.dtype
        off, nbytes = node.capacity // 2, self._x.nbytes
        self._stages = [[v[h * off:h * off + nbytes].view(dtype) for v in node.views] for h in (0, 1)]
        self._gen = node.generation

    def start(self, x):
        """Begin one all-reduce of ``x``'s current contents."""
        node = self._node
        while node.pending:
            node.pending[0].complete(None)
        if self._lean is None:
            _, steps = _allreduce_call(node, self.ctx, self._key, x, self._out)
            self._request = ShmRequest(node, self.ctx, self._key, steps, self._out)
            return
        if self._gen != node.generation:
            self._views()
        node.calls += 1
        self._half = h = node.calls & 1  # (the generic steps' parity: the call's number after counting it)
        mine = self._stages[h][node.rank]
        if mine.size:
            numpy.copyto(mine.reshape(x.shape), x)
        self._word = node.post(self._lean[0])
        node.pending.append(self)

    def complete(self, timeout=None):
        """Finish the lean form's started call: wait for every rank's flag, reduce into ``out``."""
        node, word = self._node, self._word
        if word is None:
            return
        self._word = None
        node.pending.remove(self)
        if node.missing(word, self._key, self.ctx) >= 0:
            node.wait(word, self._key, self.ctx, _deadline(timeout), timeout, 0, "arrival")
        _, red, flat = self._lean
        peers, out = self._stages[self._half], self._out
        dst = flat if flat is not None else numpy.empty(out.size, out.dtype)
        fold(peers, 0, out.size, red, [dst], node)
        if flat is None and out.size:
            numpy.copyto(out, dst.reshape(out.shape))
        self.ctx.record("allreduce", "shm", out.size, out.dtype, elements=(node.size - 1) * out.size, estimated=True)

    def test(self):
        """Advance the started all-reduce; True once it has completed."""
        if self._lean is None:
            return self._request.test()
        if self._word is not None and self._node.missing(self._word, self._key, self.ctx) >= 0:
            return False
        self.complete(None)
        return True

    def wait(self, out, timeout):
        """Complete the started all-reduce (under ``timeout`` seconds) and return ``out``."""
        if self._lean is None:
            req, self._request = self._request, None
            return req.wait(timeout)
        self.complete(timeout)
        return self._out


def plan(ctx, key, x, out):
    """Return the :class:`ShmPlan` of an all-reduce of checked ``x`` into ``out`` (an array)."""
    return ShmPlan(ctx, key, x, out)


# ------------------------------------------------------------------------------------------ the others
def _staged(node, code, nbytes):
    """Yield a growth point when this call's stage does not fit the window (see :meth:`Node.stage`)."""
    if not node.fits(nbytes):
        yield node.post(code), "arrival (the stage grows)"  # every rank makes this call before it allocates


def _reduce_scatter_steps(node, ctx, key, code, x, out):
    node.calls += 1
    size, rank = node.size, node.rank
    n, dtype = x.size, x.dtype
    red = Reduction.of(key[4], dtype, size)
    yield from _staged(node, code, x.nbytes)
    views = node.stage(x.nbytes)
    if n:
        numpy.copyto(views[rank].view(dtype).reshape(x.shape), x)
    yield node.post(code), "arrival"
    bounds = chunk_bounds(n, size)
    lo, hi = bounds[rank], bounds[rank + 1]
    fold([v.view(dtype) for v in views], lo, hi, red, [out], node, base=lo)
    ctx.record("reduce_scatter", "shm", n, dtype, elements=(size - 1) * (hi - lo), estimated=True)


def reduce_scatter(ctx, key, x, out, timeout):
    """Run the reduce-scatter of checked ``x``; return this rank's chunk (``out``, or a new array).

    One synchronisation point: each rank reduces its own ``numpy.array_split`` chunk from every
    rank's stage, in rank order, straight into ``out``.
    """
    x, t = _staged_device(ctx, x)
    if t is not None:
        return _to_device(t, reduce_scatter(ctx, key, x, None, timeout), out)
    node = _enter(ctx, key, timeout, "reduce_scatter")
    bounds = chunk_bounds(x.size, node.size)
    if out is None:
        out = numpy.empty(bounds[node.rank + 1] - bounds[node.rank], x.dtype)
    _drive(_reduce_scatter_steps(node, ctx, key, _code(key), x, out), node, ctx, key, timeout)
    return out


def _allgather_steps(node, ctx, key, code, x, box):
    node.calls += 1
    size, rank = node.size, node.rank
    out = box[0]
    if out is None:  # the all-gather-v form: the blocks' lengths first, through the flags' spare words
        yield node.post(code, (x.shape[0],)), "block lengths"
        rows = [int(r) for r in node.extras(1)[:, 0]]
        inner = math.prod(x.shape[1:])
        lengths = [r * inner * x.dtype.itemsize for r in rows]
        views = node.stage(max(lengths))  # (every rank has just passed the point: growing is safe)
        out = box[0] = numpy.empty((sum(rows),) + x.shape[1:], x.dtype)
    else:
        yield from _staged(node, code, x.nbytes)
        views = node.stage(x.nbytes)
        lengths = [x.nbytes] * size
    if x.size:
        numpy.copyto(views[rank][:x.nbytes].view(x.dtype).reshape(x.shape), x)
    yield node.post(code), "arrival"
    flat = out.reshape(-1).view(numpy.uint8)
    at = 0
    for p in range(size):
        flat[at:at + lengths[p]] = views[p][:lengths[p]]
        at += lengths[p]
    ctx.record("allgather", "shm", out.size, x.dtype, elements=out.size - x.size, estimated=True)


def allgather(ctx, x, out, timeout):
    """Gather every rank's block of checked ``x`` along axis 0 into ``out`` (None: the all-gather-v form).

    With ``out`` (equal blocks) one synchronisation point; without, two (the blocks' lengths, then
    the data). The call's fingerprint holds the dtype and the block's shape (its trailing shape in
    the all-gather-v form), so ranks whose blocks differ raise :class:`CollectiveMismatch`.
    """
    x, t = _staged_device(ctx, x)
    if t is not None:
        return _to_device(t, allgather(ctx, x, None if out is None else numpy.empty(out.shape, out.dtype), timeout), out)
    if out is None:
        key = ("allgather", "shm", 0, x.dtype, None, None, block_code((1,) + x.shape[1:]))
    else:
        key = ("allgather", "shm", out.size, x.dtype, None, None, block_code(x.shape))
    node = _enter(ctx, key, timeout, "allgather")
    box = [out]
    _drive(_allgather_steps(node, ctx, key, _code(key), x, box), node, ctx, key, timeout)
    return box[0]


def refuse(ctx, timeout):
    """Take part in an all-gather whose ``x`` on this rank cannot be gathered: every other rank raises.

    Posts a flag no valid call makes (at the all-gather-v form's first point, or the equal form's
    only one), so every rank in the call sees another call there and raises
    :class:`CollectiveMismatch`; this rank's caller then raises its own error.
    """
    key = ("allgather", "shm", -1, numpy.dtype(numpy.uint8), None, None, None)
    node = _enter(ctx, key, timeout, "allgather")
    node.calls += 1
    try:
        node.wait(node.post(_code(key)), key, ctx, _deadline(timeout), timeout, 0, "block lengths")
    except CollectiveError:
        pass


def _broadcast_steps(node, ctx, key, code, x, root):
    node.calls += 1
    yield from _staged(node, code, x.nbytes)
    views = node.stage(x.nbytes)
    if node.rank == root and x.size:
        numpy.copyto(views[root].view(x.dtype).reshape(x.shape), x)
    yield node.post(code), "arrival"
    if node.rank != root and x.size:
        numpy.copyto(x, views[root].view(x.dtype).reshape(x.shape))
    ctx.record("broadcast", "shm", x.size, x.dtype, elements=0 if node.rank == root else x.size, estimated=True)


def broadcast(ctx, key, x, root, timeout):
    """Copy the root's ``x`` into every rank's ``x`` (one synchronisation point); return ``x``."""
    host, t = _staged_device(ctx, x)
    if t is not None:
        _to_device(t, broadcast(ctx, key, host, root, timeout), x)
        return x
    node = _enter(ctx, key, timeout, "broadcast")
    _drive(_broadcast_steps(node, ctx, key, _code(key), x, root), node, ctx, key, timeout)
    return x


def _reduce_steps(node, ctx, key, code, x, root, out):
    node.calls += 1
    size, rank = node.size, node.rank
    n, dtype = x.size, x.dtype
    red = Reduction.of(key[4], dtype, size)
    yield from _staged(node, code, x.nbytes)
    views = node.stage(x.nbytes)
    if n:
        numpy.copyto(views[rank].view(dtype).reshape(x.shape), x)
    yield node.post(code), "arrival"
    peers = [v.view(dtype) for v in views]
    if x.nbytes <= SMALL_BYTES:
        if rank == root:
            fold(peers, 0, n, red, [out.reshape(-1)], node)
    else:
        bounds = chunk_bounds(n, size)
        fold(peers, bounds[rank], bounds[rank + 1], red, [peers[root]], node)
        yield node.post(code), "reduced slices"
        if rank == root and n:
            numpy.copyto(out, peers[root].reshape(out.shape))
    ctx.record("reduce", "shm", n, dtype, elements=(size - 1) * n if rank == root else 0, estimated=True)


def reduce(ctx, key, x, root, timeout):
    """Reduce checked ``x`` onto ``root``; return the result there (a new array), None elsewhere."""
    x, t = _staged_device(ctx, x)
    if t is not None:
        got = reduce(ctx, key, x, root, timeout)
        return None if got is None else _to_device(t, got, None)
    node = _enter(ctx, key, timeout, "reduce")
    out = numpy.empty(x.shape, x.dtype) if node.rank == root else None
    _drive(_reduce_steps(node, ctx, key, _code(key), x, root, out), node, ctx, key, timeout)
    return out
