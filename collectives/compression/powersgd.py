"""PowerSGD (Vogels et al. 2019): rank-r approximation by one step of power iteration with warm start;
P and Q sum element-wise, so both rounds ride the all-reduce (the compressor's own transport)."""
import math
import time
import warnings

import numpy as np

from .base import Compressor, tensor_context, check_tensor
from commlab.arrays import get_array_module

__all__ = ["PowerSGD", "matrix_layout"]


def matrix_layout(size, matrix_rank, shapes=None, min_compression_rate=1.0):
    """Split a flat vector into the pieces PowerSGD compresses.

    Parameters
    ----------
    size : int
        Elements of the flat vector.
    matrix_rank : int
        Requested rank ``r`` of the approximation.
    shapes : list of tuple of int, optional
        Parameter shapes in flat order (their sizes add up to ``size``). A shape with two or more
        dimensions ``(n, ...)`` is a matrix ``(n, prod(rest))``; a 1-D one (a bias) is sent
        uncompressed. Without ``shapes`` the whole vector is one near-square matrix
        ``(ceil(sqrt(size)), ceil(size / rows))``, zero-padded at the end.
    min_compression_rate : float
        A matrix is compressed only when ``r (rows + cols) * min_compression_rate < rows cols``
        (PyTorch's ``min_compression_rate``, whose default there is 2); 1 compresses whatever saves
        an element.

    Returns
    -------
    list of tuple
        ``(start, stop, rows, cols, r)`` per piece; ``r = 0`` marks a piece sent uncompressed: 1-D,
        or a matrix where ``r (rows + cols) * min_compression_rate >= rows cols`` with ``r`` clamped to
        ``min(rows, cols)``.

    Raises
    ------
    ValueError
        If the sizes of ``shapes`` do not add up to ``size``.

    Examples
    --------
    >>> matrix_layout(20, 1, shapes=[(4, 4), (4,)])  # a 4 x 4 weight at rank 1, its bias raw
    [(0, 16, 4, 4, 1), (16, 20, 4, 1, 0)]
    >>> matrix_layout(10, 2)  # no shapes: one near-square matrix, zero-padded
    [(0, 10, 4, 3, 0)]
    >>> matrix_layout(20, 1, shapes=[(4, 4), (4,)], min_compression_rate=2)  # 8 * 2 >= 16: raw
    [(0, 16, 4, 4, 0), (16, 20, 4, 1, 0)]
    """
    if shapes is None:
        rows = max(1, math.isqrt(max(size - 1, 0)) + 1) if size else 0
        shapes = [(rows, -(-size // rows))] if size else []
        padded = True
    else:
        shapes = [tuple(int(d) for d in s) for s in shapes]
        total = sum(math.prod(s) for s in shapes)
        if total != size:
            raise ValueError(f"shapes: sizes add up to {total}, the gradient has {size} elements")
        padded = False
    pieces, start = [], 0
    for shape in shapes:
        count = size if padded else math.prod(shape)
        rows, cols = (shape[0], math.prod(shape[1:])) if len(shape) >= 2 else (count, 1)
        r = min(matrix_rank, rows, cols) if len(shape) >= 2 else 0
        if r * (rows + cols) * min_compression_rate >= rows * cols:
            r = 0
        pieces.append((start, start + count, rows, cols, r))
        start += count
    return pieces


class PowerSGD(Compressor):
    """Compress each matrix ``M`` (n, m) to ``P`` (n, r) and ``Q`` (m, r) with one power iteration.

    Steps before ``start_iter`` average the tensor with one plain all-reduce (PyTorch's
    ``start_powerSGD_iter``: early steps are sensitive to the approximation). Then per step
    (Algorithm 1): ``P <- M Q``; all-reduce P; ``P_hat <- orthogonalize(P)`` (QR);
    ``Q <- M^T P_hat``; all-reduce Q (mean); the result is ``P_hat Q^T``; Q is kept for the next step
    (warm start). The receivers' sum of the ranks' ``P_hat Q_i^T`` is the mean approximation, so error
    feedback (on by default) stores ``M_i - P_hat Q_i^T`` (Algorithm 2). Wire cost per matrix
    ``r (n + m)`` elements; 1-D pieces and matrices too small to gain go uncompressed with the P round.
    Vogels et al. 2019, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
    Optimization", Sec. 3, Algorithms 1 and 2.

    Parameters
    ----------
    matrix_rank : int
        Rank ``r`` of the approximation (>= 1), clamped to ``min(n, m)`` per matrix (PyTorch's
        ``matrix_approximation_rank``).
    shapes : list of tuple of int, optional
        Parameter shapes in flat order; see ``matrix_layout`` (without them, one near-square matrix).
    warm_start : bool
        Reuse last step's Q; otherwise draw a fresh Q each step from the shared seed.
    seed : int
        Seed of the first Q; the same on every rank.
    start_iter : int
        Calls per tensor name averaged uncompressed before compression starts (>= 0; 0: compress
        from the first call). PyTorch's DDP hook needs at least 2 with error feedback or warm start,
        because DDP rebuilds its buckets after the first step; ``CommHookState`` applies that rule.
    min_compression_rate : float
        Compress a matrix only when ``r (n + m) * min_compression_rate < n m`` (> 0; PyTorch's
        argument of the same name, default 2 there); 1 compresses whatever saves an element.
    rank : int, optional
        Deprecated name of ``matrix_rank`` (it reads like the MPI rank); gives a
        ``DeprecationWarning``.

    Raises
    ------
    ValueError
        If ``matrix_rank`` is not a positive int, both names are given, ``shapes`` is malformed,
        ``start_iter`` is not an int >= 0 or ``min_compression_rate`` not a positive number.

    Examples
    --------
    >>> c = PowerSGD(matrix_rank=1, shapes=[(4, 4), (4,)])
    >>> x = np.concatenate([np.outer([1.0, 2.0, 3.0, 4.0], np.ones(4)).ravel(), [5.0, 6.0, 7.0, 8.0]])
    >>> payloads, ctx = c.compress(x, "w")
    >>> [p.size for p in payloads]  # P_hat (4) and the raw bias (4), then Q (4): 12 of 20 elements
    [8, 4]
    >>> np.allclose(c.decompress(payloads, ctx), x)  # a rank-1 matrix is rebuilt exactly
    True
    """

    __slots__ = ("r", "shapes", "warm_start", "start_iter", "min_compression_rate", "_qs", "_layouts", "_steps")
    error_feedback = True
    transport = "own"

    def __init__(self, matrix_rank=4, shapes=None, warm_start=True, seed=0, rank=None, start_iter=0,
                 min_compression_rate=1.0):
        super().__init__(seed)
        if rank is not None:
            if matrix_rank != 4:
                raise ValueError("give matrix_rank only (rank is its deprecated name), not both")
            warnings.warn("PowerSGD(rank=...) is deprecated: call it matrix_rank", DeprecationWarning,
                          stacklevel=2)
            matrix_rank = rank
        if not isinstance(matrix_rank, (int, np.integer)) or isinstance(matrix_rank, bool) or matrix_rank < 1:
            raise ValueError(f"matrix_rank must be an int >= 1, got {matrix_rank!r}")
        if shapes is not None:
            if any(len(s) == 0 or any(int(d) < 0 for d in s) for s in shapes):
                raise ValueError("shapes must be a list of non-empty tuples of sizes >= 0")
            shapes = [tuple(int(d) for d in s) for s in shapes]
        if not isinstance(start_iter, (int, np.integer)) or isinstance(start_iter, bool) or start_iter < 0:
            raise ValueError(f"start_iter must be an int >= 0, got {start_iter!r}")
        if (not isinstance(min_compression_rate, (int, float, np.integer, np.floating))
                or isinstance(min_compression_rate, bool) or not 0 < min_compression_rate < math.inf):
            raise ValueError(f"min_compression_rate must be a positive number, got {min_compression_rate!r}")
        self.r, self.shapes, self.warm_start = int(matrix_rank), shapes, bool(warm_start)
        self.start_iter, self.min_compression_rate = int(start_iter), float(min_compression_rate)
        self._qs = {}  # "name/piece" -> Q (m, r), identical on every rank
        self._layouts = {}
        self._steps = {}  # name -> calls so far (start_iter counts them)

    def compress(self, x, name):
        """Run PowerSGD on one rank; return ``([P_hat and raw pieces, Q], ctx)``.

        Parameters
        ----------
        x : ndarray, any shape, float32/float64
            The tensor (flattened in C order).
        name : str
            Its key (selects the warm-start Q).

        Returns
        -------
        payloads : list of ndarray
            ``[concat(P_hat.ravel() per matrix, raw pieces), concat(Q.ravel() per matrix)]``.
        ctx : dict
            Shape, dtype and the piece layout.
        """
        _, _, payloads, ctx, _, _ = self.reduce(x, name, lambda buf: buf, 1)
        return payloads, ctx

    def decompress(self, payloads, ctx):
        """Return ``P_hat Q^T`` per matrix and the raw pieces, as one tensor of ``ctx["shape"]``."""
        q_part = payloads[1] if len(payloads) > 1 else payloads[0][:0]  # before start_iter: one payload
        return self._rebuild(payloads[0], q_part, ctx).reshape(ctx["shape"])

    def reduce(self, x, name, allreduce_sum, size):
        """Run PowerSGD's two all-reduce rounds on this rank's ``x`` (Algorithm 1).

        Parameters
        ----------
        x : ndarray, any shape, float32/float64
            This rank's (error-compensated) tensor.
        name : str
            Its key.
        allreduce_sum : callable
            ``buf -> sum over ranks of buf`` for a 1-D array; the same call order on every rank.
        size : int
            Number of ranks P.

        Returns
        -------
        mean : ndarray
            The mean approximation ``P_hat Q^T``, shape and dtype of ``x``, the same on every rank
            (before ``start_iter``: the plain mean of ``x``).
        local : ndarray
            This rank's share ``P_hat Q_i^T`` (what error feedback subtracts), shape of ``x``
            (before ``start_iter``: ``x`` itself, so error feedback stores nothing).
        payloads : list of ndarray
            The two buffers this rank sent (bytes are counted from them).
        ctx : dict
            Shape, dtype and layout.
        compress_s, decompress_s : float
            Seconds spent compressing (products, QR) and rebuilding.

        Raises
        ------
        TypeError
            If ``x`` is float16 (QR in half precision).
        """
        xp = check_tensor(x, name)
        if x.dtype == np.float16:
            raise TypeError("x must be float32 or float64 for PowerSGD (QR in half precision)")
        t0 = time.perf_counter()
        flat = x.ravel()
        step = self._steps.get(name, 0)
        self._steps[name] = step + 1
        if step < self.start_iter:  # plain all-reduce; nothing is approximated, nothing is kept
            ctx = tensor_context(x, layout=[(0, flat.size, flat.size, 1, 0)])
            total = allreduce_sum(flat)
            t1 = time.perf_counter()
            mean = total * flat.dtype.type(1.0 / size)
            return mean.reshape(x.shape), x, [flat], ctx, 0.0, time.perf_counter() - t1
        ctx = tensor_context(x, layout=self._layout(name, flat.size))
        mats, ps, buf_p = self._p_round(flat, name, ctx["layout"], xp)
        compress_s = time.perf_counter() - t0
        sum_p = allreduce_sum(buf_p)
        t0 = time.perf_counter()
        p_hats, buf_q, off = self._q_round(mats, ps, sum_p, flat.dtype, xp)
        compress_s += time.perf_counter() - t0
        sum_q = allreduce_sum(buf_q)
        t0 = time.perf_counter()
        scale = flat.dtype.type(1.0 / size)
        p_part = _concat([p.ravel() for p in p_hats], flat.dtype, xp)
        mean = self._rebuild(xp.concatenate([p_part, sum_p[off:] * scale]), sum_q * scale, ctx)
        mine = xp.concatenate([p_part, buf_p[off:]])  # P_hat and this rank's raw pieces
        local = self._rebuild(mine, buf_q, ctx)
        decompress_s = time.perf_counter() - t0
        self._keep_q(name, ctx["layout"], sum_q * scale)
        return mean.reshape(x.shape), local.reshape(x.shape), [mine, buf_q], ctx, compress_s, decompress_s

    def _layout(self, name, n):
        """Return (and cache) the piece layout of tensor ``name`` with ``n`` elements."""
        key = (name, n)
        if key not in self._layouts:
            self._layouts[key] = matrix_layout(n, self.r, self.shapes, self.min_compression_rate)
        return self._layouts[key]

    def _p_round(self, flat, name, layout, xp):
        """Return the matrices M (n, m), their products P = M Q (n, r) and the P round's buffer.

        Q is last step's mean Q (warm start) or drawn from the shared seed; the buffer is every
        P, then the raw pieces sent uncompressed.
        """
        fresh = not self.warm_start or any(f"{name}/{i}" not in self._qs
                                           for i, p in enumerate(layout) if p[4])
        rng = self._rng(name, shared=True) if fresh else None
        mats, ps, raws = [], [], []
        for i, (a, b, rows, cols, r) in enumerate(layout):
            if not r:
                raws.append(flat[a:b])
                continue
            m = xp.zeros(rows * cols, flat.dtype)
            m[:b - a] = flat[a:b]
            m = m.reshape(rows, cols)  # (n, m)
            if fresh:
                q = xp.asarray(rng.standard_normal((cols, r)).astype(flat.dtype))
            else:
                q = xp.asarray(self._qs[f"{name}/{i}"])  # (m, r)
            mats.append(m)
            ps.append(m @ q)  # (n, r)
        return mats, ps, _concat([p.ravel() for p in ps] + raws, flat.dtype, xp)

    @staticmethod
    def _q_round(mats, ps, sum_p, dtype, xp):
        """Orthogonalize the summed P's and return ``(P_hats, Q round's buffer, end of the P's)``."""
        p_hats, q_locals, off = [], [], 0
        for m, p in zip(mats, ps):
            p_hat = xp.linalg.qr(sum_p[off:off + p.size].reshape(p.shape))[0]  # (n, r), orthonormal
            off += p.size
            p_hats.append(p_hat)
            q_locals.append(m.T @ p_hat)  # (m, r)
        return p_hats, _concat([q.ravel() for q in q_locals], dtype, xp), off

    def _rebuild(self, buf_p, buf_q, ctx):
        """Rebuild the flat tensor from the P_hat/raw buffer and the Q buffer."""
        xp = get_array_module(buf_p)
        out = xp.empty(ctx["size"], ctx["dtype"])
        off_p = off_q = 0
        raws = []
        for a, b, rows, cols, r in ctx["layout"]:
            if not r:
                raws.append((a, b))
                continue
            p = buf_p[off_p:off_p + rows * r].reshape(rows, r)
            q = buf_q[off_q:off_q + cols * r].reshape(cols, r)
            off_p, off_q = off_p + rows * r, off_q + cols * r
            out[a:b] = (p @ q.T).ravel()[:b - a]  # (n, m), padding dropped
        for a, b in raws:
            out[a:b] = buf_p[off_p:off_p + b - a]
            off_p += b - a
        return out

    def _keep_q(self, name, layout, q_all):
        """Store the mean Q of every matrix for the warm start (dropped when all zero)."""
        off = 0
        xp = get_array_module(q_all)
        for i, (_, _, _, cols, r) in enumerate(layout):
            if not r:
                continue
            q = q_all[off:off + cols * r].reshape(cols, r)
            off += cols * r
            if bool(xp.any(q != 0)):
                self._qs[f"{name}/{i}"] = q.copy()
            else:  # a zero gradient: start again from a random Q next step
                self._qs.pop(f"{name}/{i}", None)

    def state_dict(self):
        """Return the counters, the calls per name (``"step/<name>"``) and the warm-start Qs (``"q/<name>/<piece>"``)."""
        state = super().state_dict()
        state.update({"step/" + k: np.array(v, np.int64) for k, v in self._steps.items()})
        state.update({"q/" + k: v.copy() for k, v in self._qs.items()})
        return state

    def load_state_dict(self, state):
        """Restore the counters, the calls per name and the warm-start Qs."""
        super().load_state_dict(state)
        self._steps = {k[5:]: int(v) for k, v in state.items() if k.startswith("step/")}
        self._qs = {k[2:]: v.copy() for k, v in state.items() if k.startswith("q/")}

    def __repr__(self):
        return (f"PowerSGD(matrix_rank={self.r}, warm_start={self.warm_start}, seed={self.seed}, "
                f"start_iter={self.start_iter}, min_compression_rate={self.min_compression_rate:g})")


def _concat(parts, dtype, xp):
    """Concatenate 1-D arrays (an empty array of ``dtype`` when there are none)."""
    return xp.concatenate(parts) if parts else xp.zeros(0, dtype)
