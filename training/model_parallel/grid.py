"""The 3D process grid (data x tensor x pipeline) and where each parameter of the MLP lives on it.

P ranks form a D x T x Q grid, D = P / (T Q). Rank order follows Megatron-LM (Narayanan et al.,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC 2021,
section 3.3): tensor fastest, then data, then pipeline, ``rank = (q D + d) T + t``, so a tensor
group is T consecutive ranks (the same node when T divides the ranks per node). Each axis is a
sub-communicator made with ``Split``.

The MLP's linear layers are numbered k = 0..L-1. Layers pair up as in Megatron's MLP block: an
even k followed by another layer is column-parallel, the next one row-parallel; an unpaired last
layer (the classifier, odd L) is replicated over the tensor group. Pipeline stage q holds the
linear layers of :func:`training.model_parallel.pipeline.stage_layers`, each with the activation after it.
Every stage draws its layers' initial weights from the same seeded stream as
``training.model.nn.build_mlp``, so every grid starts from the one dense model.
"""
import numpy

import collectives
import collectives.engine.context
from training.model.nn import Linear, ReLU, Sequential, Tanh
from commlab.arrays import get_array_module
from training.model_parallel.layers import ColumnParallelLinear, RowParallelLinear
from training.model_parallel.pipeline import stage_layers

__all__ = ["Grid", "check_grid", "layer_kinds", "build_stage", "dense_stream", "load_dense", "placement"]


def layer_kinds(n_linear):
    """Return the kind of each linear layer: "column", "row" or "replicated" (see module doc)."""
    kinds = []
    for k in range(n_linear):
        if k % 2:
            kinds.append("row")
        else:
            kinds.append("column" if k + 1 < n_linear else "replicated")
    return kinds


