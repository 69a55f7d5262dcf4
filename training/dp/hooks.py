"""The data-parallel gradient hooks: the plain all-reduce of the flat gradient (fused, bucketed, or
overlapped with the backward pass) and the factory that picks it or a compressor.

A *gradient hook* is any callable ``hook(flat_grad) -> (avg_grad, info)`` with ``state_dict()``
and ``load_state_dict(d)``; ``info`` holds at least ``bytes_sent`` (bytes), ``compress_s`` and
``decompress_s`` (seconds). :class:`AllreduceHook` averages with ``collectives.allreduce`` (or, under
a deadline, persistent plans of each bucket); a compressor from ``collectives.compression.make_hook``
plugs in at the same point, between backward and the optimizer step.
"""
import math

import numpy

import collectives
import collectives.engine.context
from commlab import tracing
from collectives.compression import make_hook
from collectives.compression.hook import GradientHook
from training.dp.overlap import OverlapStep, layer_starts

__all__ = ["AllreduceHook", "bucket_bounds", "make_grad_hook", "share_gradients"]


def bucket_bounds(slices, itemsize, bucket_bytes):
    """Group parameters into contiguous gradient buckets of about ``bucket_bytes``, last layer first.

    Parameters are taken from the end of the flat gradient backwards and a bucket is closed once
    it holds at least ``bucket_bytes`` (as DDP's ``bucket_cap_mb``, Li et al., VLDB 2020,
    section 3.2.3); a parameter is never split.

    Parameters
    ----------
    slices : list of (str, int, int)
        (name, offset, size) per parameter in flat order (``Sequential.slices``).
    itemsize : int
        Bytes per gradient element.
    bucket_bytes : int
        Bucket capacity in bytes; 0 means one bucket holding the whole gradient.

    Returns
    -------
    list of (int, int)
        Element ranges ``[lo, hi)`` of the flat gradient, in all-reduce order (last layer first).
    """
    if bucket_bytes < 0:
        raise ValueError(f"bucket_bytes must be >= 0, got {bucket_bytes}")
    total = sum(size for _, _, size in slices)
    if bucket_bytes == 0 or total == 0:
        return [(0, total)]
    bounds, hi, filled = [], total, 0
    for _, off, size in reversed(slices):
        filled += size * itemsize
        if filled >= bucket_bytes:
            bounds.append((off, hi))
            hi, filled = off, 0
    if hi > 0:
        bounds.append((0, hi))
    return bounds


def _bytes_sent(comm):
    """Return the bytes this rank sent in the last collective on ``comm`` (``collectives.engine.context.last_stats``)."""
    return int(collectives.engine.context.last_stats(comm).get("bytes_sent", 0))


class AllreduceHook(GradientHook):
    """Average the flat gradient across ranks in place: one fused all-reduce, or buckets.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Communicator of the data-parallel ranks.
    algorithm : str
        Any name in ``collectives.ALGORITHMS``.
    buckets : list of (int, int), optional
        Element ranges all-reduced one after another (see :func:`bucket_bounds`); default: one.
    timeout : float, optional
        Seconds each all-reduce may wait for a peer before ``collectives.CollectiveTimeout``
        (default: no limit).
    overlap : bool
        True: :func:`train_step` starts each bucket's all-reduce as soon as the backward pass has
        written its gradients (:meth:`begin`, :mod:`training.dp.overlap`); called directly, the hook
        still all-reduces after the backward pass.

    Notes
    -----
    ``info["bytes_sent"]`` is ``collectives.engine.context.last_stats()["bytes_sent"]`` summed over
    buckets. The hook implements the one hook contract,
    :class:`collectives.compression.hook.GradientHook`, as the compression hook does.
    """

    __slots__ = ("comm", "algorithm", "buckets", "timeout", "overlap", "_plans", "_grad")
    owns_momentum = False  # the optimizer keeps its own momentum

    def __init__(self, comm, algorithm="auto", buckets=None, timeout=None, overlap=False):
        if algorithm not in collectives.ALGORITHMS:
            raise ValueError(f"algorithm must be one of {collectives.ALGORITHMS}, got {algorithm!r}")
        if timeout is not None and not (isinstance(timeout, (int, float)) and 0 < timeout < math.inf):
            raise ValueError(f"timeout must be None or a positive number of seconds, got {timeout!r}")
        if not isinstance(overlap, bool):
            raise ValueError(f"overlap must be True or False, got {overlap!r}")
        self.comm, self.algorithm, self.buckets, self.timeout = comm, algorithm, buckets, timeout
        self.overlap = overlap
        self._plans, self._grad = None, None

    def __call__(self, grad):
        buckets = self.buckets or [(0, grad.size)]
        plans = self._persistent(grad, buckets)
        sent = 0
        for i, (lo, hi) in enumerate(buckets):
            part = grad[lo:hi]
            with tracing.span("allreduce", "comm", {"bucket": i, "elements": hi - lo}):
                if plans is None:
                    collectives.allreduce(part, comm=self.comm, op="avg", algorithm=self.algorithm, out=part,
                                          timeout=self.timeout)
                else:
                    plans[i].start()
                    plans[i].wait(self.timeout)
            sent += _bytes_sent(self.comm)
        return grad, {"bytes_sent": sent, "compress_s": 0.0, "decompress_s": 0.0}

    def _persistent(self, grad, buckets):
        """Return one persistent all-reduce plan per bucket of ``grad`` (made on the first call), or None.

        The flat gradient is the same array at every step, so each bucket's all-reduce is planned
        once (:func:`collectives.allreduce_init`, ``MPI_Allreduce_init`` for the library's
        all-reduce) and started and waited at every step. Only with a timeout: persistent
        collectives are matched by the order in which the ranks made them, so ranks whose calls
        differ wait for each other, and the timeout turns that wait into an error. Without one,
        or for device arrays, every step calls :func:`collectives.allreduce`. ``shm`` always plans
        (its plans check every start's call through the flags, timeout or not): on a gradient in
        shared memory (:func:`share_gradients`) each start copies nothing in or out.
        """
        if (self.timeout is None and self.algorithm != "shm") or type(grad) is not numpy.ndarray:
            return None
        if self._grad is not grad:
            if self._plans is not None:
                for plan in self._plans:
                    plan.free()
            parts = [grad[lo:hi] for lo, hi in buckets]
            self._plans = [collectives.allreduce_init(part, comm=self.comm, op="avg", algorithm=self.algorithm, out=part)
                           for part in parts]
            self._grad = grad
        return self._plans

    def begin(self, model):
        """Return the :class:`training.dp.overlap.OverlapStep` of one step on ``model.grads``.

        Parameters
        ----------
        model : training.model.nn.Sequential
            The model whose flat gradient the hook averages.
        """
        buckets = self.buckets or [(0, model.grads.size)]
        return OverlapStep(model.grads, self.comm, self.algorithm, buckets, layer_starts(model), self.timeout)

    def state_dict(self):
        """Return ``{}``: a plain all-reduce keeps no state."""
        return {}

    def load_state_dict(self, d):
        """Accept the (empty) state of :meth:`state_dict`."""

    def close(self):
        """Free nothing: the hook sends on the run's own communicator."""


