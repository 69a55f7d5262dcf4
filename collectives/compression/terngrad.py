"""TernGrad: stochastic ternarization to {-1, 0, +1} times the tensor's max |g| (Wen et al. 2017)."""
import numpy as np

from .base import Compressor, tensor_context, check_tensor
from commlab.arrays import get_array_module
from .quantize import scale_up

__all__ = ["TernGrad", "pack_2bit", "unpack_2bit"]


def pack_2bit(codes):
    """Pack 2-bit codes (values 0..3), four to a byte.

    Parameters
    ----------
    codes : ndarray, shape (n,), uint8
        Codes in 0..3.

    Returns
    -------
    ndarray, shape (ceil(n / 4),), uint8
        Code ``4 j + i`` sits in bits ``2 i, 2 i + 1`` of byte ``j``.

    Examples
    --------
    >>> packed = pack_2bit(np.array([1, 2, 0, 3, 1], np.uint8))
    >>> packed.tolist(), unpack_2bit(packed, 5).tolist()
    ([201, 1], [1, 2, 0, 3, 1])
    """
    xp = get_array_module(codes)
    n = codes.size
    padded = xp.zeros(-(-n // 4) * 4, np.uint8)
    padded[:n] = codes
    quads = padded.reshape(-1, 4)  # (n/4, 4)
    return quads[:, 0] | (quads[:, 1] << 2) | (quads[:, 2] << 4) | (quads[:, 3] << 6)


def unpack_2bit(packed, n):
    """Invert ``pack_2bit``: return the first ``n`` codes, shape (n,), uint8."""
    xp = get_array_module(packed)
    quads = xp.stack([(packed >> s) & 3 for s in (0, 2, 4, 6)], axis=1)  # (n/4, 4)
    return quads.ravel()[:n]


class TernGrad(Compressor):
    """Ternarize each element to ``s * sign(g_i) * b_i`` with ``b_i ~ Bernoulli(|g_i| / s)``.

    ``s = max|g|`` per tensor (layer-wise scaler), so ``E[s sign(g) b] = g`` (unbiased). The ternary
    values go on the wire as 2-bit codes, four per byte, plus one float32 scaler: 2 bits per element.
    Optional gradient clipping to ``clip * std(g)`` before ternarizing (the paper uses 2.5) trades a
    small bias for a smaller scaler. Wen et al. 2017, "TernGrad: Ternary Gradients to Reduce
    Communication in Distributed Deep Learning", Sec. 3.1 (ternarization), Sec. 3.3 (clipping).

    Parameters
    ----------
    clip : float or None
        Clip to ``clip`` standard deviations first (> 0); None: no clipping (unbiased).
    seed : int
        RNG seed (the Bernoulli draws are independent between ranks).

    Raises
    ------
    ValueError
        If ``clip`` is not positive.

    Examples
    --------
    Elements at ``+-max|g|`` are kept with probability 1, zeros with probability 0:

    >>> c = TernGrad(seed=0)
    >>> payloads, ctx = c.compress(np.array([2.0, -2.0, 0.0], np.float32), "w")
    >>> [p.nbytes for p in payloads]  # a float32 scaler, then 2 bits per element
    [4, 1]
    >>> c.decompress(payloads, ctx)
    array([ 2., -2.,  0.], dtype=float32)
    """

    __slots__ = ("clip",)

    def __init__(self, clip=None, seed=0):
        super().__init__(seed)
        if clip is not None and not clip > 0:
            raise ValueError(f"clip must be > 0 or None, got {clip!r}")
        self.clip = None if clip is None else float(clip)

    def compress(self, x, name):
        """Return ``([scaler float32 (1,), codes uint8 (ceil(size / 4),)], ctx)``."""
        xp = check_tensor(x, name)
        flat = x.ravel() if x.dtype != np.float16 else x.ravel().astype(np.float32)
        if self.clip is not None and flat.size:
            bound = self.clip * float(xp.std(flat))
            flat = xp.clip(flat, -bound, bound)
        scale = scale_up(xp.max(xp.abs(flat)) if flat.size else 0.0, xp)
        inv = 1.0 / float(scale[0]) if float(scale[0]) > 0 else 0.0
        dtype = np.float32 if flat.dtype == np.float32 else np.float64
        u = xp.asarray(self._rng(name, shared=False).random(flat.size, dtype=dtype))
        keep = u < xp.abs(flat) * flat.dtype.type(inv)  # Bernoulli(|g| / s)
        codes = (keep * (1 + (flat < 0))).astype(np.uint8)  # 0: zero, 1: +1, 2: -1
        return [scale, pack_2bit(codes)], tensor_context(x)

    def decompress(self, payloads, ctx):
        """Return ``scaler * {0, +1, -1}[code]`` in ``ctx["dtype"]``, reshaped."""
        scale, packed = payloads
        xp = get_array_module(packed)
        codes = unpack_2bit(packed, ctx["size"])
        table = xp.asarray(np.array([0, 1, -1, 0], ctx["dtype"]))
        return (table[codes] * scale.astype(ctx["dtype"])[0]).reshape(ctx["shape"])

    def __repr__(self):
        return f"TernGrad(clip={self.clip}, seed={self.seed})"