def check_grid(P, tensor, pipeline, sizes, batch_size, micro_batches):
    """Check a grid against the job and the model; the same error on every rank, before any message.

    Parameters
    ----------
    P : int
        Ranks in the job.
    tensor, pipeline : int
        T and Q, >= 1.
    sizes : sequence of int
        Widths (input, hidden..., classes).
    batch_size : int
        Global batch (samples).
    micro_batches : int
        Micro-batches per local batch, >= 1.

    Returns
    -------
    int
        The data-parallel degree D = P / (T Q).

    Raises
    ------
    ValueError
        When T Q does not divide P, a split width is smaller than T, there are more stages than
        linear layers, the global batch does not divide by D, or the micro-batches do not divide
        the local batch (each message names the flags involved).
    """
    if tensor < 1 or pipeline < 1 or micro_batches < 1:
        raise ValueError(f"--tensor-parallel, --pipeline-parallel and --micro-batches must be >= 1, got "
                         f"{tensor}, {pipeline}, {micro_batches}")
    if P % (tensor * pipeline):
        raise ValueError(f"the grid does not fit the job: --tensor-parallel {tensor} x --pipeline-parallel "
                         f"{pipeline} = {tensor * pipeline} does not divide the {P} ranks")
    kinds = layer_kinds(len(sizes) - 1)
    for k, kind in enumerate(kinds):
        if kind == "column" and sizes[k + 1] < tensor:
            raise ValueError(f"layer {k} has {sizes[k + 1]} units, fewer than the tensor group of {tensor} "
                             f"ranks (--tensor-parallel): every rank needs at least one unit")
    n_linear = len(sizes) - 1
    if pipeline > n_linear:
        raise ValueError(f"--pipeline-parallel {pipeline} stages for {n_linear} linear layers: every stage "
                         f"needs at least one (at most number of hidden layers + 1 stages)")
    D = P // (tensor * pipeline)
    if batch_size % D:
        raise ValueError(f"batch_size ({batch_size}) must be a multiple of the data-parallel degree "
                         f"{D} = {P} ranks / ({tensor} x {pipeline})")
    if (batch_size // D) % micro_batches:
        raise ValueError(f"--micro-batches {micro_batches} does not divide the local batch of "
                         f"{batch_size // D} samples (batch_size {batch_size} / data-parallel degree {D})")
    return D


class Grid:
    """This rank's place on the D x T x Q grid and the three axis communicators.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        All P ranks (collective: every rank must construct it).
    tensor, pipeline : int
        T and Q; T Q must divide P (checked by :func:`check_grid` first).

    Attributes
    ----------
    D, T, Q : int
    d, t, q : int
        Coordinates of this rank.
    data, tensor, pipeline : mpi4py.MPI.Comm
        Ranks sharing (t, q), (d, q) and (d, t): rank in each is d, t and q.
    """

    def __init__(self, comm, tensor, pipeline):
        P = comm.Get_size()
        assert P % (tensor * pipeline) == 0, "check_grid first"
        self.T, self.Q, self.D = tensor, pipeline, P // (tensor * pipeline)
        r = comm.Get_rank()
        self.t, self.d, self.q = r % self.T, (r // self.T) % self.D, r // (self.T * self.D)
        self.tensor = comm.Split(self.q * self.D + self.d, self.t)
        self.data = comm.Split(self.q * self.T + self.t, self.d)
        self.pipeline = comm.Split(self.d * self.T + self.t, self.q)

    def coords(self):
        """Return (d, t, q)."""
        return self.d, self.t, self.q

    def free(self):
        """Free the three axis communicators."""
        for c in (self.tensor, self.data, self.pipeline):
            collectives.engine.context.free_context(c)  # the collectives' duplicate of it
            c.Free()


def dense_stream(sizes, activation="relu", dtype="float64", seed=0):
    """Yield (k, W, b) for every linear layer of ``build_mlp(sizes, activation, dtype, seed)``.

    The same generator calls in the same order as :class:`training.model.nn.Sequential`'s init, one
    dense layer at a time (W: (n_in, n_out), b: (n_out,)), so a stage can take its layers' shards
    without holding the whole model.
    """
    rng = numpy.random.default_rng(seed)
    init = "he" if activation == "relu" else "glorot"
    for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layer = Linear(a, b, init="glorot" if k == len(sizes) - 2 else init)
        W, bias = numpy.empty((a, b), dtype), numpy.empty(b, dtype)
        layer.bind([W, bias], [None, None])
        layer.init(rng)
        yield k, W, bias


def build_stage(sizes, grid, activation="relu", dtype="float64", seed=0, algorithm="auto", timeout=None,
                xp=numpy):
    """Build this rank's stage of the MLP over ``sizes`` on ``grid``, initialized as ``build_mlp``.

    Parameters
    ----------
    sizes : sequence of int
        Widths (input, hidden..., classes).
    grid : Grid
    activation : {"relu", "tanh"}
    dtype : str
    seed : int
    algorithm : str
        All-reduce algorithm of the tensor-parallel layers.
    timeout : float, optional
        Seconds a tensor-parallel all-reduce may wait for a peer.
    xp : module
        Array module of the flat buffers.

    Returns
    -------
    tuple of (training.model.nn.Sequential, list of int)
        The stage model and the global index k of each of its linear layers.
    """
    kinds = layer_kinds(len(sizes) - 1)
    act = ReLU if activation == "relu" else Tanh
    init = "he" if activation == "relu" else "glorot"
    layers = []
    for k, kind in enumerate(kinds):
        last = k == len(kinds) - 1
        how = "glorot" if last else init
        if kind == "replicated":
            layers.append(Linear(sizes[k], sizes[k + 1], init=how))
        else:
            cls = ColumnParallelLinear if kind == "column" else RowParallelLinear
            layers.append(cls(sizes[k], sizes[k + 1], grid.tensor, init=how, algorithm=algorithm,
                              timeout=timeout))
        if not last:
            layers.append(act())
    lo, hi = stage_layers(layers, grid.Q, grid.q)
    mine = layers[lo:hi]
    model = Sequential(mine, dtype=dtype, seed=seed, xp=xp)
    linear = [layer for layer in mine if hasattr(layer, "n_in")]
    ks = [layers.index(layer) // 2 for layer in linear]  # layers alternate linear, activation
    todo = dict(zip(ks, linear))
    for k, W, b in dense_stream(sizes, activation, dtype, seed):
        if k in todo:
            load_dense(todo[k], W, b)
    return model, ks


def load_dense(layer, W, b):
    """Copy this rank's part of the full ``W`` and ``b`` into ``layer`` (any linear kind)."""
    if isinstance(layer, (ColumnParallelLinear, RowParallelLinear)):
        layer.load_dense(W, b)
    else:
        xp = get_array_module(layer.W)
        layer.W[...] = xp.asarray(W, dtype=layer.W.dtype)
        layer.b[...] = xp.asarray(b, dtype=layer.b.dtype)


def placement(layer):
    """Return ((axis, lo) of W, (axis, lo) of b) of ``layer``'s shard in the full tensors; axis -1: whole."""
    if isinstance(layer, ColumnParallelLinear):
        return (1, layer.lo), (0, layer.lo)
    if isinstance(layer, RowParallelLinear):
        return (0, layer.lo), (-1, 0)
    return (-1, 0), (-1, 0)
