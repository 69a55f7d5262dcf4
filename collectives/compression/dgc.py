"""Deep Gradient Compression (Lin et al. 2018): top-k with momentum correction, local gradient
clipping, momentum factor masking and an exponential warm-up of the sparsity."""
import math

import numpy as np

from .base import Memory
from commlab.arrays import get_array_module
from .sparse import TopK, resolve_k

__all__ = ["DGC", "DGCMemory"]


class DGCMemory(Memory):
    """Momentum correction and momentum factor masking: DGC's memory.

    ``compensate``: clip ``g`` to the L2 norm ``clip_norm / sqrt(P)`` (local gradient
    clipping), then ``u <- m u + g`` and ``v <- v + u``; return ``v``. ``update``: ``v <- v - sent``
    and ``u`` set to 0 where an element was sent (momentum factor masking). Transmitted values plus
    ``v`` therefore add up to the sum of the momentum-corrected ``u``; with ``momentum = 0`` this is
    plain error feedback. Lin et al. 2018, "Deep Gradient Compression", Sec. 3.2 and Algorithm 1.
    The optimizer then applies the aggregated update without momentum of its own
    (``owns_momentum``).

    Parameters
    ----------
    momentum : float
        Momentum factor ``m`` in [0, 1).
    clip_norm : float or None
        Global L2 clipping threshold (> 0); None: no clipping.
    size : int
        Number of ranks P (>= 1); each clips at ``clip_norm / sqrt(P)``.

    Raises
    ------
    ValueError
        If an argument is out of range.

    Examples
    --------
    >>> mem = DGCMemory(momentum=0.5)
    >>> v = mem.compensate(np.array([1.0, 2.0]), "w")  # u = v = g at first
    >>> mem.update(v, "w", np.array([0.0, 2.0]))  # element 1 sent: its v and u are cleared
    >>> mem.compensate(np.array([2.0, 2.0]), "w")  # u = 0.5 u + g = (2.5, 2), v = v + u
    array([3.5, 2. ])
    """

    __slots__ = ("momentum", "clip_norm", "size", "velocities", "momenta")
    owns_momentum = True

    def __init__(self, momentum=0.9, clip_norm=None, size=1):
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0 or None, got {clip_norm!r}")
        if not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"size must be an int >= 1, got {size!r}")
        self.momentum = float(momentum)
        self.clip_norm = None if clip_norm is None else float(clip_norm)
        self.size = int(size)
        self.velocities = {}  # v: accumulated, not yet sent
        self.momenta = {}  # u: momentum-corrected gradient

    def compensate(self, x, name):
        """Return the accumulated velocity ``v`` of ``name`` after adding this step's ``x``.

        Parameters
        ----------
        x : ndarray, any shape, float
            This step's gradient.
        name : str
            The tensor's key.

        Returns
        -------
        ndarray
            ``v``, same shape and dtype as ``x`` (a new array).
        """
        xp = get_array_module(x)
        if self.clip_norm is not None:
            bound = self.clip_norm / math.sqrt(self.size)
            norm = float(xp.sqrt(xp.sum(x.astype(np.float64) ** 2)))
            if norm > bound:
                x = x * x.dtype.type(bound / norm)
        u = self.momenta.get(name)
        if u is not None and u.shape != x.shape:
            raise ValueError(f"x: shape {x.shape} does not match the memory of {name!r} {u.shape}")
        u = x.copy() if u is None else xp.asarray(u) * x.dtype.type(self.momentum) + x
        v = self.velocities.get(name)
        v = u.copy() if v is None else xp.asarray(v) + u
        self.momenta[name] = u
        return v

    def update(self, x, name, compressed_then_decompressed):
        """Keep ``x - sent`` as ``v`` and zero ``u`` where an element was sent."""
        sent = compressed_then_decompressed
        mask = sent != 0
        self.velocities[name] = x - sent
        u = self.momenta[name]
        u[mask] = 0

    def state_dict(self):
        """Return ``{"velocity/<name>": v, "momentum/<name>": u}``."""
        state = {"velocity/" + k: v.copy() for k, v in self.velocities.items()}
        state.update({"momentum/" + k: u.copy() for k, u in self.momenta.items()})
        return state

    def load_state_dict(self, state):
        """Restore ``v`` and ``u`` written by ``state_dict``."""
        self.velocities = {k[9:]: v.copy() for k, v in state.items() if k.startswith("velocity/")}
        self.momenta = {k[9:]: v.copy() for k, v in state.items() if k.startswith("momentum/")}


class DGC(TopK):
    """Deep Gradient Compression: top-k of the momentum-corrected velocity, with sparsity warm-up.

    The kept fraction starts at 25% and falls exponentially to ``ratio`` over ``warmup_steps`` steps
    (the paper's 75%, 93.75%, ..., 99.9% schedule over the first epochs, made continuous). Pair it with
    ``DGCMemory`` (``make_hook`` does). The threshold is found exactly (``argpartition``) rather than
    by the paper's sampling. Lin et al. 2018, "Deep Gradient Compression: Reducing the Communication
    Bandwidth for Distributed Training", Sec. 3 and 4 (warm-up training).

    Parameters
    ----------
    ratio : float
        Final fraction of elements kept, in (0, 1].
    k : int or None
        Final number kept (>= 1); overrides ``ratio``.
    momentum : float
        Momentum of the memory ``make_memory`` builds, in [0, 1).
    clip_norm : float or None
        Global clipping threshold of that memory (> 0), or None.
    warmup_steps : int
        Steps of sparsity warm-up (>= 0); 0 starts at ``ratio``.
    seed : int
        Unused; kept for the common constructor.

    Examples
    --------
    >>> c = DGC(k=1)
    >>> c.make_memory(size=4)  # doctest: +ELLIPSIS
    <collectives.compression.dgc.DGCMemory object at ...>
    >>> payloads, ctx = c.compress(np.array([0.5, -2.0, 1.0], np.float32), "w")
    >>> c.decompress(payloads, ctx)
    array([ 0., -2.,  0.], dtype=float32)
    """

    __slots__ = ("momentum", "clip_norm", "warmup_steps")

    def __init__(self, ratio=0.001, k=None, momentum=0.9, clip_norm=None, warmup_steps=0, seed=0):
        super().__init__(ratio=ratio, k=k, seed=seed)
        if not isinstance(warmup_steps, (int, np.integer)) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an int >= 0, got {warmup_steps!r}")
        DGCMemory(momentum, clip_norm)  # validates momentum and clip_norm
        self.momentum, self.clip_norm = float(momentum), clip_norm
        self.warmup_steps = int(warmup_steps)

    def make_memory(self, size=1):
        """Return the ``DGCMemory`` this compressor works with (``size``: number of ranks P)."""
        return DGCMemory(self.momentum, self.clip_norm, size)

    def _keep(self, n, name):
        """Return this step's k: the warm-up fraction until ``warmup_steps``, then the final one."""
        final = resolve_k(n, self.ratio, self.k)
        step = self._iteration(name)
        if step >= self.warmup_steps or n == 0:
            return final
        start = 0.25 * n
        if start <= final:
            return final
        frac = step / self.warmup_steps
        return resolve_k(n, 1.0, int(math.ceil(start * (final / start) ** frac)))

    def __repr__(self):
        return (f"DGC(ratio={self.ratio}, k={self.k}, momentum={self.momentum}, "
                f"clip_norm={self.clip_norm}, warmup_steps={self.warmup_steps})")
