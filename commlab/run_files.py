"""Run records: configuration header and the run's identity, per-step and per-epoch JSON lines,
summary, epoch table.

Files in a run directory (all written by rank 0 alone, with :func:`commlab.file_formats.write_json`):

``config.json``
    ``{"config": resolved Config, "run": run_info()}``; each resumed job keeps ``run`` as it was
    and appends ``run_info()`` plus ``resumed_from`` and ``changed`` (the configuration fields it
    changed, ``[old, new]``) to a ``resumes`` list; ``config`` is then the latest job's. The first
    job's ``run.run_id`` is the run's identity (:func:`run_id_of`), which checkpoints carry; a run
    directory without ``config.json`` belongs to a job killed before it wrote one
    (:func:`never_configured`).
``metrics.jsonl``
    One line per step: ``step``, ``epoch``, ``loss`` (rank 0's batch), ``lr``, ``compute_s``,
    ``comm_s``, ``wait_s``, ``transfer_s``, ``compress_s``, ``decompress_s`` (seconds),
    ``bytes_sent`` (bytes, rank 0), ``skipped`` (0/1), ``arrival_s`` (seconds from the step's start to
    its first collective), ``wall_s`` (seconds since the run started).
``epochs.jsonl``
    One line per epoch: the epoch table's values (means over ranks) plus ``wall_s``.
``summary.json``
    Final test accuracy, wall time, communication fraction and totals, and ``load_average_end`` (the
    1-minute load average when the run ended: with ``config.json``'s ``run.load_average`` it tells
    whether the run was measured on a quiet machine, :func:`commlab.provenance.is_quiet`).

Communication time: ``comm_s`` = ``wait_s`` + ``transfer_s`` (seconds, per-rank sums, means over
ranks). ``wait_s`` is the skew: the time a rank spends at the step's first exchange (a one-element
all-reduce) until the last rank arrives, plus that small message's latency; ``transfer_s`` is the
gradient exchange itself, once the ranks are in step. A rank that waits for a slower one counts
the wait in ``comm_s`` and ``wait_s`` but not in ``transfer_s``: the mean ``comm_s`` over ranks can
exceed rank 0's ``wall_s`` on a machine whose ranks share cores, while ``transfer_s`` is what the
messages themselves took. ``summary.json`` holds the run's totals of both (rank 0; ``null`` when a
resumed run's earlier epochs were recorded without them).

Imports: NumPy and :mod:`commlab` only; mpi4py is imported inside :func:`run_info`, when it is called.
"""
import json
import os
import platform
import socket
import sys
import time
import uuid

import numpy

from commlab.byte_sizes import format_bytes
from commlab.file_formats import read_jsonl, write_json
from commlab.provenance import mpi_library

__all__ = ["run_info", "write_config", "run_id_of", "never_configured", "MetricsWriter", "EpochTable",
           "TABLE_COLUMNS"]


def run_info(comm):
    """Return what a results file must carry besides the configuration.

    Returns
    -------
    dict
        MPI library version (first line, runs of whitespace collapsed), MPI standard version,
        mpi4py and NumPy versions, P, host, Python version, argv, the start time (ISO 8601,
        local), the core count, the 1-minute load average at the start, and ``run_id``: a random
        identifier (128 bits, hex) that the first job of a run keeps in ``config.json`` and writes into
        every checkpoint, so that a checkpoint copied from another run is recognised.
    """
    import mpi4py  # asked when a run starts, never when commlab is imported
    from mpi4py import MPI

    return {"run_id": uuid.uuid4().hex, "mpi_library": mpi_library(),  # one line: MPICH's padding and Open MPI's NUL removed
            "mpi_version": "%d.%d" % MPI.Get_version(), "mpi4py": mpi4py.__version__,
            "numpy": numpy.__version__, "P": comm.size, "host": socket.gethostname(),
            "python": platform.python_version(), "argv": sys.argv[1:],
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "cores": os.cpu_count(),
            "load_average": round(os.getloadavg()[0], 2)}


def write_config(run_dir, config, info, resumed_from=None):
    """Write ``run_dir/config.json`` (call on rank 0).

    Parameters
    ----------
    run_dir : str
    config : dict
        The resolved configuration (``Config.to_dict()``).
    info : dict
        :func:`run_info` of this job.
    resumed_from : str, optional
        The checkpoint this job resumed from: the file's first ``run`` record is then kept and
        this job's appended to ``resumes``, with ``changed`` = {field: [old, new]} for every
        configuration field (but ``resume``) that differs from the previous job's.
    """
    path = os.path.join(run_dir, "config.json")
    record = {"config": config, "run": info}
    if resumed_from:
        try:
            with open(path, encoding="utf-8") as f:
                old = json.load(f)
        except (OSError, ValueError):
            old = {}
        old = old if isinstance(old, dict) else {}
        prev = old.get("config") if isinstance(old.get("config"), dict) else {}
        changed = {k: [prev.get(k), v] for k, v in config.items() if k != "resume" and prev.get(k) != v}
        resumes = old.get("resumes") if isinstance(old.get("resumes"), list) else []
        record = {**old, "config": config, "run": old.get("run") or info,  # (a first job killed before it wrote one)
                  "resumes": resumes + [{**info, "resumed_from": resumed_from, "changed": changed}]}
    write_json(path, record)


