"""Tensor-parallel replica: a trained MLP re-sharded into column- and row-parallel Linear layers.

Shoeybi et al., "Megatron-LM", 2019, section 3: in a pair of Linear layers ``A`` then ``B``, rank r
of T keeps the columns of ``A`` (and of its bias) and the matching rows of ``B``; the activation
between them is element-wise, so it runs on the local columns; the pair's output is the sum over
ranks of ``h_r @ B_r``, one all-reduce per pair, then ``B``'s bias is added once. The layers are
:class:`training.model_parallel.layers.ColumnParallelLinear` and
:class:`~training.model_parallel.layers.RowParallelLinear`, built from the checkpoint's dense weights.

The split rule for a whole MLP: Linear layer ``k`` (0-based) is column-parallel when ``k`` is even and
it is not the last layer, row-parallel when ``k`` is odd; an even last layer (a model with an even
number of hidden layers, including the linear model) is row-parallel over the full input, each rank
taking its own input columns. Widths follow the ``numpy.array_split`` rule
(:func:`training.model_parallel.layers.shard_bounds`); a split width must be at least T.

The summation rule (what makes answers reproducible): floating-point addition is not associative,
so a sum of T > 2 partials depends on the order of the additions, and every all-reduce algorithm
has its own (the ring starts each chunk at another rank, recursive doubling adds pairs, the MPI
library chooses for itself). The serving forward therefore adds the partial outputs of a
row-parallel layer in rank order, ``((p_0 + p_1) + p_2) + ...``, then the bias, whatever the
algorithm (:func:`rank_order_allreduce`). Its single-process reference is
:func:`emulate_forward`: the same shards, the same matrix products, the same additions in the same
order, in one process. Answers equal it bitwise for every T and every algorithm. They are not the
bits of the unsplit model's ``x @ W + b`` for T >= 2 (a GEMM adds its products in its own blocked
order, which no split reproduces); they agree with it to rounding (a few ulps of the logits).
"""
import time

import numpy

import collectives
import collectives.engine.context
from training.model_parallel.layers import ColumnParallelLinear, RowParallelLinear

__all__ = ["shard_layers", "row_parallel_widths", "rank_order_allreduce", "TensorParallelForward", "emulate_forward"]


def shard_layers(weights, rank, size, comm=None, algorithm="auto", timeout=None):
    """Return rank ``rank``'s tensor-parallel layers of the MLP ``weights`` under the split rule.

    Parameters
    ----------
    weights : list of (ndarray (in, out), ndarray (out,)), float64
        Full layer weights and biases, input layer first.
    rank, size : int
        This rank and the tensor-parallel degree T.
    comm : mpi4py.MPI.Intracomm, optional
        The replica's group (None builds the shards only, for :func:`emulate_forward`).
    algorithm : str
        All-reduce algorithm, a key of :data:`collectives.ALGORITHMS`.
    timeout : float, optional
        Seconds an all-reduce may wait for a peer.

    Returns
    -------
    list of (layer, slice or None)
        Each layer and, for an even last layer, the input columns this rank takes.

    Raises
    ------
    ValueError
        When a split width is below T, or ``rank``/``size``/``algorithm`` are out of range.
    """
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, size) with size >= 1, got rank={rank}, size={size}")
    out, last = [], len(weights) - 1
    for k, (W, b) in enumerate(weights):
        cls = ColumnParallelLinear if k % 2 == 0 and k != last else RowParallelLinear
        layer = cls.from_dense(W, b, comm=comm, rank=rank, size=size, algorithm=algorithm, timeout=timeout)
        cols = slice(layer.lo, layer.hi) if cls is RowParallelLinear and k % 2 == 0 else None
        out.append((layer, cols))
    return out


def row_parallel_widths(weights):
    """Return the output widths (units) of the layers the split rule makes row-parallel, in order.

    Each of them all-reduces a (rows, width) partial per forward (T times that under the rank-order
    rule of :func:`rank_order_allreduce`).

    Parameters
    ----------
    weights : list of (ndarray (in, out), ndarray (out,))
    """
    last = len(weights) - 1
    return [int(W.shape[1]) for k, (W, _) in enumerate(weights) if k % 2 == 1 or k == last]


def _act(name):
    return numpy.tanh if name == "tanh" else (lambda z: numpy.maximum(z, 0.0))


