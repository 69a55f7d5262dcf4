"""The checks of a whole run's configuration against the job, made before anything is created.

:func:`check_run` finds, on every rank alike, the configuration errors that depend on the job (rank
count, batch split, parameter-server settings, files, the tuning table, optional packages), so that
a bad run fails with one message before its run directory exists.

Imports: :mod:`training.job`, :mod:`training.ps_mode` (its own checks) and :mod:`collectives`.
"""
import dataclasses
import json
import os
import zlib

import numpy

from training.data.datasets import load_dataset
from training.job import array_module
from training.ps_mode.worker import check_ps
from training.monitor.setup import check_monitor
from training.data.skew import check_skew, uses_shards

__all__ = ["check_run", "agree", "agree_grid", "PER_RANK", "LAYOUT"]

#: Settings left out of :func:`agree`: those that may differ between ranks by design (where rank 0
#: writes: run directory and name, trace file; how much a rank logs; the address the metrics endpoint of
#: rank 0 binds), and the model's layout
#: (``hidden``, ``dtype``), which :func:`training.dp.layout.verify_param_layout` compares once the model is
#: built, naming the layers and parameter counts that differ.
PER_RANK = frozenset(("run_dir", "name", "trace", "log_level", "hidden", "dtype", "metrics_host"))
#: The model's layout among :data:`PER_RANK`: compared by :func:`agree_grid` on a model-parallel grid, whose
#: stages hold different layers by design, so that no layout check of whole models can compare them.
LAYOUT = frozenset(("hidden", "dtype"))
_SHOWN = 60  # characters of a value shown in the message


def agree(cfg, comm, per_rank=PER_RANK):
    """Raise on every rank unless every rank of ``comm`` resolved the same configuration.

    Each rank hashes every setting (CRC-32 of its JSON form) but those of ``per_rank`` (default
    :data:`PER_RANK`); one all-gather of the hashes finds the settings that differ, and a second of
    their values names them (as PyTorch's DDP verifies that every rank holds the same model at
    construction). ``cfg`` is a training :class:`~training.settings.config.Config` or any dataclass (serving's
    configuration).

    Raises
    ------
    ValueError
        Naming each differing setting with the ranks that hold each value, on every rank.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from training.settings.config import Config
    >>> agree(Config(), MPI.COMM_WORLD)  # one rank (under mpiexec -n 1): nothing to compare
    """
    if comm.Get_size() == 1:
        return
    fields = cfg.to_dict() if hasattr(cfg, "to_dict") else dataclasses.asdict(cfg)
    items = sorted((k, json.dumps(v, sort_keys=True, default=str)) for k, v in fields.items() if k not in per_rank)
    mine = numpy.array([zlib.crc32(v.encode()) for _, v in items], numpy.int64)
    every = numpy.empty((comm.Get_size(), mine.size), numpy.int64)
    comm.Allgather(mine, every)
    differ = [j for j in range(mine.size) if (every[:, j] != every[0, j]).any()]
    if not differ:
        return
    def shown(text):  # exactly _SHOWN bytes: the value's start, marked when cut
        raw = text.encode()
        raw = raw if len(raw) <= _SHOWN else raw[:_SHOWN - 3] + "...".encode()
        return raw.ljust(_SHOWN, b"\0")

    text = b"".join(shown(items[j][1]) for j in differ)
    values = numpy.empty((comm.Get_size(), len(text)), numpy.uint8)
    comm.Allgather(numpy.frombuffer(text, numpy.uint8).copy(), values)
    parts = []
    for n, j in enumerate(differ):
        held = {}  # grouped by the full value's hash, shown by its (possibly cut) start
        for rank in range(comm.Get_size()):
            v = bytes(values[rank, n * _SHOWN:(n + 1) * _SHOWN]).rstrip(b"\0").decode(errors="replace")
            held.setdefault(int(every[rank, j]), (v, []))[1].append(rank)
        parts.append(f"--{items[j][0].replace('_', '-')}: " + "; ".join(
            f"rank{'s' if len(r) > 1 else ''} {','.join(map(str, r))}: {v}" for v, r in held.values()))
    raise ValueError("the ranks were started with different settings (every rank must run the same job): "
                     + " | ".join(parts))


def agree_grid(cfg, comm):
    """Raise on every rank unless every rank of a model-parallel job resolved the same configuration,
    the model's layout included (:data:`LAYOUT`: the stages' widths and the dtype).

    The first comparison is :func:`agree`'s, the one every job makes first (a rank launched without the
    grid, which takes another driver, makes it too, so the ranks meet in the same call); once it passes
    every rank is on the grid, and a second comparison adds the layout.

    Raises
    ------
    ValueError
        Naming each differing setting with the ranks that hold each value, on every rank.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from training.settings.config import Config
    >>> agree_grid(Config(pipeline_parallel=2), MPI.COMM_WORLD)  # one rank: nothing to compare
    """
    agree(cfg, comm)
    agree(cfg, comm, PER_RANK - LAYOUT)


def check_run(cfg, comm):
    """Check, on every rank, what the configuration needs from the job before anything is created.

    Returns
    -------
    module
        The array module of ``cfg.device`` (from :func:`array_module`).

    Raises
    ------
    ValueError
        When the ranks resolved different settings (:func:`agree`), the global batch is smaller
        than the ranks (workers with ``--mode ps``: each needs a sample of every batch), a
        parameter-server setting does not fit P (:func:`training.ps_mode.worker.check_ps`),
        ``--data-dir`` is not a directory, the ``--partition`` cannot be drawn
        (:func:`training.data.skew.check_skew`), or ``algorithm="auto"`` cannot read its tuning table
        (``COMMLAB_TUNING``), or the monitoring cannot start
        (:func:`training.monitor.setup.check_monitor`: the metrics port is taken, ...).
    ImportError
        When ``--device gpu`` is asked for without CuPy, or a monitoring option without its library.
    """
    agree(cfg, comm)
    P = comm.Get_size()
    if cfg.mode == "ps":
        check_ps(cfg, P)  # rank count, batch split, fault specs, server checkpoints
    elif cfg.batch_size < P:
        raise ValueError(f"the global batch ({cfg.batch_size}) is smaller than the number of ranks ({P}): every rank "
                         "needs at least one sample of each batch (raise --batch-size or use fewer ranks)")
    if cfg.data == "mnist" and not os.path.isdir(cfg.data_dir):
        raise ValueError(f"--data-dir {cfg.data_dir}: no such directory (it must hold the MNIST IDX files)")
    if uses_shards(cfg):  # the partition's own checks need the labels: draw it now, as every rank will
        labels = load_dataset(cfg).y_train
        check_skew(cfg, labels, int(labels.max()) + 1, P - cfg.servers if cfg.mode == "ps" else P)
    if cfg.algorithm == "auto":
        from collectives.model.auto import select_allreduce

        select_allreduce(P, 8)  # loads the tuning table (COMMLAB_TUNING) now, not mid-run
    check_monitor(cfg, comm)  # libraries, TensorBoard directory, the metrics port on rank 0
    return array_module(cfg, comm)
