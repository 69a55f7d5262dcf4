"""Sign compressors: ``signsgd`` (majority vote of three-valued signs, 2 bits per element),
``efsignsgd`` (scaled 1-bit sign with error feedback) and ``onebit`` (two reconstruction means with
error feedback, 1 bit per element)."""
import numpy as np

from .base import Compressor, tensor_context, check_tensor
from commlab.arrays import get_array_module
from .terngrad import pack_2bit, unpack_2bit

__all__ = ["SignSGD", "EFSignSGD", "OneBit", "pack_signs", "unpack_signs"]


def pack_signs(x):
    """Pack ``x >= 0`` into bits, eight per byte (``np.packbits``, big bit order).

    Parameters
    ----------
    x : ndarray, shape (n,), float

    Returns
    -------
    ndarray, shape (ceil(n / 8),), uint8
    """
    xp = get_array_module(x)
    return xp.packbits(x >= 0)


def unpack_signs(packed, n, dtype):
    """Return the first ``n`` packed signs as ``+1`` / ``-1``, shape (n,), ``dtype``."""
    xp = get_array_module(packed)
    bits = xp.unpackbits(packed)[:n]
    return bits.astype(dtype) * 2 - 1


def _mean_abs(flat, xp):
    """Return mean |x| as a float32 array of shape (1,) (0 for an empty tensor)."""
    value = float(xp.mean(xp.abs(flat.astype(np.float64)))) if flat.size else 0.0
    return xp.asarray(np.array([value], np.float32))


def _sign_codes(x):
    """Return the 2-bit codes of ``sign(x)``: 0 for 0, 1 for +1, 2 for -1; shape (n,), uint8."""
    return (x > 0).astype(np.uint8) + 2 * (x < 0).astype(np.uint8)


def _code_values(codes, dtype):
    """Return the sign ``{0, +1, -1}`` of each 2-bit code (code 3 is never sent: 0), in ``dtype``."""
    xp = get_array_module(codes)
    return xp.asarray(np.array([0, 1, -1, 0], dtype))[codes]


class SignSGD(Compressor):
    """Send the sign of each element, -1, 0 or +1 (2 bits); aggregate by majority vote.

    ``sign(0) = 0``, as in the authors' implementation (Bernstein et al.'s ``torch.sign``): an exact
    zero casts no vote, so an all-zero gradient gives a zero update. The receivers compute
    ``sign(sum_r sign(g_r))``; tie rule: an element whose signs sum to 0 (as many +1 as -1 votes,
    or no votes) gets 0. Bernstein et al. 2018, "signSGD: Compressed Optimisation for Non-Convex
    Problems", Algorithm 3 (majority vote). With ``scaled`` the vote is multiplied by the ranks'
    mean of ``mean|g_r|`` (one float32 more per rank), so the update has the gradient's magnitude
    and the learning rate of the other compressors carries over; ``scaled=False`` is the paper's
    pure sign (use a learning rate near 1e-4).

    On the wire: three values do not fit one bit, so each element is a 2-bit code (0: zero, 1: +1,
    2: -1; four per byte, ``terngrad.pack_2bit``), ``ceil(size / 4)`` bytes, plus 4 bytes when
    ``scaled``.

    Parameters
    ----------
    scaled : bool
        Multiply the vote by the mean magnitude (see above).
    seed : int
        Unused (signs are deterministic); kept for the common constructor.

    Examples
    --------
    >>> import numpy as np
    >>> x, y = np.array([0.5, -1.5, 0.0, 3.0], np.float32), np.array([-1.0, -1.0, 1.0, 1.0], np.float32)
    >>> payloads, ctx = SignSGD().compress(x, "w")
    >>> SignSGD().decompress(payloads, ctx)  # mean|x| = 1.25 times the sign
    array([ 1.25, -1.25,  0.  ,  1.25], dtype=float32)
    >>> c = SignSGD(scaled=False)
    >>> c.aggregate([c.compress(v, "w")[0] for v in (x, y, x)], ctx)  # majority vote of three ranks
    array([ 1., -1.,  1.,  1.], dtype=float32)
    """

    __slots__ = ("scaled",)

    def __init__(self, scaled=True, seed=0):
        super().__init__(seed)
        if not isinstance(scaled, (bool, np.bool_)):
            raise ValueError(f"scaled must be a bool, got {scaled!r}")
        self.scaled = bool(scaled)

    def compress(self, x, name):
        """Return ``([sign codes uint8 (ceil(size / 4),), mean|x| float32 (1,)], ctx)`` (no scale if
        not ``scaled``)."""
        xp = check_tensor(x, name)
        flat = x.ravel()
        payloads = [pack_2bit(_sign_codes(flat))]
        if self.scaled:
            payloads.append(_mean_abs(flat, xp))
        return payloads, tensor_context(x)

    def decompress(self, payloads, ctx):
        """Return ``scale * sign`` with ``sign`` in {-1, 0, +1} (one rank's view), reshaped."""
        signs = _code_values(unpack_2bit(payloads[0], ctx["size"]), ctx["dtype"])
        if self.scaled:
            signs = signs * payloads[1].astype(ctx["dtype"])[0]
        return signs.reshape(ctx["shape"])

    def aggregate(self, gathered, ctx):
        """Return the majority vote ``sign(sum_r sign_r)``, 0 where the sum is 0 (times the mean
        scale when ``scaled``)."""
        xp = get_array_module(gathered[0][0])
        votes = _code_values(unpack_2bit(gathered[0][0], ctx["size"]), np.int32)
        for payloads in gathered[1:]:
            votes = votes + _code_values(unpack_2bit(payloads[0], ctx["size"]), np.int32)
        out = xp.sign(votes).astype(ctx["dtype"])
        if self.scaled:
            scale = sum(float(p[1][0]) for p in gathered) / len(gathered)
            out = out * ctx["dtype"].type(scale)
        return out.reshape(ctx["shape"])

    def __repr__(self):
        return f"SignSGD(scaled={self.scaled})"


