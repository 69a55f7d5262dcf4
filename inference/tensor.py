"""Tensor-parallel replica: a trained MLP re-sharded into column- and row-parallel Linear layers.

Shoeybi et al., "Megatron-LM", 2019, section 3: in a pair of Linear layers ``A`` then ``B``, rank r
of T keeps the columns of ``A`` (and of its bias) and the matching rows of ``B``; the activation
between them is element-wise, so it runs on the local columns; the pair's output is the sum over
ranks of ``h_r @ B_r``, one all-reduce per pair, then ``B``'s bias is added once. The layers are
:class:`training.parallel_layers.ColumnParallelLinear` and
:class:`~training.parallel_layers.RowParallelLinear`, built from the checkpoint's dense weights;
their all-reduce is commlab's :func:`collectives.allreduce` with the algorithm the caller names.

The split rule for a whole MLP: Linear layer ``k`` (0-based) is column-parallel when ``k`` is even and
it is not the last layer, row-parallel when ``k`` is odd; an even last layer (a model with an even
number of hidden layers, including the linear model) is row-parallel over the full input, each rank
taking its own input columns. Widths follow the ``numpy.array_split`` rule
(:func:`training.parallel_layers.shard_bounds`); a split width must be at least T.
"""
import numpy

import collectives
from training.parallel_layers import ColumnParallelLinear, RowParallelLinear

__all__ = ["shard_layers", "TensorParallelForward", "emulate_forward"]


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


def _act(name):
    return numpy.tanh if name == "tanh" else (lambda z: numpy.maximum(z, 0.0))


class TensorParallelForward:
    """One rank's part of the tensor-parallel forward; every rank of ``comm`` calls it together.

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
    """

    def __init__(self, weights, activation, comm, algorithm="auto", timeout=None):
        if algorithm not in collectives.ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(collectives.ALGORITHMS)}, got {algorithm!r}")
        self.layers = shard_layers(weights, comm.rank, comm.size, comm, algorithm, timeout)
        self.act, self.comm = _act(activation), comm
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
        """All-reduce calls since the last :meth:`reset`."""
        return sum(layer.stats["calls"] for layer, _ in self.layers)

    def __call__(self, x):
        """Return the full logits of ``x`` (B, n_features) float64, identical on every rank."""
        last = len(self.layers) - 1
        for k, (layer, cols) in enumerate(self.layers):
            x = layer.forward(x if cols is None else numpy.ascontiguousarray(x[:, cols]))
            x = self.act(x) if k < last else x.copy()  # layer outputs are reused buffers
        return x


def emulate_forward(weights, activation, size):
    """Return a single-process function computing the T-way tensor-parallel forward.

    Every rank's shards are those of :func:`shard_layers`; the partial sums of a row-parallel
    layer are added in rank order, ``(p0 + p1) + p2 ...``, then the bias. For T = 2 this equals
    any all-reduce's result bitwise (one addition, commutative); for T > 2 an all-reduce may add
    in another order, so results agree to rounding.

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
