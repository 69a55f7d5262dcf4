"""The library reduce-scatter (``algorithm="mpi"``), planned once per call signature.

A :class:`ScatterPlan` holds what a repeated call reuses: the chunk counts (``numpy.array_split``'s),
the library call (``MPI_Reduce_scatter_block`` when the chunks are equal, ``MPI_Reduce_scatter`` with
the count vector otherwise), the MPI op and, for float ``min``/``max``, the NaN mask's buffers
(:func:`collectives.engine.buffers.nan_mask`, reduced beside the data as the all-reduce does). Device
arrays go to the library directly when MPI is CUDA-aware and are refused otherwise
(:func:`collectives.library.call.run_library`); only host plans are kept for repeated calls.

Every call posts the 2-element fingerprint all-reduce (:func:`collectives.library.call.call`) and then
the data, whatever the op and count, so ranks whose calls differ in any field still post library
calls of the same kinds in the same order, and the fingerprint raises on every rank; the NaN mask's
reduce-scatter is posted only after the fingerprint matched. The
fingerprint does not ride in the data here, as it does in the small all-reduce: a reduce-scatter
that carries it and one that does not (another count, or an all-gather on another rank) would post
different library collectives, and MPICH then paired one rank's reduce-scatter with another's
fingerprint all-reduce and returned values on some ranks.
"""
import numpy
from mpi4py import MPI

from collectives.backend import accumulation_dtype
from commlab.arrays import get_array_module
from collectives.engine.buffers import MPI_OPS, finish
from collectives.engine.context import CallRecord, existing_context
from collectives.engine.fingerprint import checks_enabled, debug_enabled, settings_token
from collectives.library.call import finish_lean, lean_pair, post_failed, run_library, settle
from collectives.schedules.schedule import chunk_bounds

__all__ = ["ScatterPlan", "cached_scatter_plan"]


