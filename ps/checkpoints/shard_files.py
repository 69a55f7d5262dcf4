"""A parameter server's checkpoint: what its shard's file holds, whose it is, and the checks made before
a server resumes from it.

Server ``N`` writes ``ps_serverN.npz`` (:func:`server_checkpoint_path`) with
:func:`commlab.file_formats.write_npz` (atomic, SHA-256 inside). The file holds:

============================  ==================================================================
``params``                    the shard, shape (n_r,), float32 or float64
``offset``, ``total``         where the shard lies in the flat vector (elements)
``servers``                   the run's server ranks S
``pushes``, ``version``       pushes folded into the shard, optimizer updates applied (counts)
``elapsed``                   seconds of training when it was written
``optim/*``                   the optimizer's state (:class:`ps.serving.server_optimizer.ServerOptimizer`)
``folded``, ``status``        the clock table (:class:`ps.serving.consistency.ClockTable`), one per worker
``meta/run_id``               the run's id (:attr:`ps.job.settings.PSOptions.run_id`), UTF-8 bytes as uint8
``meta/server``               N, the shard's index
``meta/layout``               a row-sharded table's layout (:meth:`ps.shards.rows.RowSharding.fingerprint`;
                              sparse servers only: their pieces are no slice of a flat vector)
============================  ==================================================================

Generations: a server writes its file each time its folded pushes cross a multiple of the interval (and
when its loop ends), and before it replaces the file it keeps the one there as ``ps_serverN.prev.npz``
when that holds fewer pushes (a hard link: the bytes are not copied). Every replica of a shard writes
(the same bytes but the time), so a backup that takes over has the generation its dead primary missed.
A job killed between two servers' writes, or inside one, thus leaves every shard's previous generation
beside the newer ones: :func:`newest_generation` picks the newest generation every shard holds, and a
directory where no generation is complete (a job killed inside its first write) holds no checkpoint yet.

``meta/run_id`` is the entry the trainer's own checkpoints carry (:mod:`training.origin`), so one run's
files, whatever wrote them, name the same run. Before a server resumes, :func:`check_server_checkpoint`
refuses, naming the file: a file of another run (unless the caller accepts one, ``allow_foreign``), a
shard of another server index (a file copied under another server's name), another layout (servers,
workers; a sparse server's rows sharded otherwise, naming the setting), and values that pass the checksum
but make no sense (integer or non-finite parameters,
negative counts, more updates than pushes).

Imports: :mod:`commlab.file_formats`, :mod:`ps.shards.key_ranges` and :mod:`ps.shards.rows` only.
"""
import os
import zipfile

import numpy as np

from commlab.file_formats import CheckpointError, read_npz, write_npz
from ps.shards.key_ranges import shard_offsets
from ps.shards.rows import layout_difference

__all__ = ["RUN_ID", "server_checkpoint_path", "run_id_entry", "held_run_id", "server_arrays", "save_server",
           "check_server_checkpoint", "read_server_checkpoint", "check_resume", "restore_server",
           "previous_checkpoint_path", "newest_generation"]

RUN_ID = "meta/run_id"  # the origin entry of every checkpoint: its run's id, UTF-8 bytes as uint8
_COUNTS = ("offset", "total", "servers", "pushes", "version")  # one whole number >= 0 each
_FOREIGN_HINT = ("to start from it on purpose, accept another run's checkpoint (the trainer's "
                 "--allow-foreign-checkpoint)")


def server_checkpoint_path(directory, server):
    """Return the checkpoint file of server ``server`` in ``directory``.

    Parameters
    ----------
    directory : str
        The servers' checkpoint directory (the trainer's is ``RUN_DIR/ps``).
    server : int or "*"
        The server's index ``0 <= server < S``, or ``"*"`` for the glob pattern of every server's file.

    Returns
    -------
    str

    Examples
    --------
    >>> server_checkpoint_path("runs/a/ps", 1)
    'runs/a/ps/ps_server1.npz'
    """
    return os.path.join(directory, f"ps_server{server}.npz")


