"""commlab's minimal NumPy/CuPy neural-net trainer.

Model, optimizers, data and configuration are re-exported here; the MPI-facing modules are
imported by name: ``training.dp.data_parallel`` (gradient hook, step, evaluation), ``training.checkpoint``,
``training.metrics``, ``training.elastic`` (``--elastic``: survivors of a dead rank keep training under ULFM)
and ``training.train`` (``mpiexec -n P python -m training.train``).

Subpackages: :mod:`training.dp` (data parallelism), :mod:`training.model_parallel` (tensor and
pipeline parallelism, the data x tensor x pipeline grid) and :mod:`training.ps_mode`
(parameter-server training), above the shared modules here (``nn``, ``optim``, ``data``,
``config``, ``cli``, ``checkpoint``, ``metrics``, ``progress``...). ``training.train`` drives them all.

Imports: :mod:`ps` and :mod:`collectives`; never :mod:`inference`, :mod:`plots` or :mod:`experiments`.
"""
from training.cli import parse_args
from training.config import Config
from training.data import (Dataset, DistributedSampler, load_dataset, load_digits, load_mnist,
                           make_synthetic)
from training.nn import Linear, ReLU, Sequential, SoftmaxCrossEntropy, Tanh, build_mlp
from training.optim import SGD, Adam, make_optimizer

__all__ = ["Config", "parse_args", "Dataset", "DistributedSampler", "load_dataset", "load_digits",
           "load_mnist", "make_synthetic", "Linear", "ReLU", "Tanh", "SoftmaxCrossEntropy",
           "Sequential", "build_mlp", "SGD", "Adam", "make_optimizer"]
