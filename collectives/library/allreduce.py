"""The library route of the all-reduce: MPI's own all-reduce, under commlab's rules and checks.

One entry per call: :func:`library_allreduce`, after :func:`collectives.allreduce` has checked the
arguments and resolved ``auto``, or :func:`run_plan` for a repeated small call whose signature
passed those checks before. A small NumPy call (at most
:data:`~collectives.library.call.PIGGYBACK_MAX` elements) runs a cached
:class:`~collectives.library.plans.LibraryPlan` and remembers its signature for the next call;
anything else posts ``MPI_Iallreduce`` on a working copy (or out of place, straight from ``x`` into
``out``) with the fingerprint check (:mod:`collectives.library.call`). The float16 / bfloat16
accumulation, NaN under ``min``/``max`` and integer ``avg`` rules are those of every route
(:mod:`collectives.engine.buffers`).
"""
import numpy
from mpi4py import MPI

from collectives.engine.buffers import ACC, MPI_OPS, finish, nan_mask, prepare, restore_nan
from collectives.errors import CollectiveError
from collectives.library.call import CHECK_ELEMENTS, call, encode_check, piggyback, settle, verify_check
from collectives.library.plans import library_plan
from collectives.engine.fingerprint import checks_enabled, settings_token
from collectives.model.auto import table_token

__all__ = ["library_allreduce", "run_plan"]


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
    """
    op = key[4]
    if given is not None:
        plan = library_plan(ctx, key, x.shape, x.dtype, op)
        if plan is not None:
            ctx.keep((given, op, x.dtype, x.shape), (plan, table_token() if given == "auto" else None,
                                                     settings_token()))
            return run_plan(plan, x, out, timeout)
    return _mpi_allreduce(ctx, key, x, op, out, timeout, xp)


def run_plan(plan, x, out, timeout):
    """Start ``plan`` on ``x`` and wait for it (under ``timeout`` seconds); return ``out`` (or a new array)."""
    if timeout is None:
        return plan.run(x, out)
    plan.start(x, timeout)
    return plan.wait(numpy.empty(x.shape, x.dtype) if out is None else out, timeout)


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