def rank_order_allreduce(x, comm, algorithm="auto", timeout=None, slots=None, plan=None):
    """Return the sum of ``x`` over the ranks of ``comm``, added in rank order, on every rank.

    Each rank writes ``x`` into its own slot of a ``(T, *x.shape)`` buffer filled with ``-0.0``,
    the additive identity of IEEE 754 arithmetic (``v + -0.0 == v`` for every ``v``, signed zeros
    included), and the buffer is summed by :func:`collectives.allreduce` with ``algorithm``: each
    element of slot ``t`` then has one term that is not ``-0.0``, ``x`` of rank ``t``, so no order of
    additions can change it, and every rank holds every rank's ``x`` exactly (an all-gather carried
    by the all-reduce). The slots are then added locally in rank order, ``((x_0 + x_1) + x_2) + ...``.
    The result is therefore bitwise the same on every rank, for every algorithm and every T, and a
    single process reproduces it from the T inputs; an all-reduce of ``x`` itself adds in its
    algorithm's own order, which for T > 2 changes the last bits (floating-point addition is not
    associative; on reproducible parallel sums, Demmel and Nguyen, "Fast reproducible
    floating-point summation", ARITH 2013).

    Cost: the all-reduce carries ``T n`` elements instead of ``n`` (the latency terms, which
    dominate the small messages of a serving forward, are those of the algorithm; the bandwidth
    term is T times larger, e.g. ``2 (T-1) n`` elements sent per rank by the ring), plus
    ``(T-1) n`` local additions.

    Parameters
    ----------
    x : ndarray, float64 or float32
        This rank's partial sum, any shape (``(B, n_out)`` in the forward).
    comm : mpi4py.MPI.Intracomm
        The tensor-parallel group; every rank calls with the same shape and dtype.
    algorithm : str
        All-reduce algorithm, a key of :data:`collectives.ALGORITHMS` (``auto`` picks by the size
        ``T * x.nbytes``).
    timeout : float, optional
        Seconds the all-reduce may wait for a peer (:class:`collectives.CollectiveTimeout`).
    slots : ndarray, shape ``(T,) + x.shape``, x.dtype, optional
        Scratch buffer to reuse between calls (overwritten).
    plan : collectives.calls.persistent.AllreducePlan, optional
        A persistent all-reduce of ``slots`` into itself (:func:`collectives.allreduce_init`), started
        and waited instead of a new call; needs ``slots`` and, to turn a mismatch into an error
        instead of a wait, ``timeout``.

    Returns
    -------
    ndarray, x.shape, x.dtype
        A fresh array.

    Raises
    ------
    ValueError
        When ``slots`` has the wrong shape or dtype, or from :func:`collectives.allreduce`.
    """
    T, shape = comm.Get_size(), (comm.Get_size(), *x.shape)
    if slots is None:
        slots = numpy.empty(shape, x.dtype)
    elif slots.shape != shape or slots.dtype != x.dtype:
        raise ValueError(f"slots must be {shape} {x.dtype}, got {slots.shape} {slots.dtype}")
    slots.fill(-0.0)
    slots[comm.Get_rank()] = x
    if plan is not None:
        plan.start()
        plan.wait(timeout)
    else:
        collectives.allreduce(slots, comm=comm, op="sum", algorithm=algorithm, out=slots, timeout=timeout)
    total = slots[0].copy()
    for t in range(1, T):
        total += slots[t]
    return total


