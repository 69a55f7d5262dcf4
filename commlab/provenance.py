"""Results as code: what every results file of a study or benchmark carries, and the quiet-machine guard.

A measurement taken while other jobs load the cores measures the load, not the code. Every study and
benchmark therefore

1. checks that its results files can be written (:func:`unwritable`) and the host's 1-minute load
   average before it starts (:func:`guard`): above the threshold (``--max-load``; default
   :func:`default_max_load`, a quarter of a load unit per core) it refuses with one error line, or,
   with ``--allow-noisy``, runs and marks its file noisy;
2. samples the load average while it runs (a run is noisy when a sample exceeds the threshold plus
   its own P ranks, each of which adds about one unit) (:class:`LoadWatch`, a daemon thread reading
   ``os.getloadavg`` every ``interval`` seconds);
3. writes a ``"provenance"`` record into its results file (:func:`stamp`): the command that produced
   it (:func:`command_line`), the versions (Python, NumPy, mpi4py, the MPI library, commlab), P, the
   core count, the host, the date, the load before and during the run, the threshold and the verdict
   ``noisy``; then writes the file (:func:`commlab.file_formats.write_json`).

The published results come only from files that are not noisy (:func:`is_noisy`, :func:`is_quiet`).
The guard reads its settings from an ``argparse`` namespace (``max_load``, ``allow_noisy``,
``settle``), which :func:`add_options` declares on a program's parser.

Imports: the standard library only; mpi4py is imported inside :func:`mpi_library`, when it is called.

Examples
--------
>>> import argparse
>>> from commlab import provenance
>>> args = argparse.Namespace(max_load=1000.0, allow_noisy=False, settle=0.0)
>>> watch = provenance.guard(args)           # refuses (ValueError) when the machine is busy
>>> record = provenance.stamp({"rows": []}, watch, P=1)
>>> sorted(record["provenance"])[:4]
['P', 'command', 'cores', 'date']
>>> record["provenance"]["noisy"]
False
"""
import datetime
import os
import platform
import shlex
import sys
import threading
import time

__all__ = ["LOAD_PER_CORE", "default_max_load", "is_quiet", "add_options", "guard", "LoadWatch", "provenance",
           "stamp", "is_noisy", "command_line", "unwritable", "mpi_library"]

#: Load-average units per core above which a machine is busy: a measurement there measures the other
#: jobs (0.5 on 2 cores). Studies refuse to start above it (:func:`guard`); the published results
#: come only from runs below it.
LOAD_PER_CORE = 0.25


def default_max_load(cores=None):
    """Return the load-average threshold of a quiet machine: :data:`LOAD_PER_CORE` x cores.

    Parameters
    ----------
    cores : int, optional
        Core count (default ``os.cpu_count()``).

    Examples
    --------
    >>> default_max_load(2)
    0.5
    """
    return LOAD_PER_CORE * (cores or os.cpu_count() or 1)


def is_quiet(before, during_max, P, max_load):
    """True when a run's load was below ``max_load`` before it and below ``max_load + P`` during it.

    Each of the run's own busy-polling ranks adds about one unit of load, hence ``+ P`` during.

    Examples
    --------
    >>> is_quiet(0.1, 2.3, 2, 0.5), is_quiet(0.8, 0.8, 2, 0.5), is_quiet(0.1, 3.1, 2, 0.5)
    (True, False, False)
    """
    return before <= max_load and during_max <= max_load + (P or 1)


def add_options(parser, real):
    """Add ``--max-load``, ``--settle`` and ``--allow-noisy`` to an ``argparse`` parser of a study or benchmark.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    real : callable
        ``real(low, high)`` returns the ``argparse`` type of a finite number in ``[low, high]``: the
        program's own declaration of a number option (``training.settings.options.real``), so that the
        options are checked like every other option of the program.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_options(parser, lambda low, high: float)
    >>> parser.parse_args(["--max-load", "1000"])
    Namespace(max_load=1000.0, settle=0.0, allow_noisy=False)
    """
    parser.add_argument("--max-load", type=real(-1e15, 1e15), default=None, metavar="L",
                        help="refuse to start when the 1-minute load average is above L "
                             f"(default {LOAD_PER_CORE:g} x cores = {default_max_load():g} here)")
    parser.add_argument("--settle", type=real(0, 1e15), default=0.0, metavar="S",
                        help="wait up to S seconds for the load average to fall below --max-load before "
                             "deciding (the job's own start-up lifts it; default 0: decide at once)")
    parser.add_argument("--allow-noisy", action="store_true",
                        help="run on a busy machine anyway and mark the results file noisy "
                             "(never published)")


