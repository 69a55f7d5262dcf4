"""The compressor contract, the error-feedback memory and the utilities every compressor shares.

A compressor turns one tensor into the list of arrays that go on the wire and back::

    payloads, ctx = compressor.compress(x, name)     # payloads: list of arrays, counted byte by byte
    y = compressor.decompress(payloads, ctx)         # same shape and dtype as x

``ctx`` holds only what every rank knows without being told (shape, dtype, indices drawn from the
shared seed), so one rank can decompress another rank's payloads with its own ``ctx``. Error feedback
is not part of a compressor: it lives in a separate memory keyed by ``name`` (the contract follows
Horovod and GRACE, Xu et al. 2021, "GRACE: A Compressed Communication Framework for Distributed
Machine Learning").
"""
import zlib

import numpy as np

from commlab.arrays import get_array_module

__all__ = ["Compressor", "Memory", "ErrorFeedback", "TRANSPORTS", "check_tensor", "payload_nbytes",
           "tensor_context"]

_FLOATS = (np.float16, np.float32, np.float64)

#: How a compressor's payloads travel (``Compressor.transport``), as GRACE's communicators:
#: ``"allreduce"`` sums them element-wise (decompression is linear, shapes agree on every rank);
#: ``"allgather"`` gathers them (same sizes on every rank) and ``"allgatherv"`` (sizes differ),
#: then :meth:`Compressor.aggregate` decompresses and averages; ``"own"``: the compressor runs its
#: own pattern of all-reduce rounds in :meth:`Compressor.reduce` (PowerSGD).
TRANSPORTS = ("allreduce", "allgather", "allgatherv", "own")


