"""Compressed communication: each compressor's payloads travel as it declares (``transport``): the
all-reduce for payloads that sum, all-gather(-v) and aggregation after decompression for the rest,
the compressor's own rounds (PowerSGD's two all-reduces); and the sparse all-reduce.

Every call reports the bytes this rank sent, counted from the payload buffers it handed to the
collectives (plus the size header of an all-gather-v), and the compress / decompress seconds.
"""
import time

import numpy as np
from mpi4py import MPI

import collectives.engine.context
import collectives.schedules.registry
from collectives.backend import BFLOAT16
from collectives.calls.allgather import allgather
from collectives.calls.allreduce import allreduce

from .base import TRANSPORTS, check_tensor, payload_nbytes
from commlab.arrays import get_array_module
from .sparse import scatter_add

__all__ = ["compressed_allreduce", "sparse_allreduce", "allgather_payloads"]

_HALF = (np.dtype(np.float16), np.dtype(BFLOAT16))  # payload dtypes divided by P before the sum


class _Call:
    """One compressed all-reduce's communicator, algorithms and wire-byte counter."""

    __slots__ = ("comm", "size", "algorithm", "gather_algorithm", "wire", "timeout")

    def __init__(self, comm, algorithm, gather_algorithm, timeout=None):
        self.comm, self.size = comm, comm.Get_size()
        self.algorithm, self.gather_algorithm = algorithm, gather_algorithm
        self.timeout = timeout
        self.wire = [0]  # bytes the collectives actually sent (collectives.engine.context.last_stats)

    def allreduce_sum(self, buf, accumulate="float32"):
        """Return the sum over ranks of the 1-D array ``buf`` and count its wire bytes."""
        out = allreduce(buf, comm=self.comm, op="sum", algorithm=self.algorithm,
                                    accumulate=accumulate, timeout=self.timeout)
        _wire(self.wire, self.comm)
        return out


def _wire(counter, comm):
    """Add the bytes the last collective on ``comm`` sent (``collectives.engine.context.last_stats``) to ``counter``."""
    counter[0] += int(collectives.engine.context.last_stats(comm).get("bytes_sent", 0))


def allgather_payloads(payloads, comm, variable_size=False, algorithm="ring", _wire_bytes=None, timeout=None):
    """All-gather every rank's payload list in one byte buffer.

    The payloads are viewed as bytes, concatenated and sent with one ``collectives.allgather`` of
    uint8. With ``variable_size`` the element counts go first in a small int64 all-gather
    (all-gather-v); otherwise every rank's payloads have this rank's shapes.

    Parameters
    ----------
    payloads : list of ndarray, 1-D
        This rank's payloads.
    comm : mpi4py.MPI.Comm
        Communicator.
    variable_size : bool
        Payload sizes may differ between ranks.
    algorithm : str
        All-gather algorithm (``collectives.schedules.registry.OP_ALGORITHMS["allgather"]``).
    timeout : float, optional
        Seconds each all-gather may wait for a peer (``collectives.CollectiveTimeout`` then).

    Returns
    -------
    gathered : list of list of ndarray
        ``gathered[r]`` is rank ``r``'s payload list (dtypes as sent).
    nbytes : int
        Bytes this rank sent: its byte buffer plus the size header.
    """
    xp = get_array_module(payloads[0])
    wire = _wire_bytes if _wire_bytes is not None else [0]
    dtypes = [p.dtype for p in payloads]
    counts = np.array([p.size for p in payloads], np.int64)
    header = 0
    if variable_size:
        all_counts = allgather(counts, comm=comm, algorithm=algorithm, timeout=timeout)
        _wire(wire, comm)
        all_counts = np.asarray(all_counts).reshape(comm.Get_size(), len(payloads))
        header = int(counts.nbytes)
    else:
        all_counts = np.tile(counts, (comm.Get_size(), 1))
    itemsizes = np.array([d.itemsize for d in dtypes], np.int64)
    lengths = [int(row @ itemsizes) for row in all_counts]  # bytes of each rank's payloads
    parts = [xp.ascontiguousarray(p).ravel().view(np.uint8) for p in payloads]
    blob = xp.concatenate(parts) if parts else xp.zeros(0, np.uint8)
    everything = allgather(blob, comm=comm, algorithm=algorithm, timeout=timeout)
    _wire(wire, comm)
    gathered, start = [], 0
    for row, length in zip(all_counts, lengths):
        mine, off = [], start
        for count, dtype in zip(row, dtypes):
            size = int(count) * dtype.itemsize
            mine.append(everything[off:off + size].copy().view(dtype))  # copy: aligned
            off += size
        gathered.append(mine)
        start += length
    assert start == everything.size, "all-gather returned an unexpected number of bytes"
    return gathered, int(blob.nbytes) + header


