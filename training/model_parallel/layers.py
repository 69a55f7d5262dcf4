"""Tensor-parallel linear layers (Megatron-LM) and the one rule that splits a width over a group.

Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
Parallelism", 2019, section 3: an MLP block ``Y = act(X A) B`` is split over a tensor group of T
ranks by cutting ``A`` by columns (output features) and ``B`` by rows (input features). Rank t
computes ``act(X A_t) B_t``, a partial sum of ``Y``; one all-reduce finishes the forward (the
paper's operator *g*), and one all-reduce of the input gradient finishes the backward (its
operator *f*). Between the two layers the activation stays split, so the pair needs no other
message.

:class:`ColumnParallelLinear` holds ``W[:, lo:hi]`` and ``b[lo:hi]``; its forward needs no
communication and its backward all-reduces dL/dX over the group. :class:`RowParallelLinear` holds
``W[lo:hi, :]`` and the whole bias; its forward all-reduces the partial outputs (then adds the
bias), its backward needs no communication. Both all-reduce through ``collectives.allreduce``
(any algorithm, optional timeout). ``lo:hi`` come from :func:`shard_bounds`, the
``numpy.array_split`` rule of the rest of commlab, so widths that T does not divide work.

Layers follow :mod:`training.model.nn`: ``param_shapes`` / ``bind`` / ``init`` / ``parameters`` /
``forward`` / ``backward``, so a :class:`~training.model.nn.Sequential` can hold them in its flat
buffers; built with :meth:`~_TensorParallelLinear.from_dense` they own their arrays instead.
"""
import abc
import math
import time

import numpy

import collectives
import collectives.engine.context
import collectives.schedules.schedule
from training.model.nn import Layer, Linear
from commlab.arrays import get_array_module

__all__ = ["shard_bounds", "ColumnParallelLinear", "RowParallelLinear"]


def shard_bounds(width, parts, index):
    """Return the ``[lo, hi)`` range of shard ``index`` when ``width`` is split over ``parts`` ranks.

    The ``numpy.array_split`` rule (``collectives.schedules.schedule.chunk_bounds``): the first ``width % parts``
    shards hold ``width // parts + 1`` units, the others ``width // parts``; 10 units over 4 ranks
    give 3, 3, 2, 2.

    Parameters
    ----------
    width : int
        Number of features (units) to split, >= ``parts``.
    parts : int
        Ranks in the tensor group, >= 1.
    index : int
        Rank in the group, ``0 <= index < parts``.

    Returns
    -------
    tuple of (int, int)

    Raises
    ------
    ValueError
        When ``parts < 1``, ``index`` is out of range, or ``width < parts`` (a rank would hold
        an empty shard).
    """
    width, parts, index = int(width), int(parts), int(index)
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if not 0 <= index < parts:
        raise ValueError(f"index must be in [0, {parts}), got {index}")
    if width < parts:
        raise ValueError(f"a width of {width} units cannot be split over a tensor group of {parts} "
                         f"ranks: every rank needs at least one unit (width >= tensor-parallel size)")
    b = collectives.schedules.schedule.chunk_bounds(width, parts)
    return b[index], b[index + 1]


