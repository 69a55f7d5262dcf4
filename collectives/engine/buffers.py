"""Buffers of a collective call: DLPack adoption, the accumulation buffer, ``avg``, NaN (the checks: :mod:`collectives.arguments`).

Shared by the all-reduce (:mod:`collectives.calls.allreduce`) and the other collectives (:mod:`collectives.calls.reduce_scatter`);
the rules themselves (float16 accumulation, integer ``avg``, NaN propagation) are documented in
:mod:`collectives.calls.allreduce`.

**DLPack** (:func:`adopt`): a tensor of another library (PyTorch, JAX, ...) that speaks DLPack
(``__dlpack__``) enters as a NumPy view of its own memory (``numpy.from_dlpack``, zero-copy), or as a
CuPy view for device memory; the result goes back in the caller's type (``torch.from_dlpack`` on the
result's memory, zero-copy; ``out=`` and in-place calls return the caller's own object). NumPy cannot
import bfloat16 through DLPack, so a PyTorch bfloat16 tensor enters through a bit view
(``tensor.view(torch.int16)``) reinterpreted as ``ml_dtypes.bfloat16``; a JAX bfloat16 array converts
to that dtype itself. PyTorch tensors that require grad are detached first.
"""
import sys

import numpy
from mpi4py import MPI

from collectives.backend import BFLOAT16, DTYPES, accumulation_dtype
from commlab.arrays import get_array_module

__all__ = ["MPI_OPS", "ACC", "prepare", "finish", "nan_mask", "restore_nan", "raw",
           "adopt", "AdoptedRequest"]

#: Op name -> MPI op, for the ``mpi`` algorithm (``avg`` is a SUM followed by the division).
MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.SUM}

#: dtype -> accumulation dtype.
ACC = {d: accumulation_dtype(d) for d in DTYPES}


_CPU_DEVICES = (1, 3)  # DLPack device types kDLCPU and kDLCUDAHost: memory NumPy can read


def _foreign(a):
    """Return True for an array that is neither NumPy's nor a CuPy/registered device array, but speaks DLPack."""
    return (a is not None and type(a) is not numpy.ndarray and hasattr(a, "__dlpack__")
            and not isinstance(a, numpy.ndarray) and get_array_module(a) is numpy)


def _library(a):
    """Return the top-level module of ``a``'s type (``torch``, ``jax``, ``jaxlib``, ...)."""
    return sys.modules.get(type(a).__module__.split(".")[0])


def _import(a, name):
    """Return a NumPy (host) or CuPy (device) view of DLPack tensor ``a``.

    Raises
    ------
    TypeError
        Device memory without CuPy, or a dtype DLPack cannot carry into NumPy.
    """
    if getattr(a, "requires_grad", False) and hasattr(a, "detach"):
        a = a.detach()  # PyTorch refuses to export a tensor that requires grad
    device = int(a.__dlpack_device__()[0]) if hasattr(a, "__dlpack_device__") else 1
    is_bf16 = str(getattr(a, "dtype", "")).rsplit(".", 1)[-1] == "bfloat16"
    if device not in _CPU_DEVICES:
        try:
            import cupy
        except ImportError:
            raise TypeError(f"{name} lives in device memory (DLPack device type {device}): install CuPy "
                            "(the 'gpu' extra) to pass device tensors") from None
        if is_bf16:
            raise TypeError(f"{name}: bfloat16 device tensors are not supported (CuPy has no bfloat16)")
        return cupy.from_dlpack(a)
    if is_bf16:
        torch = _library(a)
        if torch is not None and torch.__name__ == "torch":
            return numpy.from_dlpack(a.view(torch.int16)).view(BFLOAT16)
        return numpy.asarray(a)  # JAX arrays convert to ml_dtypes.bfloat16 themselves
    try:
        return numpy.from_dlpack(a)
    except (BufferError, TypeError, RuntimeError) as exc:
        raise TypeError(f"{name} ({type(a).__module__}.{type(a).__name__}) cannot be read through DLPack: "
                        f"{exc}") from None


def _export(result, like):
    """Return ``result`` (NumPy or CuPy) in the type of ``like`` (a DLPack tensor), zero-copy where possible."""
    lib = _library(like)
    if lib is None:
        return result
    if lib.__name__ == "torch":
        if result.dtype == BFLOAT16:
            return lib.from_dlpack(result.view(numpy.int16)).view(lib.bfloat16)
        return lib.from_dlpack(result)
    if lib.__name__ in ("jax", "jaxlib"):
        import jax.numpy as jnp

        return jnp.asarray(result)
    convert = getattr(lib, "from_dlpack", None)
    return convert(result) if convert is not None else result


