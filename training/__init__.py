"""commlab's minimal NumPy/CuPy neural-net trainer.

Model, optimizers, data and configuration are re-exported here; the MPI-facing modules are
imported by name: ``training.dp.data_parallel`` (step, evaluation), ``training.dp.hooks`` (gradient
hooks), ``training.runtime.checkpoint``, ``training.driver.elastic`` (``--elastic``: survivors of a dead
rank keep training under ULFM) and ``training.train`` (``mpiexec -n P python -m training.train``).

Rooms, each above the ones it may import (the ``training`` contract of the project's import-linter
configuration): :mod:`training.train`, the command, drives them all; :mod:`training.driver` (the
checks before a run, a data-parallel run's parts, elastic training); :mod:`training.settings` (the
configuration, its command line, the option parser of every command); :mod:`training.ctr` (the ctr
model); :mod:`training.model_parallel` (tensor and pipeline parallelism, the data x tensor x
pipeline grid) and :mod:`training.ps_mode` (parameter-server training); :mod:`training.dp` (data
parallelism) and :mod:`training.monitor` (live monitoring); :mod:`training.runtime` (a run's parts
built from its configuration, its checkpoints, its state, its display); :mod:`training.data` (data
sets, sampling, skewed partitions) and :mod:`training.model` (layers, optimizers). The job predictor
(:mod:`training.predict`) and the emulated cluster (:mod:`training.emulator`) are tools built on them.

Imports: :mod:`ps` and :mod:`collectives`; never :mod:`inference`, :mod:`plots` or :mod:`experiments`.
"""
from training.settings.cli import parse_args
from training.settings.config import Config
from training.data.datasets import Dataset, load_dataset, load_digits, load_mnist, make_synthetic
from training.data.sampling import DistributedSampler
from training.model.nn import Linear, ReLU, Sequential, SoftmaxCrossEntropy, Tanh, build_mlp
from training.model.optim import SGD, Adam, make_optimizer

__all__ = ["Config", "parse_args", "Dataset", "DistributedSampler", "load_dataset", "load_digits",
           "load_mnist", "make_synthetic", "Linear", "ReLU", "Tanh", "SoftmaxCrossEntropy",
           "Sequential", "build_mlp", "SGD", "Adam", "make_optimizer"]
