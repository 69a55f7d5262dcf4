"""A data-parallel run's parts, built and checked before any run directory exists.

:func:`build_trainer` loads the data and builds the model, optimizer, loss and gradient hook (restored
from a checkpoint with ``--resume``, of either kind: a model-parallel run's shards are assembled into the
whole model); :func:`training.train.train_dp` trains with them.
"""
import os

from commlab.logs import get_logger
from training.runtime.build import build_model
from training.runtime.checkpoint import load_checkpoint
from commlab.file_formats import CheckpointError
from training.data.datasets import load_dataset
from training.dp.shares import BatchShares, memory_cap
from training.dp.hooks import make_grad_hook
from training.dp.hooks import share_gradients
from training.dp.local_sgd import LocalSGD
from training.dp.layout import verify_param_layout
from training.model_parallel.sharded import newest_checkpoint, restore_sharded
from training.model.nn import SoftmaxCrossEntropy
from training.model.optim import make_optimizer
from training.driver.preflight import check_run
from training.data.skew import gradient_scale
from training.runtime.state import TrainState, restore

__all__ = ["Trainer", "build_trainer"]

_log = get_logger("training.train")


class Trainer:
    """Everything a data-parallel run holds: data, model, optimizer, loss, gradient hook, counters.

    Attributes
    ----------
    xp : module
        The array module (NumPy, or CuPy with ``--device gpu``).
    ds : training.data.datasets.Dataset
        The run's data (every rank holds all of it; each trains on its own part of a batch).
    model, opt, loss_fn, hook
        The model, its optimizer, the loss and the gradient hook (all-reduce or compressor).
    state : training.runtime.state.TrainState
        Counters: epoch, step, seconds, bytes.
    resumed_from : str or None
        The checkpoint restored, if any; ``saved_config`` its run's configuration.
    local : training.dp.local_sgd.LocalSGD or None
        Local SGD's model averaging (``--local-steps`` > 1).
    shares : training.dp.shares.BatchShares
        Each rank's samples of a global batch (re-split by speed with ``--balance``; restored with ``--resume``).
    weight : float
        This rank's weight in the sample-weighted average of gradients (``--weighted-average``:
        ``W n_w / sum n``, :func:`training.data.skew.gradient_scale`; 1.0 otherwise).
    """

    __slots__ = ("xp", "ds", "model", "opt", "loss_fn", "hook", "state", "resumed_from", "saved_config", "local",
                 "shares", "weight")

    def __init__(self, **parts):
        for k in self.__slots__:
            setattr(self, k, parts.get(k))


def build_trainer(cfg, comm):
    """Load the data and build model, optimizer, loss and gradient hook (restored with ``--resume``).

    Everything that can fail on a bad configuration happens here, on every rank alike, before a
    run directory is created.

    Parameters
    ----------
    cfg : training.settings.config.Config
        The run's settings (:func:`training.settings.cli.parse_args`).
    comm : mpi4py.MPI.Comm
        The run's communicator; every rank calls this.

    Returns
    -------
    Trainer

    Raises
    ------
    ValueError
        From :func:`check_run`, when a part rejects its arguments, or when the ranks' models
        differ (``training.dp.layout.verify_param_layout``).
    ImportError
        From :func:`check_run` (``--device gpu`` without CuPy).
    CheckpointError
        When the checkpoint to resume from is unusable (on every rank, naming the file).

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from training.settings.cli import parse_args
    >>> t = build_trainer(parse_args(["--hidden", "16"]), MPI.COMM_WORLD)
    >>> t.model.size, t.ds.n_classes, type(t.hook).__name__   # 64 x 16 + 16, 16 x 10 + 10 parameters
    (1210, 10, 'AllreduceHook')
    >>> t.hook.close()
    """
    xp = check_run(cfg, comm)
    ds = load_dataset(cfg)
    model = build_model(cfg, ds.n_features, ds.n_classes, xp)
    verify_param_layout(model, comm, cfg.timeout)  # before any gradient exchange: a mismatch would hang or mix
    share_gradients(cfg, comm, model)  # algorithm "shm": the flat gradient in shared memory, before the optimizer
    hook = make_grad_hook(cfg, comm, model)
    # the compressor's memory applies momentum (DGC): the optimizer then has none
    opt, loss_fn = make_optimizer(cfg, model, momentum=0.0 if hook.owns_momentum else None), SoftmaxCrossEntropy()
    state, path, saved = TrainState(), None, None
    shares = _batch_shares(cfg, comm, ds, model, opt)
    newest = newest_checkpoint(cfg.resume) if cfg.resume else None
    if newest is not None and os.path.isdir(newest):  # a model-parallel run's shards, assembled for this model
        path, saved = newest, restore_sharded(newest, model, opt, hook, state, comm, cfg.allow_foreign_checkpoint)
    elif cfg.resume:
        path, arrays = load_checkpoint(cfg.resume, comm, missing_ok=True, timeout=cfg.timeout,
                                       foreign_ok=cfg.allow_foreign_checkpoint)
        if path is None and comm.rank == 0:
            _log.info("--resume %s: the run ended before its first checkpoint; starting it again from the "
                      "beginning", cfg.resume)
        elif path is not None:
            saved = restore(path, arrays, model, opt, hook, state)
            _restore_shares(path, arrays, shares, comm.rank)
    weight = gradient_scale(cfg, ds.y_train, comm.rank, comm.size) if cfg.weighted_average else 1.0
    # the models' average takes the gradients' weights, W n_w / sum n
    local = LocalSGD(comm, hook, cfg.local_steps, cfg.post_local_epoch, cfg.average_optimizer,
                     weight if cfg.weighted_average else None) \
        if cfg.local_steps > 1 else None  # local SGD (training.dp.local_sgd)
    return Trainer(xp=xp, ds=ds, model=model, opt=opt, loss_fn=loss_fn, hook=hook, state=state,
                   resumed_from=path, saved_config=saved, local=local, shares=shares, weight=weight)


def _batch_shares(cfg, comm, ds, model, opt):
    """Return the run's :class:`BatchShares`, each share within ``--memory-gb`` (on every rank alike)."""
    cap = memory_cap(cfg, ds, model, sum(getattr(v, "nbytes", 0) for v in opt.state_dict().values()))
    try:
        return BatchShares(comm.Get_size(), cfg.batch_size, every=cfg.balance_every, cap=cap,
                           gain=cfg.balance_gain, balance=cfg.balance)
    except ValueError as e:
        if cap is None:
            raise
        raise ValueError(f"{e} (--memory-gb {cfg.memory_gb:g} allows {cap} samples per rank)") from None


def _restore_shares(path, arrays, shares, rank):
    """Continue with the checkpoint's batch shares (the equal split when they were another job's)."""
    try:
        fits = shares.load_state_dict(arrays)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {path} does not fit this run: {e}") from None
    if not fits and "balance/shares" in arrays and rank == 0:
        _log.info("--resume: the checkpoint's batch shares %s are another job's (P, --batch-size or --memory-gb "
                  "changed); starting from the equal split %s", arrays["balance/shares"].tolist(), shares.shares.tolist())
