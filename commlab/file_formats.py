"""The file formats every layer writes: atomic, checksummed ``.npz`` files, atomic JSON, JSON lines.

``.npz`` (the storage format of every checkpoint in commlab): a ``.npz`` without pickle (plain
numeric arrays only) holding a flat dict of arrays plus ``meta/sha256``, the SHA-256 of every other
entry (name, dtype, shape and bytes, in sorted name order). :func:`write_npz` writes it to a
temporary file, fsyncs and renames it into place (atomic on POSIX); :func:`read_npz` and
:func:`parse_npz` verify it, and a missing, corrupt, truncated or tampered file raises
:class:`CheckpointError` naming the file. The parameter servers write their shards with it, the
trainer its checkpoints (rank 0 reading and broadcasting).

JSON: :func:`write_json` writes a whole document atomically (results files, ``config.json``,
``summary.json``); :func:`read_jsonl` reads a JSON-lines record file (``metrics.jsonl``,
``epochs.jsonl``), dropping a last line that a kill tore. A writer killed mid-write leaves
``PATH.tmp.PID`` behind; the next write in the same folder removes it
(:func:`remove_stale_temporaries`).

Imports: NumPy and :mod:`commlab` (the error root, the array-module helpers, the loggers) only.
"""
import contextlib
import glob
import hashlib
import io
import json
import os
import zipfile

import numpy

from commlab.arrays import to_host
from commlab.error_root import CommlabError
from commlab.logs import get_logger

__all__ = ["CheckpointError", "write_npz", "read_npz", "parse_npz", "remove_stale_temporaries", "write_json",
           "read_jsonl"]

_log = get_logger("file_formats")  # the logger commlab.file_formats


class CheckpointError(CommlabError, ValueError):
    """A checkpoint file cannot be used (unreadable, corrupt, truncated or inconsistent)."""


def _digest(arrays):
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = numpy.ascontiguousarray(arrays[key])
        h.update(f"{key}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return numpy.frombuffer(h.digest(), numpy.uint8).copy()


def write_npz(path, arrays):
    """Write ``arrays`` to ``path`` on this rank alone: ``.npz`` without pickle, SHA-256 inside, atomic.

    The file is written to ``PATH.tmp.PID``, synced and renamed, so a reader never sees half a file.
    Temporary files that a killed writer left beside ``path`` (``*.npz.tmp.PID`` of a process that
    no longer runs on this host) are removed first; a failed write removes its own.

    Parameters
    ----------
    path : str
    arrays : dict of str -> array-like
        Numeric arrays (CuPy arrays are copied to the host).

    Raises
    ------
    TypeError
        When an entry is an object array (checkpoints never hold pickles).
    CheckpointError
        Naming ``path`` and the cause, when the file cannot be written (disk full, file size limit,
        permissions, a missing directory).

    Examples
    --------
    >>> import os, tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_npz(os.path.join(d, "shard.npz"), {"params": numpy.arange(3.0)})
    ...     read_npz(os.path.join(d, "shard.npz"))
    {'params': array([0., 1., 2.])}
    """
    host = {k: to_host(v) for k, v in arrays.items()}
    for k, v in host.items():
        if v.dtype.hasobject:
            raise TypeError(f"checkpoint entry {k!r} is an object array")
    host["meta/sha256"] = _digest(host)
    remove_stale_temporaries(os.path.dirname(path) or ".")
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            numpy.savez(f, **host)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise CheckpointError(f"cannot write checkpoint {path}: {e.strerror or e}") from None


def remove_stale_temporaries(directory, pattern="*.npz.tmp.*"):
    """Remove ``*.npz.tmp.PID`` files in ``directory`` whose writer no longer runs on this host.

    A process killed while :func:`write_npz` wrote leaves its full-size temporary file behind; the
    next write in the same directory calls this. Files of live processes are kept.

    Parameters
    ----------
    directory : str
    pattern : str
        Glob pattern of the temporary files, ending in ``.tmp.*`` (the writer's process id); default:
        those of :func:`write_npz`.

    Returns
    -------
    list of str
        The files removed.
    """
    removed = []
    for tmp in glob.glob(os.path.join(glob.escape(directory), pattern)):
        pid = tmp.rsplit(".", 1)[1]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            os.remove(tmp)
            removed.append(tmp)
    return removed


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def read_npz(path):
    """Read and verify a file written by :func:`write_npz` on this rank alone.

    Parameters
    ----------
    path : str

    Returns
    -------
    dict of str -> ndarray
        The arrays, without ``meta/sha256``.

    Raises
    ------
    CheckpointError
        Naming the file, when it is missing, corrupt, truncated or fails its checksum.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror or e}") from None
    return parse_npz(data, path)


def parse_npz(data, path):
    """Decode and verify the bytes of a file written by :func:`write_npz`.

    Parameters
    ----------
    data : bytes
        The whole file.
    path : str
        The file's name, for the error message.

    Returns
    -------
    dict of str -> ndarray
        The arrays, without ``meta/sha256``.

    Raises
    ------
    CheckpointError
        Naming ``path``, when the bytes are corrupt, truncated or fail the checksum.

    Examples
    --------
    >>> parse_npz(b"not a zip file", "shard.npz")
    Traceback (most recent call last):
    ...
    commlab.file_formats.CheckpointError: ...shard.npz...
    """
    try:
        with numpy.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated: {e}") from None
    stored = arrays.pop("meta/sha256", None)
    if stored is None:
        raise CheckpointError(f"checkpoint {path} has no checksum (meta/sha256)")
    if not numpy.array_equal(stored, _digest(arrays)):
        raise CheckpointError(f"checkpoint {path} fails its SHA-256 check (corrupt or modified)")
    return arrays


def write_json(path, obj):
    """Write ``obj`` as indented JSON to ``path`` atomically (temporary file ``PATH.tmp.PID``, then rename).

    The temporary files of ``path`` that a killed writer left (``PATH.tmp.PID`` of a process that no
    longer runs on this host) are removed first.
    """
    remove_stale_temporaries(os.path.dirname(path) or ".", glob.escape(os.path.basename(path)) + ".tmp.*")
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def read_jsonl(path):
    """Return the list of JSON objects in a JSON-lines file ([] when it does not exist).

    A torn last line (a run killed while appending it) is dropped with a warning naming the file; a
    damaged line before the last is an error.

    Raises
    ------
    ValueError
        A line other than the last is not a JSON object (the message names the file and the line).

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "epochs.jsonl")
    >>> with open(path, "w") as f:
    ...     _ = f.write('{"epoch": 1}\\n{"epoch": 2}\\n{"epo')
    >>> read_jsonl(path)
    [{'epoch': 1}, {'epoch': 2}]
    """
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [(i, line) for i, line in enumerate(f, 1) if line.strip()]
    rows = []
    for k, (i, line) in enumerate(lines):
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            if k == len(lines) - 1:  # torn by a kill while it was written: the record never finished
                _log.warning("%s: dropped its torn last line %d (%s)", path, i, exc)
                break
            raise ValueError(f"{path}: line {i} is not a JSON object ({exc}); the file is damaged") from None
        rows.append(row)
    return rows
