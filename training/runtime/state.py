"""Trainer state as checkpoint arrays: counters, model, optimizer and gradient-hook state.

A checkpoint (see :mod:`training.runtime.checkpoint`) is a flat dict of numeric arrays. The trainer's
entries are ``model/params``, ``optim/NAME`` (the optimizer's ``state_dict``), ``compression/NAME``
(the gradient hook's, e.g. a compressor's error feedback), ``train/NAME`` (:class:`TrainState`)
and ``meta/config`` (the resolved configuration as UTF-8 JSON bytes). Local SGD (``--local-steps``
> 1) adds ``ranks/optim/NAME``: every rank's own optimizer state, stacked (shape ``(P, ...)``, row
``r`` from rank ``r``), since between two averages each rank steps its own momentum or moments;
each rank resumes from its row. Restoring all of them makes a resumed run bitwise identical to an
uninterrupted one with the same configuration.
"""
import json

import numpy

from collectives.engine.waiting import wait_within
from commlab.arrays import to_host
from commlab.file_formats import CheckpointError
from commlab.arrays import get_array_module

__all__ = ["TrainState", "checkpoint_arrays", "restore", "check_values"]


class TrainState:
    """Counters that a checkpoint carries besides model, optimizer and hook state.

    ``epoch`` and ``step`` count completed epochs and optimizer steps; ``skipped`` the steps
    skipped for a non-finite gradient; ``wall_s``, ``compute_s`` and ``comm_s`` are seconds
    (compute and communication as means over ranks); ``bytes_sent`` is bytes per rank.
    """

    __slots__ = ("epoch", "step", "skipped", "wall_s", "compute_s", "comm_s", "bytes_sent")
    _FLOATS = ("wall_s", "compute_s", "comm_s")

    def __init__(self):
        self.epoch = self.step = self.skipped = self.bytes_sent = 0
        self.wall_s = self.compute_s = self.comm_s = 0.0

    def state_dict(self):
        """Return the counters as ``train/NAME`` arrays."""
        return {f"train/{k}": numpy.array(getattr(self, k), numpy.float64 if k in self._FLOATS
                                          else numpy.int64) for k in self.__slots__}

    def load_state_dict(self, d):
        """Restore the counters from :meth:`state_dict` output.

        Raises
        ------
        KeyError
            When a counter is missing.
        ValueError
            Naming the entry, when a counter is not one finite number >= 0 (a tampered or foreign
            file whose checksum was recomputed).
        """
        for k in self.__slots__:
            v = numpy.asarray(d[f"train/{k}"])
            if v.size != 1 or v.dtype.kind not in "iuf" or not numpy.isfinite(v).all() or v.item() < 0:
                raise ValueError(f"entry train/{k} = {v.tolist()!r} is not a count or time >= 0")
            if k not in self._FLOATS and v.item() != int(v.item()):
                raise ValueError(f"entry train/{k} = {v.item()!r} is not a whole number")
            setattr(self, k, float(v.item()) if k in self._FLOATS else int(v.item()))


def checkpoint_arrays(cfg, model, opt, hook, state):
    """Return the checkpoint entries of a data-parallel run.

    Parameters
    ----------
    cfg : training.settings.config.Config
    model : training.model.nn.Sequential
    opt : training.model.optim.SGD or training.model.optim.Adam
    hook : gradient hook with ``state_dict()``
    state : TrainState

    Returns
    -------
    dict of str -> array
    """
    d = {"model/params": model.params,
         "meta/config": numpy.frombuffer(json.dumps(cfg.to_dict()).encode(), numpy.uint8)}
    d.update({f"optim/{k}": v for k, v in opt.state_dict().items()})
    if cfg.local_steps > 1:  # local SGD: each rank's optimizer state is its own between averages
        d.update(_every_rank({f"optim/{k}": v for k, v in opt.state_dict().items()}, hook.comm, cfg.timeout))
    d.update({f"compression/{k}": v for k, v in hook.state_dict().items()})
    d.update(state.state_dict())
    return d


def _every_rank(arrays, comm, timeout):
    """Return ``{"ranks/KEY": every rank's array KEY stacked, shape (P, ...)}`` (collective, all-gathers)."""
    out = {}
    for key in sorted(arrays):
        mine = numpy.array(to_host(arrays[key]), order="C")  # (a 0-d array stays 0-d)
        stacked = numpy.empty((comm.Get_size(),) + mine.shape, mine.dtype)  # (P, ...)
        wait_within(comm.Iallgather(mine, stacked), timeout, "allgather", "checkpoint: every rank's " + key)
        out[_RANKS + key] = stacked
    return out