class ScatterPlan:
    """The library reduce-scatter of one call signature, ready to run again.

    Parameters
    ----------
    ctx : Context
        The communicator's library context.
    x : ndarray (NumPy or device)
        An input of the signature (its shape, dtype and array module are the plan's).
    op : str
        ``sum``, ``avg``, ``prod``, ``min`` or ``max``.
    key : tuple
        The call key (:mod:`collectives.engine.fingerprint`), algorithm ``"mpi"``.
    bounds : sequence of int, length P + 1, optional
        Chunk boundaries of a reduce-scatter-v (``MPI_Reduce_scatter`` with their counts); default
        ``chunk_bounds(x.size, P)``.
    """

    __slots__ = ("ctx", "key", "acc", "chunk", "op", "size", "elements", "send", "method", "counts", "mpi_op", "mask",
                 "got", "isnan", "xp", "_pair", "_lean", "fast")

    def __init__(self, ctx, x, op, key, bounds=None):
        self.ctx = ctx
        size, rank, n = ctx.size, ctx.rank, x.size
        bounds = chunk_bounds(n, size) if bounds is None else bounds
        self.counts = [bounds[i + 1] - bounds[i] for i in range(size)]
        self.key, self.op, self.size, self.acc = key, op, size, accumulation_dtype(x.dtype)
        self.chunk, self.elements, self.mpi_op = self.counts[rank], n - self.counts[rank], MPI_OPS[op]
        self.method = "Ireduce_scatter_block" if len(set(self.counts)) == 1 else "Ireduce_scatter"
        self.send = None  # a cast or non-contiguous input is copied here first
        self.mask = self.got = self.isnan = None
        self._pair = (None, None, False)  # (out, send, direct) of the last call: its overlap test, kept
        xp = self.xp = get_array_module(x)
        if op in ("min", "max") and self.acc.kind == "f":
            self.isnan = xp.empty(n, bool)
            self.mask, self.got = self.isnan.view(numpy.uint8), xp.empty(self.chunk, numpy.uint8)
        # a host plan without a NaN mask, under the checks settings in force now: what :func:`call` works
        # out at every call (the fingerprint's code, the statistics), worked out once (:meth:`_run_lean`)
        self._lean = self.fast = None
        if xp is numpy and self.isnan is None and checks_enabled() and not debug_enabled():
            acc = self.acc
            fp, want, fp_spec = lean_pair(key)  # the plan's own fingerprint pair
            self._lean = (settings_token(), (fp, want), fp_spec,
                          (getattr(ctx.comm, self.method), f"MPI_{self.method[1:]}"), MPI.Datatype.fromcode(acc.char),
                          CallRecord("reduce_scatter", "mpi", n, acc, self.elements * acc.itemsize, None, None, True))
            self.fast = self._fast_run(ctx, x.dtype)

    def current(self):
        """Return True when the plan's one-frame form was made under the checks settings in force now."""
        return self._lean is not None and self._lean[0] is settings_token()

    def _args(self, send, recv, op):
        return (send, recv, op) if self.method == "Ireduce_scatter_block" else (send, recv, self.counts, op)

    def run(self, ctx, x, timeout, out=None):
        """Reduce-scatter ``x`` (the plan's shape and dtype); return this rank's chunk (``out``, else new).

        Raises
        ------
        CollectiveMismatch
            The fingerprint shows that the ranks' calls differ, or the library reported an error.
        CollectiveTimeout
            A rank did not join within ``timeout``.
        """
        if ctx.broken is not None:
            ctx.check_usable()
        xp = self.xp
        if x.dtype == self.acc and x.flags.c_contiguous:
            send = x.reshape(-1)
        else:
            send = self.send = xp.empty(x.size, self.acc) if self.send is None else self.send
            xp.copyto(send.reshape(x.shape), x, casting="unsafe")
        last_out, last_x, direct = self._pair
        if out is None or out is not last_out or x is not last_x:  # (a repeated call on the same arrays: known)
            direct = (out is not None and out.dtype == self.acc and out.flags.c_contiguous
                      and not (xp is numpy and numpy.may_share_memory(out, send)))  # (MPI: no receive inside the send)
            self._pair = (out, x, direct) if send is not self.send else (None, None, False)
        mine = out.reshape(-1) if direct else xp.empty(self.chunk, self.acc)  # the library writes it
        lean = self._lean
        if lean is not None and timeout is None and not ctx.active and lean[0] is settings_token():
            if ctx.agreed != self.acc:  # another element type than the last checked call's: checked alone first
                settle(ctx, self.key, self.acc, None)
            self._run_lean(ctx, send, mine, lean)
        else:
            self._run_library(ctx, xp, send, mine, timeout)
        if self.op == "avg":
            finish(mine, mine, "avg", self.size, xp, True)  # the division, in place
        if out is not None:
            if not direct:
                xp.copyto(out, mine.reshape(out.shape), casting="unsafe")
            return out
        return mine if x.dtype == self.acc else mine.astype(x.dtype)

    def _run_lean(self, ctx, send, mine, lean):
        """The library call of a repeated host call without a deadline: the 2-element fingerprint
        all-reduce and the reduce-scatter, posted and waited, as :func:`collectives.library.call.call`
        posts them, with the call's code and statistics made once."""
        _, pair, fp_spec, (method, phase), kind, record = lean
        ctx._seq += 1  # (Context.advance: no exchange outside debug mode for a reduce-scatter)
        # the buffers with their MPI datatype given: mpi4py does not read each array's format
        try:
            reqs = [ctx.comm.Iallreduce(MPI.IN_PLACE, fp_spec, MPI.MAX),
                    method(*self._args([send, kind], [mine, kind], self.mpi_op))]
        except MPI.Exception as exc:  # the library refused a call as it was posted
            raise post_failed(ctx, self.key, exc, phase) from None
        finish_lean(ctx, self.key, reqs, pair, record, phase)

    def _fast_run(self, ctx, dtype):
        """Return :attr:`fast`: the repeated call into ``out`` in one Python frame, or None when ``x`` is
        cast on the way (float16) or ``op`` is ``avg``.

        ``fast(x, out)`` takes what :func:`collectives.calls.reduce_scatter._repeated_scatter` has
        checked (``x`` of the plan's shape and dtype, ``out`` a writable array of the chunk's shape and
        dtype, no deadline, nothing in flight, the settings unchanged) and runs the steps of
        :meth:`run` and :meth:`_run_lean` with what they read bound once: both library calls posted
        with their datatypes given, waited, the fingerprint pair compared, the statistics recorded.
        It returns None, having sent nothing, when ``x`` is not contiguous or ``out`` overlaps it;
        :meth:`run` then copies.
        """
        if dtype != self.acc or self.op == "avg":
            return None
        _, pair, fp_spec, (method, phase), kind, record = self._lean
        iallreduce, in_place, mpi_max = ctx.comm.Iallreduce, MPI.IN_PLACE, MPI.MAX
        n, chunk, mpi_op, key = self.elements + self.chunk, self.chunk, self.mpi_op, self.key
        counts = None if self.method == "Ireduce_scatter_block" else self.counts
        kind_dtype = self.acc
        apart = [None, None]  # the last (out, x) found contiguous and apart: a repeated pair is not tested again

        def fast(x, out):
            if ctx.agreed is not kind_dtype:  # another element type than the last checked call's: run() checks it first
                return None
            if out is not apart[0] or x is not apart[1]:
                if not (x.flags.c_contiguous and out.flags.c_contiguous) or numpy.may_share_memory(out, x):
                    return None
                apart[0], apart[1] = out, x
            ctx._seq += 1
            try:
                check = iallreduce(in_place, fp_spec, mpi_max)  # first, as every other path posts it
                data = (method([x, chunk, kind], [out, chunk, kind], mpi_op) if counts is None  # (a block's count)
                        else method([x, n, kind], [out, chunk, kind], counts, mpi_op))
            except MPI.Exception as exc:  # the library refused a call as it was posted
                raise post_failed(ctx, key, exc, phase) from None
            finish_lean(ctx, key, [check, data], pair, record, phase)
            return out

        return fast

    def _run_library(self, ctx, xp, send, mine, timeout):
        """Post the library call through :func:`collectives.library.call.run_library` (device arrays,
        deadlines, the NaN mask, debug mode); restore NaN and record the statistics."""
        more = ()
        if self.isnan is not None:
            xp.isnan(send, out=self.isnan)
            more = [(self.method, self._args(self.mask, self.got, MPI.MAX))]
        run_library(ctx, self.key, xp, self.method, self._args(send, mine, self.mpi_op), timeout, more)
        if self.got is not None and self.got.any():
            mine[self.got.view(bool)] = numpy.nan
        ctx.record("reduce_scatter", "mpi", send.size, self.acc, elements=self.elements, estimated=True)