def _by_allreduce(compressor, p, name, call):
    """Sum the payloads with the all-reduce and decompress the sum once (``transport "allreduce"``).

    float16 and bfloat16 payloads are divided by P in their own dtype before the sum, as
    PyTorch's ``fp16_compress_hook`` and ``bf16_compress_hook`` do (cast, ``div_(world_size)``,
    all-reduce), so the sum of P shares of at most 65504 / P stays finite: the result overflows where a
    rank's own value does (``|x| >= 65520`` rounds to ``inf`` in float16), not where the sum over ranks
    passes 65504. Wider payloads are summed and the sum divided.
    """
    t0 = time.perf_counter()
    payloads, ctx = compressor.compress(p, name)
    compress_s = time.perf_counter() - t0
    half = all(buf.dtype in _HALF for buf in payloads)
    # half-precision payloads stay half precision on the wire: that is the point of fp16 and bf16 compression
    shares = [buf / buf.dtype.type(call.size) for buf in payloads] if half else payloads
    summed = [call.allreduce_sum(buf, accumulate="native") for buf in shares]
    t1 = time.perf_counter()
    mean = compressor.decompress(summed, ctx)
    if not half:
        mean = mean / p.dtype.type(call.size)
    return mean, payloads, ctx, payload_nbytes(payloads), compress_s, time.perf_counter() - t1


def _by_allgather(compressor, p, name, call):
    """All-gather(-v) the payloads; ``compressor.aggregate`` decompresses and averages them."""
    t0 = time.perf_counter()
    payloads, ctx = compressor.compress(p, name)
    compress_s = time.perf_counter() - t0
    gathered, nbytes = allgather_payloads(payloads, call.comm, compressor.transport == "allgatherv",
                                          call.gather_algorithm, call.wire, call.timeout)
    t1 = time.perf_counter()
    mean = compressor.aggregate(gathered, ctx)
    return mean, payloads, ctx, nbytes, compress_s, time.perf_counter() - t1


_TRANSPORTS = {"allreduce": _by_allreduce, "allgather": _by_allgather, "allgatherv": _by_allgather}