class LoadWatch:
    """Sample the 1-minute load average in a daemon thread while a measurement runs.

    Parameters
    ----------
    max_load : float
        Threshold of a quiet machine (load-average units).
    interval : float
        Seconds between samples.

    Attributes
    ----------
    before : float
        The load average when the watch was made.
    samples : list of float
        Load averages read while it ran.
    """

    def __init__(self, max_load, interval=5.0):
        self.max_load = float(max_load)
        self.before = os.getloadavg()[0]
        self.samples = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval):
        while not self._stop.wait(interval):
            self.samples.append(os.getloadavg()[0])

    def summary(self):
        """Stop sampling; return ``{"before", "during_max", "during_mean", "samples"}`` (load units)."""
        self._stop.set()
        during = self.samples + [os.getloadavg()[0]]
        return {"before": round(self.before, 2), "during_max": round(max(during), 2),
                "during_mean": round(sum(during) / len(during), 2), "samples": len(during)}


def guard(args, comm=None, interval=5.0):
    """Check that the machine is quiet before a measurement; return a running :class:`LoadWatch`.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed options ``max_load`` (load-average units; None: :func:`default_max_load`),
        ``allow_noisy`` (bool) and, optionally, ``settle`` (seconds rank 0 may wait for the load
        average to fall below the threshold first, the other ranks sleeping).
    comm : mpi4py.MPI.Comm, optional
        With a communicator rank 0 reads the load and broadcasts its verdict, so every rank refuses
        alike (one error on every rank before any measurement).
    interval : float
        Seconds between load samples while the measurement runs.

    Returns
    -------
    LoadWatch
        Call :func:`stamp` with it when the measurement ends.

    Raises
    ------
    ValueError
        When the load average is above the threshold and ``--allow-noisy`` was not given.
    """
    limit = args.max_load if args.max_load is not None else default_max_load()
    settle = getattr(args, "settle", 0.0) or 0.0
    if settle > 0:  # rank 0 waits for its own job's start-up to leave the load average; the others sleep
        if comm is None or comm.Get_rank() == 0:
            deadline = time.monotonic() + settle
            while os.getloadavg()[0] > limit and time.monotonic() < deadline:
                time.sleep(2.0)
        if comm is not None:
            req = comm.Ibarrier()
            while not req.Test():
                time.sleep(0.05)
    watch = LoadWatch(limit, interval)
    busy = watch.before > limit
    if comm is not None:
        busy = comm.bcast(busy, root=0)
    if busy and not args.allow_noisy:
        watch.summary()
        raise ValueError(f"the 1-minute load average is {watch.before:.2f}, above {limit:g} "
                         f"(--max-load; default {LOAD_PER_CORE:g} x {os.cpu_count()} cores): a measurement "
                         "now would measure the other jobs. Wait for a quiet machine (--settle S waits up to S "
                         "seconds for it), or pass --allow-noisy to mark the results file noisy")
    return watch


def _version(module):
    mod = sys.modules.get(module)
    return getattr(mod, "__version__", None) if mod is not None else None