_RANKS = "ranks/"  # prefix of the entries that hold every rank's own state, stacked


def check_values(arrays):
    """Raise ``ValueError`` naming the entry when the parameters or the optimizer's state make no sense.

    Checked: every ``model/...`` and ``optim/...`` entry (a data-parallel checkpoint's flat
    ``model/params``, or a tensor a sharded checkpoint's parts were assembled into, ``model/L0.W``)
    must hold finite floating-point numbers, and ``optim/steps`` a whole number >= 0. A tampered or
    foreign file whose checksum was recomputed passes the checksum, not this.

    Examples
    --------
    >>> import numpy
    >>> check_values({"model/params": numpy.ones(3), "optim/steps": numpy.array(2)})
    >>> check_values({"model/L0.W": numpy.array([[1.0, numpy.nan]])})
    Traceback (most recent call last):
    ...
    ValueError: entry model/L0.W holds 1 values that are not finite
    """
    for key, v in arrays.items():
        if not key.startswith(("model/", "optim/", _RANKS + "optim/")):
            continue
        v = numpy.asarray(v)
        if key == _RANKS + "optim/steps":
            if v.ndim != 1 or v.dtype.kind not in "iu" or (v < 0).any():
                raise ValueError(f"entry {key} = {v.tolist()!r} is not one step count >= 0 per rank")
        elif key == "optim/steps":
            if v.size != 1 or v.dtype.kind not in "iu" or int(v.reshape(-1)[0]) < 0:
                raise ValueError(f"entry {key} = {v.tolist()!r} is not a step count >= 0")
        elif v.dtype.kind != "f":
            raise ValueError(f"entry {key} holds {v.dtype} values, not floating-point numbers")
        elif not numpy.isfinite(v).all():
            raise ValueError(f"entry {key} holds {int((~numpy.isfinite(v)).sum())} values that are not finite")


def restore(path, arrays, model, opt, hook, state):
    """Load :func:`checkpoint_arrays` output into model, optimizer, hook and counters in place.

    Parameters
    ----------
    path : str
        The checkpoint file (named in errors).
    arrays : dict of str -> ndarray
        From :func:`training.runtime.checkpoint.load_checkpoint`.
    model, opt, hook, state
        As for :func:`checkpoint_arrays`; overwritten.

    Returns
    -------
    dict
        The configuration the checkpoint was written with (``{}`` when it holds none).

    Raises
    ------
    CheckpointError
        When an entry is missing or does not fit (another model size, optimizer or compressor).
    """
    try:
        if arrays["model/params"].shape != model.params.shape:
            raise ValueError(f"it holds {arrays['model/params'].size} parameters, the model has "
                             f"{model.size} (same --hidden and data?)")
        check_values(arrays)
        xp = get_array_module(model.params)
        model.params[...] = xp.asarray(arrays["model/params"], dtype=model.dtype)
        opt.load_state_dict(_own_optimizer_state(arrays, getattr(hook, "comm", None)))
        hook.load_state_dict({k[12:]: v for k, v in arrays.items() if k.startswith("compression/")})
        state.load_state_dict(arrays)
        saved = json.loads(arrays["meta/config"].tobytes()) if "meta/config" in arrays else {}
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} does not fit this run: {e}") from None
    return saved if isinstance(saved, dict) else {}


def _own_optimizer_state(arrays, comm):
    """Return this rank's optimizer state: its row of ``ranks/optim/...`` when saved, else ``optim/...``.

    Raises
    ------
    ValueError
        When the checkpoint holds every rank's state for another number of ranks.
    """
    rows = {k[len(_RANKS) + 6:]: v for k, v in arrays.items() if k.startswith(_RANKS + "optim/")}
    if not rows:
        return {k[6:]: v for k, v in arrays.items() if k.startswith("optim/")}
    rank, size = (0, 1) if comm is None else (comm.Get_rank(), comm.Get_size())
    for k, v in rows.items():
        if v.shape[0] != size:
            raise ValueError(f"entry {_RANKS}optim/{k} holds the optimizer state of {v.shape[0]} ranks, this job "
                             f"has {size}: local SGD resumes on as many ranks")
    return {k: v[rank] for k, v in rows.items()}