def check_tensor(x, name):
    """Check a tensor handed to ``compress`` and return its array module.

    Parameters
    ----------
    x : ndarray, any shape, float16/float32/float64
        The tensor.
    name : str
        Its key in per-tensor state.

    Returns
    -------
    module
        NumPy or CuPy.

    Raises
    ------
    TypeError
        If ``x`` is not a floating-point array or ``name`` is not a string.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    dtype = getattr(x, "dtype", None)
    if dtype is None or dtype.type not in _FLOATS:
        raise TypeError(f"x must be a float16/float32/float64 array, got {dtype}")
    return get_array_module(x)


def payload_nbytes(payloads):
    """Return the bytes on the wire for a list of payload arrays (int).

    Examples
    --------
    >>> payload_nbytes([np.zeros(3, np.float32), np.zeros(2, np.int8)])
    14
    """
    return int(sum(int(p.nbytes) for p in payloads))


def tensor_context(x, **extra):
    """Return the context of a compressed ``x``: its shape, dtype and size plus compressor-specific items.

    Every compressor's ``compress`` returns it beside the payloads; ``decompress`` reads it back.
    ``extra`` holds what the compressor adds (rank-independent: indices, a layout).

    Parameters
    ----------
    x : ndarray, any shape
        The tensor being compressed.
    **extra
        Compressor-specific items.

    Returns
    -------
    dict
        ``{"shape": tuple, "dtype": numpy.dtype, "size": int, **extra}``.

    Examples
    --------
    >>> tensor_context(np.zeros((2, 3), np.float32), k=2)
    {'shape': (2, 3), 'dtype': dtype('float32'), 'size': 6, 'k': 2}
    """
    ctx = {"shape": tuple(x.shape), "dtype": x.dtype, "size": int(x.size)}
    ctx.update(extra)
    return ctx


class Compressor:
    """Base class of every compressor: the contract, a per-name step counter and a shared RNG.

    Randomness is counter based: the generator for one call is seeded from (``seed``, ``name``, how
    many times ``name`` has been compressed, stream). The shared stream (indices of random-k, PowerSGD's
    first Q) is identical on every rank; the rank stream (stochastic rounding) is independent between
    ranks, so the rounding noise averages out. The state is the counter, so a resumed run draws the
    same numbers.

    Parameters
    ----------
    seed : int
        Seed, the same on every rank (>= 0).

    Attributes
    ----------
    transport : str
        Class attribute: how the payloads travel, one of ``TRANSPORTS`` (default ``"allgather"``).
    error_feedback : bool
        Class attribute: error feedback is on by default (``make_hook``).
    comm_rank : int
        This process's rank, set by the communication layer; selects the per-rank RNG stream.

    Examples
    --------
    The contract, on a concrete compressor (half precision):

    >>> from collectives.compression import FP16Compressor
    >>> c = FP16Compressor()
    >>> (a, ctx), (b, _) = c.compress(np.array([1.0, 2.0]), "g"), c.compress(np.array([3.0, 6.0]), "g")
    >>> c.decompress(a, ctx)
    array([1., 2.])
    >>> c.aggregate([a, b], ctx)  # the mean over two ranks' payloads
    array([2., 4.])
    """

    __slots__ = ("seed", "comm_rank", "_counts")
    transport = "allgather"
    error_feedback = False

    def __init__(self, seed=0):
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        self.seed = int(seed)
        self.comm_rank = 0
        self._counts = {}

    def compress(self, x, name):
        """Compress ``x``; return ``(payloads, ctx)``. Abstract."""
        raise NotImplementedError("abstract method: a compressor must implement compress")

    def decompress(self, payloads, ctx):
        """Rebuild a tensor from ``payloads`` and ``ctx``. Abstract."""
        raise NotImplementedError("abstract method: a compressor must implement decompress")

    def aggregate(self, gathered, ctx):
        """Average the tensors of all ranks from their gathered payloads.

        Parameters
        ----------
        gathered : list of list of ndarray
            ``gathered[r]`` is rank ``r``'s payload list.
        ctx : dict
            This rank's context (valid for every rank's payloads).

        Returns
        -------
        ndarray
            The mean over ranks of the decompressed tensors, shape and dtype of ``ctx``.
        """
        out = self.decompress(gathered[0], ctx)
        for payloads in gathered[1:]:
            out = out + self.decompress(payloads, ctx)
        return out / len(gathered)

    def reduce(self, x, name, allreduce_sum, size):
        """Average ``x`` over the ranks with the compressor's own rounds (``transport == "own"``).

        Parameters
        ----------
        x : ndarray, any shape, float
            This rank's (error-compensated) tensor.
        name : str
            Its key.
        allreduce_sum : callable
            ``buf -> sum over ranks of buf`` for a 1-D array; the same call order on every rank.
        size : int
            Number of ranks P.

        Returns
        -------
        tuple
            ``(mean, local, payloads, ctx, compress_s, decompress_s)``: the mean over ranks and this
            rank's own decompressed share (shape and dtype of ``x``), the buffers this rank sent,
            the context, and the seconds spent compressing and rebuilding. Abstract.
        """
        raise NotImplementedError("abstract method: a compressor with transport 'own' must implement reduce")

    def make_memory(self, size=1):
        """Return the memory this compressor uses by default: ``ErrorFeedback`` or None.

        Parameters
        ----------
        size : int
            Number of ranks P (used by memories that scale with it).
        """
        return ErrorFeedback() if self.error_feedback else None

    def state_dict(self):
        """Return the state as a flat dict of str -> ndarray (no pickle)."""
        state = {"seed": np.array(self.seed, np.int64)}
        for name, count in self._counts.items():
            state["iteration/" + name] = np.array(count, np.int64)
        return state

    def load_state_dict(self, state):
        """Restore the state written by ``state_dict``.

        Raises
        ------
        ValueError
            If ``state`` was written with another seed.
        """
        if "seed" in state and int(state["seed"]) != self.seed:
            raise ValueError(f"state: seed {int(state['seed'])} does not match {self.seed}")
        self._counts = {k[len("iteration/"):]: int(v) for k, v in state.items()
                        if k.startswith("iteration/")}

    def _rng(self, name, shared):
        """Return the generator for this call of ``name`` and advance its counter."""
        count = self._counts.get(name, 0)
        self._counts[name] = count + 1
        stream = 0 if shared else self.comm_rank + 1
        return np.random.default_rng([self.seed, zlib.crc32(name.encode()), count, stream])

    def _iteration(self, name):
        """Return how many times ``name`` has been compressed so far."""
        return self._counts.get(name, 0)

    def __repr__(self):
        return f"{type(self).__name__}(seed={self.seed})"


class Memory:
    """Base class of the memories that carry what compression dropped into the next step.

    Attributes
    ----------
    owns_momentum : bool
        Class attribute: the memory applies momentum itself (DGC's momentum correction), so the
        optimizer must run without momentum of its own.
    """

    __slots__ = ()
    owns_momentum = False

    def compensate(self, x, name):
        """Return the tensor to compress: ``x`` corrected by the memory of ``name``. Abstract."""
        raise NotImplementedError("abstract method: a memory must implement compensate")

    def update(self, x, name, compressed_then_decompressed):
        """Remember what compression of ``x`` dropped. Abstract."""
        raise NotImplementedError("abstract method: a memory must implement update")

    def state_dict(self):
        """Return the state as a flat dict of str -> ndarray. Abstract."""
        raise NotImplementedError("abstract method: a memory must implement state_dict")

    def load_state_dict(self, state):
        """Restore the state written by ``state_dict``. Abstract."""
        raise NotImplementedError("abstract method: a memory must implement load_state_dict")


class ErrorFeedback(Memory):
    """Error feedback: add last step's compression error to this step's gradient.

    ``compensate`` returns ``p = x + e`` and ``update(p, name, c)`` stores ``e = p - c``, where ``c`` is
    what the receivers rebuild from this rank's payloads. Over steps, everything transmitted plus the
    residual equals the sum of the gradients (mass conservation). Seide et al. 2014, "1-bit SGD",
    Sec. 3; Karimireddy et al. 2019, "Error Feedback Fixes SignSGD", Algorithm 2.

    Examples
    --------
    >>> ef = ErrorFeedback()
    >>> p = ef.compensate(np.array([1.0, 2.0]), "w")  # no residual yet: a copy of x
    >>> ef.update(p, "w", np.array([0.0, 2.0]))  # the receivers got 0.0 for the first element
    >>> ef.compensate(np.array([1.0, 1.0]), "w")  # the dropped 1.0 is added back
    array([2., 1.])
    """

    __slots__ = ("residuals",)

    def __init__(self):
        self.residuals = {}

    def compensate(self, x, name):
        """Return ``x`` plus the residual of ``name`` (a new array; zero residual at first).

        Parameters
        ----------
        x : ndarray, any shape, float
            This step's gradient.
        name : str
            The tensor's key.

        Returns
        -------
        ndarray
            Same shape and dtype as ``x``.

        Raises
        ------
        ValueError
            If the stored residual has another shape.
        """
        res = self.residuals.get(name)
        if res is None:
            return x.copy()
        res = get_array_module(x).asarray(res)  # a residual restored from a host checkpoint
        if res.shape != x.shape:
            raise ValueError(f"x: shape {x.shape} does not match the residual of {name!r} {res.shape}")
        return x + res

    def update(self, x, name, compressed_then_decompressed):
        """Store ``x - compressed_then_decompressed`` as the residual of ``name``.

        Parameters
        ----------
        x : ndarray
            The compensated tensor that was compressed.
        name : str
            The tensor's key.
        compressed_then_decompressed : ndarray, shape of x
            What the receivers rebuild from this rank's payloads.
        """
        if compressed_then_decompressed.shape != x.shape:
            raise ValueError("compressed_then_decompressed: shape does not match x")
        self.residuals[name] = x - compressed_then_decompressed

    def state_dict(self):
        """Return ``{"residual/<name>": ndarray}``."""
        return {"residual/" + k: v.copy() for k, v in self.residuals.items()}

    def load_state_dict(self, state):
        """Restore the residuals written by ``state_dict``."""
        self.residuals = {k[len("residual/"):]: v.copy() for k, v in state.items()
                          if k.startswith("residual/")}
