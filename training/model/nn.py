"""Layers of a minimal multilayer perceptron whose parameters share one flat buffer.

A :class:`Sequential` model allocates ONE flat parameter array and ONE flat gradient array and
hands every layer views into them, so the whole model's gradient is a single contiguous array:
a data-parallel step all-reduces it with one collective (tensor fusion, Sergeev & Del Balso,
"Horovod", 2018, section 4), or in contiguous buckets, last layer first (Li et al., "PyTorch
Distributed", VLDB 2020, section 3.2.3).

Layers follow the micrograd/tinygrad pattern: ``forward`` caches what ``backward`` needs and
``backward`` *writes* (does not accumulate) parameter gradients into the gradient views. Outputs
are preallocated buffers reused from call to call, so a returned array is only valid until the
layer's next call. Array code is written once for NumPy and CuPy (``xp``).
"""
import abc
import math

import numpy

from commlab.arrays import get_array_module
from commlab import tracing
import training.model.layer_trace as layer_trace

__all__ = ["Layer", "Linear", "ReLU", "Tanh", "SoftmaxCrossEntropy", "Sequential", "build_mlp"]

# Small batches run Linear's GEMMs in their transposed form, the batch as the short side of the
# product, and copy the result back: OpenBLAS (NumPy's BLAS) computes dL/dx = (W @ dy.T).T 25-40 %
# faster than dy @ W.T at 16-32 rows (784- and 1024-wide layers, one thread), still 13 % at 64, and
# y = (W.T @ x.T).T + b (the bias added in the copy) 6-19 % faster than x @ W + b at 16-32 rows,
# no faster at 48; both are slower from 128 rows on (the copy's cost grows, the GEMM gain goes).
_TRANSPOSED_DX_ROWS = 64
_TRANSPOSED_Y_ROWS = 32


class Layer(abc.ABC):
    """Base class: a differentiable map with optional parameters held in flat-buffer views."""

    def param_shapes(self):
        """Return the shapes of this layer's parameters, in flat-buffer order."""
        return []

    def bind(self, params, grads):
        """Take views (one per entry of :meth:`param_shapes`) into the flat buffers."""
        if params:
            raise ValueError("this layer has no parameters to bind")

    def init(self, rng):
        """Fill the bound parameters from ``rng`` (a seeded ``numpy.random.Generator``)."""

    def parameters(self):
        """Return a list of (parameter view, gradient view) pairs."""
        return []

    @abc.abstractmethod
    def forward(self, x):
        """Return the layer output for input ``x``, shape (B, in) -> (B, out)."""
        raise NotImplementedError

    @abc.abstractmethod
    def backward(self, dy, need_input_grad=True):
        """Write parameter gradients and return dL/dx (``None`` when not ``need_input_grad``)."""
        raise NotImplementedError

    def _buf(self, key, shape, like, dtype=None):
        """Return a reusable uninitialized buffer ``key`` of ``shape`` (dtype: ``like``'s)."""
        dtype = like.dtype if dtype is None else numpy.dtype(dtype)
        bufs = self.__dict__.setdefault("_bufs", {})
        b = bufs.get(key)
        if b is None or b.shape != shape or b.dtype != dtype:
            b = bufs[key] = get_array_module(like).empty(shape, dtype)
        return b


