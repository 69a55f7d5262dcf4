"""Server-side state: the optimizer that updates a shard, and what its checkpoint holds.

The optimizer runs on the server (ps-lite's server-side update, Li et al., OSDI 2014, section 3.2):
workers push gradients, servers own the parameters and the optimizer state of their shard.

* SGD with momentum (Polyak 1964, in the form ``v = mu v + g; w -= lr v`` used by PyTorch);
* Adam (Kingma and Ba, ICLR 2015, algorithm 1), for configurations that ask for it;
* staleness-aware learning rate (Zhang, Gupta, Lian and Liu, "Staleness-aware Async-SGD for
  Distributed Deep Learning", IJCAI 2016, section 3): the step of a gradient whose staleness is
  ``tau`` clocks is ``lr / max(1, tau)``.

``state_dict()`` gives plain arrays; the server writes them with the trainer's checkpoint writer
(``training.checkpoint.write_npz``: atomic, no pickle, SHA-256 inside) and reads them back verified.
"""
import math

import numpy as np

__all__ = ["ServerOptimizer"]

_OPTIMIZERS = ("sgd", "adam")


class ServerOptimizer:
    """Update one shard in place with SGD-momentum or Adam, with optional staleness-aware steps.

    Parameters
    ----------
    size : int
        Shard length (elements).
    dtype : numpy.dtype
        Parameter dtype (float32 or float64).
    kind : {"sgd", "adam"}
        Update rule.
    lr : float
        Base learning rate (dimensionless step size), > 0.
    momentum : float
        SGD momentum coefficient in [0, 1).
    weight_decay : float
        L2 coefficient added to the gradient (``g + weight_decay * w``), >= 0.
    betas : tuple of float
        Adam moment decay rates, each in [0, 1).
    eps : float
        Adam denominator floor, > 0.
    schedule : {"constant", "cosine"}
        Learning-rate schedule over the training progress (0 .. 1).
    staleness_lr : bool
        Divide the step by ``max(1, tau)`` (Zhang et al. 2016).

    Raises
    ------
    ValueError
        When an argument is out of range (the message names it).
    """

    __slots__ = ("kind", "lr", "momentum", "weight_decay", "betas", "eps", "schedule",
                 "staleness_lr", "steps", "m", "v", "_tmp", "_tmp2")

    def __init__(self, size, dtype, kind="sgd", lr=0.1, momentum=0.0, weight_decay=0.0,
                 betas=(0.9, 0.999), eps=1e-8, schedule="constant", staleness_lr=False):
        if kind not in _OPTIMIZERS:
            raise ValueError(f"kind must be one of {_OPTIMIZERS}, got {kind!r}")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        if schedule not in ("constant", "cosine"):
            raise ValueError(f"schedule must be 'constant' or 'cosine', got {schedule!r}")
        self.kind, self.lr, self.momentum = kind, float(lr), float(momentum)
        self.weight_decay, self.betas, self.eps = float(weight_decay), tuple(betas), float(eps)
        self.schedule, self.staleness_lr = schedule, bool(staleness_lr)
        self.steps = 0  # updates applied to this shard
        self.m = np.zeros(size, dtype=dtype)  # momentum buffer (SGD) or first moment (Adam)
        self.v = np.zeros(size if kind == "adam" else 0, dtype=dtype)  # Adam second moment
        self._tmp = np.empty(size, dtype=dtype)  # scratch: no temporaries per update
        self._tmp2 = np.empty(size if weight_decay else 0, dtype=dtype)

    def rate(self, progress=0.0, staleness=0, divisor=1):
        """Return the step size for this update.

        Parameters
        ----------
        progress : float
            Fraction of the training budget spent, in [0, 1] (cosine schedule).
        staleness : float
            Staleness ``tau`` of the gradient (clocks); used when ``staleness_lr`` is set.
        divisor : int
            ``W`` for a single worker's push under ASP and SSP (one push is ``1 / W`` of a
            clock's update), 1 for BSP's aggregated update. Dividing (rather than multiplying by
            ``1 / W``) keeps ``lr = W`` an exact unit step.
        """
        lr = self.lr / divisor
        if self.schedule == "cosine":
            lr *= 0.5 * (1.0 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))
        if self.staleness_lr:
            lr /= max(1.0, float(staleness))
        return lr

    def step(self, params, grad, lr):
        """Apply one update to ``params`` in place (the trainer's arithmetic, operation by operation).

        Parameters
        ----------
        params : ndarray, shape (n,)
            Shard parameters, updated in place.
        grad : ndarray, shape (n,)
            Gradient of the shard (same dtype); not modified.
        lr : float
            Step size from :meth:`rate`.
        """
        tmp = self._tmp
        if self.weight_decay:
            np.multiply(params, self.weight_decay, out=tmp)
            grad = np.add(grad, tmp, out=self._tmp2)
        self.steps += 1
        if self.kind == "sgd":
            if self.momentum:
                self.m *= self.momentum
                self.m += grad
                grad = self.m
            np.multiply(grad, lr, out=tmp)
            params -= tmp
            return
        b1, b2 = self.betas
        self.m *= b1
        np.multiply(grad, 1 - b1, out=tmp)
        self.m += tmp
        self.v *= b2
        np.multiply(grad, grad, out=tmp)
        tmp *= 1 - b2
        self.v += tmp
        np.sqrt(self.v, out=tmp)
        tmp *= 1.0 / math.sqrt(1 - b2 ** self.steps)
        tmp += self.eps
        np.divide(self.m, tmp, out=tmp)
        tmp *= lr / (1 - b1 ** self.steps)
        params -= tmp

    def state_dict(self):
        """Return the checkpointable state (arrays only, no pickle needed)."""
        return {"opt_m": self.m.copy(), "opt_v": self.v.copy(),
                "opt_steps": np.array(self.steps, dtype=np.int64)}

    def load_state_dict(self, state):
        """Restore :meth:`state_dict` output.

        Raises
        ------
        ValueError
            When the saved moments do not match this shard's length.
        """
        if state["opt_m"].shape != self.m.shape or state["opt_v"].shape != self.v.shape:
            raise ValueError(f"checkpoint optimizer state has shape {state['opt_m'].shape}, "
                             f"this shard needs {self.m.shape} (same servers, model and optimizer?)")
        self.m[:] = state["opt_m"]
        self.v[:] = state["opt_v"]
        self.steps = int(state["opt_steps"])