def adopt(x, out=None):
    """Take DLPack tensors in: return ``(x, out, wrap)`` with NumPy/CuPy views and the way back.

    Parameters
    ----------
    x : array or DLPack tensor, any shape
        The collective's input: a PyTorch or JAX CPU tensor, anything with ``__dlpack__``, or an
        ndarray (then nothing is converted).
    out : array or DLPack tensor, optional
        Result buffer. A PyTorch tensor receives the result through its own ``copy_`` (autograd's
        version counter sees the write); other tensors are written through their NumPy view.

    Returns
    -------
    x, out : ndarray
        Views of the same memory (no copy for CPU tensors; bfloat16 as ``ml_dtypes.bfloat16``).
    wrap : callable or None
        ``wrap(result)`` returns the result in the caller's type: the caller's ``out`` object when one
        was given, the caller's ``x`` when the result is ``x``'s own memory (in place), None for None,
        else a tensor of ``x``'s type on the result's memory. None when nothing was converted.

    Raises
    ------
    TypeError
        A device tensor without CuPy, or a dtype DLPack cannot carry.
    RuntimeError
        ``out`` is a PyTorch leaf tensor that requires grad while grad mode is on.
    """
    fx, fo = _foreign(x), _foreign(out)
    if not fx and not fo:
        return x, out, None
    orig_x, orig_out = x, out
    if fx:
        x = _import(x, "x")
    through_torch = False
    if fo:
        out = _import(out, "out")
        lib = _library(orig_out)
        if lib is not None and lib.__name__ == "torch":
            if orig_out.requires_grad and orig_out.is_leaf and lib.is_grad_enabled():
                raise RuntimeError("out: a leaf tensor that requires grad cannot be written in place (PyTorch "
                                   "refuses it too); pass out=None, or call under torch.no_grad()")
            # the result is written by PyTorch's own copy_, so autograd's version counter sees the write (a
            # tensor saved for backward then fails backward, as any in-place op would make it)
            out, through_torch = get_array_module(out).empty_like(out), True

    def wrap(result):
        if result is None:
            return None
        if through_torch:
            orig_out.copy_(_export(result, orig_out))
            return orig_out
        if orig_out is not None:
            return orig_out
        if result is x:
            return orig_x
        return _export(result, orig_x) if fx else result

    return x, out, wrap


class AdoptedRequest:
    """A non-blocking collective's request whose result goes back in the caller's tensor type.

    Parameters
    ----------
    request : Request
        The request of the call on the adopted (NumPy/CuPy) buffers.
    wrap : callable
        From :func:`adopt`.
    """

    __slots__ = ("_request", "_wrap")

    def __init__(self, request, wrap):
        self._request, self._wrap = request, wrap

    def test(self):
        """Advance the request without blocking; True once it has completed."""
        return self._request.test()

    def wait(self, timeout=None):
        """Complete the request and return its result in the caller's type."""
        return self._wrap(self._request.wait(timeout))

    @property
    def done(self):
        """True once the request has completed."""
        return self._request.done

    @property
    def result(self):
        """The result in the caller's type (None before completion)."""
        return None if self._request.result is None else self._wrap(self._request.result)

    def __getattr__(self, name):
        return getattr(self._request, name)


def prepare(x, out, ctx, xp, slot, accumulate="float32", lazy=False, extra=0):
    """Return (out, work, acc dtype, direct, inp): ``work`` is the flat accumulation-dtype buffer.

    ``direct`` is True when ``work`` is ``out``'s own memory (no copy back needed at the end). With
    ``lazy`` and a contiguous ``x`` of the accumulation dtype, ``x`` is not copied into ``work``:
    ``inp`` is its flat view, for the executor to read (``execute(..., inp=inp)``); otherwise ``work``
    holds a copy of ``x`` and ``inp`` is None. ``extra`` > 0 asks for that many more elements after
    the data in ``work`` (never ``out``'s memory then).
    """
    acc = ACC[x.dtype] if accumulate == "float32" else x.dtype
    if out is None:
        out = xp.empty(x.shape, dtype=x.dtype)
    direct = out.dtype == acc and out.flags.c_contiguous and not extra
    if direct:
        work = out.reshape(-1)
    else:
        n = x.size + extra
        work = ctx.buffer(xp, acc, n, slot) if slot else xp.empty(n, dtype=acc)
    inp = None
    if x.size and not (direct and out is x):
        if lazy and x.dtype == acc and x.flags.c_contiguous and not _may_overlap(xp, x, out):
            inp = x.reshape(-1)
        else:
            xp.copyto(work[:x.size].reshape(x.shape), x, casting="unsafe")
    return out, work, acc, direct, inp


def _may_overlap(xp, a, b):
    """Return True unless ``a`` and ``b`` certainly use disjoint memory (bounds check only)."""
    may = getattr(xp, "may_share_memory", None)
    return True if may is None else bool(may(a, b))


def finish(out, work, op, size, xp, direct=False):
    """Apply ``avg``'s division and move ``work`` (its first ``out.size`` elements) into ``out``."""
    work = work[:out.size]
    if op == "avg" and size > 1 and work.size:
        if work.dtype.kind == "f" or work.dtype == BFLOAT16:  # ml_dtypes' bfloat16 has kind "V"
            xp.true_divide(work, size, out=work)
        else:
            xp.floor_divide(work, size, out=work)
    if work.size and not direct:
        xp.copyto(out, work.reshape(out.shape), casting="unsafe")
    return out


def nan_mask(buf, op):
    """Return a uint8 NaN mask of ``buf`` for float min/max, else None.

    MPICH's ``MPI_MIN`` / ``MPI_MAX`` compare with ``<`` and so keep or drop a NaN depending on where it
    sits in the reduction order; commlab's rule is NumPy's (NaN propagates). The ``mpi`` algorithm
    therefore reduces this mask with ``MPI_MAX`` alongside and writes NaN back where any rank had one.
    """
    if op not in ("min", "max") or buf.dtype.kind != "f":
        return None
    xp = get_array_module(buf)
    return xp.isnan(buf).view(numpy.uint8)


def restore_nan(buf, mask):
    """Write NaN into ``buf`` where the reduced ``mask`` is set (see :func:`nan_mask`)."""
    if mask is not None and buf.size:
        buf[mask.view(bool)] = numpy.nan


def raw(a):
    """View a flat buffer as unsigned integers of the same width, for copy-only messages."""
    return a.view(f"u{a.dtype.itemsize}")
