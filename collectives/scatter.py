"""The library reduce-scatter of host arrays (``algorithm="mpi"``), planned once per call signature.

A :class:`ScatterPlan` holds everything a repeated call reuses: the chunk counts
(``numpy.array_split``'s), the library call (``MPI_Reduce_scatter_block`` when the chunks are equal,
``MPI_Reduce_scatter`` with the count vector otherwise), its private buffers and the check values.

The call fingerprint travels as :mod:`collectives.library` describes for the all-reduce:

* messages of at most :data:`~collectives.library.PIGGYBACK_MAX` elements carry it *inside the
  data*: every chunk of the send buffer is followed by the check elements, so the chunk each rank
  receives ends with the reduced check elements, verified as the all-reduce verifies them (under
  the call's own op). One library call, as a direct ``MPI_Reduce_scatter_block`` makes, for 64-128
  more bytes per rank;
* larger messages post the 2-element fingerprint all-reduce beside the data.

The rule that decides between the two depends only on a field of the call key (the count), so ranks
that make the same call post the same library calls. Float ``min``/``max`` reduce a NaN mask beside
the data (:func:`collectives.buffers.nan_mask`), as the all-reduce does.
"""
import numpy
from mpi4py import MPI

from .backend import accumulation_dtype
from .buffers import MPI_OPS, finish
from .library import CHECK_ELEMENTS, check_values, mismatch, piggyback, run_library
from .schedule import chunk_bounds

__all__ = ["ScatterPlan"]


class ScatterPlan:
    """The library reduce-scatter of one call signature on host arrays, ready to run again.

    Parameters
    ----------
    ctx : Context
        The communicator's library context.
    x : numpy.ndarray
        An input of the signature (its shape and dtype are the plan's).
    op : str
        ``sum``, ``avg``, ``prod``, ``min`` or ``max``.
    key : tuple
        The call key (:mod:`collectives.fingerprint`), algorithm ``"mpi"``.
    """

    __slots__ = ("key", "acc", "chunk", "op", "size", "elements", "inline", "send", "parts", "recv", "mine",
                 "tail", "want", "method", "counts", "mpi_op", "mask", "got", "isnan", "x", "sources")

    def __init__(self, ctx, x, op, key):
        size, rank, n = ctx.size, ctx.rank, x.size
        bounds = chunk_bounds(n, size)
        counts = [bounds[i + 1] - bounds[i] for i in range(size)]
        self.key, self.op, self.size, self.acc = key, op, size, accumulation_dtype(x.dtype)
        self.chunk, self.elements, self.mpi_op = counts[rank], n - counts[rank], MPI_OPS[op]
        self.inline = piggyback(op, n)
        extra = CHECK_ELEMENTS if self.inline else 0
        self.counts = [c + extra for c in counts]
        self.method = "Ireduce_scatter_block" if len(set(counts)) == 1 else "Ireduce_scatter"
        self.send = self.parts = self.tail = self.want = self.x = self.sources = None
        if self.inline:  # chunk i of the data, then its check elements, for every i
            self.send = numpy.empty(n + size * extra, self.acc)
            sent, want = check_values(key, size, self.acc)
            self.parts = self._parts(bounds, counts, extra)
            for _, _, checks in self.parts:
                checks[...] = sent
            self.want = want.tobytes()
        self.recv = numpy.empty(self.counts[rank], self.acc) if self.inline else None  # (else: out, or new)
        self.mine, self.tail = (self.recv[:self.chunk], self.recv[self.chunk:]) if self.inline else (None, None)
        self.mask = self.got = self.isnan = None
        if op in ("min", "max") and self.acc.kind == "f":
            self.isnan = numpy.empty(n, bool)
            self.mask, self.got = self.isnan.view(numpy.uint8), numpy.empty(self.chunk, numpy.uint8)

    def _parts(self, bounds, counts, extra):
        """Return ``(data view, elements of x, check view)`` groups of the send buffer: one per run of
        equal chunks (``array_split`` makes at most two), as 2-D views, so copying ``x`` in takes two
        assignments whatever P is."""
        size, parts, first = len(counts), [], 0
        while first < size:
            last = first
            while last + 1 < size and counts[last + 1] == counts[first]:
                last += 1
            rows, c = last - first + 1, counts[first]
            start = bounds[first] + first * extra
            block = self.send[start:start + rows * (c + extra)].reshape(rows, c + extra)
            parts.append((block[:, :c], (bounds[first], bounds[last + 1]), block[:, c:]))
            first = last + 1
        return parts

    def run(self, ctx, x, timeout, out=None):
        """Reduce-scatter ``x`` (the plan's shape and dtype); return this rank's chunk (``out``, else new).

        Raises
        ------
        CollectiveMismatch
            The check elements or the fingerprint show that the ranks' calls differ, or the library
            reported an error.
        CollectiveTimeout
            A rank did not join within ``timeout``.
        """
        ctx.check_usable()
        flat = x.reshape(-1)  # (a copy when x is not contiguous)
        if self.inline:
            if x is not self.x or not x.flags.c_contiguous:  # views of x, kept for a call with the same array
                self.x, self.sources = x, [flat[lo:hi].reshape(data.shape) for data, (lo, hi), _ in self.parts]
            for (data, _, _), source in zip(self.parts, self.sources):
                data[...] = source
            send = self.send
        elif x.dtype == self.acc and x.flags.c_contiguous:
            send = flat
        else:
            send = self.send = numpy.empty(x.size, self.acc) if self.send is None else self.send
            send[...] = flat
        recv, direct = self.recv, False
        if recv is None:  # large: the library writes into out itself when it can (no copy of the chunk)
            direct = out is not None and out.dtype == self.acc and out.flags.c_contiguous
            recv = out.reshape(-1) if direct else numpy.empty(self.chunk, self.acc)
        args = (send, recv, self.mpi_op) if self.method == "Ireduce_scatter_block" else \
            (send, recv, self.counts, self.mpi_op)
        more = ()
        if self.isnan is not None:
            numpy.isnan(flat, out=self.isnan)
            plain = [c - CHECK_ELEMENTS for c in self.counts] if self.inline else self.counts
            more = [(self.method, (self.mask, self.got, MPI.MAX) if self.method == "Ireduce_scatter_block"
                     else (self.mask, self.got, plain, MPI.MAX))]
        run_library(ctx, self.key, numpy, self.method, args, timeout, more, check=not self.inline)
        if self.inline and self.tail.tobytes() != self.want:
            err = mismatch(self.key)
            ctx.fail(f"reduce_scatter: {err}")
            raise err
        mine = recv[:self.chunk]
        if self.got is not None and self.got.any():
            mine[self.got.view(bool)] = numpy.nan
        if self.op == "avg":
            finish(mine, mine, "avg", self.size, numpy, True)  # the division, in place
        ctx.record("reduce_scatter", "mpi", x.size, self.acc, elements=self.elements, estimated=True)
        if out is not None:
            if not direct:
                out[...] = mine
            return out
        if recv is self.recv or x.dtype != self.acc:  # the plan's buffer is reused by the next call
            return mine.astype(x.dtype)
        return mine
