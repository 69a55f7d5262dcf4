"""Launch a Python module under ``mpiexec -n P`` from a pytest test, with a hard timeout.

Multi-rank test bodies live in ``tests/mpi_*.py`` modules (run as ``python -m tests.mpi_x``). They
check and report through :mod:`tests.mpicases` (each failure with its rank): status 0 when every case
passes, else a report and a non-zero status. A hung
job is killed when ``timeout`` seconds pass and the test fails with what it printed so far.

Launcher options: ``MPIEXEC_ARGS`` (split like a shell line) go before ``-n`` on every launch. Under
Open MPI's ``mpiexec`` (PRRTE, Open MPI 5) :func:`launcher_env` allows more ranks than cores
(``PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe``, the environment form of
``--map-by :OVERSUBSCRIBE``) and running as root, leaves out the ``smsc/cma`` and ``btl/ofi``
components (see :func:`launcher_env`), and MPICH's ``-disable-auto-cleanup`` (survivors of a dead rank keep running)
becomes ``--enable-recovery``.
"""
import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

from commlab.job_control import job_processes, marked_env, stop_job

__all__ = ["mpiexec_path", "run_mpi", "launcher", "launcher_env", "launcher_args", "program_output", "finish",
           "job_failed"]

_RULE = "-" * 74  # Open MPI's help messages are framed by lines of 74 dashes
_HYDRA = ("=" * 20, "=   ", "YOUR APPLICATION TERMINATED WITH THE EXIT STRING",  # MPICH's BAD TERMINATION block
          "This typically refers to a problem with your application.", "Please see the FAQ page for debugging")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Seconds Open MPI's launcher gets to end a job after reporting a rank's ``MPI_Abort`` (see :func:`run_mpi`).
ABORT_GRACE = 3.0


def mpiexec_path():
    """Return the ``mpiexec`` beside the running interpreter, else the one on ``PATH``."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(here):
        return here
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("mpiexec not found: install the 'mpich' extra (pip install -e '.[mpich]')")
    return found


@functools.lru_cache(maxsize=None)
def launcher(path=None):
    """Return ``"openmpi"``, ``"mpich"`` or ``"other"``: which MPI's ``mpiexec`` is at ``path``."""
    path = path or mpiexec_path()
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "other"
    if "Open MPI" in text or "OpenRTE" in text or "PRRTE" in text:
        return "openmpi"
    return "mpich" if "HYDRA" in text or "MPICH" in text else "other"


