"""Gradient hooks: the one contract (:class:`GradientHook`) and its compressed form (:class:`CompressionHook`).

Every way commlab reduces a data-parallel gradient implements :class:`GradientHook`: the trainer's
plain all-reduce (``training.dp.hooks.AllreduceHook``, whose ``begin`` gives the overlapped
step of ``training.dp.overlap``), :class:`CompressionHook` here, and the PyTorch DDP hook
(``collectives.interop.torch_hook.CommHookState``, which runs one of these per DDP bucket).
"""
from typing import Protocol, runtime_checkable

import numpy as np
from mpi4py import MPI

import collectives.engine.context
import collectives.schedules.registry
from commlab.arrays import to_host
from collectives.calls.allreduce import ALGORITHMS
from collectives.engine.waiting import wait_within

from .base import ErrorFeedback, check_tensor
from .comm import compressed_allreduce
from .catalog import compressor_arguments, make_compressor, parse_literal

__all__ = ["GradientHook", "CompressionHook", "make_hook"]


@runtime_checkable
class GradientHook(Protocol):
    """The hook contract: a function of a gradient bucket that returns the reduced bucket.

    ``reduced, info = hook(bucket)``: ``bucket`` is this rank's flat gradient (or one bucket of it),
    shape (n,), float; ``reduced`` is the mean over the ranks, shape (n,), identical on every rank
    (it may be ``bucket`` itself, reduced in place); ``info`` is a dict with at least
    ``bytes_sent`` (int, this rank), ``compress_s`` and ``decompress_s`` (seconds). Collective: every
    rank calls it alike. ``state_dict()`` / ``load_state_dict(state)`` capture what a resumed run
    needs (error feedback), ``close()`` frees what the hook owns, and ``owns_momentum`` says whether
    the hook applies momentum itself (DGC), so the optimizer must not.
    """

    owns_momentum: bool

    def __call__(self, bucket):
        """Return ``(reduced, info)`` for one gradient bucket."""

    def state_dict(self):
        """Return the hook's state (arrays) for a checkpoint."""

    def load_state_dict(self, state):
        """Restore the state of :meth:`state_dict`."""

    def close(self):
        """Free what the hook owns (a duplicated communicator)."""