def compressed_allreduce(x, name, compressor, memory=None, comm=None, algorithm="auto",
                         gather_algorithm="ring", timeout=None):
    """Average ``x`` over the ranks of ``comm`` through ``compressor``.

    Steps: ``p = memory.compensate(x)``; then by ``compressor.transport``: ``"allreduce"``
    compresses ``p``, sums the payloads with ``collectives.allreduce`` and decompresses once
    (divided by P; half-precision payloads, float16 and bfloat16, are divided by P before the sum,
    so they overflow only where one rank's own value does); ``"allgather"`` / ``"allgatherv"``
    all-gather the payloads (all-gather-v when their sizes vary) and ``compressor.aggregate``
    decompresses and averages them (sparse ones with ``add.at``; sign votes by majority); ``"own"``
    runs the compressor's own rounds
    (``compressor.reduce``: PowerSGD's two all-reduces); finally
    ``memory.update(p, name, decompress(own payloads))``.

    Parameters
    ----------
    x : ndarray, any shape, float16/float32/float64
        This rank's tensor (not modified).
    name : str
        Its key in the compressor and memory state.
    compressor : Compressor
        The compressor (configured alike on every rank).
    memory : Memory or None
        Error-feedback memory of this rank, or None.
    comm : mpi4py.MPI.Comm, optional
        Communicator (``MPI.COMM_WORLD`` by default).
    algorithm : str
        All-reduce algorithm for payloads that are summed.
    gather_algorithm : str
        All-gather algorithm for the other payloads.
    timeout : float, optional
        Seconds each of the step's collectives may wait for a peer (None: no limit).

    Returns
    -------
    mean : ndarray
        The averaged decompressed tensor, shape and dtype of ``x``, the same on every rank.
    info : dict
        ``bytes_sent`` (int, bytes of this rank's payload buffers this step), ``compress_s`` and
        ``decompress_s`` (float, seconds), ``elements`` (int), ``bits_per_element`` (float) and
        ``wire_bytes`` (int, bytes the collectives actually sent: all-gather forwarding, float32
        partial sums of float16 and bfloat16 under ``mpi`` and ``shm``, and the size header included).

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point array (on every rank, before any message).
    ValueError
        If ``compressor.transport`` is not one of ``TRANSPORTS``.
    collectives.CollectiveTimeout
        When a peer is silent for ``timeout`` seconds in one of the step's collectives.

    Examples
    --------
    Run under ``mpiexec -n P``; here P = 1. bf16 keeps 8 significant bits (257 becomes 256) and
    sends 2 bytes an element:

    >>> from collectives.compression import make_compressor
    >>> mean, info = compressed_allreduce(np.array([1.0, 257.0], np.float32), "w", make_compressor("bf16"))
    >>> mean.tolist(), info["bytes_sent"]
    ([1.0, 256.0], 4)
    """
    check_tensor(x, name)
    if compressor.transport not in TRANSPORTS:
        raise ValueError(f"compressor.transport must be one of {TRANSPORTS}, got {compressor.transport!r}")
    call = _Call(comm if comm is not None else MPI.COMM_WORLD, algorithm, gather_algorithm, timeout)
    compressor.comm_rank = call.comm.Get_rank()
    t0 = time.perf_counter()
    p = memory.compensate(x, name) if memory is not None else x
    compensate_s = time.perf_counter() - t0
    if compressor.transport == "own":
        mean, local, payloads, _, compress_s, decompress_s = compressor.reduce(
            p, name, call.allreduce_sum, call.size)
        nbytes = payload_nbytes(payloads)
    else:
        mean, payloads, ctx, nbytes, compress_s, decompress_s = _TRANSPORTS[compressor.transport](
            compressor, p, name, call)
        t1 = time.perf_counter()
        local = compressor.decompress(payloads, ctx) if memory is not None else None
        decompress_s += time.perf_counter() - t1
    if memory is not None:
        memory.update(p, name, local)
    info = {"bytes_sent": int(nbytes), "compress_s": float(compensate_s + compress_s),
            "decompress_s": float(decompress_s), "elements": int(x.size),
            "bits_per_element": 8.0 * nbytes / x.size if x.size else 0.0, "wire_bytes": call.wire[0]}
    return mean.astype(x.dtype, copy=False).reshape(x.shape), info


def sparse_allreduce(indices, values, size, comm=None, algorithm="ring"):
    """Average sparse rows over ranks: all-gather-v the (index, row) pairs and add them up.

    Indices that repeat across ranks are summed (``add.at``), then everything is divided by P.

    Parameters
    ----------
    indices : ndarray, shape (k,), integer
        Row indices of this rank, in ``0..size-1`` (k may differ between ranks).
    values : ndarray, shape (k,) or (k, width), float
        The rows.
    size : int
        Rows of the dense result.
    comm : mpi4py.MPI.Comm, optional
        Communicator (``MPI.COMM_WORLD`` by default).
    algorithm : str
        All-gather algorithm.

    Returns
    -------
    ndarray, shape (size,) or (size, width), dtype of values
        The mean over ranks of the dense tensors.

    Raises
    ------
    TypeError
        If ``indices`` is not integer or ``values`` not floating point.
    ValueError
        If the shapes disagree or an index is out of range.
    """
    xp = get_array_module(values)
    indices = xp.asarray(indices)
    if indices.dtype.kind not in "iu":
        raise TypeError(f"indices must be integer, got {indices.dtype}")
    if values.dtype.kind != "f":
        raise TypeError(f"values must be floating point, got {values.dtype}")
    if indices.ndim != 1 or values.ndim not in (1, 2) or values.shape[0] != indices.shape[0]:
        raise ValueError(f"indices {indices.shape} and values {values.shape}: need (k,) and (k, ...)")
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= size):
        raise ValueError(f"indices must lie in [0, {size}), got [{int(indices.min())}, "
                         f"{int(indices.max())}]")
    comm = comm if comm is not None else MPI.COMM_WORLD
    width = values.shape[1:]
    flat_values = xp.ascontiguousarray(values).ravel()
    gathered, _ = allgather_payloads([indices.astype(np.int64), flat_values], comm, True, algorithm)
    out = xp.zeros((size,) + width, values.dtype)
    all_indices = xp.concatenate([pl[0] for pl in gathered])  # (sum of k,), repeats across ranks
    all_values = xp.concatenate([pl[1] for pl in gathered]).reshape((all_indices.size,) + width)
    scatter_add(out, all_indices, all_values)
    return out / values.dtype.type(comm.Get_size())
