"""A run's pieces built from its configuration: the model, each rank's sampler, the data on the device.

Shared by the data-parallel driver (:mod:`training.train`) and the parameter-server mode
(:mod:`training.ps_mode.worker`), so both build the same model from the same seed and read the same
samples.
"""
import numpy

from training.data.sampling import DistributedSampler
from training.model.nn import build_mlp
from training.data.skew import shard_sampler, uses_shards

__all__ = ["build_model", "make_sampler", "to_device"]


def build_model(cfg, n_features, n_classes, xp=numpy):
    """Build the MLP ``n_features -> cfg.hidden... -> n_classes`` with ``cfg``'s dtype and seed.

    Parameters
    ----------
    cfg : training.settings.config.Config
    n_features, n_classes : int
        Input features and output classes.
    xp : module
        Array module of the parameters (NumPy or CuPy).

    Returns
    -------
    training.model.nn.Sequential
    """
    return build_mlp([n_features, *cfg.hidden, n_classes], activation=cfg.activation,
                     dtype=cfg.dtype, seed=cfg.seed, xp=xp)


def make_sampler(cfg, n, rank, size, labels=None, record_dir=None):
    """Return the training-set sampler of rank ``rank`` of ``size``.

    The :class:`~training.data.sampling.DistributedSampler` of an IID run; with a skewed ``--partition``,
    ``--resample`` or ``--shared-fraction``, the rank's :class:`training.data.shard_sampler.ShardSampler`
    (``labels``, the training labels, are then needed; rank 0 passes its run directory as
    ``record_dir`` to log the partition and write its record, :func:`training.data.skew.shard_sampler`).
    """
    if uses_shards(cfg):
        if labels is None:
            raise ValueError(f"partition {cfg.partition}: the sampler needs the training labels")
        return shard_sampler(cfg, labels, int(labels.max()) + 1, rank, size, record_dir)
    return DistributedSampler(n, rank, size, shuffle=cfg.shuffle, seed=cfg.seed, drop_last=cfg.drop_last)


def to_device(ds, dtype, xp=numpy):
    """Return (x_train, y_train, x_test, y_test) as ``xp`` arrays, features cast to ``dtype``."""
    return (xp.asarray(ds.x_train, dtype=dtype), xp.asarray(ds.y_train),
            xp.asarray(ds.x_test, dtype=dtype), xp.asarray(ds.y_test))