def provenance(P=None, command=None):
    """Return where a results file came from: command, versions, P, cores, host and date.

    Parameters
    ----------
    P : int, optional
        MPI ranks of the measurement.
    command : str, optional
        The command line (default: this process's ``python -m module args``).

    Returns
    -------
    dict
        ``command``, ``versions`` (python, numpy, mpi4py, mpi_library, commlab), ``P``, ``cores``,
        ``host``, ``date`` (UTC, ISO 8601), and ``emulated``: on the emulated cluster the emulator's
        command up to its ``--`` (``COMMLAB_EMULATED``, :func:`training.emulator.emulate.cluster_line`),
        which then also starts ``command``; None elsewhere.
    """
    if command is None:
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        head = ["python", "-m", spec.name] if spec is not None else ["python", *sys.argv[:1]]
        command = shlex.join(head + sys.argv[1:])
    emulated = os.environ.get("COMMLAB_EMULATED", "")
    # only the emulator's own line counts (python -m training.emulator.emulate ... --): any other value
    # was not set by it, and a results file must not claim a cluster it did not run on
    if not (emulated.startswith("python -m training.emulator.emulate ") and emulated.endswith(" --")):
        emulated = None
    if emulated and not command.startswith(emulated):
        command = f"{emulated} {command}"
    versions = {"python": platform.python_version(), "numpy": _version("numpy"), "mpi4py": _version("mpi4py")}
    if "mpi4py.MPI" in sys.modules:
        versions["mpi_library"] = mpi_library()
    try:
        from importlib.metadata import version

        versions["commlab"] = version("commlab")
    except Exception:  # noqa: BLE001 - not installed as a distribution: run from the tree
        versions["commlab"] = None
    return {"command": command, "versions": versions, "P": P, "cores": os.cpu_count(), "host": platform.node(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "emulated": emulated}


def stamp(record, watch, P=None, command=None):
    """Add ``record["provenance"]``: :func:`provenance`, the load before and during, and ``noisy``.

    Parameters
    ----------
    record : dict
        The results about to be written (changed in place and returned).
    watch : LoadWatch
        From :func:`guard`; it stops sampling here.
    P : int, optional
    command : str, optional

    Returns
    -------
    dict
        ``record``. ``noisy`` is true when the load before exceeded the threshold, or a sample taken
        during the run exceeded it plus the measurement's own ranks (``P``, default 1: each busy-polling
        rank adds one unit of load on its own).
    """
    load = watch.summary()
    noisy = not is_quiet(load["before"], load["during_max"], P, watch.max_load)
    record["provenance"] = {**provenance(P, command), "load": load, "max_load": watch.max_load, "noisy": noisy}
    return record


def is_noisy(record):
    """True when a results dict was measured on a busy machine, or carries no provenance at all."""
    prov = record.get("provenance")
    return prov is None or bool(prov.get("noisy", True))


def command_line(module, argv=None):
    """Return ``python -m MODULE ARGV...`` for an entry point's ``main(argv)``, or None when ``argv`` is None.

    A results file's provenance names the command that made it (:func:`stamp`); when ``main`` is
    called with its own ``argv`` (a test, another program) this process's command line is not that
    command. With ``argv`` None the entry point parsed ``sys.argv``, and None lets
    :func:`provenance` read it from there.

    Parameters
    ----------
    module : str
        The entry point's module, e.g. ``"experiments.bench.trainer_vs_torch"``.
    argv : list of str, optional
        The arguments ``main`` parsed.

    Returns
    -------
    str or None

    Examples
    --------
    >>> command_line("experiments.bench.trainer_vs_torch", ["--steps", 3])
    'python -m experiments.bench.trainer_vs_torch --steps 3'
    >>> command_line("experiments.bench.trainer_vs_torch") is None
    True
    """
    return None if argv is None else shlex.join(["python", "-m", module, *map(str, argv)])


def unwritable(*paths):
    """Return why one of ``paths`` cannot be written (folders made if missing), or None.

    Each file is really opened for writing (a new one is removed again, an existing one is left as it
    is): permission bits say little to root or on a read-only file system. A study calls it before
    any measurement, so that a bad ``--out`` fails at once rather than after the run.

    Parameters
    ----------
    *paths : str
        Results files an experiment will write.

    Returns
    -------
    str or None
        The reason, naming the path; None when every path can be written.

    Examples
    --------
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> unwritable(os.path.join(d, "out", "results.json")) is None
    True
    >>> unwritable(d)  # doctest: +ELLIPSIS
    "'...' is a folder, give a file path"
    """
    for path in paths:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        except OSError as exc:
            return f"cannot make the folder of {path!r}: {exc.strerror or exc}"
        if os.path.isdir(path):
            return f"{path!r} is a folder, give a file path"
        try:
            if os.path.exists(path):
                open(path, "a", encoding="utf-8").close()  # leaves the contents as they are
            else:
                open(path, "x", encoding="utf-8").close()
                os.remove(path)
        except OSError as exc:
            return f"{path!r} is not writable: {exc.strerror or exc}"
    return None


def mpi_library(version=None):
    """Return the MPI library's version string on one line: the one place that formats it.

    Parameters
    ----------
    version : str, optional
        A raw ``MPI_Get_library_version`` string (default: this process's library, which imports
        mpi4py).

    Returns
    -------
    str
        Its first line with NUL bytes removed (Open MPI ends the string with one, which would print
        as a box glyph in files and figures) and runs of whitespace collapsed (MPICH pads
        ``Version:``), e.g. ``"MPICH Version: 5.0.2"`` or ``"Open MPI v5.0.11, package: ..."``.

    Examples
    --------
    >>> mpi_library("MPICH Version:      5.0.2\\nMPICH Release date: ...")
    'MPICH Version: 5.0.2'
    """
    if version is None:
        from mpi4py import MPI

        version = MPI.Get_library_version()
    first = (version.replace("\x00", "").strip().splitlines() or [""])[0]
    return " ".join(first.split())
