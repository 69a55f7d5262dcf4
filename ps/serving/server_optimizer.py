"""Server-side state: the learning-rate rule of a shard's updates, and what its checkpoint holds.

The optimizer runs on the server (ps-lite's server-side update, Li et al., OSDI 2014, section 3.2):
workers push gradients, servers own the parameters and the optimizer state of their shard. The
update rule itself (SGD with momentum, Adam...) is the caller's: the server is handed a factory
that builds an optimizer over the shard's flat buffers, and decides only the step size:

* the learning-rate schedule over the training progress: the rule ``lr_at(pushes, horizon)`` the
  caller hands it (the trainer hands ``training.model.optim.lr_rule``, the one implementation its
  data-parallel driver uses as well), else the constant ``lr``;
* the staleness-aware learning rate (Zhang, Gupta, Lian and Liu, "Staleness-aware Async-SGD for
  Distributed Deep Learning", IJCAI 2016, section 3): the step of a gradient whose staleness is
  ``tau`` clocks is ``lr / max(1, tau)``;
* the divisor ``W`` of a single worker's push under ASP (BSP and SSP apply one update per clock,
  on the mean of the clock's ``W`` gradients).

``state_dict()`` gives plain arrays; the server writes them with :func:`commlab.file_formats.write_npz`
(atomic, no pickle, SHA-256 inside) and reads them back verified.
"""

import numpy as np

__all__ = ["ServerOptimizer"]

_PREFIX = "optim/"  # checkpoint keys of the optimizer state, beside the server's own (as the trainer's)
_OLD_PREFIX = "opt_"  # the same keys in server checkpoints written before they matched the trainer's


class ServerOptimizer:
    """Update one shard in place with the caller's optimizer, at the parameter server's step size.

    Parameters
    ----------
    params : ndarray, shape (n,), float32 or float64
        The shard, updated in place by :meth:`step`.
    make_optimizer : callable
        ``make_optimizer(params, grads) -> optimizer`` over the flat shard and a gradient buffer of
        the same shape and dtype. The optimizer has the interface of :mod:`training.model.optim`: a
        ``lr`` attribute (set here before every update), ``step()`` (one update of ``params``
        from ``grads``), ``state_dict()`` and ``load_state_dict()``.
    lr : float
        Base learning rate (dimensionless step size), > 0: the step size when ``lr_at`` is None.
    lr_at : callable, optional
        ``lr_at(step, total_steps) -> float``: the caller's learning-rate schedule over the pushes.
    staleness_lr : bool
        Divide the step by ``max(1, tau)`` (Zhang et al. 2016).

    Raises
    ------
    ValueError
        When an argument is out of range (the message names it).
    TypeError
        When ``make_optimizer`` is not callable.

    Examples
    --------
    The step size of an ASP push (``W = 2``) whose gradient is 4 clocks stale:

    >>> opt = ServerOptimizer(np.zeros(2), lambda params, grads: None, lr=0.4, staleness_lr=True)
    >>> opt.rate(staleness=4, divisor=2)  # 0.4 / 2 / 4
    0.05
    """

    __slots__ = ("lr", "lr_at", "staleness_lr", "grads", "optimizer")

    def __init__(self, params, make_optimizer, lr=0.1, lr_at=None, staleness_lr=False):
        if not callable(make_optimizer):
            raise TypeError(f"make_optimizer must be callable, got {type(make_optimizer).__name__}")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if lr_at is not None and not callable(lr_at):
            raise TypeError(f"lr_at must be callable (step, total_steps) -> float, got {type(lr_at).__name__}")
        self.lr, self.lr_at, self.staleness_lr = float(lr), lr_at, bool(staleness_lr)
        self.grads = np.zeros_like(params)  # the gradient of the update being applied, shape (n,)
        self.optimizer = make_optimizer(params, self.grads)

    @property
    def steps(self):
        """Updates applied to this shard (int)."""
        return self.optimizer.steps

    def rate(self, step=0, total_steps=0, staleness=0, divisor=1):
        """Return the step size for this update.

        Parameters
        ----------
        step : int
            Pushes folded into the shard before this update (the schedule's progress).
        total_steps : int
            Pushes over which the schedule runs (the horizon); 0 keeps the base rate.
        staleness : float
            Staleness ``tau`` of the gradient (clocks); used when ``staleness_lr`` is set.
        divisor : int
            ``W`` for a single worker's push under ASP (one push is ``1 / W`` of a clock's
            update), 1 for the one update per clock of BSP and SSP. Dividing (rather than
            multiplying by ``1 / W``) keeps ``lr = W`` an exact unit step.

        Returns
        -------
        float
        """
        lr = (self.lr if self.lr_at is None else self.lr_at(step, total_steps)) / divisor
        if self.staleness_lr:
            lr /= max(1.0, float(staleness))
        return lr

    def step(self, grad, lr):
        """Apply one update to the shard in place with the optimizer at step size ``lr``.

        Parameters
        ----------
        grad : ndarray, shape (n,)
            Gradient of the shard (same dtype); copied, not modified.
        lr : float
            Step size from :meth:`rate`.
        """
        self.grads[...] = grad
        self.optimizer.lr = lr
        self.optimizer.step()

    def state_dict(self):
        """Return the optimizer's checkpointable state, keys prefixed ``optim/`` (arrays only)."""
        return {_PREFIX + k: np.array(v, copy=True) for k, v in self.optimizer.state_dict().items()}

    def load_state_dict(self, state):
        """Restore :meth:`state_dict` output (other keys of ``state`` are ignored).

        Checkpoints written with the former ``opt_`` prefix load as well.

        Raises
        ------
        ValueError
            When the saved state does not fit this shard's optimizer (length or update rule).
        """
        prefix = _PREFIX if any(k.startswith(_PREFIX) for k in state) else _OLD_PREFIX
        mine = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        want = set(self.optimizer.state_dict())
        if set(mine) != want:
            raise ValueError(f"checkpoint optimizer state holds {sorted(mine)}, this shard's optimizer "
                             f"needs {sorted(want)} (same optimizer and momentum?)")
        try:
            self.optimizer.load_state_dict(mine)
        except ValueError as e:
            raise ValueError(f"checkpoint optimizer state does not fit this shard: {e} "
                             f"(same servers, model and optimizer?)") from None