def run_id_entry(run_id):
    """Return the origin entry ``{"meta/run_id": uint8 bytes}`` of ``run_id`` (``{}`` when it is empty).

    Examples
    --------
    >>> run_id_entry("5f2a")
    {'meta/run_id': array([ 53, 102,  50,  97], dtype=uint8)}
    >>> run_id_entry("")
    {}
    """
    return {RUN_ID: np.frombuffer(run_id.encode(), np.uint8).copy()} if run_id else {}


def held_run_id(arrays):
    """Return the run id a checkpoint's ``arrays`` hold (``""`` when none).

    Examples
    --------
    >>> held_run_id(run_id_entry("5f2a")), held_run_id({})
    ('5f2a', '')
    """
    held = np.asarray(arrays.get(RUN_ID, np.zeros(0, np.uint8)))
    if held.dtype != np.uint8:
        return "?"
    return bytes(held.reshape(-1)).decode("utf-8", "replace")


def server_arrays(server):
    """Return the checkpoint entries of ``server`` (a :class:`ps.serving.shard_server.Server`): the table above."""
    state = {"params": server.params, "offset": server.offset, "total": server.total,
             "pushes": server.pushes, "servers": server.opts.servers, "elapsed": server.elapsed(),
             "version": server.version, "meta/server": np.array([server.index], np.int64)}
    state.update(server.opt.state_dict())
    state.update(server.table.state_dict())
    state.update(run_id_entry(server.opts.run_id))
    if getattr(server, "layout", None) is not None:  # a sparse server's pieces of rows (ps.embedding.sparse_push_pull)
        state["meta/layout"] = np.asarray(server.layout, np.int64)
    return state


def save_server(server):
    """Write ``server``'s checkpoint into ``server.opts.checkpoint_dir`` (atomic), keeping the previous
    generation (the module docstring); return its path."""
    os.makedirs(server.opts.checkpoint_dir, exist_ok=True)
    path = server_checkpoint_path(server.opts.checkpoint_dir, server.index)
    _keep_previous(path, server.pushes)
    write_npz(path, server_arrays(server))
    return path


def previous_checkpoint_path(path):
    """Return where the generation before ``path``'s is kept.

    Examples
    --------
    >>> previous_checkpoint_path("runs/a/ps/ps_server1.npz")
    'runs/a/ps/ps_server1.prev.npz'
    """
    return path[:-len(".npz")] + ".prev.npz"


def _keep_previous(path, pushes):
    """Before ``path`` is replaced by a generation of ``pushes``, keep the file there as the previous one when it
    holds fewer pushes (a replica writing the same generation finds it already replaced: it keeps nothing)."""
    prev = previous_checkpoint_path(path)
    tmp = f"{prev}.tmp.{os.getpid()}"
    try:
        os.link(path, tmp)  # the file as it is now, whoever replaces it meanwhile
    except FileNotFoundError:
        return
    held = _pushes_of(tmp)
    if held is not None and held < pushes:
        os.replace(tmp, prev)
    if os.path.lexists(tmp):  # not kept, or rename() did nothing: another replica's link made prev this file
        os.remove(tmp)


