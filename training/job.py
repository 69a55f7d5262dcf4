"""What a training job needs from its environment, settled before anything is created.

:func:`array_module` picks NumPy or CuPy (one GPU per rank on the node), :func:`set_threads` caps
BLAS threads per rank (:func:`commlab.job_control.limit_threads`), and :func:`end_lost` ends a
job whose peer may be dead with one line saying what failed and how to restart. The checks of a
whole run's configuration against the job are :func:`training.driver.preflight.check_run`'s.
"""
import os
import time

import numpy
from mpi4py import MPI

from collectives.engine.policy import abort, failure_line
from collectives.engine.waiting import library_failure
from collectives.errors import CollectiveError
from commlab.job_control import limit_threads
from commlab.logs import get_logger

__all__ = ["array_module", "set_threads", "end_lost"]

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

    The node's cores are this process's CPU affinity, or ``$COMMLAB_NODE_CORES`` when set (the emulated
    cluster's share of the host for each node, :mod:`training.emulator.emulate`).

    Returns
    -------
    int
        The thread count asked for (applied when threadpoolctl is installed, see
        :func:`commlab.job_control.limit_threads`).
    """
    n = cfg.threads
    if n == 0:
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        cores = int(os.environ.get("COMMLAB_NODE_CORES") or 0) or cores  # an emulated node's share of the host
        n = max(1, (cores or 1) // local.size)
        local.Free()
    if limit_threads(n):
        _log.debug("BLAS and OpenMP threads limited to %d per rank", n)
    else:
        _log.debug("threadpoolctl is not installed: BLAS threads left as they are (%d per rank asked for)", n)
    return n


def end_lost(exc, hint, rank):
    """End the job (``MPI_Abort``) after ``exc`` showed that a peer may be dead: ``MPI_Finalize`` would wait for it.

    One ``error: rank R: ...`` line says what failed (a collective's error names its peer and round;
    a parameter-server timeout, ``ps.wire.messages.PSTimeout``; a transfer the MPI library failed, an
    ``MPI.Exception``), that the peer may have died or hung and where to read why, and ``hint``, how
    to restart (:func:`training.runtime.checkpoint.restart_hint`). After a parameter-server timeout the rank
    waits ``1.5 * min(rank, 3)`` seconds first, so that the lowest such rank reports and its abort
    ends the others.
    """
    if isinstance(exc, CollectiveError):
        abort(failure_line(exc, hint))
    if isinstance(exc, MPI.Exception):
        exc = f"the MPI library failed a transfer ('{library_failure(exc)[0]}')"
    else:
        time.sleep(1.5 * min(rank, 3))
    abort(f"{exc}; ending the job: that peer may have died or hung (its own output says why); then {hint}")