class TensorParallelForward:
    """One rank's part of the tensor-parallel forward; every rank of ``comm`` calls it together.

    Column-parallel layers run :class:`~training.model_parallel.layers.ColumnParallelLinear`'s forward
    (no message); a row-parallel layer computes its partial ``x_r @ W_r`` (B, n_out), sums the
    partials with :func:`rank_order_allreduce` (rank order, whatever ``algorithm``), then adds the
    bias: the rule of the module docstring, so the logits equal :func:`emulate_forward` bitwise.

    Parameters
    ----------
    weights : list of (ndarray, ndarray)
        Full weights (each rank keeps only its shards).
    activation : {"relu", "tanh"}
    comm : mpi4py.MPI.Intracomm
        The replica's group of T ranks.
    algorithm : str
        All-reduce algorithm, a key of :data:`collectives.ALGORITHMS` (``auto`` picks by size).
    timeout : float, optional
        Seconds an all-reduce may wait for a peer (raises :class:`collectives.CollectiveTimeout`).

    Attributes
    ----------
    comm_s : float
        Seconds spent in all-reduce calls since the last :meth:`reset`.
    allreduce_calls : int
        All-reduce calls since the last reset.

    Raises
    ------
    ValueError
        When ``algorithm`` is unknown or a split width is below T.
    """

    def __init__(self, weights, activation, comm, algorithm="auto", timeout=None):
        if algorithm not in collectives.ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(collectives.ALGORITHMS)}, got {algorithm!r}")
        self.layers = shard_layers(weights, comm.rank, comm.size, comm, algorithm, timeout)
        self.act, self.comm = _act(activation), comm
        self.algorithm, self.timeout = algorithm, timeout
        self._slots = {}
        self.reset()

    def reset(self):
        """Zero the communication counters."""
        for layer, _ in self.layers:
            layer.stats.update(bytes_sent=0, calls=0, comm_s=0.0)

    @property
    def comm_s(self):
        """Seconds spent in this rank's all-reduce calls since the last :meth:`reset`."""
        return sum(layer.stats["comm_s"] for layer, _ in self.layers)

    @property
    def allreduce_calls(self):
        """All-reduce calls since the last reset."""
        return sum(layer.stats["calls"] for layer, _ in self.layers)

    def _row_parallel(self, layer, x):
        part = x @ layer.W  # (B, n_out), this rank's partial sum
        key = (layer.lo, part.shape)
        if key not in self._slots:  # a buffer per layer and batch shape, and with a timeout its persistent plan
            slots = numpy.empty((self.comm.size, *part.shape), part.dtype)
            plan = None if self.timeout is None else collectives.allreduce_init(
                slots, comm=self.comm, op="sum", algorithm=self.algorithm, out=slots)
            self._slots[key] = (slots, plan)
        slots, plan = self._slots[key]
        t0 = time.perf_counter()
        y = rank_order_allreduce(part, self.comm, self.algorithm, self.timeout, slots, plan)
        st = layer.stats
        st["comm_s"] += time.perf_counter() - t0
        st["bytes_sent"] += collectives.engine.context.last_stats(self.comm).get("bytes_sent", 0)
        st["calls"] += 1
        y += layer.b
        return y

    def __call__(self, x):
        """Return the full logits of ``x`` (B, n_features) float64, identical on every rank."""
        last = len(self.layers) - 1
        for k, (layer, cols) in enumerate(self.layers):
            if cols is not None:
                x = numpy.ascontiguousarray(x[:, cols])
            if isinstance(layer, RowParallelLinear):
                x = self._row_parallel(layer, x)
            else:
                x = layer.forward(x)  # never the last layer: the activation below makes a fresh array
            if k < last:
                x = self.act(x)
        return x


def emulate_forward(weights, activation, size):
    """Return the single-process reference of the T-way tensor-parallel forward.

    Every rank's shards are those of :func:`shard_layers`, their matrix products the same; the
    partial sums of a row-parallel layer are added in rank order, ``((p0 + p1) + p2) + ...``, then
    the bias: the rule :class:`TensorParallelForward` follows, so its answers equal this function's
    bitwise for every T and every all-reduce algorithm. For T = 1 it is the dense forward; for
    T >= 2 it agrees with the dense forward to rounding only (the module docstring says why).

    Parameters
    ----------
    weights : list of (ndarray, ndarray)
    activation : {"relu", "tanh"}
    size : int
        Tensor-parallel degree T.

    Returns
    -------
    callable
        (B, n_features) float64 -> (B, n_classes) float64.
    """
    shards = [shard_layers(weights, r, size) for r in range(size)]
    act, last = _act(activation), len(weights) - 1

    def forward(x):
        xs = [x] * size
        for k in range(len(weights)):
            layers = [shards[r][k] for r in range(size)]
            if isinstance(layers[0][0], ColumnParallelLinear):
                xs = [xs[r] @ lay.W + lay.b for r, (lay, _) in enumerate(layers)]
            else:
                parts = [(xs[r] if cols is None else numpy.ascontiguousarray(xs[r][:, cols])) @ lay.W
                         for r, (lay, cols) in enumerate(layers)]
                total = parts[0].copy()
                for p in parts[1:]:
                    total += p
                total += layers[0][0].b
                xs = [total] * size
            if k < last:
                xs = [act(v) for v in xs]
        return xs[0]

    return forward