def run_id_of(run_dir):
    """Return the run id of ``run_dir`` (``config.json``'s first ``run`` record), or None when it has none.

    Examples
    --------
    >>> import json, os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> run_id_of(d) is None
    True
    >>> with open(os.path.join(d, "config.json"), "w") as f:
    ...     json.dump({"config": {}, "run": {"run_id": "5f2a"}}, f)
    >>> run_id_of(d)
    '5f2a'
    """
    try:
        with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
            run = json.load(f).get("run")
    except (OSError, ValueError, AttributeError):
        return None
    rid = run.get("run_id") if isinstance(run, dict) else None
    return rid if isinstance(rid, str) and rid else None


def never_configured(run_dir):
    """Return True when ``run_dir`` is a run directory whose job was killed before it wrote ``config.json``:
    it holds nothing, or only the temporary files of an interrupted write (``*.tmp*``).

    Examples
    --------
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> never_configured(d)
    True
    >>> open(os.path.join(d, "config.json.tmp.123"), "w").close()
    >>> never_configured(d)
    True
    >>> open(os.path.join(d, "metrics.jsonl"), "w").close()
    >>> never_configured(d)
    False
    """
    try:
        names = os.listdir(run_dir)
    except OSError:
        return False
    return not os.path.exists(os.path.join(run_dir, "config.json")) and all(".tmp" in n for n in names)


def _torn(path):
    """Return True when ``path`` exists and does not end with a line end (its last line was torn)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:
        return False


class MetricsWriter:
    """Append step and epoch records to ``metrics.jsonl`` and ``epochs.jsonl`` (rank 0 only).

    A file whose last line a kill tore (it has no line end) loses that line first, with the warning
    of :func:`commlab.file_formats.read_jsonl` naming the file, also without ``keep_epochs`` (a
    parameter-server run appends its records), so that the next record starts a line of its own.

    Parameters
    ----------
    run_dir : str
    enabled : bool
        False on every rank but 0: all methods then do nothing.
    keep_epochs : int, optional
        When resuming, records of epochs after this one (left by an interrupted run) are
        dropped first, so the files describe one consistent history.
    """

    def __init__(self, run_dir, enabled, keep_epochs=None):
        self.enabled = enabled
        self._steps = self._epochs = None
        self._kept = []
        if not enabled:
            return
        paths = [os.path.join(run_dir, n) for n in ("metrics.jsonl", "epochs.jsonl")]
        for path in paths:
            if keep_epochs is None and not _torn(path):
                continue
            rows = [r for r in read_jsonl(path) if keep_epochs is None or r.get("epoch", 0) <= keep_epochs]
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            os.replace(tmp, path)
            if keep_epochs is not None:
                self._kept = rows  # the epoch records of the run so far (epochs.jsonl's, the last path)
        self._steps = open(paths[0], "a", encoding="utf-8")
        self._epochs = open(paths[1], "a", encoding="utf-8")

    def step(self, record):
        """Append one per-step record (a dict of JSON-ready values)."""
        if self.enabled:
            self._steps.write(json.dumps(record) + "\n")

    def epoch(self, record):
        """Append one per-epoch record and flush both files."""
        if self.enabled:
            self._kept.append(record)
            self._epochs.write(json.dumps(record) + "\n")
            self._epochs.flush()
            self._steps.flush()

    def total(self, key):
        """Return the sum of ``key`` over the run's epoch records, kept and new (None if any lacks it).

        On a resumed run this covers the earlier jobs' epochs too (those of ``epochs.jsonl`` up to
        ``keep_epochs``); a record written before ``key`` existed makes the total unknown (None).
        On a disabled writer: None.
        """
        if not self.enabled or any(r.get(key) is None for r in self._kept):
            return None
        return float(sum(r[key] for r in self._kept))

    def close(self):
        """Close the files."""
        if self.enabled:
            self._steps.close()
            self._epochs.close()


#: (header, record key, width) of each epoch-table column.
TABLE_COLUMNS = (
    ("epoch", "epoch", 5),
    ("loss", "loss", 7),
    ("train acc", "train_acc", 9),
    ("test acc", "test_acc", 8),
    ("compute s", "compute_s", 9),
    ("comm s", "comm_s", 7),
    ("wait s", "wait_s", 7),
    ("transfer s", "transfer_s", 10),
    ("sent/rank", "bytes_sent", 10),
    ("skipped", "skipped", 7),
)


def _cell(key, v):
    if v is None:  # a record without this column (a run that does not measure it)
        return "-"
    if key in ("epoch", "skipped"):
        return f"{int(v):d}"
    if key == "loss":
        return f"{v:.4f}"
    if key.endswith("_acc"):
        return f"{v:.2%}"
    if key == "bytes_sent":
        return format_bytes(v)
    return f"{v:.3f}"


class EpochTable:
    """Format the per-epoch table: loss, train/test accuracy, compute and communication seconds,
    bytes sent per rank, skipped steps.

    ``compute s`` and ``comm s`` are per-rank sums over the epoch's steps (means over ranks);
    ``comm s`` splits into ``wait s`` (skew: waiting for the last rank to arrive) and
    ``transfer s`` (the gradient exchange), shown as ``-`` for a record without them;
    ``sent/rank`` is the gradient traffic one rank sent during the epoch.
    """

    def header(self):
        """Return the header line."""
        return "  ".join(h.rjust(w) for h, _, w in TABLE_COLUMNS)

    def row(self, record):
        """Return one formatted line for an epoch record."""
        return "  ".join(_cell(k, record.get(k)).rjust(w) for _, k, w in TABLE_COLUMNS)
