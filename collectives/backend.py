"""Dtype and op tables and GPU buffer handling of the collectives (their argument checks: :mod:`collectives.arguments`).

Array code in commlab is written once against an *array module* ``xp`` (NumPy, or CuPy for device
arrays), picked from the input by :func:`commlab.arrays.get_array_module`. This module holds the
supported dtypes and reduction ops and decides how device buffers reach MPI:

* **direct**: the MPI library is CUDA-aware, so device buffers are handed to MPI as they are (mpi4py
  reads their ``__cuda_array_interface__``);
* **staged**: device data is copied into pinned host buffers, MPI moves the host copies, and received
  data is copied back to the device, where the reductions run.

Either way the current stream is synchronized before MPI touches device memory. The environment
variable ``COMMLAB_CUDA_AWARE=0/1`` overrides detection.

bfloat16 is ``ml_dtypes.bfloat16`` (the NumPy dtype JAX uses; ``ml_dtypes`` is a dependency of commlab).
"""
import os

import ml_dtypes
import numpy

from commlab.provenance import mpi_library

__all__ = [
    "DTYPES", "COPY_DTYPES", "OPS", "accumulation_dtype", "cuda_aware",
    "DeviceTransport", "BFLOAT16", "mpi_library_key",
]

#: ``ml_dtypes.bfloat16`` as a NumPy dtype.
BFLOAT16 = numpy.dtype(ml_dtypes.bfloat16)
_BF16 = (BFLOAT16,)

#: Element types of reducing collectives, as NumPy dtypes (bfloat16 last, when available).
DTYPES = tuple(numpy.dtype(t) for t in ("float16", "float32", "float64", "int32", "int64")) + _BF16

#: Element types of copy-only collectives (all-gather, broadcast), which move raw bytes.
COPY_DTYPES = DTYPES[:5] + tuple(numpy.dtype(t) for t in ("int8", "uint8", "int16", "uint16", "uint32", "uint64",
                                                          "bool")) + _BF16

#: Reduction op name -> ufunc name. ``avg`` reduces with ``add`` and divides by P at the end
#: (floats: true division; integers: floor division, ``numpy.floor_divide``).
OPS = {"sum": "add", "prod": "multiply", "min": "minimum", "max": "maximum", "avg": "add"}

def accumulation_dtype(dtype):
    """Return the dtype reductions accumulate in: float32 for float16 and bfloat16, else ``dtype`` itself."""
    dtype = numpy.dtype(dtype)
    return numpy.dtype(numpy.float32) if dtype == numpy.float16 or dtype in _BF16 else dtype


def mpi_library_key(version=None):
    """Return ``(name, version)`` of the MPI library, e.g. ``("MPICH", "5.0.2")``, ``("Open MPI", "5.0.11")``.

    Keys the measured tuning tables by library (read from :func:`commlab.provenance.mpi_library`'s text):
    an ``auto`` table measured with one library is
    not applied under another. Unknown libraries give their first word and ``""``.
    """
    import re

    text = mpi_library(version)
    for name, pattern in (("Open MPI", r"Open MPI v?([0-9][0-9.]*)"), ("MPICH", r"MPICH Version:? ?([0-9][0-9.]*)"),
                          ("Intel MPI", r"Intel\(R\) MPI Library ([0-9][0-9.]*)"),
                          ("MVAPICH", r"MVAPICH2? Version:? ?([0-9][0-9.]*)")):
        m = re.search(pattern, text)
        if m:
            return name, m.group(1).rstrip(".")
    return (text.split()[0] if text else ""), ""


def cuda_aware():
    """Return True when device buffers may be handed to MPI directly.

    ``COMMLAB_CUDA_AWARE=1`` or ``0`` decides when set. Otherwise the MPI library is asked: mpi4py's
    ``MPI.Query_cuda_support()`` where it exists (MPICH and Open MPI builds with CUDA), else the
    ``MPIX_CUDA_AWARE`` hint some launchers set; without any sign of support, False (host staging).
    """
    env = os.environ.get("COMMLAB_CUDA_AWARE")
    if env is not None:
        if env not in ("0", "1"):
            raise ValueError(f"COMMLAB_CUDA_AWARE={env!r} must be 0 or 1")
        return env == "1"
    from mpi4py import MPI

    query = getattr(MPI, "Query_cuda_support", None)
    if query is not None:
        return bool(query())
    return os.environ.get("MPIX_CUDA_AWARE", "0") == "1"


class DeviceTransport:
    """Move device buffers to and from MPI, directly or through pinned host staging buffers.

    Parameters
    ----------
    xp : module
        The device array module (``cupy`` or a registered module).
    direct : bool
        True for a CUDA-aware MPI (device buffers go to MPI as they are); False to stage through host.

    Notes
    -----
    ``sync()`` synchronizes the current stream (CuPy) so kernels that wrote a send buffer have finished
    before MPI reads it. The staging buffers are page-locked (``cupyx.empty_pinned``) when CuPy is the
    module, ordinary NumPy arrays otherwise; they are cached by (dtype, size) and grown as needed.
    """

    __slots__ = ("xp", "direct", "_pinned", "syncs", "staged_bytes")

    def __init__(self, xp, direct):
        self.xp = xp
        self.direct = bool(direct)
        self._pinned = {}
        self.syncs = 0  # number of stream synchronizations issued
        self.staged_bytes = 0  # bytes copied through host staging buffers

    def sync(self):
        """Synchronize the current stream before MPI reads or writes device memory."""
        self.syncs += 1
        cuda = getattr(self.xp, "cuda", None)
        if cuda is not None:
            cuda.get_current_stream().synchronize()

    def host_buffer(self, dtype, n, slot):
        """Return a pinned host buffer of ``n`` elements of ``dtype`` for staging slot ``slot``."""
        key = (numpy.dtype(dtype), slot)
        buf = self._pinned.get(key)
        if buf is None or buf.size < n:
            buf = self._empty_pinned(max(n, 1), dtype)
            self._pinned[key] = buf
        return buf[:n]

    def _empty_pinned(self, n, dtype):
        if self.xp.__name__ == "cupy":
            import cupyx

            return cupyx.empty_pinned((n,), dtype=dtype)
        return numpy.empty(n, dtype=dtype)

    def to_host(self, dev, slot):
        """Copy 1-D device array ``dev`` into a staging buffer and return the host view."""
        host = self.host_buffer(dev.dtype, dev.size, slot)
        if dev.size:
            if hasattr(dev, "get"):
                dev.get(out=host)
            else:
                numpy.copyto(host, numpy.asarray(dev))
        self.staged_bytes += dev.nbytes
        return host

    def to_device(self, host, dev):
        """Copy host array ``host`` into 1-D device array ``dev``."""
        if dev.size:
            if hasattr(dev, "set"):
                dev.set(host)
            else:
                numpy.copyto(numpy.asarray(dev), host)
        self.staged_bytes += host.nbytes