class Linear(Layer):
    """Affine map ``y = x @ W + b`` with ``W`` of shape (in, out).

    Parameters
    ----------
    n_in, n_out : int
        Input and output widths (units).
    init : {"he", "glorot"}
        He normal, std sqrt(2 / n_in) (He et al., ICCV 2015, section 2.2), for layers followed by
        ReLU; Glorot uniform, limit sqrt(6 / (n_in + n_out)) (Glorot & Bengio, AISTATS 2010,
        eq. 16), otherwise. Biases start at zero.

    Examples
    --------
    >>> import numpy as np
    >>> model = Sequential([Linear(2, 1, init="glorot")], dtype="float64")
    >>> model.params[:] = [1.0, 2.0, 0.5]  # W (2, 1), then b
    >>> model.forward(np.array([[1.0, 1.0], [3.0, 0.0]]))
    array([[3.5],
           [3.5]])
    """

    def __init__(self, n_in, n_out, init="he"):
        if n_in < 1 or n_out < 1:
            raise ValueError(f"n_in and n_out must be >= 1, got {n_in}, {n_out}")
        if init not in ("he", "glorot"):
            raise ValueError(f"init must be 'he' or 'glorot', got {init!r}")
        self.n_in, self.n_out, self.init_name = int(n_in), int(n_out), init
        self.W = self.b = self.dW = self.db = None
        self._x = None

    def param_shapes(self):
        return [(self.n_in, self.n_out), (self.n_out,)]

    def bind(self, params, grads):
        self.W, self.b = params
        self.dW, self.db = grads

    def init(self, rng):
        xp = get_array_module(self.W)
        if self.init_name == "he":
            w = rng.standard_normal((self.n_in, self.n_out)) * math.sqrt(2.0 / self.n_in)
        else:
            lim = math.sqrt(6.0 / (self.n_in + self.n_out))
            w = rng.uniform(-lim, lim, (self.n_in, self.n_out))
        self.W[...] = xp.asarray(w, dtype=self.W.dtype)
        self.b[...] = 0

    def parameters(self):
        return [(self.W, self.dW), (self.b, self.db)]

    def forward(self, x):
        xp = get_array_module(x)
        self._x = x
        y = self._buf("y", (x.shape[0], self.n_out), x)  # (B, out)
        if xp is numpy and x.shape[0] <= _TRANSPOSED_Y_ROWS:
            yt = self._buf("yt", (self.n_out, x.shape[0]), x)  # (out, B)
            xp.matmul(self.W.T, x.T, out=yt)
            xp.add(yt.T, self.b, out=y)
        else:
            xp.matmul(x, self.W, out=y)
            y += self.b
        return y

    def backward(self, dy, need_input_grad=True):
        xp = get_array_module(dy)
        xp.matmul(self._x.T, dy, out=self.dW)  # (in, out)
        xp.sum(dy, axis=0, out=self.db)
        if not need_input_grad:
            return None
        dx = self._buf("dx", (dy.shape[0], self.n_in), dy)  # (B, in)
        if xp is numpy and dy.shape[0] <= _TRANSPOSED_DX_ROWS:
            dxt = self._buf("dxt", (self.n_in, dy.shape[0]), dy)  # (in, B)
            xp.matmul(self.W, dy.T, out=dxt)  # the GEMM with the batch as its short side
            xp.copyto(dx, dxt.T)
        else:
            xp.matmul(dy, self.W.T, out=dx)
        return dx


class ReLU(Layer):
    """Rectified linear unit, ``y = max(x, 0)`` (Nair & Hinton, ICML 2010)."""

    def forward(self, x):
        xp = get_array_module(x)
        y = self._y = self._buf("y", x.shape, x)
        xp.maximum(x, 0, out=y)
        return y

    def backward(self, dy, need_input_grad=True):
        xp = get_array_module(dy)
        mask = self._buf("mask", dy.shape, dy, bool)
        xp.greater(self._y, 0, out=mask)
        dx = self._buf("dx", dy.shape, dy)
        xp.multiply(dy, mask, out=dx)  # a bool mask multiplies 40x faster than copyto(where=)
        return dx


class Tanh(Layer):
    """Hyperbolic tangent, ``y = tanh(x)``, with ``dy/dx = 1 - y**2``."""

    def forward(self, x):
        xp = get_array_module(x)
        y = self._y = self._buf("y", x.shape, x)
        xp.tanh(x, out=y)
        return y

    def backward(self, dy, need_input_grad=True):
        xp = get_array_module(dy)
        dx = self._buf("dx", dy.shape, dy)
        xp.multiply(self._y, self._y, out=dx)
        xp.subtract(1, dx, out=dx)
        xp.multiply(dx, dy, out=dx)
        return dx