class CompressionHook(GradientHook):
    """Compressed gradient averaging for data-parallel training, with all its state.

    ``avg, info = hook(flat_grad)`` each step. The hook owns a duplicate of the communicator, the
    compressor and its error-feedback memory, and a step counter; ``state_dict`` (collective)
    captures all of it, every rank's residuals included (PowerSGD's Q, DGC's momentum, RNG
    counters), so a resumed run is exact.

    Parameters
    ----------
    compressor : Compressor
        Configured alike on every rank.
    memory : Memory or None
        This rank's memory (error feedback), or None.
    comm : mpi4py.MPI.Comm, optional
        Communicator, duplicated here (``MPI.COMM_WORLD`` by default). Collective: every rank builds
        its hook at the same point.
    algorithm : str
        All-reduce algorithm for summable payloads (``collectives.ALGORITHMS``).
    gather_algorithm : str
        All-gather algorithm for the other payloads.
    name : str
        Key of the flat gradient in the compressor and memory state.
    timeout : float, optional
        Seconds each collective of the hook (the duplicate of ``comm``, every step's all-reduce or
        all-gather, the state all-gather) may wait for a peer before
        :class:`collectives.CollectiveTimeout` (None: no limit).

    Raises
    ------
    ValueError
        When an algorithm is unknown or ``timeout`` is not a positive number.
    """

    __slots__ = ("compressor", "memory", "comm", "algorithm", "gather_algorithm", "name",
                 "iteration", "timeout")

    def __init__(self, compressor, memory=None, comm=None, algorithm="auto",
                 gather_algorithm="ring", name="grad", timeout=None):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, got {algorithm!r}")
        gathers = collectives.schedules.registry.OP_ALGORITHMS["allgather"]
        if gather_algorithm not in gathers:
            raise ValueError(f"gather_algorithm must be one of {gathers}, got {gather_algorithm!r}")
        if timeout is not None and not (isinstance(timeout, (int, float)) and 0 < timeout < float("inf")):
            raise ValueError(f"timeout must be None or a positive number of seconds, got {timeout!r}")
        self.compressor = compressor
        self.memory = memory
        self.timeout = timeout
        self.comm, req = (comm if comm is not None else MPI.COMM_WORLD).Idup()
        wait_within(req, timeout, "collective", "duplicating the communicator")
        self.algorithm = algorithm
        self.gather_algorithm = gather_algorithm
        self.name = name
        self.iteration = 0

    @property
    def owns_momentum(self):
        """True when the memory applies momentum itself (DGC): run the optimizer without it."""
        return self.memory is not None and self.memory.owns_momentum

    def __call__(self, flat_grad):
        """Average ``flat_grad`` over the ranks through the compressor.

        Parameters
        ----------
        flat_grad : ndarray, shape (n,), float32/float64
            This rank's flat gradient of the whole model (not modified).

        Returns
        -------
        avg : ndarray, shape (n,), dtype of flat_grad
            Mean over ranks of the decompressed gradients, identical on every rank.
        info : dict
            ``bytes_sent`` (int, this rank, this step), ``compress_s``, ``decompress_s`` (seconds),
            ``bits_per_element``, ``elements``, ``step`` and ``wire_bytes`` (see ``compressed_allreduce``).

        Raises
        ------
        TypeError
            If ``flat_grad`` is not float32/float64.
        ValueError
            If ``flat_grad`` is not 1-D.
        """
        check_tensor(flat_grad, self.name)
        if flat_grad.dtype not in (np.float32, np.float64):
            raise TypeError(f"flat_grad must be float32 or float64, got {flat_grad.dtype}")
        if flat_grad.ndim != 1:
            raise ValueError(f"flat_grad must be 1-D, got shape {flat_grad.shape}")
        avg, info = compressed_allreduce(flat_grad, self.name, self.compressor, self.memory,
                                         self.comm, self.algorithm, self.gather_algorithm, self.timeout)
        self.iteration += 1
        info["step"] = self.iteration
        return avg, info

    def state_dict(self):
        """Return all state as a flat dict of str -> NumPy array (no pickle). Collective.

        Every rank calls it at the same point. The compressor state (step counters, PowerSGD's Q)
        is the same on every rank; the memory (residuals, DGC's momentum) differs per rank, so its
        arrays are all-gathered and stacked: ``memory/...`` has shape ``(P, ...)``, row ``r`` from
        rank ``r``. The result is identical on every rank, so rank 0 alone may write it.

        Returns
        -------
        dict
            ``iteration``, ``size`` (number of ranks P), ``compressor/...`` and ``memory/...``
            entries.
        """
        size = self.comm.Get_size()
        state = {"iteration": np.array(self.iteration, np.int64), "size": np.array(size, np.int64)}
        state.update({"compressor/" + k: to_host(v) for k, v in self.compressor.state_dict().items()})
        if self.memory is not None:
            for key, value in sorted(self.memory.state_dict().items()):
                mine = np.ascontiguousarray(to_host(value))
                stacked = np.empty((size,) + mine.shape, mine.dtype)  # (P, ...)
                wait_within(self.comm.Iallgather(mine, stacked), self.timeout, "allgather", "compression state")
                state["memory/" + key] = stacked
        return state

    def load_state_dict(self, state):
        """Restore the state written by ``state_dict`` (same compressor arguments and P).

        States written before ``size`` was named so carry it as ``world_size``; both are read.

        Raises
        ------
        ValueError
            If ``state`` was written by a run with another number of ranks.
        """
        size, rank = self.comm.Get_size(), self.comm.Get_rank()
        saved = int(state.get("size", state.get("world_size", size)))
        if saved != size:
            raise ValueError(f"state: written by {saved} ranks, this run has {size}")
        self.iteration = int(state["iteration"])
        self.compressor.load_state_dict({k[11:]: v for k, v in state.items()
                                         if k.startswith("compressor/")})
        if self.memory is not None:
            self.memory.load_state_dict({k[7:]: v[rank] for k, v in state.items()
                                         if k.startswith("memory/")})

    def close(self):
        """Free the duplicated communicator (and the collectives' context on it)."""
        if self.comm != MPI.COMM_NULL:
            collectives.engine.context.free_context(self.comm)
            self.comm.Free()

    def __repr__(self):
        return (f"CompressionHook({self.compressor!r}, memory={type(self.memory).__name__}, "
                f"P={self.comm.Get_size() if self.comm != MPI.COMM_NULL else 0})")


def make_hook(name, comm=None, algorithm="auto", gather_algorithm="ring", error_feedback=None,
              shapes=None, timeout=None, **kwargs):
    """Build the training hook for the compressor registered as ``name``.

    Parameters
    ----------
    name : str
        A key of ``COMPRESSORS`` (``"none"`` is plain averaging through the all-reduce).
    comm : mpi4py.MPI.Comm, optional
        Communicator (duplicated); every rank calls ``make_hook`` with the same arguments.
    algorithm : str
        All-reduce algorithm for summable payloads.
    gather_algorithm : str
        All-gather algorithm for the other payloads.
    error_feedback : bool or None
        Use the compressor's memory (None: its default; on for topk, randomk, threshold, efsignsgd,
        onebit, dgc and powersgd). Strings ``"true"``/``"false"`` are accepted.
    shapes : list of tuple of int, optional
        The model's parameter shapes in flat order; used by compressors that take them (PowerSGD)
        and ignored by the others.
    timeout : float, optional
        Seconds each of the hook's collectives may wait for a peer (:class:`CompressionHook`).
    **kwargs
        Compressor arguments (strings are converted), e.g. ``ratio=0.01``, ``matrix_rank=4``,
        ``levels=127``.

    Returns
    -------
    CompressionHook

    Raises
    ------
    ValueError
        If the name or an argument is unknown or out of range.
    """
    if "shapes" in compressor_arguments(name):
        kwargs["shapes"] = shapes
    compressor = make_compressor(name, **kwargs)
    if isinstance(error_feedback, str):
        error_feedback = parse_literal(error_feedback)
    if error_feedback not in (None, True, False):
        raise ValueError(f"error_feedback must be None, True or False, got {error_feedback!r}")
    memory = compressor.make_memory((comm if comm is not None else MPI.COMM_WORLD).Get_size())
    if error_feedback is True and memory is None:
        memory = ErrorFeedback()
    elif error_feedback is False:
        memory = None
    return CompressionHook(compressor, memory, comm, algorithm, gather_algorithm, timeout=timeout)
