"""The checks of a whole run's configuration against the job, made before anything is created.

:func:`check_run` finds, on every rank alike, the configuration errors that depend on the job (rank
count, batch split, parameter-server settings, files, the tuning table, optional packages), so that
a bad run fails with one message before its run directory exists.

Imports: :mod:`training.job`, :mod:`training.ps_mode` (its own checks) and :mod:`collectives`.
"""
import os

from training.job import array_module
from training.ps_mode.worker import check_ps

__all__ = ["check_run"]


def check_run(cfg, comm):
    """Check, on every rank, what the configuration needs from the job before anything is created.

    Returns
    -------
    module
        The array module of ``cfg.device`` (from :func:`array_module`).

    Raises
    ------
    ValueError
        When the global batch does not divide among the ranks (workers with ``--mode ps``), a
        parameter-server setting does not fit P (:func:`training.ps_mode.worker.check_ps`),
        ``--data-dir`` is not a directory, or ``algorithm="auto"`` cannot read its tuning table
        (``COMMLAB_TUNING``).
    ImportError
        When ``--device gpu`` is asked for without CuPy.
    """
    P = comm.Get_size()
    if cfg.mode == "ps":
        check_ps(cfg, P)  # rank count, batch split, fault specs, server checkpoints
    elif cfg.batch_size % P:
        raise ValueError(f"batch_size ({cfg.batch_size}) must be a multiple of the number of ranks ({P})")
    if cfg.data == "mnist" and not os.path.isdir(cfg.data_dir):
        raise ValueError(f"--data-dir {cfg.data_dir}: no such directory (it must hold the MNIST IDX files)")
    if cfg.algorithm == "auto":
        from collectives.model.auto import select_allreduce

        select_allreduce(P, 8)  # loads the tuning table (COMMLAB_TUNING) now, not mid-run
    return array_module(cfg, comm)