class SoftmaxCrossEntropy(Layer):
    """Mean softmax cross-entropy over a batch, computed with the log-sum-exp shift.

    ``loss = mean_i(logsumexp(z_i) - z_i[y_i])``; ``dL/dz = (softmax(z) - onehot(y)) / B``.
    """

    def forward(self, z, labels):
        """Return the mean loss (Python float) for logits ``z`` (B, C) and int ``labels`` (B,)."""
        xp = get_array_module(z)
        if z.ndim != 2 or labels.shape != (z.shape[0],):
            raise ValueError(f"z must be (B, C) and labels (B,), got {z.shape} and {labels.shape}")
        B = z.shape[0]
        p = self._p = self._buf("p", z.shape, z)  # (B, C) probabilities
        xp.subtract(z, z.max(axis=1, keepdims=True), out=p)
        self._labels = labels
        rows = xp.arange(B)
        picked = p[rows, labels]  # shifted logit of the true class, (B,)
        xp.exp(p, out=p)
        s = p.sum(axis=1)  # (B,)
        loss = float((xp.log(s) - picked).sum()) / B if B else 0.0
        p /= s[:, None]
        return loss

    def backward(self, dy=None, need_input_grad=True):
        """Return dL/dz, shape (B, C), for the batch of the last :meth:`forward`."""
        B = self._p.shape[0]
        dz = self._buf("dz", self._p.shape, self._p)
        dz[...] = self._p
        dz[get_array_module(dz).arange(B), self._labels] -= 1
        dz /= max(B, 1)
        return dz


class Sequential:
    """A chain of layers whose parameters and gradients are views into two flat arrays.

    Parameters
    ----------
    layers : list of Layer
        Distinct layer objects (the same object twice, e.g. tied weights, is refused).
    dtype : str or dtype
        Parameter dtype (float32 or float64).
    seed : int
        Seed of the ``numpy.random.Generator`` used by every layer's ``init``, in layer order.
    xp : module
        Array module owning the flat buffers (``numpy`` or ``cupy``).

    Attributes
    ----------
    params, grads : ndarray, shape (n,), dtype
        The flat parameter and gradient arrays; every layer parameter is a view into them.
    slices : list of (str, int, int)
        (name, offset, size) of each parameter in the flat arrays, in layer order.

    Raises
    ------
    TypeError
        When ``dtype`` is not a floating type.
    ValueError
        When one layer object appears twice in ``layers`` (naming both indices): ``backward``
        writes each gradient view instead of adding to it, and a layer caches the input of its
        last ``forward``, so a reused layer would get the gradient of its last use only.

    Examples
    --------
    >>> model = Sequential([Linear(3, 2), ReLU(), Linear(2, 2, init="glorot")])
    >>> model.size, model.slices[:2]
    (14, [('0.Linear.W', 0, 6), ('0.Linear.b', 6, 2)])
    >>> model.params[6:8] = 5.0  # the first bias, through the flat buffer
    >>> model.layers[0].b
    array([5., 5.], dtype=float32)
    >>> layer = Linear(2, 2)
    >>> Sequential([layer, layer])
    Traceback (most recent call last):
    ...
    ValueError: layers[1] is the same Linear object as layers[0]: ...
    """

    def __init__(self, layers, dtype="float32", seed=0, xp=numpy):
        dtype = numpy.dtype(dtype)
        if dtype.kind != "f":
            raise TypeError(f"dtype must be a floating type, got {dtype}")
        self.layers, self.dtype = list(layers), dtype
        first = {}
        for i, layer in enumerate(self.layers):
            j = first.setdefault(id(layer), i)
            if j != i:  # backward writes, not adds, gradients, and layers cache their inputs
                raise ValueError(f"layers[{i}] is the same {type(layer).__name__} object as layers[{j}]: "
                                 "a layer may appear only once in a Sequential (shared or tied weights "
                                 "are not supported; use a separate layer object)")
        shapes = [(i, s) for i, layer in enumerate(self.layers) for s in layer.param_shapes()]
        n = sum(math.prod(s) for _, s in shapes)
        self.params = xp.zeros(n, dtype)
        self.grads = xp.zeros(n, dtype)
        self.slices, off = [], 0
        for i, layer in enumerate(self.layers):
            pv, gv = [], []
            for j, s in enumerate(layer.param_shapes()):
                size = math.prod(s)
                pv.append(self.params[off:off + size].reshape(s))
                gv.append(self.grads[off:off + size].reshape(s))
                self.slices.append((f"{i}.{type(layer).__name__}.{'Wb'[j] if j < 2 else j}", off, size))
                off += size
            layer.bind(pv, gv)
        rng = numpy.random.default_rng(seed)
        for layer in self.layers:
            layer.init(rng)

    def writes_every_gradient(self):
        """Return True when one :meth:`backward` overwrites every element of :attr:`grads`.

        True for this class's own ``backward`` over layers whose parameterized ones are all exactly
        :class:`Linear` (its ``backward`` writes ``dW`` and ``db`` whole, never adds to them); then a
        training step need not zero the gradient first. False for a subclass that overrides
        ``backward`` (it may skip layers) and for any other parameterized layer type, whose gradients
        are zeroed before each step (``training.dp.data_parallel.compute_gradient``).
        """
        if type(self).backward is not Sequential.backward:
            return False
        return all(type(layer) is Linear or not layer.param_shapes() for layer in self.layers)

    @property
    def size(self):
        """Number of scalar parameters."""
        return int(self.params.size)

    def parameters(self):
        """Return every layer's (parameter view, gradient view) pairs, in flat-buffer order."""
        return [pg for layer in self.layers for pg in layer.parameters()]

    def forward(self, x):
        """Return the logits (B, n_out) for a batch ``x`` (B, n_in) of the model's dtype."""
        if tracing.enabled():  # one event per layer (training.model.layer_trace)
            return layer_trace.forward(self, x)
        for layer in self.layers:
            x = layer.forward(x)
        return x

    def backward(self, dy, on_grad=None):
        """Write all parameter gradients into ``grads`` given dL/dlogits ``dy`` (B, n_out).

        Each layer overwrites its own gradient views; a layer whose ``backward`` is not run keeps
        what ``grads`` held, so a training step zeroes ``grads`` first
        (``training.dp.data_parallel.compute_gradient``) unless :meth:`writes_every_gradient`.

        Parameters
        ----------
        dy : ndarray, shape (B, n_out), model dtype
            Gradient of the loss with respect to the logits.
        on_grad : callable, optional
            Called as ``on_grad(i)`` right after layer ``i``'s ``backward`` has written its parameter
            gradients (layers run last to first), so that a data-parallel step can start the
            all-reduce of a gradient bucket while the earlier layers are still being differentiated
            (Li et al., "PyTorch Distributed", VLDB 2020, section 3.2.3).
        """
        if tracing.enabled():  # one event per layer (training.model.layer_trace)
            return layer_trace.backward(self, dy, on_grad)
        last = len(self.layers) - 1
        for i in range(last, -1, -1):
            dy = self.layers[i].backward(dy, need_input_grad=i > 0)
            if on_grad is not None:
                on_grad(i)

    def predict(self, x):
        """Return the predicted class (argmax of the logits) of each row of ``x``."""
        return self.forward(x).argmax(axis=1)


