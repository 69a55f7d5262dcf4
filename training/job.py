"""What a training job needs from its environment, settled before anything is created.

:func:`array_module` picks NumPy or CuPy (one GPU per rank on the node), :func:`set_threads` caps
BLAS threads per rank, and :func:`check_run` finds, on every rank alike, the configuration errors
that depend on the job (rank count, files, optional packages), so that a bad run fails with one
message before its run directory exists.
"""
import os

import numpy
from mpi4py import MPI

from training.ps_mode import check_ps

__all__ = ["array_module", "set_threads", "check_run"]


def array_module(cfg, comm):
    """Return the array module for ``cfg.device`` (NumPy, or CuPy with one GPU per local rank)."""
    if cfg.device == "cpu":
        return numpy
    try:
        import cupy  # optional dependency: the 'gpu' extra
    except ImportError as e:
        raise ImportError(f"--device gpu needs CuPy ({e}); install the gpu extra: "
                          "pip install -e '.[gpu]'") from None

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    cupy.cuda.Device(local.rank % cupy.cuda.runtime.getDeviceCount()).use()
    local.Free()
    return cupy


def set_threads(cfg, comm):
    """Limit BLAS threads per rank to ``cfg.threads`` (0: cores on the node / ranks on the node).

    Returns
    -------
    int
        The thread count applied (threadpoolctl is used when installed; otherwise unchanged).
    """
    n = cfg.threads
    if n == 0:
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        n = max(1, (cores or 1) // local.size)
        local.Free()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return n
    threadpool_limits(limits=n)
    return n


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
        parameter-server setting does not fit P (:func:`training.ps_mode.check_ps`),
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
        from collectives.select import select_allreduce

        select_allreduce(P, 8)  # loads the tuning table (COMMLAB_TUNING) now, not mid-run
    return array_module(cfg, comm)
