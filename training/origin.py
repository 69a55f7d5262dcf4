"""Where a checkpoint comes from: the origin entries each trainer checkpoint carries (``meta/run_id``,
the run id its run keeps in ``config.json``, :func:`commlab.run_files.run_id_of`; ``meta/epoch``), and
the check that a checkpoint was written by the run whose directory holds it.

The entry ``meta/run_id`` is the parameter servers' own (:mod:`ps.checkpoints.shard_files`), so a run's trainer and
server checkpoints name it alike.

Imports: :mod:`commlab` (the checkpoint error, the run id) and :mod:`ps.checkpoints.shard_files` (the run id
entry) only.
"""
import os
import re

import numpy

from commlab.file_formats import CheckpointError
from commlab.run_files import run_id_of
from ps.checkpoints.shard_files import held_run_id, run_id_entry

__all__ = ["CHECKPOINT_NAME", "checkpoint_origin", "check_origin"]

#: A data-parallel checkpoint's file name, ``ckpt-epochNNNN.npz`` (the epoch after which it was taken).
CHECKPOINT_NAME = re.compile(r"^ckpt-epoch(\d+)\.npz$")


def checkpoint_origin(path):
    """Return the origin entries of checkpoint ``path``: ``meta/run_id`` (its run's id, UTF-8 bytes) and
    ``meta/epoch`` (from its name ``ckpt-epochN.npz``), each only when known.

    Examples
    --------
    >>> checkpoint_origin("no-such-run/ckpt-epoch0003.npz")  # no config.json there: no run id
    {'meta/epoch': array([3])}
    """
    out = run_id_entry(run_id_of(os.path.dirname(path) or ".") or "")
    m = CHECKPOINT_NAME.match(os.path.basename(path))
    if m:
        out["meta/epoch"] = numpy.array([int(m.group(1))], numpy.int64)
    return out


def check_origin(f, arrays, foreign_ok=False):
    """Raise :class:`CheckpointError` unless checkpoint file ``f`` was written by the run whose directory holds it.

    The checkpoint's ``meta/run_id`` must be the run id of its directory's ``config.json`` and its
    ``meta/epoch`` the epoch its name gives: a file copied in from another run, or renamed to another
    epoch, is refused. ``foreign_ok`` (``--allow-foreign-checkpoint``) accepts a file of another run
    (the user starts from it on purpose); the epoch must still agree with the name.

    Examples
    --------
    >>> import numpy as np
    >>> arrays = {"meta/epoch": np.array([3])}
    >>> check_origin("run/ckpt-epoch0002.npz", arrays, foreign_ok=True)
    Traceback (most recent call last):
    ...
    commlab.file_formats.CheckpointError: checkpoint run/ckpt-epoch0002.npz holds epoch 3, its name says epoch 2: it was renamed; ...
    """
    m = CHECKPOINT_NAME.match(os.path.basename(f))
    if m and "meta/epoch" in arrays:
        held = int(numpy.asarray(arrays["meta/epoch"]).reshape(-1)[0])
        if held != int(m.group(1)):
            raise CheckpointError(f"checkpoint {f} holds epoch {held}, its name says epoch {int(m.group(1))}: it was "
                                  "renamed; give it its own name, or resume from the file of that epoch")
    if foreign_ok:
        return
    here = run_id_of(os.path.dirname(f) or ".")
    held = held_run_id(arrays)
    if here is not None and held != here:
        whose = f"run {held}" if held else "a run that recorded no run id"
        raise CheckpointError(f"checkpoint {f} was written by {whose}, not by the run of {os.path.dirname(f) or '.'} "
                              f"({here}): it was copied from another run. To start from it on purpose, pass "
                              "--allow-foreign-checkpoint")