class _TensorParallelLinear(Layer):
    """Shared part of the column- and row-parallel layers (see the module docstring)."""

    _AXIS = None  # axis of W that is split: 1 (columns) or 0 (rows)

    def __init__(self, n_in, n_out, comm=None, rank=None, size=None, init="he", algorithm="auto",
                 timeout=None):
        if n_in < 1 or n_out < 1:
            raise ValueError(f"n_in and n_out must be >= 1, got {n_in}, {n_out}")
        if init not in ("he", "glorot"):
            raise ValueError(f"init must be 'he' or 'glorot', got {init!r}")
        if algorithm not in collectives.ALGORITHMS:
            raise ValueError(f"algorithm must be one of {collectives.ALGORITHMS}, got {algorithm!r}")
        if timeout is not None and not (isinstance(timeout, (int, float)) and 0 < timeout < math.inf):
            raise ValueError(f"timeout must be None or a positive number of seconds, got {timeout!r}")
        size = comm.Get_size() if size is None and comm is not None else (1 if size is None else size)
        rank = comm.Get_rank() if rank is None and comm is not None else (0 if rank is None else rank)
        if comm is not None and (comm.Get_size(), comm.Get_rank()) != (size, rank):
            raise ValueError(f"rank {rank} of {size} does not match the communicator "
                             f"(rank {comm.Get_rank()} of {comm.Get_size()})")
        self.n_in, self.n_out, self.init_name = int(n_in), int(n_out), init
        self.comm, self.rank, self.size = comm, int(rank), int(size)
        self.algorithm, self.timeout = algorithm, timeout
        self.lo, self.hi = shard_bounds(self.n_out if self._AXIS == 1 else self.n_in, self.size, self.rank)
        self.W = self.b = self.dW = self.db = None
        self._x = None
        self.stats = {"bytes_sent": 0, "calls": 0, "comm_s": 0.0}  # shared by clones (copy.copy)

    @classmethod
    def from_dense(cls, W, b, comm=None, rank=None, size=None, algorithm="auto", timeout=None):
        """Build this rank's shard of the dense layer ``y = x @ W + b``; the layer owns its arrays.

        Parameters
        ----------
        W : ndarray, shape (n_in, n_out), float32 or float64
            The full (unsharded) weight.
        b : ndarray, shape (n_out,), same dtype
            The full bias.
        comm : mpi4py.MPI.Comm, optional
            The tensor group (None only for a group of one).
        rank, size : int, optional
            Rank in the group and group size (default: the communicator's).
        algorithm : str
            All-reduce algorithm, any of ``collectives.ALGORITHMS``.
        timeout : float, optional
            Seconds each all-reduce may wait for a peer (``collectives.CollectiveTimeout``).

        Returns
        -------
        ColumnParallelLinear or RowParallelLinear

        Raises
        ------
        ValueError
            When the shapes do not match or the split width is smaller than the group.
        """
        if W.ndim != 2 or b.shape != (W.shape[1],):
            raise ValueError(f"W must be (n_in, n_out) and b (n_out,), got {W.shape} and {b.shape}")
        layer = cls(W.shape[0], W.shape[1], comm, rank, size, algorithm=algorithm, timeout=timeout)
        xp = get_array_module(W)
        shapes = layer.param_shapes()
        layer.bind([xp.empty(s, W.dtype) for s in shapes], [xp.zeros(s, W.dtype) for s in shapes])
        layer.load_dense(W, b)
        return layer

    def bind(self, params, grads):
        self.W, self.b = params
        self.dW, self.db = grads

    def parameters(self):
        return [(self.W, self.dW), (self.b, self.db)]

    def init(self, rng):
        """Draw the full weight exactly as :class:`training.model.nn.Linear` does, keep this rank's shard.

        The same ``rng`` state therefore gives every rank its part of one and the same dense
        layer, and a model of these layers equals ``training.model.nn.build_mlp``'s.
        """
        dense = Linear(self.n_in, self.n_out, init=self.init_name)
        W = numpy.empty((self.n_in, self.n_out), self.W.dtype)
        b = numpy.empty(self.n_out, self.W.dtype)
        dense.bind([W, b], [None, None])
        dense.init(rng)
        self.load_dense(W, b)

    def load_dense(self, W, b):
        """Copy this rank's shard of the full ``W`` (n_in, n_out) and ``b`` (n_out,) into the layer."""
        xp = get_array_module(self.W)
        if tuple(W.shape) != (self.n_in, self.n_out) or tuple(b.shape) != (self.n_out,):
            raise ValueError(f"expected W {(self.n_in, self.n_out)} and b {(self.n_out,)}, "
                             f"got {tuple(W.shape)} and {tuple(b.shape)}")
        w_part, b_part = self.shard_of(W, b)
        self.W[...] = xp.asarray(w_part, dtype=self.W.dtype)
        self.b[...] = xp.asarray(b_part, dtype=self.b.dtype)

    @abc.abstractmethod
    def shard_of(self, W, b):
        """Return this rank's (weight, bias) parts of a full ``W`` and ``b`` (views, no copy)."""

    def _allreduce(self, x):
        """Sum ``x`` over the tensor group in place (nothing to do for a group of one)."""
        if self.size == 1:
            return x
        if self.comm is None:
            raise ValueError(f"rank {self.rank} of a tensor group of {self.size} has no communicator: "
                             "pass comm to run forward/backward (without it a layer only holds a shard)")
        t0 = time.perf_counter()
        collectives.allreduce(x, comm=self.comm, op="sum", algorithm=self.algorithm, out=x,
                              timeout=self.timeout)
        st = self.stats
        st["comm_s"] += time.perf_counter() - t0
        st["bytes_sent"] += collectives.engine.context.last_stats(self.comm).get("bytes_sent", 0)
        st["calls"] += 1
        return x


