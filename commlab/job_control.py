"""Job control: end a launched MPI job with every process it started, tell whether an error struck
every rank, cap a process's thread pools.

Ending a job. Killing the launcher's process group is not enough: MPICH's Hydra starts each rank in a session of
its own and Open MPI's PRRTE each rank in a process group of its own, so ``os.killpg`` on the
launcher's group (or ``subprocess.run``'s timeout, which kills the launcher alone) leaves the ranks
running, re-parented to init; a rank spinning in a progress loop then never ends. :func:`stop_job`
finds the job's processes two ways before it signals anything -- the launcher's descendants (read
from ``/proc``) and, when the job was started with :func:`marked_env`, every process whose
environment carries the job's marker (found even after its parent died) -- sends them ``first``
(SIGTERM: the launcher gets to end its ranks itself), waits ``grace`` seconds, and sends SIGKILL to
whatever is left, looking again for processes started meanwhile. Linux only (``/proc``).

An error inside a job: :func:`all_failed` tells a program whether every rank reached the same error
(rank 0 alone reports it, and the job exits) or only some did (the job must be aborted, or the others
wait for ever). A job sharing a node: :func:`limit_threads` caps this process's BLAS and OpenMP
thread pools.

Imports: the standard library only (a communicator is used through the object given; threadpoolctl,
optional, inside :func:`limit_threads`).
"""
import os
import signal
import time
import uuid

__all__ = ["MARKER", "marked_env", "job_processes", "stop_job", "all_failed", "limit_threads"]

#: Environment variable that carries a job's marker into every process of the job.
MARKER = "COMMLAB_JOB"


def marked_env(env):
    """Return ``(env with a new marker under MARKER, the marker)`` for a job about to start."""
    mark = uuid.uuid4().hex
    return {**env, MARKER: mark}, mark


def _table():
    """Return {pid: (parent pid, start time in clock ticks, state)} of the live processes."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        table[int(name)] = (int(fields[1]), int(fields[19]), fields[0])
    return table


def _carries(pid, var, value):
    needle = f"{var}={value}".encode() + b"\0"
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read() + b"\0"
    except OSError:
        return False


def job_processes(roots=(), var=MARKER, value=None):
    """Return {pid: start time} of the live descendants of ``roots`` and the processes marked ``var=value``.

    Parameters
    ----------
    roots : iterable of int
        Process ids whose descendants are collected (the roots themselves are not).
    var, value : str, optional
        Environment entry that marks the job's processes; not searched when ``value`` is None.

    Returns
    -------
    dict of int to int
        Process id -> start time (clock ticks since boot), so that a reused id is never signalled.
        Zombies and this process are left out.
    """
    roots = list(roots)
    marked = [] if value is None else [int(n) for n in os.listdir("/proc") if n.isdigit() and _carries(n, var, value)]
    if not roots and not marked:
        return {}  # nothing marked and no roots: nothing to collect (the test harness's usual look, made cheap)
    table = _table()
    kids = {}
    for pid, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    found, todo = set(), [kid for root in roots for kid in kids.get(root, ())]
    todo += [pid for pid in marked if pid in table]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += kids.get(pid, ())
    found.discard(os.getpid())
    return {pid: table[pid][1] for pid in found if table[pid][2] != b"Z"}


def _alive(procs):
    """Return the ids among ``procs`` (pid -> start time) still running as the same process, zombies excluded."""
    table = _table()
    return [pid for pid, start in procs.items() if pid in table and table[pid][1] == start and table[pid][2] != b"Z"]


def _send(proc, procs, sig):
    """Send ``sig`` to the launcher's process group and to each of ``procs`` still alive."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            proc.send_signal(sig)
    for pid in _alive(procs):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_job(proc, mark=None, grace=2.0, first=signal.SIGTERM):
    """End ``proc`` (a launcher started with ``start_new_session=True``) and every process of its job.

    Parameters
    ----------
    proc : subprocess.Popen
        The launcher (``mpiexec``) or a program that launches it.
    mark : str, optional
        The job's marker from :func:`marked_env`; its processes are found by it too.
    grace : float
        Seconds given to the job between ``first`` and SIGKILL (none when ``first`` is SIGKILL).
    first : int
        First signal: SIGTERM lets the launcher end its ranks; SIGKILL ends everything at once.

    Returns
    -------
    None
        Every process found has ended; the caller still collects ``proc``'s output and status.
    """
    procs = job_processes([proc.pid], value=mark)
    for sig in (first, signal.SIGKILL, signal.SIGKILL):
        _send(proc, procs, sig)
        deadline = time.monotonic() + (grace if sig != signal.SIGKILL else 5.0)
        while (proc.poll() is None or _alive(procs)) and time.monotonic() < deadline:
            time.sleep(0.05)
        roots = _alive(procs) + ([proc.pid] if proc.poll() is None else [])
        procs.update(job_processes(roots, value=mark))  # started after the first look: ranks being spawned
        if proc.poll() is not None and not _alive(procs):
            break
    proc.wait()


def all_failed(comm, seconds=5.0):
    """Return True when every rank of ``comm`` reaches this call within ``seconds`` (a failure alike on all).

    Called after an error: when it was raised on every rank (a bad setting checked everywhere), all
    of them arrive and rank 0 alone reports it; when some ranks are elsewhere (still running, or
    waiting on a peer) the call returns False after ``seconds`` and the caller ends the job.
    Non-blocking barrier polled until the deadline, so it never hangs.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
    seconds : float
        How long to wait for the other ranks (seconds).

    Returns
    -------
    bool
    """
    if comm.Get_size() == 1:
        return True
    req = comm.Ibarrier()
    deadline = time.monotonic() + seconds
    while not req.Test():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def limit_threads(n):
    """Cap the BLAS and OpenMP thread pools of this process at ``n`` threads (threadpoolctl).

    threadpoolctl is an optional package (it comes with the ``data`` extra, scikit-learn's
    dependency); without it the pools are left as they are.

    Parameters
    ----------
    n : int
        Threads per pool, >= 1.

    Returns
    -------
    bool
        True when the limit was applied, False when threadpoolctl is not installed.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return False
    threadpool_limits(limits=n)
    return True
