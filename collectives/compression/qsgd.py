"""QSGD: stochastic quantization to ``s`` levels of each bucket's L2 norm (Alistarh et al. 2017)."""
import numpy as np

from .base import Compressor, tensor_context, check_tensor
from commlab.arrays import get_array_module
from .quantize import stochastic_round

__all__ = ["QSGD", "level_dtype"]


def level_dtype(levels):
    """Return the smallest signed integer type that holds ``-levels .. levels``."""
    for dtype in (np.int8, np.int16, np.int32):
        if levels <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"levels must be <= {np.iinfo(np.int32).max}, got {levels}")


class QSGD(Compressor):
    """Quantize each bucket to ``s`` levels of its L2 norm with unbiased stochastic rounding.

    For a bucket ``v`` of ``d`` elements: ``Q(v)_i = ||v||_2 * sign(v_i) * l_i / s`` with
    ``l_i = stochastic_round(s |v_i| / ||v||_2)`` in ``0..s``. Then ``E[Q(v)] = v`` and
    ``E||Q(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2`` (Lemma 3.1). On the wire: one float32
    norm per bucket and one signed level per element in the smallest integer type (int8 for
    ``s <= 127``). Alistarh et al. 2017, "QSGD: Communication-Efficient SGD via Gradient Quantization
    and Encoding", Sec. 3.1 (quantization), Sec. 5 (bucketing); Elias coding of the levels is not used.

    Parameters
    ----------
    levels : int
        ``s``, the number of positive levels (>= 1); 127 gives 8-bit levels.
    bucket : int
        Elements per bucket, each with its own norm (>= 1).
    seed : int
        RNG seed (the rounding draws are independent between ranks).

    Raises
    ------
    ValueError
        If ``levels`` or ``bucket`` is out of range.

    Examples
    --------
    A bucket whose ``s |v_i| / ||v||`` are whole levels is sent exactly (``||(3, -4)|| = 5``):

    >>> import numpy as np
    >>> c = QSGD(levels=5, bucket=2)
    >>> (norms, levels), ctx = c.compress(np.array([3.0, -4.0], np.float32), "w")
    >>> norms, levels
    (array([5.], dtype=float32), array([ 3, -4], dtype=int8))
    >>> c.decompress([norms, levels], ctx)
    array([ 3., -4.], dtype=float32)
    """

    __slots__ = ("levels", "bucket", "_dtype")

    def __init__(self, levels=127, bucket=512, seed=0):
        super().__init__(seed)
        if not isinstance(levels, (int, np.integer)) or levels < 1:
            raise ValueError(f"levels must be an int >= 1, got {levels!r}")
        if not isinstance(bucket, (int, np.integer)) or bucket < 1:
            raise ValueError(f"bucket must be an int >= 1, got {bucket!r}")
        self.levels = int(levels)
        self.bucket = int(bucket)
        self._dtype = level_dtype(self.levels)

    def compress(self, x, name):
        """Return ``([norms float32 (nb,), levels int (x.size,)], ctx)``, ``nb = ceil(size / bucket)``.

        Parameters
        ----------
        x : ndarray, any shape, float
            The tensor.
        name : str
            Its key (selects the RNG counter).
        """
        xp = check_tensor(x, name)
        flat = x.ravel() if x.dtype != np.float16 else x.ravel().astype(np.float32)
        n, d = flat.size, self.bucket
        nb = -(-n // d)
        padded = xp.zeros(nb * d, flat.dtype)
        padded[:n] = flat
        buckets = padded.reshape(nb, d)  # (nb, d)
        norms = xp.sqrt(xp.sum(buckets.astype(np.float64) ** 2, axis=1))  # (nb,)
        norms32 = norms.astype(np.float32)
        low = norms32.astype(np.float64) < norms  # round the sent norm up: every |v_i| <= norm
        norms32[low] = xp.nextafter(norms32[low], xp.float32(np.inf))
        safe = xp.where(norms32 > 0, norms32, 1).astype(flat.dtype)
        ratio = xp.abs(buckets) * (flat.dtype.type(self.levels) / safe[:, None])  # (nb, d) in [0, s]
        lev = stochastic_round(ratio, self._rng(name, shared=False), xp)
        lev = xp.minimum(lev, self.levels) * xp.sign(buckets)
        return [norms32, lev.ravel()[:n].astype(self._dtype)], tensor_context(x)

    def decompress(self, payloads, ctx):
        """Return ``norm * level / s`` per element in ``ctx["dtype"]``, reshaped."""
        norms, lev = payloads
        xp = get_array_module(lev)
        n = ctx["size"]
        step = xp.repeat(norms.astype(ctx["dtype"]) / ctx["dtype"].type(self.levels), self.bucket)[:n]
        return (lev.astype(ctx["dtype"]) * step).reshape(ctx["shape"])

    def __repr__(self):
        return f"QSGD(levels={self.levels}, bucket={self.bucket}, seed={self.seed})"