def share_gradients(cfg, comm, model):
    """Move ``model.grads`` into shared memory when the plain ``shm`` all-reduce will average it.

    With ``cfg.algorithm == "shm"``, no compressor, host arrays, no ``--elastic`` and every rank of
    ``comm`` on one node, the flat gradient is moved into a buffer of :func:`collectives.shm.shared_empty` and every
    layer's gradient views are bound to it, so that each step's in-place all-reduce reads and writes
    the ranks' gradients where they lie (no copy in or out). Call it before the optimizer is made
    (the optimizer keeps the flat gradient it is given). Collective over ``comm``.

    Parameters
    ----------
    cfg : training.settings.config.Config
    comm : mpi4py.MPI.Comm
    model : training.model.nn.Sequential

    Returns
    -------
    bool
        True when the gradient was moved.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from training.settings.cli import parse_args
    >>> from training.model.nn import Linear, Sequential
    >>> model = Sequential([Linear(3, 2)])
    >>> share_gradients(parse_args(["--algorithm", "shm"]), MPI.COMM_WORLD, model)
    True
    >>> model.grads.size, numpy.shares_memory(model.layers[0].dW, model.grads)
    (8, True)
    """
    if cfg.algorithm != "shm" or cfg.compression != "none" or type(model.grads) is not numpy.ndarray or cfg.elastic:
        return False  # (--elastic frees a shrunk communicator's memory: the gradient stays the model's own)
    if collectives.engine.context.get_context(comm).nodes()[0] != 1:
        return False  # (the all-reduce itself refuses such a communicator, with the reason)
    from collectives.shm import shared_empty

    grads = shared_empty(model.grads.shape, model.grads.dtype, comm=comm)
    grads[...] = model.grads
    off = 0
    for layer in model.layers:
        params, views = [], []
        for shape in layer.param_shapes():
            size = math.prod(shape)
            params.append(model.params[off:off + size].reshape(shape))
            views.append(grads[off:off + size].reshape(shape))
            off += size
        layer.bind(params, views)
    model.grads = grads
    return True


def make_grad_hook(cfg, comm, model):
    """Build the gradient hook named by ``cfg.compression`` (plain all-reduce for "none").

    Every collective of the hook (the plain all-reduce and its buckets, or the compressor's
    all-reduces and all-gathers) waits at most ``cfg.timeout`` seconds for a peer. ``cfg.overlap``
    applies to the plain all-reduce; a compressor needs the whole gradient and runs after the
    backward pass whatever ``cfg.overlap`` says.

    Parameters
    ----------
    cfg : training.settings.config.Config
    comm : mpi4py.MPI.Comm
    model : training.model.nn.Sequential

    Returns
    -------
    AllreduceHook or collectives.compression.CompressionHook
        ``hook(flat_grad) -> (avg_grad, info)`` with ``state_dict`` / ``load_state_dict``,
        ``close()`` and ``owns_momentum``.

    Raises
    ------
    ValueError
        When the compressor's name or an argument is unknown or out of range.
    """
    if cfg.compression == "none":
        buckets = bucket_bounds(model.slices, model.dtype.itemsize, cfg.bucket_bytes)
        return AllreduceHook(comm, cfg.algorithm, buckets, cfg.timeout, cfg.overlap)
    shapes = [tuple(p.shape) for p, _ in model.parameters()]
    return make_hook(cfg.compression, comm=comm, algorithm=cfg.algorithm, shapes=shapes,
                     timeout=cfg.timeout, **cfg.compression_args)
