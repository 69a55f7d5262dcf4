"""What a run shows: rank 0's progress bar, log messages with the rank in front, the trace file.

Under ``mpiexec`` a rank's stderr is a pipe to the launcher, never a terminal, so tqdm's own rule
(``disable=None``: off unless the stream is a terminal) hides the bar in every MPI run.
:func:`progress_bar` decides instead from where the launcher's output goes
(:func:`launcher_terminal`):

* a terminal (the rank's own stderr, or that of the ``mpiexec`` it runs under, which forwards each
  ``\\r``-update as it comes): the usual bar, updated in place at most every 0.5 s. Under a launcher
  whose stdout is the terminal, the bar is drawn on stdout: rank 0's stdout and stderr reach the
  launcher through two pipes, forwarded in no fixed order, and a table row printed on stdout would
  otherwise land in the middle of the bar's line;
* anything else (a log file, a pipe, a batch system): one plain status line every
  :data:`LOG_INTERVAL` seconds, so a long job's log shows how far it got without filling up
  with ``\\r`` redraws.

``--no-progress`` (``enabled=False``) turns the bar off altogether.
"""
import os
import shutil
import sys

from tqdm import tqdm

from commlab import tracing
from commlab.logs import get_logger

__all__ = ["LOG_INTERVAL", "LAUNCHERS", "progress_bar", "launcher_terminal", "write_trace"]

#: Seconds between two status lines when the output is not a terminal.
LOG_INTERVAL = 30.0

#: Process names of the MPI launchers and their per-node proxies (MPICH's Hydra, Open MPI's PRRTE
#: and ORTE, Slurm).
LAUNCHERS = ("hydra_pmi_proxy", "mpiexec", "mpiexec.hydra", "mpirun", "prted", "prterun", "orted",
             "srun", "slurmstepd")


def _parent(pid):
    """Return (name, parent pid) of process ``pid`` from ``/proc`` (None when unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    return name, int(stat[stat.rindex(")") + 2:].split()[1])


def _is_terminal(path):
    return path.startswith("/dev/pts/") or path.startswith("/dev/tty")


def launcher_terminal(stream=None):
    """Return True when ``stream`` ends on a terminal, directly or through the MPI launcher.

    Under an MPI launcher (this process's ancestors, named in :data:`LAUNCHERS`, read from
    ``/proc``), ``stream`` (default ``sys.stderr``; ``sys.stdout`` or ``sys.stderr``) ends on a
    terminal when the outermost launcher writes the same stream (its file descriptor 1 or 2) to
    one: the launcher forwards the rank's output there. The rank's own ``isatty()`` does not tell:
    Open MPI's launcher (PRRTE) gives every rank a pseudo-terminal as stdout, of 0 columns, wherever
    its own output goes. Without a launcher: ``stream.isatty()``. False for a log file, a pipe, a
    rank on another node than ``mpiexec``, a system without ``/proc``.

    Parameters
    ----------
    stream : file, optional
    """
    stream = sys.stderr if stream is None else stream
    try:
        own = stream.isatty()
    except (AttributeError, ValueError):  # a closed or file-less stream
        return False
    fd = 1 if stream is sys.stdout else 2 if stream is sys.stderr else None
    outermost = _outermost_launcher()
    if fd is None or outermost is None:
        return own
    try:
        return _is_terminal(os.readlink(f"/proc/{outermost}/fd/{fd}"))
    except OSError:
        return False


def _outermost_launcher():
    """Return the pid of the outermost launcher process among this process's ancestors (or None)."""
    pid, outermost = os.getppid(), None
    for _ in range(8):  # rank -> proxy -> mpiexec, and a wrapper or two
        info = _parent(pid)
        if info is None or info[0] not in LAUNCHERS:
            break
        outermost, pid = pid, info[1]
    return outermost


class _Lines:
    """File-like adapter: each of tqdm's ``\\r`` redraws becomes one line; blank redraws, and a redraw of
    the count just written (the closing one, when the last update already showed it), are dropped."""

    def __init__(self, stream):
        self.stream = stream
        self.last = None

    def write(self, text):
        text = text.replace("\r", "").rstrip()
        count = text.rsplit("|", 1)[-1].split()[:1]  # "3/4" of "75%|###   | 3/4 [00:01<...]"
        if text and count != self.last:
            self.stream.write(text + "\n")
            self.last = count

    def flush(self):
        self.stream.flush()


def progress_bar(total, unit, enabled=True, stream=None, desc=None):
    """Return rank 0's tqdm bar for ``total`` units of work, shown as the output allows.

    Parameters
    ----------
    total : int
        Units of work (steps, pushes, runs).
    unit : str
        Their name, shown in the bar.
    enabled : bool
        False (``--no-progress``): a disabled bar, whose methods do nothing.
    stream : file, optional
        Where the bar goes. Default: ``sys.stdout`` when it ends on a terminal through the MPI
        launcher (:func:`launcher_terminal`), so that the bar and the lines ``bar.write`` prints
        travel through the same pipe and reach the terminal in order; else ``sys.stderr``.
    desc : str, optional
        Prefix of the bar.

    Returns
    -------
    tqdm.tqdm
        On a terminal: redrawn in place, at most every 0.5 s. Otherwise: one status line per
        :data:`LOG_INTERVAL` seconds, and a last one when the bar is closed. ``bar.write(line)`` prints a line to stdout without
        breaking the bar.
    """
    if not enabled:
        return tqdm(total=total, disable=True)
    launched = _outermost_launcher() is not None  # then a terminal is the launcher's, not the rank's
    if stream is None:
        direct = not launched and sys.stderr.isatty() and sys.stdout.isatty()
        stream = sys.stdout if not direct and launcher_terminal(sys.stdout) else sys.stderr
    if launcher_terminal(stream):
        direct = not launched and stream.isatty()
        size = None if direct else shutil.get_terminal_size()  # not the rank's pty: PRRTE's is 0 x 0
        return tqdm(total=total, unit=unit, desc=desc, leave=False, disable=False, file=stream,
                    dynamic_ncols=direct, ncols=size and size.columns, nrows=size and size.lines,
                    mininterval=0.5)
    return tqdm(total=total, unit=unit, desc=desc, leave=True, disable=False, file=_Lines(stream),
                ncols=100, ascii=True, mininterval=LOG_INTERVAL, miniters=1)  # leave: a last line at the end


def write_trace(path, comm, timeout=None):
    """Stop tracing, gather every rank's events on rank 0 and write them to ``path`` (Chrome JSON).

    Collective over ``comm``: every rank sends its events to rank 0 (point-to-point), which waits
    at most ``timeout`` seconds for each and names in a warning the ranks it did not hear from.

    Parameters
    ----------
    path : str
        The trace file (``--trace``), written by rank 0.
    comm : mpi4py.MPI.Comm
    timeout : float, optional
        Seconds rank 0 waits for a rank's events (None: no limit).
    """
    tracing.stop()
    chrome, missing = tracing.gather(comm, 0, timeout)
    if comm.Get_rank() == 0:
        tracing.write(path, chrome, missing)
        log = get_logger("training.runtime.progress")
        if missing:
            log.warning("trace: no events from rank(s) %s", ", ".join(map(str, missing)))
        log.info("trace: %d events from %d rank(s) -> %s (open in https://ui.perfetto.dev or chrome://tracing)",
                 sum(e["ph"] == "X" for e in chrome), comm.Get_size() - len(missing), path)
