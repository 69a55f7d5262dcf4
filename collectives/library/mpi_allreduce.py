"""The library route of the all-reduce: MPI's own all-reduce, under commlab's rules and checks.

One entry per call, after :func:`collectives.allreduce` has checked the arguments
(:func:`collectives.arguments.check_allreduce`) and resolved ``auto``: :func:`library_allreduce`
(blocking) or :func:`library_iallreduce` (an :class:`MPIRequest`). A small NumPy call (at most
:data:`~collectives.library.call.PIGGYBACK_MAX` elements) runs a cached
:class:`~collectives.library.plans.LibraryPlan` and remembers its signature, so that the next call
finds the plan by one look-up (:func:`collectives.calls.signatures.cached_plan`) before any check;
anything else posts ``MPI_Iallreduce`` on a working copy (or out of place, straight from ``x`` into
``out``) with the fingerprint check (:mod:`collectives.library.call`). The float16 / bfloat16
accumulation, NaN under ``min``/``max`` and integer ``avg`` rules are those of every route
(:mod:`collectives.engine.buffers`).
"""
import numpy
from mpi4py import MPI

from collectives.arguments import check_timeout
from collectives.engine.buffers import ACC, MPI_OPS, finish, nan_mask, prepare, restore_nan
from collectives.engine.fingerprint import checks_enabled, key_code, settings_token
from collectives.engine.waiting import Where, deadline_of, wait_all
from collectives.errors import CollectiveError, CollectiveTimeout
from collectives.library.call import (CHECK_ELEMENTS, call, encode_check, library_error, mismatch, piggyback, settle,
                                      verify_check)
from collectives.library.plans import library_plan
from collectives.model.auto import table_token

__all__ = ["library_allreduce", "library_iallreduce", "MPIRequest"]


def library_allreduce(ctx, key, x, out, timeout, xp, given=None):
    """Run the library's all-reduce of checked arguments; return the result.

    Parameters
    ----------
    ctx : Context
        The communicator's library context (:mod:`collectives.engine.context`).
    key : tuple
        The call key (:mod:`collectives.engine.fingerprint`); ``key[4]`` is the reduction.
    x : ndarray
        The input, checked (NumPy or CuPy).
    out : ndarray or None
        Checked result array, or None for a new one.
    timeout : float or None
        Seconds the call may wait for a peer.
    xp : module
        ``numpy`` or ``cupy``.
    given : str or None
        The algorithm as the caller gave it (``"mpi"`` or ``"auto"``) when the call may take and
        remember a cached plan (NumPy, default grid and accumulation); None otherwise.

    Returns
    -------
    ndarray
        ``out``, or a new array of ``x``'s shape and dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from collectives.engine.context import get_context
    >>> key = ("allreduce", "mpi", 3, np.dtype("float64"), "max", None, None)
    >>> library_allreduce(get_context(), key, np.arange(3.0), None, None, np)  # one rank: x itself
    array([0., 1., 2.])
    """
    op = key[4]
    if given is not None:
        plan = library_plan(ctx, key, x.shape, x.dtype, op)
        if plan is not None:
            ctx.keep((given, op, x.dtype, x.shape), (plan, table_token() if given == "auto" else None,
                                                     settings_token()))
            return plan.allreduce(x, out, timeout)
    return _mpi_allreduce(ctx, key, x, op, out, timeout, xp)


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
    if checks_enabled():
        settle(ctx, key, work.dtype, timeout, inline=inline)
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
    verify = (lambda: verify_check(buf[x.size:], key, ctx.size)) if inline and more else None
    call(ctx, key, "Iallreduce", (MPI.IN_PLACE, buf, MPI_OPS[op]), timeout, check=not inline, extra=more,
         verify=verify)
    if inline and verify is None:
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
    settle(ctx, key, send.dtype, timeout)
    mask = nan_mask(send, op)  # NaN positions of this rank's input, reduced alongside
    more = [("Iallreduce", (MPI.IN_PLACE, mask, MPI.MAX))] if mask is not None else []
    call(ctx, key, "Iallreduce", (send, buf, MPI_OPS[op]), timeout, extra=more)
    restore_nan(buf, mask)
    p = ctx.size
    ctx.record("allreduce", "mpi", x.size, x.dtype, elements=2 * (p - 1) * x.size // p, estimated=True)
    return finish(out, buf, op, p, numpy, True)


def library_iallreduce(ctx, key, x, out, xp):
    """Start the library's all-reduce of checked arguments (``MPI_Iallreduce``); return its :class:`MPIRequest`.

    The fingerprint pair travels in its own ``MPI_Iallreduce`` beside the data, and the NaN mask of
    float ``min``/``max`` in a third; the check is made when the request completes.

    Parameters
    ----------
    ctx, key, x, out, xp
        As for :func:`library_allreduce`.

    Raises
    ------
    ValueError
        Device arrays without a CUDA-aware MPI (before any message).

    Examples
    --------
    >>> import numpy as np
    >>> from collectives.engine.context import get_context
    >>> key = ("allreduce", "mpi", 2, np.dtype("float64"), "sum", None, None)
    >>> req = library_iallreduce(get_context(), key, np.ones(2), None, np)
    >>> req.wait(), req.record.estimated
    (array([1., 1.]), True)
    """
    op, size = key[4], ctx.size
    out, work, acc, direct, _ = prepare(x, out, ctx, xp, None, "float32")
    ctx.begin(key)
    if ctx.transport(xp) is not None and not ctx.transport(xp).direct:
        raise ValueError("iallreduce with algorithm='mpi' needs a CUDA-aware MPI for device arrays")
    record = ctx.record("allreduce", "mpi", x.size, acc, elements=2 * (size - 1) * x.size // size, estimated=True)
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

    return MPIRequest(reqs, done, ctx, key, record)


class MPIRequest:
    """An ``MPI_Iallreduce`` request with the :class:`~collectives.engine.request.Request` interface.

    Parameters
    ----------
    req : list of mpi4py.MPI.Request
        The fingerprint's, the data's and (float min/max) the NaN mask's all-reduce.
    finish : callable
        Checks the fingerprint and finishes the result; its return value becomes :attr:`result`.
    ctx : Context
    key : tuple
        The call key (errors name it).
    record : CallRecord
        The call's own record.
    """

    __slots__ = ("_req", "_finish", "_ctx", "_key", "_failed", "result", "done", "record")

    def __init__(self, req, finish, ctx, key, record):
        self._req, self._finish, self._ctx, self._key, self.record = req, finish, ctx, key, record
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
                wait_all(self._req, [None] * len(self._req), deadline_of(timeout),
                         Where("allreduce", 0, "MPI_Iallreduce", timeout),
                         progress=self._ctx.progress if self._ctx.active else None)
            except CollectiveTimeout as exc:
                self._failed = str(exc)
                self._ctx.fail(f"allreduce: {exc}")
                raise
            except MPI.Exception as exc:
                raise self._lost(exc) from None
            self._complete()
        return self.result
