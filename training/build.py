"""A run's pieces built from its configuration: the model, each rank's sampler, the data on the device.

Shared by the data-parallel driver (:mod:`training.train`) and the parameter-server mode
(:mod:`training.ps_mode.worker`), so both build the same model from the same seed and read the same
samples.
"""
import numpy

from training.data import DistributedSampler
from training.nn import build_mlp

__all__ = ["build_model", "make_sampler", "to_device"]


def build_model(cfg, n_features, n_classes, xp=numpy):
    """Build the MLP ``n_features -> cfg.hidden... -> n_classes`` with ``cfg``'s dtype and seed.

    Parameters
    ----------
    cfg : training.config.Config
    n_features, n_classes : int
        Input features and output classes.
    xp : module
        Array module of the parameters (NumPy or CuPy).

    Returns
    -------
    training.nn.Sequential
    """
    return build_mlp([n_features, *cfg.hidden, n_classes], activation=cfg.activation,
                     dtype=cfg.dtype, seed=cfg.seed, xp=xp)


def make_sampler(cfg, n, rank, size):
    """Return the training-set :class:`~training.data.DistributedSampler` of rank ``rank`` of ``size``."""
    return DistributedSampler(n, rank, size, shuffle=cfg.shuffle, seed=cfg.seed, drop_last=cfg.drop_last)


def to_device(ds, dtype, xp=numpy):
    """Return (x_train, y_train, x_test, y_test) as ``xp`` arrays, features cast to ``dtype``."""
    return (xp.asarray(ds.x_train, dtype=dtype), xp.asarray(ds.y_train),
            xp.asarray(ds.x_test, dtype=dtype), xp.asarray(ds.y_test))