def cached_scatter_plan(x, *, comm=None, op="sum", algorithm="auto", out=None):
    """Return the cached :class:`ScatterPlan` a repeated ``reduce_scatter(x, ...)`` would run now, else None.

    The one look-up of a repeated reduce-scatter (:func:`collectives.reduce_scatter` asks it before
    any check; ``experiments/bench/breakdown.py`` times it): the plan cached on ``comm``'s context
    under the signature (algorithm as given, op, dtype, shape, checks setting). None when there is
    none, or when ``out`` is not a writable NumPy array of the chunk's shape and ``x``'s dtype (the
    full path then runs and says what is wrong). No message is sent.

    Parameters
    ----------
    x : ndarray
        An input of the call's shape and dtype.
    comm, op, algorithm, out
        As for :func:`collectives.reduce_scatter` (``op`` a string).

    Returns
    -------
    ScatterPlan or None

    Examples
    --------
    >>> import numpy as np
    >>> import collectives
    >>> x = np.ones(4, np.float32)
    >>> _ = collectives.reduce_scatter(x, algorithm="mpi")
    >>> cached_scatter_plan(x, algorithm="mpi").chunk
    4
    >>> cached_scatter_plan(x, algorithm="ring") is None
    True
    """
    ctx = existing_context(comm)
    if ctx is None:
        return None
    try:
        plan = ctx.fast.get(("reduce_scatter", algorithm, op, x.dtype, x.shape, checks_enabled()))
    except TypeError:  # an unhashable algorithm or op: the full checks name it
        return None
    if plan is None:
        return None
    if out is not None and (type(out) is not numpy.ndarray or out.shape != (plan.chunk,) or out.dtype != x.dtype
                            or not out.flags.writeable):
        return None
    return plan
