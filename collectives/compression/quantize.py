"""Element-wise quantizers: ``none`` (identity), ``fp16`` (half precision), ``bf16`` (bfloat16) and
``int8`` (stochastic rounding to 8-bit integers with one scale per tensor)."""
import numpy as np

from collectives.backend import BFLOAT16

from .base import Compressor, tensor_context, check_tensor

__all__ = ["NoneCompressor", "FP16Compressor", "BF16Compressor", "Int8Compressor", "stochastic_round", "scale_up"]


def stochastic_round(r, rng, xp=np):
    """Round ``r`` down or up at random so that the result is unbiased: E[round(r)] = r.

    Parameters
    ----------
    r : ndarray, float
        Values to round.
    rng : numpy.random.Generator
        Source of the uniform draws.
    xp : module
        NumPy or CuPy (the module of ``r``).

    Returns
    -------
    ndarray
        ``floor(r + u)`` with ``u ~ U[0, 1)``, same dtype as ``r``; it is ``floor(r) + 1`` with
        probability ``r - floor(r)``. Gupta et al. 2015, "Deep Learning with Limited Numerical
        Precision", Sec. 3.
    """
    dtype = np.float32 if r.dtype == np.float32 else np.float64
    u = xp.asarray(rng.random(r.shape, dtype=dtype))
    return xp.floor(r + u)


class NoneCompressor(Compressor):
    """Send the tensor unchanged (the baseline: 32 bits per float32 element).

    Examples
    --------
    >>> c = NoneCompressor()
    >>> payloads, ctx = c.compress(np.arange(6.0).reshape(2, 3), "w")
    >>> payloads[0].shape, ctx["shape"]
    ((6,), (2, 3))
    >>> c.decompress(payloads, ctx).tolist()
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    """

    __slots__ = ()
    transport = "allreduce"

    def compress(self, x, name):
        """Return ``([x.ravel()], ctx)``.

        Parameters
        ----------
        x : ndarray, any shape, float
            The tensor.
        name : str
            Its key (unused).

        Returns
        -------
        payloads : list of ndarray
            One array, shape (x.size,), dtype of x.
        ctx : dict
            Shape and dtype.
        """
        check_tensor(x, name)
        return [x.ravel()], tensor_context(x)

    def decompress(self, payloads, ctx):
        """Return the payload reshaped to ``ctx["shape"]`` (a copy)."""
        return payloads[0].reshape(ctx["shape"]).astype(ctx["dtype"], copy=True)


class FP16Compressor(Compressor):
    """Cast to IEEE half precision (16 bits per element; summable, so it rides the all-reduce).

    Each element keeps 11 significant bits: the round-trip error is at most ``2**-11 * |x|`` for normal
    values (``|x| >= 2**-14``) and 2**-25 absolutely below; values with ``|x| >= 65520`` (the midpoint
    above float16's largest finite 65504) overflow to Inf. In ``compressed_allreduce`` each rank's
    float16 values are divided by P before the sum, as PyTorch's ``fp16_compress_hook`` does, so the
    average overflows only where one rank's own value does (on 2 ranks, 36,500 on each gives 36,512,
    float16's nearest value to 36,500, not Inf); at P not a power of two the rounded shares of values
    within a few units of 65504 can still round their sum up to Inf. Micikevicius et al. 2018, "Mixed Precision Training", Sec. 3.

    Examples
    --------
    >>> c = FP16Compressor()
    >>> payloads, ctx = c.compress(np.array([1.0, 0.5, 2049.0], np.float32), "w")
    >>> payloads[0].dtype, payloads[0].nbytes
    (dtype('float16'), 6)
    >>> c.decompress(payloads, ctx).tolist()  # 2049 needs 12 significant bits
    [1.0, 0.5, 2048.0]
    """

    __slots__ = ()
    transport = "allreduce"

    def compress(self, x, name):
        """Return ``([x as float16, shape (x.size,)], ctx)``."""
        check_tensor(x, name)
        return [x.ravel().astype(np.float16)], tensor_context(x)

    def decompress(self, payloads, ctx):
        """Return the payload cast back to ``ctx["dtype"]`` and reshaped."""
        return payloads[0].astype(ctx["dtype"]).reshape(ctx["shape"])


