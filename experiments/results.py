"""Results as code: what every results file of a study or benchmark carries, and the quiet-machine guard.

A measurement taken while other jobs load the cores measures the load, not the code. Every study and
benchmark therefore

1. checks the host's 1-minute load average before it starts (:func:`guard`): above the threshold
   (``--max-load``; default :func:`default_max_load`, a quarter of a load unit per core) it refuses
   with one error line, or, with ``--allow-noisy``, runs and marks its file noisy;
2. samples the load average while it runs (a run is noisy when a sample exceeds the threshold plus
   its own P ranks, each of which adds about one unit) (:class:`LoadWatch`, a daemon thread reading
   ``os.getloadavg`` every ``interval`` seconds);
3. writes a ``"provenance"`` record into its results file (:func:`stamp`): the command that produced
   it, the versions (Python, NumPy, mpi4py, the MPI library, commlab), P, the core count, the host, the
   date, the load before and during the run, the threshold and the verdict ``noisy``.

:mod:`plots.publish` never publishes a noisy file (:func:`plots.publish.check_quiet`).

Examples
--------
>>> import argparse
>>> from experiments import results
>>> parser = argparse.ArgumentParser()
>>> results.add_options(parser)
>>> args = parser.parse_args(["--max-load", "1000"])
>>> watch = results.guard(args)           # refuses (ValueError) when the machine is busy
>>> record = results.stamp({"rows": []}, watch, P=1)
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

from training.metrics import LOAD_PER_CORE, default_max_load, is_quiet
from training.options import real

__all__ = ["default_max_load", "add_options", "guard", "guard_or_say", "LoadWatch", "provenance", "stamp",
           "is_noisy"]

def add_options(parser):
    """Add ``--max-load`` and ``--allow-noisy`` to an ``argparse`` parser of a study or benchmark."""
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
        Parsed options of :func:`add_options` (``max_load``, ``allow_noisy``, ``settle``: seconds rank 0
        may wait for the load average to fall below the threshold first, the other ranks sleeping).
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


def guard_or_say(args, comm, prefix="error"):
    """Return :func:`guard`'s watch, or None after rank 0 printed the refusal as ``PREFIX: message``."""
    try:
        return guard(args, comm)
    except ValueError as e:
        if comm is None or comm.Get_rank() == 0:
            print(f"{prefix}: {e}", file=sys.stderr, flush=True)
        return None


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
        ``host``, ``date`` (UTC, ISO 8601).
    """
    if command is None:
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        head = ["python", "-m", spec.name] if spec is not None else ["python", *sys.argv[:1]]
        command = shlex.join(head + sys.argv[1:])
    versions = {"python": platform.python_version(), "numpy": _version("numpy"), "mpi4py": _version("mpi4py")}
    if "mpi4py.MPI" in sys.modules:
        from collectives.backend import mpi_library

        versions["mpi_library"] = mpi_library()
    try:
        from importlib.metadata import version

        versions["commlab"] = version("commlab")
    except Exception:  # noqa: BLE001 - not installed as a distribution: run from the tree
        versions["commlab"] = None
    return {"command": command, "versions": versions, "P": P, "cores": os.cpu_count(), "host": platform.node(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


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