def _pushes_of(path):
    """Return the pushes a server checkpoint holds, or None when it is missing or unreadable (read unverified:
    :func:`read_server_checkpoint` verifies the file chosen)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return int(np.asarray(z["pushes"]).reshape(-1)[0])
    except (OSError, ValueError, KeyError, IndexError, TypeError, zipfile.BadZipFile, EOFError):
        return None


def newest_generation(directory, shards):
    """Return the files, one per shard, of the newest generation that every shard's checkpoint holds, or None.

    Each shard has its file ``ps_serverN.npz`` and maybe the previous generation's (:func:`previous_checkpoint_path`);
    a generation is the number of pushes a file holds. None when no generation is complete: no shard has
    written yet, or a job was killed inside its first write.

    Parameters
    ----------
    directory : str
        The servers' checkpoint directory.
    shards : int
        Number of shards.

    Returns
    -------
    list of str or None

    Examples
    --------
    >>> import tempfile
    >>> newest_generation(tempfile.mkdtemp(), 2) is None
    True
    """
    have = {}  # pushes -> {shard: file}
    for g in range(shards):
        current = server_checkpoint_path(directory, g)
        for path in (previous_checkpoint_path(current), current):
            n = _pushes_of(path)
            if n is not None:
                have.setdefault(n, {})[g] = path
    complete = [n for n, files in have.items() if len(files) == shards]
    return [have[max(complete)][g] for g in range(shards)] if complete else None


def _one_count(path, key, v):
    v = np.asarray(v)
    if v.size != 1 or v.dtype.kind not in "iu" or int(v.reshape(-1)[0]) < 0:
        raise CheckpointError(f"checkpoint {path}: entry {key} = {v.tolist()!r} is not a whole number >= 0")
    return int(v.reshape(-1)[0])


def _check_values(path, arrays):
    """Raise :class:`CheckpointError` naming ``path`` and the entry when a value makes no sense."""
    missing = [k for k in ("params", "offset", "total", "servers", "pushes", "elapsed", "folded", "status")
               if k not in arrays]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {missing}: it is not a parameter server's checkpoint")
    counts = {k: _one_count(path, k, arrays[k]) for k in _COUNTS if k in arrays}
    params = np.asarray(arrays["params"])
    if params.ndim != 1 or params.dtype.kind != "f":
        raise CheckpointError(f"checkpoint {path}: entry params holds {params.dtype} values of shape {params.shape}, "
                              "not a vector of floating-point numbers")
    if not np.isfinite(params).all():
        raise CheckpointError(f"checkpoint {path}: entry params holds {int((~np.isfinite(params)).sum())} "
                              "values that are not finite")
    if counts["servers"] < 1 or counts["offset"] + params.size > counts["total"] and "meta/layout" not in arrays:
        raise CheckpointError(f"checkpoint {path}: a shard of {params.size} at offset {counts['offset']} does not "
                              f"fit a vector of {counts['total']} on {counts['servers']} server(s)")
    if counts.get("version", 0) > counts["pushes"]:
        raise CheckpointError(f"checkpoint {path}: {counts['version']} updates applied from {counts['pushes']} "
                              "pushes (an update needs at least one push): the counts contradict each other")
    elapsed = np.asarray(arrays["elapsed"])
    if elapsed.size != 1 or elapsed.dtype.kind not in "iuf" or not np.isfinite(elapsed).all() or elapsed.item() < 0:
        raise CheckpointError(f"checkpoint {path}: entry elapsed = {elapsed.tolist()!r} is not seconds >= 0")
    for key in ("folded", "status"):
        v = np.asarray(arrays[key])
        if v.ndim != 1 or v.dtype.kind not in "iu" or (v < 0).any():
            raise CheckpointError(f"checkpoint {path}: entry {key} holds {v.tolist()!r}, not one count >= 0 per worker")
    for key, v in arrays.items():
        if not key.startswith(("optim/", "opt_")):
            continue
        v = np.asarray(v)
        if v.dtype.kind in "iu" and (v < 0).any():
            raise CheckpointError(f"checkpoint {path}: entry {key} holds a negative count")
        if v.dtype.kind not in "iuf":
            raise CheckpointError(f"checkpoint {path}: entry {key} holds {v.dtype} values, not numbers")
        if v.dtype.kind == "f" and not np.isfinite(v).all():
            raise CheckpointError(f"checkpoint {path}: entry {key} holds {int((~np.isfinite(v)).sum())} values "
                                  "that are not finite")


def check_server_checkpoint(path, arrays, index, *, run_id="", allow_foreign=False, servers=None, workers=None,
                            total=None, shards=None, layout=None):
    """Raise :class:`CheckpointError`, naming ``path``, unless server ``index`` may resume from ``arrays``.

    Parameters
    ----------
    path : str
        The file (``ps_serverN.npz``), named in every error.
    arrays : dict of str -> ndarray
        Its verified entries (:func:`commlab.file_formats.read_npz`).
    index : int
        The server index that resumes from it (N of its name).
    run_id : str
        The resuming run's id; ``""`` skips the origin check (a caller that keeps no run id).
    allow_foreign : bool
        Accept a file that another run wrote (its run id differs, or it holds none).
    servers, workers : int, optional
        The job's server ranks S and workers W, when known: the file must have been written by a job
        of the same shape.
    total, shards : int, optional
        The flat vector's length and the number of shards, when known: the file must hold shard
        ``index`` of that split (:func:`ps.shards.key_ranges.shard_offsets`), unless it holds a row layout.
    layout : ndarray, optional
        The job's row layout (:meth:`ps.shards.rows.RowSharding.fingerprint`), when its servers hold pieces of
        rows: the file must hold the same.

    Raises
    ------
    CheckpointError
        When the file belongs to another run, another server index or another job shape, or a value
        makes no sense (the module docstring lists them).

    Examples
    --------
    >>> import numpy as np
    >>> good = {"params": np.zeros(3), "offset": np.array(0), "total": np.array(3), "servers": np.array(1),
    ...         "pushes": np.array(8), "version": np.array(4), "elapsed": np.array(0.5),
    ...         "folded": np.array([4, 4]), "status": np.array([0, 0]), "meta/server": np.array([0]),
    ...         **run_id_entry("5f2a")}
    >>> check_server_checkpoint("ps/ps_server0.npz", good, 0, run_id="5f2a", servers=1, workers=2)
    >>> check_server_checkpoint("ps/ps_server0.npz", good, 0, run_id="77aa")
    Traceback (most recent call last):
    ...
    commlab.file_formats.CheckpointError: checkpoint ps/ps_server0.npz was written by run 5f2a, not by run 77aa: ...
    >>> check_server_checkpoint("ps/ps_server1.npz", good, 1)
    Traceback (most recent call last):
    ...
    commlab.file_formats.CheckpointError: checkpoint ps/ps_server1.npz holds the shard of server 0, not of server 1: ...
    """
    _check_values(path, arrays)
    if "meta/server" in arrays:
        held = _one_count(path, "meta/server", arrays["meta/server"])
        if held != int(index):
            raise CheckpointError(f"checkpoint {path} holds the shard of server {held}, not of server {index}: it "
                                  f"was copied under another server's name; restore ps_server{held}.npz there")
    if run_id and not allow_foreign:
        held = held_run_id(arrays)
        if held != run_id:
            whose = f"run {held}" if held else "a run that recorded no run id"
            raise CheckpointError(f"checkpoint {path} was written by {whose}, not by run {run_id}: it was copied "
                                  f"from another run; {_FOREIGN_HINT}")
    if servers is not None and int(np.asarray(arrays["servers"]).reshape(-1)[0]) != servers:
        raise CheckpointError(f"checkpoint {path} was written by a job of {int(np.asarray(arrays['servers']).item())} "
                              f"server(s), this job has {servers}: resume with the same servers")
    if workers is not None and np.asarray(arrays["folded"]).shape != (workers,):
        raise CheckpointError(f"checkpoint {path} was written by a job of {np.asarray(arrays['folded']).size} "
                              f"worker(s), this job has {workers}: resume with the same number of ranks")
    if layout is not None or "meta/layout" in arrays:
        if layout is not None and "meta/layout" not in arrays:
            raise CheckpointError(f"checkpoint {path} holds a slice of a flat vector, this job's servers hold "
                                  "pieces of rows: resume with the same model and mode")
        differ = "" if layout is None else layout_difference(arrays["meta/layout"], layout)
        if differ:
            raise CheckpointError(f"checkpoint {path} holds {differ}: resume with the same settings")
    elif total is not None and shards is not None:
        offsets = shard_offsets(total, shards)
        want = (int(offsets[index]), int(offsets[index + 1] - offsets[index]), int(total))
        held = (int(np.asarray(arrays["offset"]).item()), int(np.asarray(arrays["params"]).size),
                int(np.asarray(arrays["total"]).item()))
        if held != want:
            raise CheckpointError(f"checkpoint {path} holds a shard of another layout (offset {held[0]}, "
                                  f"{held[1]} of {held[2]} parameters; this job's shard {index}: offset {want[0]}, "
                                  f"{want[1]} of {want[2]}): resume with the same servers and model")


def read_server_checkpoint(path, index, **expect):
    """Read ``path`` (verified, :func:`commlab.file_formats.read_npz`) and check it for server ``index``; return its arrays.

    ``expect`` are the keyword arguments of :func:`check_server_checkpoint`.

    Raises
    ------
    CheckpointError
        Naming ``path``: missing, corrupt, or refused by :func:`check_server_checkpoint`.
    """
    arrays = read_npz(path)
    check_server_checkpoint(path, arrays, index, **expect)
    return arrays


def check_resume(directory, shards, **expect):
    """Check, on any rank, the checkpoint of every shard in ``directory`` before a run resumes from them.

    The files of the newest generation every shard holds (:func:`newest_generation`), else every shard's
    current file, are read and checked as their servers will (:func:`read_server_checkpoint`, ``expect``
    its keyword arguments, with ``shards`` set here), and they must be of one generation:
    shards of different generations together would be two models.

    Parameters
    ----------
    directory : str
        The servers' checkpoint directory (files ``ps_server0.npz`` ... ``ps_server{shards-1}.npz``).
    shards : int
        Number of shards (one file each).

    Returns
    -------
    int
        The pushes the checkpoints hold (where the run resumes).

    Raises
    ------
    CheckpointError
        Naming the file: missing, corrupt, refused by :func:`check_server_checkpoint`, or of
        another generation than ``ps_server0.npz``.

    Examples
    --------
    >>> import tempfile
    >>> check_resume(tempfile.mkdtemp(), 1)
    Traceback (most recent call last):
    ...
    commlab.file_formats.CheckpointError: cannot read checkpoint .../ps_server0.npz: No such file or directory
    """
    paths = newest_generation(directory, shards) or [server_checkpoint_path(directory, g) for g in range(shards)]
    pushes = [int(read_server_checkpoint(p, g, shards=shards, **expect)["pushes"]) for g, p in enumerate(paths)]
    for g in range(1, shards):
        if pushes[g] != pushes[0]:
            raise CheckpointError(f"the server checkpoints are of different generations: {paths[0]} holds "
                                  f"{pushes[0]} pushes, {paths[g]} holds {pushes[g]} (the job ended between the "
                                  "servers' writes); resuming would mix two models")
    return pushes[0]


def restore_server(server, path):
    """Load checkpoint ``path`` into ``server`` (shard, optimizer state, clocks, counts) after the checks.

    Raises
    ------
    CheckpointError
        From :func:`read_server_checkpoint` (run id ``server.opts.run_id`` unless ``opts.allow_foreign``).
    ValueError
        When the optimizer state does not fit this shard's optimizer.
    """
    opts = server.opts
    even = shard_offsets(server.total, opts.shards)  # a row-sharded (sparse) server's shard is not the even split
    regular = server.params.size == int(even[server.index + 1] - even[server.index])
    state = read_server_checkpoint(path, server.index, run_id=opts.run_id, allow_foreign=opts.allow_foreign,
                                   servers=opts.servers, workers=server.n_workers,
                                   total=server.total if regular else None, shards=opts.shards if regular else None,
                                   layout=getattr(server, "layout", None))
    if state["params"].size != server.params.size:
        raise CheckpointError(f"checkpoint {path} holds {state['params'].size} parameters, this job's shard "
                              f"{server.index} {server.params.size}: resume with the same servers and model")
    server.params[:] = state["params"]
    server.opt.load_state_dict(state)
    server.table.load_state_dict(state)
    server.pushes = server.resumed_pushes = int(state["pushes"])
    server.version = int(state["version"]) if "version" in state else server.pushes
    server.resumed_seconds = float(state["elapsed"])