class BF16Compressor(Compressor):
    """Cast to bfloat16 (16 bits per element: float32's 8-bit exponent, 8 significant bits; summable).

    Each element keeps 8 significant bits, rounded to nearest even: the round-trip error is at most
    ``2**-8 * |x|`` for normal values; the range is float32's, so only values with ``|x|`` at or above
    about 3.3961e38 (the midpoint above bfloat16's largest finite 3.3895e38) overflow to Inf. In
    ``compressed_allreduce`` each rank's bfloat16 values are divided by P before the sum, as
    PyTorch's ``bf16_compress_hook`` does, so the average overflows only where one rank's own value
    does. A float16 tensor comes back float16: a value that rounds to bfloat16's 65536 (float16
    input of magnitude 65408 or more) comes back as float16's largest finite 65504, not Inf. Host
    arrays only: CuPy has no bfloat16. Kalamkar et al. 2019, "A Study of BFLOAT16 for Deep
    Learning Training", Sec. 2.

    Examples
    --------
    >>> c = BF16Compressor()
    >>> payloads, ctx = c.compress(np.array([1.0, 0.5, 257.0, 3e38], np.float32), "w")
    >>> str(payloads[0].dtype), payloads[0].nbytes
    ('bfloat16', 8)
    >>> c.decompress(payloads, ctx).tolist()  # 257 needs 9 significant bits: the tie rounds to even
    [1.0, 0.5, 256.0, 3.00405527047391e+38]
    """

    __slots__ = ()
    transport = "allreduce"

    def compress(self, x, name):
        """Return ``([x as bfloat16, shape (x.size,)], ctx)``.

        Raises
        ------
        TypeError
            If ``x`` is a device (CuPy) array: CuPy has no bfloat16.
        """
        if check_tensor(x, name) is not np:
            raise TypeError("bf16 compression takes host (NumPy) arrays: CuPy has no bfloat16 (use fp16 on a GPU)")
        return [x.ravel().astype(BFLOAT16)], tensor_context(x)

    def decompress(self, payloads, ctx):
        """Return the payload cast back to ``ctx["dtype"]`` and reshaped (float16: finite values saturate at 65504)."""
        if np.dtype(ctx["dtype"]) == np.float16:
            wide = payloads[0].astype(np.float32)
            limit = np.float32(np.finfo(np.float16).max)
            finite = np.isfinite(wide)
            wide[finite] = np.clip(wide[finite], -limit, limit)
            return wide.astype(np.float16).reshape(ctx["shape"])
        return payloads[0].astype(ctx["dtype"]).reshape(ctx["shape"])


class Int8Compressor(Compressor):
    """Quantize to 8-bit integers with one scale per tensor and stochastic rounding (unbiased).

    ``scale = max|x| / 127`` (float32, rounded up so that no level exceeds 127), levels
    ``q = stochastic_round(x / scale)`` in ``[-127, 127]`` as int8; the receiver rebuilds ``q * scale``.
    Wire cost 8 bits per element plus 4 bytes. Gupta et al. 2015 (stochastic rounding); per-tensor
    scaling as in Jacob et al. 2018, "Quantization and Training of Neural Networks", Sec. 2.1.

    Parameters
    ----------
    seed : int
        RNG seed (the rounding draws are independent between ranks).

    Examples
    --------
    Values on the 127 levels of ``max|x| / 127`` round to themselves, whatever the draws:

    >>> c = Int8Compressor(seed=0)
    >>> (scale, levels), ctx = c.compress(np.array([-127.0, 0.0, 64.0, 127.0], np.float32), "w")
    >>> scale, levels
    (array([1.], dtype=float32), array([-127,    0,   64,  127], dtype=int8))
    >>> c.decompress([scale, levels], ctx).tolist()
    [-127.0, 0.0, 64.0, 127.0]
    """

    __slots__ = ()

    def compress(self, x, name):
        """Return ``([scale float32 (1,), levels int8 (x.size,)], ctx)``."""
        xp = check_tensor(x, name)
        flat = x.ravel() if x.dtype != np.float16 else x.ravel().astype(np.float32)
        scale = scale_up(xp.max(xp.abs(flat)) / 127 if flat.size else 0.0, xp)
        inv = 1.0 / scale[0] if float(scale[0]) > 0 else 0.0
        levels = stochastic_round(flat * flat.dtype.type(inv), self._rng(name, shared=False), xp)
        levels = xp.clip(levels, -127, 127).astype(np.int8)
        return [scale, levels], tensor_context(x)

    def decompress(self, payloads, ctx):
        """Return ``levels * scale`` in ``ctx["dtype"]``, reshaped."""
        scale, levels = payloads
        return (levels.astype(ctx["dtype"]) * scale.astype(ctx["dtype"])[0]).reshape(ctx["shape"])


def scale_up(value, xp):
    """Return ``value`` as a float32 array of shape (1,), rounded up so it is never below ``value``.

    The scale of a quantizer (int8, TernGrad): rounding it up keeps every level within range.

    Parameters
    ----------
    value : float
        The scale, in the tensor's units.
    xp : module
        ``numpy`` or ``cupy``: the module of the returned array.

    Returns
    -------
    ndarray, shape (1,), float32

    Examples
    --------
    >>> bool(scale_up(0.1, np)[0] >= 0.1)
    True
    """
    value = float(value)
    s = np.float32(value)
    if float(s) < value:
        s = np.nextafter(s, np.float32(np.inf))
    return xp.asarray(np.array([s], np.float32))
