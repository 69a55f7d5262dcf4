"""Optimizers that update the flat parameter array in place from the flat gradient array.

Both work on whole flat buffers (one ufunc per operation for the entire model) and process them in
cache-sized chunks so that the several passes of an update read each element from memory once.
State is exposed as ``state_dict()`` / ``load_state_dict()`` so checkpoints capture it exactly.
"""
import abc
import functools
import math

import numpy

from commlab.arrays import get_array_module

__all__ = ["Optimizer", "SGD", "Adam", "Adagrad", "optimizer_factory", "make_optimizer", "SCHEDULES", "schedule_lr", "lr_rule"]

SCHEDULES = ("constant", "cosine")  #: learning-rate schedules of :func:`schedule_lr`

_CHUNK = 1 << 16  # elements per chunk: Adam's six arrays of this size (1.5 MiB in float32) stay in L2 cache


class Optimizer(abc.ABC):
    """Base class over a flat parameter array ``params`` and gradient array ``grads``.

    Parameters
    ----------
    params, grads : ndarray, shape (n,), float32 or float64
        The model's flat buffers (``Sequential.params`` and ``Sequential.grads``).
    lr : float
        Learning rate (dimensionless step size); may be changed between steps.
    weight_decay : float
        L2 coefficient: ``weight_decay * w`` is added to the gradient before the update.
    """

    def __init__(self, params, grads, lr, weight_decay=0.0):
        if params.shape != grads.shape or params.ndim != 1:
            raise ValueError(f"params and grads must be 1-D of one shape, got {params.shape}, {grads.shape}")
        if params.dtype != grads.dtype or params.dtype.kind != "f":
            raise TypeError(f"params and grads must share a float dtype, got {params.dtype}, {grads.dtype}")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr!r}")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
        self.params, self.grads = params, grads
        self.lr, self.weight_decay = float(lr), float(weight_decay)
        self.steps = 0
        xp = get_array_module(params)
        self._tmp = xp.empty(min(_CHUNK, params.size), params.dtype)
        self._tmp2 = xp.empty_like(self._tmp)

    def zero_grad(self):
        """Set the flat gradient array to zero."""
        self.grads.fill(0)

    def step(self):
        """Apply one update to ``params`` from ``grads``."""
        n = self.params.size
        for lo in range(0, n, _CHUNK):
            hi = min(lo + _CHUNK, n)
            self._update(lo, hi, self._tmp[:hi - lo], self._tmp2[:hi - lo])
        self.steps += 1

    @abc.abstractmethod
    def _update(self, lo, hi, tmp, tmp2):
        """Update ``params[lo:hi]`` from ``grads[lo:hi]`` using the scratch views ``tmp`` and ``tmp2``."""
        raise NotImplementedError

    def _state_arrays(self):
        return {}

    def state_dict(self):
        """Return the optimizer state as a flat dict of str -> ndarray (checkpoint-ready)."""
        d = {"steps": numpy.array(self.steps, numpy.int64)}
        d.update(self._state_arrays())
        return d

    def load_state_dict(self, d):
        """Restore the state saved by :meth:`state_dict` (arrays are copied in place).

        Raises
        ------
        ValueError
            When a key is missing or an array has the wrong shape.
        """
        own = self._state_arrays()
        for key in ["steps", *own]:
            if key not in d:
                raise ValueError(f"optimizer state lacks {key!r}")
        self.steps = int(d["steps"])
        for key, arr in own.items():
            if tuple(d[key].shape) != arr.shape:
                raise ValueError(f"optimizer state {key!r} has shape {d[key].shape}, expected {arr.shape}")
            arr[...] = get_array_module(arr).asarray(d[key])


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, in PyTorch's form.

    ``g = grad + wd * w;  v = momentum * v + g;  w = w - lr * v`` (Sutskever et al., ICML 2013,
    eq. 1, with the learning rate moved out of the velocity as in ``torch.optim.SGD``). With
    ``momentum = 0`` it is plain SGD.

    Examples
    --------
    >>> params, grads = numpy.array([1.0, 2.0]), numpy.array([0.5, -1.0])
    >>> opt = SGD(params, grads, lr=0.5, momentum=0.5)
    >>> opt.step(); params  # v = g
    array([0.75, 2.5 ])
    >>> opt.step(); params  # v = 0.5 v + g
    array([0.375, 3.25 ])
    """

    def __init__(self, params, grads, lr=0.1, momentum=0.9, weight_decay=0.0):
        super().__init__(params, grads, lr, weight_decay)
        if momentum < 0:
            raise ValueError(f"momentum must be >= 0, got {momentum!r}")
        self.momentum = float(momentum)
        self.velocity = get_array_module(params).zeros_like(params) if momentum else None

    def _update(self, lo, hi, tmp, tmp2):
        xp = get_array_module(tmp)
        p, g = self.params[lo:hi], self.grads[lo:hi]
        if self.weight_decay:
            xp.multiply(p, self.weight_decay, out=tmp)
            g = xp.add(g, tmp, out=tmp)
        if self.velocity is not None:
            v = self.velocity[lo:hi]
            v *= self.momentum
            v += g
            g = v
        xp.multiply(g, self.lr, out=tmp)
        p -= tmp

    def _state_arrays(self):
        return {"velocity": self.velocity} if self.velocity is not None else {}


class Adam(Optimizer):
    """Adam (Kingma & Ba, ICLR 2015, Algorithm 1) with L2 weight decay added to the gradient.

    ``m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
    w = w - lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)``.
    """

    def __init__(self, params, grads, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
        super().__init__(params, grads, lr, weight_decay)
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError(f"beta1 and beta2 must be in [0, 1), got {beta1!r}, {beta2!r}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps!r}")
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        xp = get_array_module(params)
        self.m, self.v = xp.zeros_like(params), xp.zeros_like(params)

    def step(self):
        t = self.steps + 1
        self._step_size = self.lr / (1 - self.beta1 ** t)
        self._v_scale = 1.0 / math.sqrt(1 - self.beta2 ** t)
        super().step()

    def _update(self, lo, hi, tmp, tmp2):
        xp = get_array_module(tmp)
        p, g, m, v = self.params[lo:hi], self.grads[lo:hi], self.m[lo:hi], self.v[lo:hi]
        if self.weight_decay:
            xp.multiply(p, self.weight_decay, out=tmp2)
            g = xp.add(g, tmp2, out=tmp2)
        m *= self.beta1
        xp.multiply(g, 1 - self.beta1, out=tmp)
        m += tmp
        v *= self.beta2
        xp.multiply(g, g, out=tmp)
        tmp *= 1 - self.beta2
        v += tmp
        xp.sqrt(v, out=tmp)
        tmp *= self._v_scale
        tmp += self.eps
        xp.divide(m, tmp, out=tmp)
        tmp *= self._step_size
        p -= tmp

    def _state_arrays(self):
        return {"m": self.m, "v": self.v}


class Adagrad(Optimizer):
    """Adagrad (Duchi, Hazan and Singer, JMLR 2011, section 1; PyTorch's form, no initial accumulator).

    ``g = grad + wd * w;  a = a + g^2;  w = w - lr * g / (sqrt(a) + eps)``. Every operation is per
    element, so an element whose gradient is zero keeps its weight and accumulator (``0 / eps``, hence
    ``eps > 0``): the update of the rows a batch touches (``training.ctr.sparse_optim.SparseAdagrad``)
    is the same update.

    Raises
    ------
    ValueError
        When ``eps`` is not positive (an element never touched would become ``0 / 0``).

    Examples
    --------
    >>> params, grads = numpy.array([1.0, 2.0]), numpy.array([3.0, 0.0])
    >>> opt = Adagrad(params, grads, lr=0.5)
    >>> opt.step(); params  # a = 9: w - 0.5 * 3 / (3 + eps); the zero gradient leaves 2.0
    array([0.5, 2. ])
    """

    def __init__(self, params, grads, lr=0.01, eps=1e-10, weight_decay=0.0):
        super().__init__(params, grads, lr, weight_decay)
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps!r}")
        self.eps = float(eps)
        self.accum = get_array_module(params).zeros_like(params)

    def _update(self, lo, hi, tmp, tmp2):
        xp = get_array_module(tmp)
        p, g, a = self.params[lo:hi], self.grads[lo:hi], self.accum[lo:hi]
        if self.weight_decay:
            xp.multiply(p, self.weight_decay, out=tmp2)
            g = xp.add(g, tmp2, out=tmp2)
        xp.multiply(g, g, out=tmp)
        a += tmp
        xp.sqrt(a, out=tmp)
        tmp += self.eps
        xp.divide(g, tmp, out=tmp)
        tmp *= self.lr
        p -= tmp

    def _state_arrays(self):
        return {"accum": self.accum}


def optimizer_factory(cfg):
    """Return the constructor of the optimizer ``cfg`` names, its hyper-parameters bound.

    The one mapping from the configuration to an update rule: data-parallel training calls it
    over the model's flat buffers (:func:`make_optimizer`), and the parameter servers call it once
    per shard (:class:`ps.serving.server_optimizer.ServerOptimizer`, which sets ``lr`` before every update).

    Parameters
    ----------
    cfg : training.settings.config.Config
        ``optimizer``, ``lr``, ``momentum``, ``weight_decay``, ``beta1``, ``beta2``, ``eps``.

    Returns
    -------
    callable
        ``make(params, grads) -> Optimizer`` over flat buffers (ndarray, shape (n,), float32 or
        float64).

    Raises
    ------
    ValueError
        When ``cfg.optimizer`` is not ``"sgd"``, ``"adam"`` or ``"adagrad"``.
    """
    if cfg.optimizer == "sgd":
        return functools.partial(SGD, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return functools.partial(Adam, lr=cfg.lr, beta1=cfg.beta1, beta2=cfg.beta2, eps=cfg.eps,
                                 weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adagrad":
        return functools.partial(Adagrad, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay)
    raise ValueError(f"optimizer must be 'sgd', 'adam' or 'adagrad', got {cfg.optimizer!r}")


def make_optimizer(cfg, model, *, momentum=None):
    """Build the optimizer named by ``cfg.optimizer`` over ``model``'s flat buffers.

    Parameters
    ----------
    cfg : training.settings.config.Config
    model : training.model.nn.Sequential
    momentum : float, optional
        SGD's momentum in place of ``cfg.momentum``: 0.0 when the gradient hook's compressor applies
        momentum itself (DGC's momentum correction, the hook's ``owns_momentum``). Other optimizers
        ignore it.

    Returns
    -------
    Optimizer

    Raises
    ------
    ValueError
        When ``cfg.optimizer`` is not ``"sgd"``, ``"adam"`` or ``"adagrad"``.

    Examples
    --------
    >>> from training.settings.config import Config
    >>> from training.model.nn import build_mlp
    >>> opt = make_optimizer(Config(optimizer="sgd", lr=0.5, momentum=0.0), build_mlp([2, 2]))
    >>> type(opt).__name__, opt.lr, opt.params.size
    ('SGD', 0.5, 6)
    >>> dgc = make_optimizer(Config(optimizer="sgd", momentum=0.9), build_mlp([2, 2]), momentum=0.0)
    >>> dgc.momentum, dgc.velocity is None   # the compressor's memory applies the momentum
    (0.0, True)
    """
    make = optimizer_factory(cfg)
    if momentum is not None and cfg.optimizer == "sgd":
        make = functools.partial(make, momentum=momentum)
    return make(model.params, model.grads)


def schedule_lr(schedule, lr, step, total_steps):
    """Return the learning rate of update ``step`` (0-based) of ``total_steps`` under ``schedule``.

    Cosine decay from ``lr`` to 0 (Loshchilov and Hutter, "SGDR: Stochastic Gradient Descent with
    Warm Restarts", ICLR 2017, section 3, one cycle without restarts):
    ``lr * (1 + cos(pi * min(step, total_steps) / total_steps)) / 2``, computed in that order; the
    constant schedule, or ``total_steps <= 0``, returns ``lr``. The data-parallel trainer
    (``training.train.lr_at``, steps) calls it, and hands it to the parameter servers
    (:func:`lr_rule`, called by ``ps.serving.server_optimizer.ServerOptimizer.rate`` with pushes), so the two agree to
    the last bit at equal arguments.

    Parameters
    ----------
    schedule : {"constant", "cosine"}
        The schedule.
    lr : float
        Base learning rate (dimensionless step size).
    step : int or float
        Updates done so far, in the unit of ``total_steps`` (steps, clocks or pushes), >= 0.
    total_steps : int or float
        Updates over which the cosine decays to 0.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        When ``schedule`` is not one of :data:`SCHEDULES`.

    Examples
    --------
    >>> [schedule_lr("cosine", 0.4, step, 10) for step in (0, 5, 10, 12)]
    [0.4, 0.2, 0.0, 0.0]
    >>> schedule_lr("constant", 0.4, 5, 10)
    0.4
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"lr_schedule must be 'constant' or 'cosine', got {schedule!r}")
    if schedule == "cosine" and total_steps > 0:
        return lr * 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / total_steps))
    return lr


def lr_rule(schedule, lr):
    """Return the learning-rate rule ``rule(step, total_steps) -> float`` of ``schedule`` over ``lr``.

    What the trainer hands the parameter servers (``ps.job.settings.PSOptions.lr_at``), so that the
    server's step sizes come from the same :func:`schedule_lr` as the data-parallel trainer's.

    Raises
    ------
    ValueError
        When ``schedule`` is not one of :data:`SCHEDULES`.

    Examples
    --------
    >>> lr_rule("cosine", 0.4)(5, 10)
    0.2
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"lr_schedule must be 'constant' or 'cosine', got {schedule!r}")
    return functools.partial(schedule_lr, schedule, float(lr))
