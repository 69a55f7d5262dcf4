"""Overlap of the gradient all-reduce with the backward pass (DDP's bucketed overlap).

Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020,
section 3.2.3: the gradient is split into buckets, last layer first; as soon as the backward pass has
written every gradient of a bucket, that bucket's all-reduce is *started* (non-blocking), and the
backward pass goes on with the earlier layers while the bucket travels. All buckets are started in
the same order on every rank and completed before the optimizer step.

Here a bucket is a contiguous range of the flat gradient (``training.dp.hooks.bucket_bounds``), a
whole number of parameters. Layers write their gradients last to first, so a bucket ``[lo, hi)`` is
complete once the layer holding element ``lo`` has run its ``backward``; ``Sequential.backward``
calls :meth:`OverlapStep.layer_done` right after each layer, which starts every bucket that has just
become complete, in order, with :func:`collectives.iallreduce` (``op="avg"``, in place).

**Progress.** MPICH moves a non-blocking collective's data only inside MPI calls (no background
thread by default): a hand-made algorithm's round completes, and the next one is posted, when the
request is tested; a large ``MPI_Iallreduce`` advances its internal schedule the same way. So
:meth:`OverlapStep.layer_done` also tests every bucket in flight after each layer: communication
advances between layers, and a layer's own computation runs undisturbed. MPICH's asynchronous
progress thread (``MPIR_CVAR_ASYNC_PROGRESS=1``) would advance messages during a layer too, but it
polls continuously: one more busy thread per rank, which on a machine with as many ranks as cores
takes a core from the computation it is meant to hide communication behind.

**Bitwise equal results.** Each bucket runs the same schedule on the same data as the blocking
:class:`training.dp.hooks.AllreduceHook` would (same algorithm, same count, so the same chunks and
the same order of additions), so a run with overlap ends with exactly the parameters of a run
without it. The non-finite check is the same too: each bucket's float64 sum is taken just before
its all-reduce starts, and every bucket sum is finite exactly when the whole gradient's is.
"""
import time

import numpy

import collectives
import collectives.engine.context
from commlab import tracing

__all__ = ["OverlapStep", "layer_starts"]


def layer_starts(model):
    """Return, per layer, the flat offset of its first parameter (None for a layer without any).

    Parameters
    ----------
    model : training.model.nn.Sequential
        Layers hold views into ``model.grads`` in layer order (``model.slices``).

    Returns
    -------
    list of (int or None)
        ``starts[i]``: offset in elements of layer ``i``'s first gradient element.
    """
    starts, k = [], 0
    for layer in model.layers:
        n = len(layer.param_shapes())
        starts.append(model.slices[k][1] if n else None)
        k += n
    return starts


class OverlapStep:
    """One step's bucket all-reduces, started during the backward pass and completed by :meth:`wait`.

    Parameters
    ----------
    grad : ndarray, shape (n,), float32 or float64
        The flat gradient, averaged in place bucket by bucket.
    comm : mpi4py.MPI.Comm
        Communicator of the data-parallel ranks.
    algorithm : str
        Any name in ``collectives.ALGORITHMS`` (``auto`` resolved per bucket, as the blocking hook does).
    buckets : list of (int, int)
        Element ranges ``[lo, hi)`` in start order, last layer first (``bucket_bounds``).
    starts : list of (int or None)
        :func:`layer_starts` of the model.
    timeout : float or None
        Seconds each round of a bucket's all-reduce may wait for a peer in :meth:`wait`.

    Attributes
    ----------
    finite : bool
        False once a started bucket held a NaN or an infinity on this rank.
    """

    __slots__ = ("grad", "comm", "algorithm", "buckets", "starts", "timeout", "finite", "_next", "_low",
                 "_reqs", "_t", "_sent")

    def __init__(self, grad, comm, algorithm, buckets, starts, timeout):
        self.grad, self.comm, self.algorithm, self.buckets = grad, comm, algorithm, buckets
        self.starts, self.timeout = starts, timeout
        self.finite, self._next, self._low = True, 0, grad.size
        self._reqs, self._t, self._sent = [], [], 0

    def layer_done(self, i):
        """Start every bucket complete once layer ``i``'s gradients exist, then test those in flight.

        ``Sequential.backward``'s ``on_grad`` callback: layers arrive last to first. Testing is
        what moves the buckets' messages on (see the module's notes on progress).

        Parameters
        ----------
        i : int
            Index of the layer whose ``backward`` has just written its parameter gradients.

        Raises
        ------
        collectives.CollectiveMismatch
            When a peer's call differs from this rank's (raised as the bucket's round completes).
        """
        if self.starts[i] is not None:
            self._low = min(self._low, self.starts[i])
        while self._next < len(self.buckets) and self.buckets[self._next][0] >= self._low:
            self._start()
        for req, t in zip(self._reqs, self._t):
            if len(t) == 1 and req.test():
                t.append(time.perf_counter())

    def flush(self):
        """Start the buckets not started yet (all of them once the backward pass has ended).

        Called after the backward pass, so that a model whose first layers hold no parameters, or
        a backward pass that stopped early, still starts every bucket, in the same order on every
        rank.
        """
        self._low = 0
        while self._next < len(self.buckets):
            self._start()

    def _start(self):
        lo, hi = self.buckets[self._next]
        part = self.grad[lo:hi]
        if self.finite and not numpy.isfinite(float(part.sum(dtype=numpy.float64))):
            self.finite = False
        self._t.append([time.perf_counter()])
        self._reqs.append(collectives.iallreduce(part, comm=self.comm, op="avg", algorithm=self.algorithm, out=part))
        self._sent += int(collectives.engine.context.last_stats(self.comm).get("bytes_sent", 0))
        self._next += 1

    def wait(self):
        """Complete every bucket, in start order; return the hook's ``info`` dict.

        Returns
        -------
        dict
            ``bytes_sent`` (bytes this rank sent, summed over buckets), ``compress_s`` and
            ``decompress_s`` (0.0).

        Raises
        ------
        collectives.CollectiveTimeout
            When a peer does not answer within ``timeout`` seconds.
        """
        self.flush()
        for k, (req, t) in enumerate(zip(self._reqs, self._t)):
            req.wait(self.timeout)
            if len(t) == 1:
                t.append(time.perf_counter())
            if tracing.enabled():
                lo, hi = self.buckets[k]
                tracing.complete("allreduce", "comm", t[0], t[1], {"bucket": k, "elements": hi - lo})
        return {"bytes_sent": self._sent, "compress_s": 0.0, "decompress_s": 0.0}
