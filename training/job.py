"""What a training job needs from its environment, settled before anything is created.

:func:`array_module` picks NumPy or CuPy (one GPU per rank on the node), :func:`set_threads` caps
BLAS threads per rank (:func:`limit_threads`), and :func:`check_run` finds, on every rank alike, the
configuration errors that depend on the job (rank count, files, optional packages), so that a bad
run fails with one message before its run directory exists; :func:`all_failed` then tells whether
an error was raised on every rank alike (one message) or on some only (abort the job).
"""
import os
import time

import numpy
from mpi4py import MPI

from collectives.log import get_logger
from training.ps_mode import check_ps

__all__ = ["array_module", "set_threads", "limit_threads", "check_run", "all_failed"]

_log = get_logger("training.job")


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
    devices = cupy.cuda.runtime.getDeviceCount()
    device = local.rank % devices
    cupy.cuda.Device(device).use()
    _log.debug("local rank %d of %d uses GPU %d of %d", local.rank, local.size, device, devices)
    local.Free()
    return cupy


def set_threads(cfg, comm):
    """Limit BLAS threads per rank to ``cfg.threads`` (0: cores on the node / ranks on the node).

    Returns
    -------
    int
        The thread count asked for (applied when threadpoolctl is installed, see :func:`limit_threads`).
    """
    n = cfg.threads
    if n == 0:
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        n = max(1, (cores or 1) // local.size)
        local.Free()
    if limit_threads(n):
        _log.debug("BLAS and OpenMP threads limited to %d per rank", n)
    else:
        _log.debug("threadpoolctl is not installed: BLAS threads left as they are (%d per rank asked for)", n)
    return n


def limit_threads(n):
    """Cap the BLAS and OpenMP thread pools of this process at ``n`` threads (threadpoolctl).

    threadpoolctl is an optional package (it comes with the ``data`` extra, scikit-learn's
    dependency); without it the pools are left as they are.

    Parameters
    ----------
    n : int
        Threads per pool, >= 1.

    Returns
    -------
    bool
        True when the limit was applied, False when threadpoolctl is not installed.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return False
    threadpool_limits(limits=n)
    return True


def all_failed(comm, seconds=5.0):
    """Return True when every rank of ``comm`` reaches this call within ``seconds`` (a failure alike on all).

    Called after an error: when it was raised on every rank (a bad setting checked everywhere), all
    of them arrive and rank 0 alone reports it; when some ranks are elsewhere (still running, or
    waiting on a peer) the call returns False after ``seconds`` and the caller ends the job.
    Non-blocking barrier polled until the deadline, so it never hangs.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
    seconds : float
        How long to wait for the other ranks (seconds).

    Returns
    -------
    bool
    """
    if comm.Get_size() == 1:
        return True
    req = comm.Ibarrier()
    deadline = time.monotonic() + seconds
    while not req.Test():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


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