class EFSignSGD(Compressor):
    """Send ``(||p||_1 / d) sign(p)`` for the error-compensated ``p``: 1 bit per element + 4 bytes.

    Use with the error-feedback memory (on by default). Karimireddy et al. 2019, "Error Feedback Fixes
    SignSGD and other Gradient Compression Schemes", Algorithm 1 (EF-SGD with the scaled sign).
    The sign is one bit, so an exact zero is sent as ``+||p||_1 / d`` (``pack_signs``); the error
    feedback carries the difference into the next step (mass is conserved), and an all-zero ``p``
    has scale 0 and gives exactly 0.

    Examples
    --------
    >>> import numpy as np
    >>> c = EFSignSGD()
    >>> payloads, ctx = c.compress(np.array([1.0, -3.0, 0.0, 4.0], np.float32), "w")
    >>> c.decompress(payloads, ctx)  # mean|p| = 2; the zero is sent as +2
    array([ 2., -2.,  2.,  2.], dtype=float32)
    """

    __slots__ = ()
    error_feedback = True

    def compress(self, x, name):
        """Return ``([signs uint8 (ceil(size / 8),), mean|x| float32 (1,)], ctx)``."""
        xp = check_tensor(x, name)
        flat = x.ravel()
        return [pack_signs(flat), _mean_abs(flat, xp)], tensor_context(x)

    def decompress(self, payloads, ctx):
        """Return ``mean|x| * sign``, reshaped."""
        signs = unpack_signs(payloads[0], ctx["size"], ctx["dtype"])
        return (signs * payloads[1].astype(ctx["dtype"])[0]).reshape(ctx["shape"])


class OneBit(Compressor):
    """1-bit quantization at threshold 0 with two reconstruction values: the mean of the elements that
    are >= 0 and the mean of those below (the values that minimize the squared error for the chosen
    bits). 1 bit per element + 8 bytes; use with error feedback (on by default). Seide et al. 2014,
    "1-Bit Stochastic Gradient Descent and its Application to Data-Parallel Distributed Training of
    Speech DNNs", Sec. 3 (per tensor here, per column there). Exact zeros fall in the ``>= 0`` group
    and are rebuilt as ``mean_pos`` (error feedback carries the difference); an all-zero tensor has
    ``mean_pos = 0`` and gives exactly 0.

    Examples
    --------
    >>> import numpy as np
    >>> c = OneBit()
    >>> payloads, ctx = c.compress(np.array([1.0, 3.0, -2.0, -4.0], np.float32), "w")
    >>> payloads[1]  # mean of the elements >= 0, mean of the others
    array([ 2., -3.], dtype=float32)
    >>> c.decompress(payloads, ctx)
    array([ 2.,  2., -3., -3.], dtype=float32)
    """

    __slots__ = ()
    error_feedback = True

    def compress(self, x, name):
        """Return ``([signs uint8 (ceil(size / 8),), [mean_pos, mean_neg] float32 (2,)], ctx)``."""
        xp = check_tensor(x, name)
        flat = x.ravel()
        pos = flat >= 0
        n_pos = int(xp.count_nonzero(pos))
        n_neg = flat.size - n_pos
        total = float(xp.sum(flat, dtype=np.float64))
        total_pos = float(xp.sum(xp.where(pos, flat, 0), dtype=np.float64))
        means = np.array([total_pos / n_pos if n_pos else 0.0,
                          (total - total_pos) / n_neg if n_neg else 0.0], np.float32)
        return [xp.packbits(pos), xp.asarray(means)], tensor_context(x)

    def decompress(self, payloads, ctx):
        """Return ``mean_pos`` where the bit is set and ``mean_neg`` elsewhere, reshaped."""
        xp = get_array_module(payloads[0])
        bits = xp.unpackbits(payloads[0])[:ctx["size"]]
        table = payloads[1].astype(ctx["dtype"])[::-1]  # bit 0: mean_neg, bit 1: mean_pos
        return table[bits].reshape(ctx["shape"])