class ColumnParallelLinear(_TensorParallelLinear):
    """Linear layer split by output features: rank t holds ``W[:, lo:hi]`` and ``b[lo:hi]``.

    Shoeybi et al. 2019, section 3 (the first GEMM of the MLP block, ``A = [A_1, ..., A_T]``).
    Forward ``y_t = x @ W_t + b_t``, input (B, n_in) replicated, output (B, hi - lo) split: no
    message. Backward writes ``dW_t = x.T @ dy_t``, ``db_t = sum(dy_t)`` and returns
    ``dx = sum_t dy_t @ W_t.T`` (B, n_in), one all-reduce over the group: ``2 (T-1)/T B n_in``
    elements sent per rank with a bandwidth-optimal algorithm.

    Parameters
    ----------
    n_in, n_out : int
        Full input and output widths (units); ``n_out >= size``.
    comm : mpi4py.MPI.Comm, optional
        The tensor group (None only for a group of one).
    rank, size : int, optional
        Rank in the group and its size (default: the communicator's).
    init : {"he", "glorot"}
        As :class:`training.model.nn.Linear`.
    algorithm : str
        All-reduce algorithm (``collectives.ALGORITHMS``).
    timeout : float, optional
        Seconds each all-reduce may wait for a peer.

    Raises
    ------
    ValueError
        When ``n_out < size`` (naming both), or an argument is out of range.
    """

    _AXIS = 1

    def param_shapes(self):
        return [(self.n_in, self.hi - self.lo), (self.hi - self.lo,)]

    def shard_of(self, W, b):
        return W[:, self.lo:self.hi], b[self.lo:self.hi]

    def forward(self, x):
        xp = get_array_module(x)
        self._x = x
        y = self._buf("y", (x.shape[0], self.hi - self.lo), x)  # (B, out / T)
        xp.matmul(x, self.W, out=y)
        y += self.b
        return y

    def backward(self, dy, need_input_grad=True):
        xp = get_array_module(dy)
        xp.matmul(self._x.T, dy, out=self.dW)  # (in, out / T)
        xp.sum(dy, axis=0, out=self.db)
        if not need_input_grad:
            return None
        dx = self._buf("dx", (dy.shape[0], self.n_in), dy)  # (B, in), partial sum over the group
        xp.matmul(dy, self.W.T, out=dx)
        return self._allreduce(dx)


class RowParallelLinear(_TensorParallelLinear):
    """Linear layer split by input features: rank t holds ``W[lo:hi, :]`` and the whole bias.

    Shoeybi et al. 2019, section 3 (the second GEMM of the MLP block, ``B`` split by rows).
    Forward takes the split input ``x_t`` (B, hi - lo), all-reduces ``x_t @ W_t`` (B, n_out)
    over the group, then adds ``b``: ``2 (T-1)/T B n_out`` elements sent per rank. Backward writes
    ``dW_t = x_t.T @ dy`` and ``db = sum(dy)`` (identical on every rank) and returns
    ``dx_t = dy @ W_t.T`` (B, hi - lo): no message.

    Parameters
    ----------
    n_in, n_out : int
        Full input and output widths (units); ``n_in >= size``.
    comm, rank, size, init, algorithm, timeout
        As :class:`ColumnParallelLinear`.

    Raises
    ------
    ValueError
        When ``n_in < size`` (naming both), or an argument is out of range.
    """

    _AXIS = 0

    def param_shapes(self):
        return [(self.hi - self.lo, self.n_out), (self.n_out,)]

    def shard_of(self, W, b):
        return W[self.lo:self.hi, :], b

    def forward(self, x):
        xp = get_array_module(x)
        if x.shape[1] != self.hi - self.lo:
            raise ValueError(f"RowParallelLinear expects its input shard of {self.hi - self.lo} features, "
                             f"got {x.shape[1]}")
        self._x = x
        y = self._buf("y", (x.shape[0], self.n_out), x)  # (B, out), partial sum over the group
        xp.matmul(x, self.W, out=y)
        self._allreduce(y)
        y += self.b
        return y

    def backward(self, dy, need_input_grad=True):
        xp = get_array_module(dy)
        xp.matmul(self._x.T, dy, out=self.dW)  # (in / T, out)
        xp.sum(dy, axis=0, out=self.db)
        if not need_input_grad:
            return None
        dx = self._buf("dx", (dy.shape[0], self.hi - self.lo), dy)  # (B, in / T)
        xp.matmul(dy, self.W.T, out=dx)
        return dx
