"""Buffers of a collective call: input conversion, ``out`` checks, the accumulation buffer, ``avg``, NaN.

Shared by the all-reduce (:mod:`collectives.api`) and the other collectives (:mod:`collectives.ops`);
the rules themselves (float16 accumulation, integer ``avg``, NaN propagation) are documented in
:mod:`collectives.api`.
"""
import numpy
from mpi4py import MPI

from .backend import DTYPES, accumulation_dtype, get_array_module

__all__ = ["MPI_OPS", "ACC", "as_array", "check_out", "prepare", "finish", "nan_mask", "restore_nan", "raw"]

#: Op name -> MPI op, for the ``mpi`` algorithm (``avg`` is a SUM followed by the division).
MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.SUM}

#: dtype -> accumulation dtype.
ACC = {d: accumulation_dtype(d) for d in DTYPES}


def as_array(x, name="x"):
    """Return ``x`` as an array of its own module (NumPy or device); ``TypeError`` for non-arrays."""
    if hasattr(x, "__cuda_array_interface__"):
        return x
    if isinstance(x, numpy.ndarray):  # subclasses such as numpy.matrix reshape differently: drop them
        return x if type(x) is numpy.ndarray else numpy.asarray(x)
    if hasattr(x, "__array__") or isinstance(x, (list, tuple, int, float)):
        return numpy.asarray(x)
    raise TypeError(f"{name} must be an array, not {type(x).__name__}")


def check_out(out, x):
    """Raise ``TypeError``/``ValueError`` unless ``out`` is a writable array of ``x``'s shape and dtype."""
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
        if work.dtype.kind == "f":
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