def launcher_env(env=None):
    """Return ``env`` (default ``os.environ``) plus what this launcher needs to run the tests.

    Open MPI: oversubscription allowed (the tests run 4-8 ranks on 2 cores), root allowed (CI
    runs as root), the shared-memory single-copy component ``smsc/cma`` left out
    (``OMPI_MCA_smsc=^cma``): with it, Open MPI 5.0.11 corrupts the receiving rank's memory when a
    large ``MPI_Iallreduce`` arrives truncated (a mismatched call, which the fault tests make on
    purpose): libnbc reports error 15, then the rank crashes (6 of 6 launches of the fault case
    ``skipped_call/mpi``; 0 of 8 without ``cma``); and the libfabric transport ``btl/ofi`` left out
    (``OMPI_MCA_btl=^ofi``): probing its providers made every rank's ``MPI_Init`` take 1.1-1.3 s
    instead of 0.02-0.1 s (2 ranks, 2-core machine without a fabric), about a second of every one of
    the suite's launches, while the tests' ranks talk through shared memory (``btl/sm``), or TCP
    (``btl/tcp``) across the emulated cluster. Values already set are kept. Other launchers:
    unchanged.
    """
    env = dict(os.environ if env is None else env)
    if launcher() == "openmpi":
        env.setdefault("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        env.setdefault("OMPI_MCA_smsc", "^cma")
        env.setdefault("OMPI_MCA_btl", "^ofi")
    return env


def launcher_args(mpiexec_args=()):
    """Return ``MPIEXEC_ARGS`` plus ``mpiexec_args``, MPICH-only options translated for Open MPI."""
    args = shlex.split(os.environ.get("MPIEXEC_ARGS", "")) + list(mpiexec_args)
    if launcher() == "openmpi":
        args = ["--enable-recovery" if a == "-disable-auto-cleanup" else a for a in args]
    return args


def program_output(text):
    """Return ``text`` without the launcher's own messages, so tests see what the ranks printed.

    Removed: Open MPI's help blocks (framed by lines of dashes: "prterun detected that one or more
    processes exited with non-zero status", ...), its ``[host:pid] PMIX ERROR`` lines and the NUL
    it may append; the lines of MPICH Hydra's ``BAD TERMINATION`` block.
    """
    out, inside = [], False
    for line in text.replace("\x00", "").splitlines(keepends=True):
        bare = line.strip()
        if bare == _RULE:
            inside = not inside
            continue
        if inside or " PMIX ERROR: " in bare or bare.startswith(_HYDRA):
            continue
        out.append(line)
    return "".join(out)


def job_failed(result):
    """Return True when the job of ``result`` (from :func:`run_mpi`) ended as a failure.

    That is a non-zero exit status, or Open MPI's report that a rank called ``MPI_Abort`` with a
    non-zero code: Open MPI 5's ``mpiexec --enable-recovery`` (the survivors of a dead rank keep
    running) loses the abort's code when the rank that aborts is the last one alive, and exits 0
    (seen with 5.0.11 on 2 ranks, one killed).
    """
    if result.returncode != 0:
        return True
    raw = result.stderr or ""
    return "MPI_ABORT was invoked on rank" in raw and re.search(r"Errorcode: [1-9]", raw) is not None


def finish(proc, timeout, what="", mark=None):
    """Wait for ``proc`` at most ``timeout`` seconds; then end its whole job and fail the test.

    The job is ended by :func:`commlab.job_control.stop_job`: SIGTERM to the launcher and every
    process it started (the ranks are in process groups of their own under both Hydra and PRRTE),
    SIGKILL to what is left 2 s later.

    Parameters
    ----------
    proc : subprocess.Popen
        Started with ``start_new_session=True``.
    timeout : float
        Seconds.
    what : str
        The command, named in the failure.
    mark : str, optional
        The job's marker (:func:`commlab.job_control.marked_env`), which finds ranks whose launcher
        already died.

    Returns
    -------
    tuple of (str or None, str or None)
        What ``proc.communicate`` returned: its standard output and error.

    Raises
    ------
    AssertionError
        When ``timeout`` passed, with what the process printed so far.
    """
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_job(proc, mark)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {what}\n{out}\n{err or ''}") from None


def _collect(proc, timeout, what, mark):
    """Return what ``proc`` printed (one pipe); end its job at ``timeout``, or ABORT_GRACE s after an abort report."""
    lines = []

    def read():
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen, abort_at, deadline = 0, None, time.monotonic() + timeout
    while True:
        try:
            proc.wait(timeout=0.05)
            break
        except subprocess.TimeoutExpired:
            pass
        now, n = time.monotonic(), len(lines)
        if abort_at is None and any("MPI_ABORT was invoked on rank" in line for line in lines[seen:n]):
            abort_at = now
        seen = n
        if now > deadline:
            stop_job(proc, mark)
            reader.join(10)
            raise AssertionError(f"timed out after {timeout}s: {what}\n{''.join(lines)}")
        if abort_at is not None and now - abort_at > ABORT_GRACE:
            stop_job(proc, mark, first=signal.SIGKILL)
            break
    if job_processes(value=mark):  # ranks still running after their launcher ended
        stop_job(proc, mark, first=signal.SIGKILL)
    reader.join(10)
    return "".join(lines)


def run_mpi(nprocs, module, *args, timeout=120, env=None, check=True, mpiexec_args=(), more=()):
    """Run ``mpiexec -n nprocs python -m module args...`` and return the CompletedProcess.

    Parameters
    ----------
    nprocs : int
        Number of MPI ranks.
    module : str
        Dotted module name run with ``python -m``.
    *args : str
        Extra command-line arguments for the module.
    timeout : float
        Hard limit in seconds; the whole job (launcher and ranks) is ended when it passes
        (:func:`commlab.job_control.stop_job`: SIGTERM, SIGKILL 2 s later) and the test fails.
    env : dict, optional
        Extra environment variables.
    check : bool
        Fail the calling test (``AssertionError`` with the output) when the exit status is not 0.
    mpiexec_args : sequence of str
        Extra options for ``mpiexec`` itself, placed before ``-n`` after ``MPIEXEC_ARGS``
        (see :func:`launcher_args`).
    more : sequence of (int, sequence of str)
        Further programs of an MPMD launch, ``(n, args)`` each: ``mpiexec -n nprocs python -m module
        args : -n n python -m module args' ...`` (ranks numbered in that order).

    Notes
    -----
    Two Open MPI 5.0.11 behaviours under ``--enable-recovery`` are handled here: after a rank's
    ``MPI_Abort`` the launcher may never exit (seen when two ranks aborted at once: the abort
    report was printed, then nothing until the test's 60 s timeout), so the job is ended
    ``ABORT_GRACE`` seconds after the report (status -9, a failure; the report stays in the
    output); and ranks may still run for up to a second after the launcher exited, so processes
    of the job still alive then are killed. No process of the job outlives the call.

    Returns
    -------
    subprocess.CompletedProcess
        ``stdout``: what the ranks printed (stdout and stderr merged), the launcher's own messages
        removed (:func:`program_output`); ``stderr``: the raw output, launcher messages included.

    Raises
    ------
    AssertionError
        When ``check`` is true and the job failed or timed out.
    """
    cmd = [mpiexec_path(), *launcher_args(mpiexec_args), "-n", str(nprocs), sys.executable, "-m", module,
           *map(str, args)]
    for n, extra in more:
        cmd += [":", "-n", str(n), sys.executable, "-m", module, *map(str, extra)]
    full_env = launcher_env()
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    if env:
        full_env.update(env)
    full_env, mark = marked_env(full_env)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out = _collect(proc, timeout, " ".join(cmd), mark)
    result = subprocess.CompletedProcess(cmd, proc.returncode, program_output(out), out)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit status {proc.returncode}: {' '.join(cmd)}\n{out}")
    return result
