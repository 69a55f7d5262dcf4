"""Sparsifiers: ``topk`` (largest magnitudes), ``randomk`` (indices shared by all ranks) and
``threshold`` (every element above a magnitude), with the sparse aggregation they share."""
import math

import numpy as np

from .base import Compressor, tensor_context, check_tensor
from commlab.arrays import get_array_module

__all__ = ["TopK", "RandomK", "Threshold", "scatter_add", "index_dtype", "resolve_k"]


def index_dtype(n):
    """Return the index type for a tensor of ``n`` elements: int32, or int64 beyond 2**31 - 1."""
    return np.dtype(np.int32) if n <= np.iinfo(np.int32).max else np.dtype(np.int64)


def resolve_k(n, ratio, k):
    """Return how many of ``n`` elements to keep: ``k`` if given, else ``ceil(ratio * n)``, at least 1
    (0 for an empty tensor) and at most ``n``."""
    if n == 0:
        return 0
    want = k if k is not None else math.ceil(ratio * n)
    return int(min(n, max(1, want)))


def scatter_add(out, indices, values):
    """Add ``values`` into ``out`` at ``indices``, summing repeated indices (unbuffered ``add.at``).

    Parameters
    ----------
    out : ndarray, shape (n, ...)
        Accumulator, changed in place.
    indices : ndarray, shape (k,), int
        Row indices into ``out``; may repeat (sparse vectors of several ranks).
    values : ndarray, shape (k, ...)
        Rows to add.

    Returns
    -------
    ndarray
        ``out``.
    """
    xp = get_array_module(out)
    if xp is not np:
        import cupyx  # the GPU path: CuPy's scatter_add sums repeated indices too
        cupyx.scatter_add(out, indices, values)
    else:
        np.add.at(out, indices, values)
    return out


def _check_ratio(ratio, k):
    """Validate the ``ratio`` / ``k`` pair shared by the sparsifiers."""
    if k is not None and (not isinstance(k, (int, np.integer)) or k < 1):
        raise ValueError(f"k must be an int >= 1 or None, got {k!r}")
    if not 0 < ratio <= 1:
        raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")


class _Sparse(Compressor):
    """Shared decompress / aggregate for payloads ``[indices, values]``."""

    __slots__ = ()

    def decompress(self, payloads, ctx):
        """Return a dense tensor with ``values`` at ``indices`` and zeros elsewhere."""
        indices, values = payloads
        xp = get_array_module(values)
        out = xp.zeros(ctx["size"], ctx["dtype"])
        out[indices] = values  # the indices of one rank are distinct
        return out.reshape(ctx["shape"])

    def aggregate(self, gathered, ctx):
        """Average sparse tensors of all ranks; indices repeated across ranks are summed (``add.at``)."""
        xp = get_array_module(gathered[0][1])
        out = xp.zeros(ctx["size"], ctx["dtype"])
        indices = xp.concatenate([pl[0] for pl in gathered])  # repeats across ranks
        scatter_add(out, indices, xp.concatenate([pl[1] for pl in gathered]))
        return (out / len(gathered)).reshape(ctx["shape"])


class TopK(_Sparse):
    """Keep the ``k`` elements of largest magnitude; send their indices (int32) and values.

    Use with error feedback (on by default): the dropped mass is sent later. Aji & Heafield 2017,
    "Sparse Communication for Distributed Gradient Descent", Sec. 3; Stich et al. 2018, "Sparsified SGD
    with Memory", Sec. 2. The selection is exact (``argpartition``); ties are broken arbitrarily.

    Parameters
    ----------
    ratio : float
        Fraction of elements kept, in (0, 1]; ignored when ``k`` is given.
    k : int or None
        Number of elements kept (>= 1), clamped to the tensor size.
    seed : int
        Unused (selection is deterministic); kept for the common constructor.

    Examples
    --------
    >>> c = TopK(ratio=0.5)
    >>> (indices, values), ctx = c.compress(np.array([[0.5, -4.0], [1.0, 3.0]], np.float32), "w")
    >>> sorted(indices.tolist()), indices.dtype
    ([1, 3], dtype('int32'))
    >>> c.decompress([indices, values], ctx)
    array([[ 0., -4.],
           [ 0.,  3.]], dtype=float32)
    """

    __slots__ = ("ratio", "k")
    error_feedback = True

    def __init__(self, ratio=0.01, k=None, seed=0):
        super().__init__(seed)
        _check_ratio(ratio, k)
        self.ratio, self.k = float(ratio), None if k is None else int(k)

    def _keep(self, n, name):
        """Return how many elements to keep this step."""
        return resolve_k(n, self.ratio, self.k)

    def compress(self, x, name):
        """Return ``([indices int32 (k,), values (k,) dtype of x], ctx)``."""
        xp = check_tensor(x, name)
        flat = x.ravel()
        k = self._keep(flat.size, name)
        self._counts[name] = self._iteration(name) + 1
        if k < flat.size:
            indices = xp.argpartition(xp.abs(flat), flat.size - k)[flat.size - k:]
        else:
            indices = xp.arange(flat.size)
        indices = indices.astype(index_dtype(flat.size))
        return [indices, flat[indices]], tensor_context(x)

    def __repr__(self):
        return f"{type(self).__name__}(ratio={self.ratio}, k={self.k})"


