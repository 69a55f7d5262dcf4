"""A trained checkpoint as a prediction function whose answer for a row does not depend on its batch.

A BLAS matrix product picks its kernels by matrix shape, so row ``i`` of ``X @ W`` can differ in the
last bits between a batch of 1 and a batch of 7, or between positions of the same batch. A server
that batches requests dynamically would then give a request an answer that depends on which other
requests rode with it. :class:`Predictor` therefore runs every batch padded to one fixed number of
rows (``pad_rows``, larger batches in several calls) and checks once, on a seeded probe, that a row's result is the same at every
position of that padded batch; where it is not (some BLAS kernels treat edge rows apart) it computes
row by row. Either way a request's logits are a function of its features alone, bitwise, and equal
the single-process prediction of the same checkpoint.
"""
import json
import os

import numpy

from training.runtime.checkpoint import find_checkpoint, root_bytes
from commlab.file_formats import CheckpointError, read_npz
from training.origin import check_origin
from training.settings.config import Config
from training.data.datasets import load_dataset
from training.model.nn import Linear, build_mlp
from training.runtime.state import check_values
from training.model_parallel.sharded import dense_params, find_sharded, read_pieces

__all__ = ["ModelSpec", "load_spec", "dense_forward", "Predictor", "PAD_ROWS_MAX", "forward_rows"]

#: Most rows of one forward call by default: a larger batch runs as several calls of this many rows,
#: so the start-up probe (``rows`` forwards of ``rows`` rows) does not grow with ``max_batch``.
PAD_ROWS_MAX = 32


