"""Run directories and checkpoints: decided and written by rank 0, shared by broadcast.

A checkpoint is a file of commlab's checksummed format (:mod:`commlab.file_formats`): a ``.npz`` (no pickle:
plain numeric arrays only) holding a flat dict of arrays plus ``meta/sha256``, the SHA-256 of every
other entry. Rank 0 writes it with :func:`~commlab.file_formats.write_npz` (temporary file, fsync, rename:
atomic on POSIX), then all ranks meet at a barrier. Loading is done by rank 0, which verifies the
file and broadcasts its bytes; a corrupt, truncated or tampered file raises
:class:`~commlab.file_formats.CheckpointError`, naming the file, on every rank.
"""
import contextlib
import glob
import json
import os
import time
import zipfile

import numpy
from mpi4py import MPI

from collectives.engine.waiting import wait_within
from commlab.arrays import to_host
from commlab.error_root import CommlabError
from commlab.file_formats import CheckpointError, parse_npz, read_npz, write_npz
from commlab.logs import get_logger
from commlab.run_files import never_configured, run_id_of
from ps.checkpoints.shard_files import server_checkpoint_path
from training.origin import CHECKPOINT_NAME, check_origin, checkpoint_origin

_log = get_logger("training.runtime.checkpoint")

__all__ = ["restart_hint", "nothing_to_do", "RunDirError", "root_bytes", "make_run_dir", "checkpoint_path", "epoch_checkpoints",
           "find_checkpoint",
           "unfinished_without_checkpoint",
           "save_checkpoint", "load_checkpoint", "prune_checkpoints", "saved_epochs", "epochs_note"]

_RECORDS = ("metrics.jsonl", "epochs.jsonl", "staleness.json")  # a run's records, written as it goes


class RunDirError(CommlabError, ValueError):
    """The run directory cannot be created (the name is taken) or reopened (it does not exist)."""


def root_bytes(comm, fn, error=RuntimeError, timeout=None):
    """Run ``fn()`` on rank 0 and broadcast the bytes it returns to every rank.

    When ``fn`` raises on rank 0, every rank raises ``error`` with the same message, so no rank
    is left waiting. Only buffer-based broadcasts are used.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
    fn : callable
        Called on rank 0 only; returns ``bytes``.
    error : type
        Exception type raised on every rank when ``fn`` fails.
    timeout : float, optional
        Seconds each broadcast may wait for rank 0 (None: no limit).

    Returns
    -------
    bytes

    Raises
    ------
    collectives.CollectiveTimeout
        When a broadcast does not complete within ``timeout`` (rank 0 died or is stuck).
    """
    data, head = b"", numpy.zeros(2, numpy.int64)  # (status 0 ok / 1 error, length)
    if comm.rank == 0:
        try:
            data = bytes(fn())
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
            data, head[0] = f"{e}".encode(), 1
        head[1] = len(data)
    _bcast(comm, head, timeout, "run setup: waiting for rank 0's status")
    buf = numpy.frombuffer(bytearray(data), numpy.uint8) if comm.rank == 0 else numpy.empty(head[1], numpy.uint8)
    if head[1]:
        _bcast(comm, [buf, MPI.BYTE], timeout, "run setup: waiting for rank 0's data")
    text = buf.tobytes()
    if head[0]:
        raise error(text.decode(errors="replace"))
    return text


def _bcast(comm, buf, timeout, phase):
    """``MPI_Bcast`` from rank 0, waiting at most ``timeout`` seconds (a blocking one when None)."""
    if timeout is None:
        comm.Bcast(buf, root=0)
        return
    wait_within(comm.Ibcast(buf, root=0), timeout, "broadcast", phase)


