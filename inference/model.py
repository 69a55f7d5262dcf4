"""A trained checkpoint as a prediction function whose answer for a row does not depend on its batch.

A BLAS matrix product picks its kernels by matrix shape, so row ``i`` of ``X @ W`` can differ in the
last bits between a batch of 1 and a batch of 7, or between positions of the same batch. A server
that batches requests dynamically would then give a request an answer that depends on which other
requests rode with it. :class:`Predictor` therefore runs every batch padded to one fixed number of
rows (``pad_rows``) and checks once, on a seeded probe, that a row's result is the same at every
position of that padded batch; where it is not (some BLAS kernels treat edge rows apart) it computes
row by row. Either way a request's logits are a function of its features alone, bitwise, and equal
the single-process prediction of the same checkpoint.
"""
import json

import numpy

from training.checkpoint import CheckpointError, load_checkpoint
from training.config import Config
from training.nn import Linear, build_mlp

__all__ = ["ModelSpec", "load_spec", "dense_forward", "Predictor"]


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
    config : training.config.Config
        The configuration the checkpoint was trained with.
    """

    __slots__ = ("weights", "activation", "n_features", "n_classes", "path", "config")

    def __init__(self, weights, activation, path, config):
        if activation not in ("relu", "tanh"):
            raise ValueError(f"activation must be 'relu' or 'tanh', got {activation!r}")
        self.weights, self.activation, self.path, self.config = weights, activation, path, config
        self.n_features = int(weights[0][0].shape[0])
        self.n_classes = int(weights[-1][0].shape[1])


def load_spec(path, comm, n_features, n_classes):
    """Read checkpoint ``path`` (rank 0 reads and verifies, all ranks receive) into a :class:`ModelSpec`.

    Parameters
    ----------
    path : str
        A run directory (its newest checkpoint) or a ``.npz`` checkpoint of :mod:`training.train`.
    comm : mpi4py.MPI.Comm
        Every rank of ``comm`` calls this.
    n_features, n_classes : int
        Input width and number of classes of the data the model was trained on.

    Returns
    -------
    ModelSpec

    Raises
    ------
    CheckpointError
        On every rank, when the file is missing, corrupt, holds no configuration or does not fit.
    """
    name, arrays = load_checkpoint(path, comm)
    if "meta/config" not in arrays or "model/params" not in arrays:
        raise CheckpointError(f"checkpoint {name} holds no model/params or meta/config: not a training run's")
    try:
        cfg = Config.from_dict(json.loads(arrays["meta/config"].tobytes()))
    except ValueError as e:
        raise CheckpointError(f"checkpoint {name}: its configuration cannot be read ({e})") from None
    model = build_mlp([n_features, *cfg.hidden, n_classes], activation=cfg.activation, dtype="float64")
    flat = arrays["model/params"]
    if flat.shape != model.params.shape:
        raise CheckpointError(f"checkpoint {name} holds {flat.size} parameters; a {n_features}-"
                              f"{'-'.join(map(str, cfg.hidden))}-{n_classes} MLP has {model.size}")
    model.params[...] = flat.astype(numpy.float64)  # float32 -> float64 is exact
    weights = [(layer.W.copy(), layer.b.copy()) for layer in model.layers if isinstance(layer, Linear)]
    return ModelSpec(weights, cfg.activation, name, cfg)


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
        Rows of every forward call; default ``max_batch`` rounded up to a multiple of 8.
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
        self.rows = int(pad_rows or -(-max_batch // 8) * 8)
        if self.rows < self.max_batch:
            raise ValueError(f"pad_rows ({pad_rows}) must be >= max_batch ({max_batch})")
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