def forward_rows(max_batch):
    """Return the rows of every forward call for batches of up to ``max_batch``: ``max_batch``
    rounded up to a multiple of 8, at most :data:`PAD_ROWS_MAX`.

    Examples
    --------
    >>> [forward_rows(b) for b in (1, 8, 9, 100)]
    [8, 8, 16, 32]
    """
    return min(-(-int(max_batch) // 8) * 8, PAD_ROWS_MAX)


class ModelSpec:
    """What a replica needs from a checkpoint: layer weights, activation, and the test set on rank 0.

    Attributes
    ----------
    weights : list of (ndarray (in, out), ndarray (out,)), float64
        Every Linear layer's weight and bias, input layer first.
    activation : {"relu", "tanh"}
    n_features, n_classes : int
    path : str
        The checkpoint file read.
    config : training.settings.config.Config
        The configuration the checkpoint was trained with.
    """

    __slots__ = ("weights", "activation", "n_features", "n_classes", "path", "config")

    def __init__(self, weights, activation, path, config):
        if activation not in ("relu", "tanh"):
            raise ValueError(f"activation must be 'relu' or 'tanh', got {activation!r}")
        self.weights, self.activation, self.path, self.config = weights, activation, path, config
        self.n_features = int(weights[0][0].shape[0])
        self.n_classes = int(weights[-1][0].shape[1])


def _read_on_root(path, box):
    """Rank 0: read the checkpoint of either kind, its configuration and data; return the message."""
    sharded = find_sharded(path) if os.path.isdir(path) else None
    if sharded:
        name = sharded
        _, common = read_pieces(sharded)
        saved = common.get("meta/config")
    else:
        name = find_checkpoint(path)
        arrays = read_npz(name)
        check_origin(name, arrays)  # the trainer's own check: a file of another run, or renamed, is refused
        saved = arrays.get("meta/config")
    if saved is None:
        raise CheckpointError(f"checkpoint {name} holds no meta/config: not a training run's")
    try:
        cfg = Config.from_dict(json.loads(saved.tobytes()))
    except ValueError as e:
        raise CheckpointError(f"checkpoint {name}: its configuration cannot be read ({e})") from None
    data = box["data"] = load_dataset(cfg)
    sizes = [data.n_features, *cfg.hidden, data.n_classes]
    try:
        flat = dense_params(sharded, sizes) if sharded else arrays.get("model/params")
    except CheckpointError as e:  # parts that do not cover a tensor, or hold values that make no sense
        raise CheckpointError(f"checkpoint {name}: {e}") from None
    n = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
    if flat is None or flat.size != n:
        raise CheckpointError(f"checkpoint {name} holds {0 if flat is None else flat.size} parameters; "
                              f"a {'-'.join(map(str, sizes))} MLP has {n}")
    try:
        check_values({"model/params": flat})  # the trainer's check: NaN or integer weights are not served
    except ValueError as e:
        raise CheckpointError(f"checkpoint {name}: {e}") from None
    head = json.dumps({"file": name, "config": cfg.to_dict(), "sizes": sizes}).encode()
    return numpy.array([len(head)], numpy.int64).tobytes() + head + flat.astype(numpy.float64).tobytes()


def load_spec(path, comm):
    """Read a training checkpoint on rank 0 and return its model on every rank, as float64.

    Either kind of checkpoint of :mod:`training.train` is read: a data-parallel ``.npz`` (one flat
    parameter vector), or the sharded checkpoint of a tensor/pipeline-parallel run on any grid,
    whose pieces are assembled into the dense layers (:func:`training.model_parallel.sharded.dense_params`); the
    serving job then re-shards them for its own tensor-parallel degree. float32 weights are widened
    to float64 (exactly).

    Parameters
    ----------
    path : str
        A run directory (its newest checkpoint of either kind), a ``.npz`` checkpoint or a
        ``shards-epochNNNN`` directory.
    comm : mpi4py.MPI.Comm
        Every rank of ``comm`` calls this.

    Returns
    -------
    (ModelSpec, training.data.datasets.Dataset or None)
        The model, and on rank 0 the data set it was trained on (None elsewhere).

    Raises
    ------
    CheckpointError
        On every rank, when the file is missing, corrupt, holds no configuration, does not fit, or
        holds weights that are not finite floating-point numbers.
    """
    box = {}
    msg = root_bytes(comm, lambda: _read_on_root(path, box), error=CheckpointError)
    n = int(numpy.frombuffer(msg[:8], numpy.int64)[0])
    head = json.loads(msg[8:8 + n])
    flat = numpy.frombuffer(msg[8 + n:], numpy.float64)
    cfg = Config.from_dict(head["config"])
    model = build_mlp(head["sizes"], activation=cfg.activation, dtype="float64")
    model.params[...] = flat
    weights = [(layer.W.copy(), layer.b.copy()) for layer in model.layers if isinstance(layer, Linear)]
    return ModelSpec(weights, cfg.activation, head["file"], cfg), box.get("data")


def dense_forward(weights, activation):
    """Return the whole model's forward, (B, n_features) float64 -> (B, n_classes) float64 logits.

    Parameters
    ----------
    weights : list of (ndarray (in, out), ndarray (out,)), float64
    activation : {"relu", "tanh"}
    """
    act = numpy.tanh if activation == "tanh" else (lambda z: numpy.maximum(z, 0.0))
    last = len(weights) - 1

    def forward(x):
        for k, (W, b) in enumerate(weights):
            x = x @ W + b  # (B, out)
            if k < last:
                x = act(x)
        return x

    return forward


class Predictor:
    """Batch-invariant forward: logits of up to ``max_batch`` rows, bitwise independent of the batch.

    Parameters
    ----------
    forward : callable
        Maps a (pad_rows, n_features) float64 array to (pad_rows, n_classes) float64 logits; row
        ``i`` of the output may depend only on row ``i`` of the input.
    n_features, n_classes : int
    max_batch : int
        Largest batch (rows) :meth:`predict` accepts.
    pad_rows : int, optional
        Rows of every forward call; default :func:`forward_rows` (``max_batch`` rounded up to a multiple
        of 8, at most :data:`PAD_ROWS_MAX`; a larger batch runs as several calls).
    probe : bool
        Check position invariance on a seeded probe and fall back to one row per call when it fails.
        Every process serving or checking answers must make the same choice; the probe is
        deterministic, so on one machine with one BLAS thread per rank they do.

    Attributes
    ----------
    rows : int
        Rows per forward call actually used (``pad_rows``, or 1 after a failed probe).
    """

    def __init__(self, forward, n_features, n_classes, max_batch, pad_rows=None, probe=True):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.forward, self.n_features, self.n_classes = forward, int(n_features), int(n_classes)
        self.max_batch = int(max_batch)
        self.rows = int(pad_rows or forward_rows(max_batch))
        if self.rows < 1:
            raise ValueError(f"pad_rows must be >= 1, got {pad_rows}")
        self._x = numpy.zeros((self.rows, self.n_features))
        if probe and self.rows > 1 and not self._invariant():
            self.rows = 1
            self._x = numpy.zeros((1, self.n_features))

    def _invariant(self):
        rng = numpy.random.default_rng(12345)
        x = rng.standard_normal((self.rows, self.n_features))
        ref = self._run(x).copy()
        for shift in range(1, self.rows):
            if not numpy.array_equal(self._run(numpy.roll(x, shift, axis=0)), numpy.roll(ref, shift, axis=0)):
                return False
        return True

    def _run(self, x):
        return numpy.asarray(self.forward(x))

    def predict(self, x):
        """Return the logits of ``x``.

        Parameters
        ----------
        x : ndarray, shape (n, n_features), float64
            ``n <= max_batch`` rows.

        Returns
        -------
        ndarray, shape (n, n_classes), float64
            A fresh array.
        """
        n = x.shape[0]
        if n > self.max_batch or x.ndim != 2 or x.shape[1] != self.n_features:
            raise ValueError(f"x must be (n <= {self.max_batch}, {self.n_features}), got {x.shape}")
        out = numpy.empty((n, self.n_classes))
        for s in range(0, n, self.rows):
            m = min(self.rows, n - s)
            self._x[:m] = x[s:s + m]
            self._x[m:] = 0.0
            out[s:s + m] = self._run(self._x)[:m]
        return out