def make_run_dir(cfg, comm):
    """Create the run directory on rank 0 and return its path on every rank.

    The name is ``cfg.name`` or ``TIMESTAMP-MODE-DATA-pP``, MODE ``tpT-ppQ`` on a model-parallel grid,
    DATA ``ctr`` for the ctr model (its synthetic click data) (with ``-2``, ``-3``... when taken);
    with ``cfg.resume`` it is the directory being resumed. Rank 0 also points ``RUN_DIR/latest``
    at it (a symbolic link, or a text file holding the path where links are not possible).

    Returns
    -------
    str

    Raises
    ------
    RunDirError
        On every rank, when ``cfg.name`` is taken, the run to resume does not exist, or the
        directory cannot be created.
    """
    def create():
        if cfg.resume:
            path = cfg.resume if os.path.isdir(cfg.resume) else (os.path.dirname(cfg.resume) or ".")
            if not os.path.isdir(path):
                raise OSError(f"--resume {cfg.resume}: no such run directory or checkpoint")
            if never_configured(path):  # killed before its configuration: an interrupted write's leftovers go
                for name in os.listdir(path):
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(os.path.join(path, name))
        else:
            grid = cfg.tensor_parallel * cfg.pipeline_parallel > 1  # a model-parallel grid names itself
            kind = f"tp{cfg.tensor_parallel}-pp{cfg.pipeline_parallel}" if grid else cfg.mode
            data = "ctr" if cfg.model == "ctr" else cfg.data
            base = cfg.name or f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}-{data}-p{comm.size}"
            path, k = os.path.join(cfg.run_dir, base), 1
            try:
                os.makedirs(cfg.run_dir, exist_ok=True)
            except OSError as e:
                why = "not a directory" if os.path.exists(cfg.run_dir) else (e.strerror or str(e))
                raise OSError(f"--run-dir {cfg.run_dir}: cannot create it ({why})") from None
            while True:
                try:
                    os.mkdir(path)
                    break
                except FileExistsError:
                    if cfg.name and unfinished_without_checkpoint(path):
                        _log.info("reusing run directory %s: the run there ended before its first "
                                  "checkpoint, so it starts again from the beginning", path)
                        leftovers = [n for n in os.listdir(path) if ".tmp" in n]  # an interrupted write's
                        for name in (*_RECORDS, *leftovers):  # the ended run's records would mix with the new ones
                            with contextlib.suppress(FileNotFoundError):
                                os.remove(os.path.join(path, name))
                        break
                    if cfg.name:
                        raise FileExistsError(f"run directory {path} exists: choose another --name, or "
                                              f"continue it with --resume {path}")
                    k += 1
                    path = os.path.join(cfg.run_dir, f"{base}-{k}")
                except OSError as e:
                    raise OSError(f"--run-dir {cfg.run_dir}: cannot create {path} ({e.strerror or e})") from None
        _point_latest(path)
        return path.encode()

    return root_bytes(comm, create, error=RunDirError, timeout=cfg.timeout).decode()


def restart_hint(cfg, run_dir=None):
    """Return how to restart ``cfg``'s run after its job ended early: ``restart with --resume RUN_DIR``.

    ``run_dir`` is the run's directory once :func:`make_run_dir` made it; before, the one ``cfg``
    names (``--resume``, ``--name``), else the ``latest`` link that rank 0 points at it.

    Examples
    --------
    >>> from training.settings.config import Config
    >>> restart_hint(Config(run_dir="runs", name="a"))
    'restart with --resume runs/a'
    """
    path = run_dir or cfg.resume or os.path.join(cfg.run_dir, cfg.name or "latest")
    return f"restart with --resume {path}"


def unfinished_without_checkpoint(run_dir):
    """Return True when ``run_dir`` holds a run that started but ended before its first checkpoint.

    Such a directory has the run's ``config.json`` but no ``summary.json``, no trainer checkpoint
    (``ckpt-epochNNNN.npz``) and no parameter-server checkpoint (``ps/ps_serverN.npz``): nothing in
    it can be resumed, and nothing is lost by starting the run again in it.

    Parameters
    ----------
    run_dir : str

    Returns
    -------
    bool
    """
    return ((os.path.isfile(os.path.join(run_dir, "config.json")) or never_configured(run_dir))
            and not os.path.exists(os.path.join(run_dir, "summary.json"))
            and not epoch_checkpoints(run_dir)
            and not glob.glob(server_checkpoint_path(os.path.join(glob.escape(run_dir), "ps"), "*")))


def _point_latest(path):
    parent = os.path.dirname(os.path.abspath(path))
    link, tmp = os.path.join(parent, "latest"), os.path.join(parent, f".latest.{os.getpid()}")
    try:
        os.symlink(os.path.basename(os.path.abspath(path)), tmp)
    except OSError:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(os.path.abspath(path) + "\n")
    if os.path.isdir(link) and not os.path.islink(link):
        os.remove(tmp)
        return  # a real directory named "latest" is left alone
    os.replace(tmp, link)


def checkpoint_path(run_dir, epoch):
    """Return the path of the checkpoint taken after ``epoch`` (1-based) in ``run_dir``."""
    return os.path.join(run_dir, f"ckpt-epoch{epoch:04d}.npz")


def epoch_checkpoints(run_dir):
    """Return the trainer checkpoints (``ckpt-epochNNNN.npz``) in ``run_dir``, oldest first (list of str)."""
    return sorted(p for p in glob.glob(os.path.join(glob.escape(run_dir), "ckpt-epoch*.npz"))
                  if CHECKPOINT_NAME.match(os.path.basename(p)))