def build_mlp(sizes, activation="relu", dtype="float32", seed=0, xp=numpy):
    """Build ``Linear -> act -> ... -> Linear`` over widths ``sizes`` = (in, h1, ..., out).

    Parameters
    ----------
    sizes : sequence of int
        Layer widths, input first, number of classes last (at least two entries).
    activation : {"relu", "tanh"}
        Hidden activation; relu layers get He init, tanh layers and the output layer Glorot init.
    dtype, seed, xp
        As for :class:`Sequential`.

    Returns
    -------
    Sequential

    Examples
    --------
    >>> import numpy as np
    >>> model = build_mlp([4, 8, 3], seed=0)
    >>> [type(layer).__name__ for layer in model.layers], model.size
    (['Linear', 'ReLU', 'Linear'], 67)
    >>> model.forward(np.ones((5, 4), np.float32)).shape
    (5, 3)
    """
    if len(sizes) < 2:
        raise ValueError(f"sizes needs at least (in, out), got {list(sizes)}")
    if activation not in ("relu", "tanh"):
        raise ValueError(f"activation must be 'relu' or 'tanh', got {activation!r}")
    act, init = (ReLU, "he") if activation == "relu" else (Tanh, "glorot")
    layers = []
    for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        last = k == len(sizes) - 2
        layers.append(Linear(a, b, init="glorot" if last else init))
        if not last:
            layers.append(act())
    return Sequential(layers, dtype=dtype, seed=seed, xp=xp)