class RandomK(Compressor):
    """Keep ``k`` elements at indices drawn from the seed shared by all ranks; send only the values.

    Every rank draws the same indices, so the value payloads are summable and ride the all-reduce.
    With ``rescale`` the values are multiplied by ``d / k`` so the compressor is unbiased (then error
    feedback is usually off); without it use error feedback (on by default). Stich et al. 2018,
    "Sparsified SGD with Memory", Sec. 2 (rand-k); Wangni et al. 2018, "Gradient Sparsification for
    Communication-Efficient Distributed Optimization" (unbiased rescaling).

    Parameters
    ----------
    ratio : float
        Fraction of elements kept, in (0, 1]; ignored when ``k`` is given.
    k : int or None
        Number of elements kept (>= 1), clamped to the tensor size.
    rescale : bool
        Multiply by ``d / k`` (unbiased).
    seed : int
        Seed of the shared index draws; must be the same on every rank.

    Examples
    --------
    >>> x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    >>> c = RandomK(k=2, seed=7)
    >>> payloads, ctx = c.compress(x, "w")
    >>> len(payloads), payloads[0].size  # only the values travel; every rank draws the indices
    (1, 2)
    >>> y = c.decompress(payloads, ctx)
    >>> bool((y[ctx["indices"]] == x[ctx["indices"]]).all()), int(np.count_nonzero(y))
    (True, 2)
    """

    __slots__ = ("ratio", "k", "rescale")
    transport = "allreduce"
    error_feedback = True

    def __init__(self, ratio=0.01, k=None, rescale=False, seed=0):
        super().__init__(seed)
        _check_ratio(ratio, k)
        self.ratio, self.k, self.rescale = float(ratio), None if k is None else int(k), bool(rescale)

    def compress(self, x, name):
        """Return ``([values (k,)], ctx)``; ``ctx["indices"]`` holds the shared indices."""
        xp = check_tensor(x, name)
        flat = x.ravel()
        k = resolve_k(flat.size, self.ratio, self.k)
        rng = self._rng(name, shared=True)
        indices = xp.asarray(np.sort(rng.choice(flat.size, size=k, replace=False)))
        values = flat[indices]
        if self.rescale and k:
            values = values * flat.dtype.type(flat.size / k)
        return [values], tensor_context(x, indices=indices.astype(index_dtype(flat.size)))

    def decompress(self, payloads, ctx):
        """Return a dense tensor with the values at the shared indices."""
        xp = get_array_module(payloads[0])
        out = xp.zeros(ctx["size"], ctx["dtype"])
        out[ctx["indices"]] = payloads[0]
        return out.reshape(ctx["shape"])

    def __repr__(self):
        return f"RandomK(ratio={self.ratio}, k={self.k}, rescale={self.rescale}, seed={self.seed})"


class Threshold(_Sparse):
    """Send every element with ``|x| >= threshold`` (indices int32 and values; the count varies by rank
    and step, so it goes through all-gather-v). Use with error feedback (on by default). Strom 2015,
    "Scalable Distributed DNN Training Using Commodity GPU Cloud Computing", Sec. 2.

    Parameters
    ----------
    threshold : float
        Magnitude threshold (> 0), in gradient units.
    seed : int
        Unused; kept for the common constructor.

    Examples
    --------
    >>> c = Threshold(threshold=1.0)
    >>> payloads, ctx = c.compress(np.array([0.5, -2.0, 0.1, 1.0], np.float32), "w")
    >>> payloads[0]
    array([1, 3], dtype=int32)
    >>> c.decompress(payloads, ctx)
    array([ 0., -2.,  0.,  1.], dtype=float32)
    """

    __slots__ = ("threshold",)
    error_feedback = True
    transport = "allgatherv"

    def __init__(self, threshold=1e-3, seed=0):
        super().__init__(seed)
        if not threshold > 0:
            raise ValueError(f"threshold must be > 0, got {threshold!r}")
        self.threshold = float(threshold)

    def compress(self, x, name):
        """Return ``([indices int32 (m,), values (m,)], ctx)`` with ``m`` the elements above."""
        xp = check_tensor(x, name)
        flat = x.ravel()
        self._counts[name] = self._iteration(name) + 1
        indices = xp.flatnonzero(xp.abs(flat) >= self.threshold).astype(index_dtype(flat.size))
        return [indices, flat[indices]], tensor_context(x)

    def __repr__(self):
        return f"Threshold(threshold={self.threshold})"