def find_checkpoint(path):
    """Return ``path`` if it is a file, else the newest checkpoint in directory ``path``.

    Raises
    ------
    FileNotFoundError
        When there is no checkpoint.
    """
    if os.path.isfile(path):
        return path
    found = epoch_checkpoints(path)
    if not found:
        raise FileNotFoundError(f"no checkpoint (ckpt-epochNNNN.npz) in {path}")
    return found[-1]


def save_checkpoint(path, arrays, comm, timeout=None):
    """Write ``arrays`` to ``path`` on rank 0 (atomic, with checksum) and tell every rank how it went.

    Parameters
    ----------
    path : str
        Destination ``.npz`` file.
    arrays : dict of str -> array-like
        Numeric arrays (CuPy arrays are copied to the host); object arrays are refused.
    comm : mpi4py.MPI.Comm
    timeout : float, optional
        Seconds the other ranks wait for rank 0's verdict (None: no limit).

    Returns
    -------
    str
        ``path``.

    Raises
    ------
    TypeError
        On the ranks given an object array (checkpoints never hold pickles), before any message.
    CheckpointError
        On every rank, naming ``path`` and the cause, when rank 0 cannot write it (disk full, file
        size limit, permissions, a missing directory).
    """
    for k, v in arrays.items():
        if getattr(v, "dtype", None) is not None and v.dtype.hasobject:
            raise TypeError(f"checkpoint entry {k!r} is an object array")

    def write():
        write_npz(path, {**arrays, **checkpoint_origin(path)})
        return b""

    root_bytes(comm, write, error=CheckpointError, timeout=timeout)
    return path


def load_checkpoint(path, comm, missing_ok=False, timeout=None, foreign_ok=False):
    """Read and verify a checkpoint on rank 0 and return its arrays on every rank.

    Parameters
    ----------
    path : str
        A ``.npz`` checkpoint, or a run directory (its newest checkpoint is used).
    comm : mpi4py.MPI.Comm
    missing_ok : bool
        When ``path`` is a run directory that :func:`unfinished_without_checkpoint` describes,
        return ``(None, None)`` on every rank instead of raising.
    timeout : float, optional
        Seconds the other ranks wait for rank 0's file (None: no limit).
    foreign_ok : bool
        Accept a checkpoint written by another run (:func:`check_origin`).

    Returns
    -------
    tuple of (str, dict of str -> ndarray)
        The file actually read and its arrays (without ``meta/sha256``).

    Raises
    ------
    CheckpointError
        On every rank, naming the file, when it is missing, unreadable, corrupt or truncated, or
        written by another run or under another epoch's name (:func:`check_origin`).
    """
    def read():
        if missing_ok and os.path.isdir(path) and unfinished_without_checkpoint(path):
            return b""
        f = find_checkpoint(path)
        with open(f, "rb") as fh:
            data = fh.read()
        check_origin(f, parse_npz(data, f), foreign_ok)  # verify on rank 0 before anything is broadcast
        return f.encode() + b"\0" + data

    msg = root_bytes(comm, read, error=CheckpointError, timeout=timeout)
    if not msg:
        return None, None
    name, _, data = msg.partition(b"\0")
    return name.decode(), parse_npz(data, name.decode())


def prune_checkpoints(run_dir, keep):
    """Delete all but the ``keep`` newest checkpoints of ``run_dir`` (call on rank 0)."""
    found = epoch_checkpoints(run_dir)
    for p in found[:-keep] if keep > 0 else found:
        os.remove(p)


def epochs_note(cfg, epochs_before):
    """Return the warning logged when a resume changes the cosine schedule's length, else ''."""
    if epochs_before in (None, cfg.epochs) or cfg.lr_schedule != "cosine":
        return ""
    return (f"--epochs {cfg.epochs} differs from the run's {epochs_before}: the learning-rate schedule "
            f"is recomputed for {cfg.epochs} epochs, so the result will not equal an uninterrupted "
            f"{cfg.epochs}-epoch run")


def saved_epochs(run_dir):
    """Return ``epochs`` of the configuration saved in ``run_dir/config.json`` (None if unreadable)."""
    try:
        with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
            return json.load(f)["config"]["epochs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def nothing_to_do(cfg, run_dir, epoch):
    """Return the line a resumed run already at its last epoch (``epoch``, completed) prints.

    Examples
    --------
    >>> from training.settings.config import Config
    >>> nothing_to_do(Config(epochs=3), "runs/a", 3)
    'nothing to do: runs/a is already at epoch 3 of 3 (a larger --epochs trains further)'
    """
    if epoch < cfg.epochs:
        where = f"epoch {epoch} (--stop-after {cfg.stop_after})"
    elif epoch == cfg.epochs:
        where = f"epoch {epoch} of {cfg.epochs} (a larger --epochs trains further)"
    else:
        where = f"epoch {epoch}, past --epochs {cfg.epochs}"
    return f"nothing to do: {run_dir} is already at {where}"
