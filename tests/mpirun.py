"""Launch a Python module under ``mpiexec -n P`` from a pytest test, with a hard timeout.

Multi-rank test bodies live in ``tests/mpi_*.py`` modules (run as ``python -m tests.mpi_x``). They
exit with status 0 when every case passes and print a report and exit non-zero otherwise. A hung
job is killed when ``timeout`` seconds pass and the test fails with what it printed so far.
"""
import os
import shutil
import signal
import subprocess
import sys

__all__ = ["mpiexec_path", "run_mpi"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpiexec_path():
    """Return the ``mpiexec`` beside the running interpreter, else the one on ``PATH``."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(here):
        return here
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("mpiexec not found: install the 'mpich' extra (pip install -e '.[mpich]')")
    return found


def run_mpi(nprocs, module, *args, timeout=120, env=None, check=True, mpiexec_args=()):
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
        Hard limit in seconds; the whole process group is killed when it passes.
    env : dict, optional
        Extra environment variables.
    check : bool
        Fail the calling test (``AssertionError`` with the output) when the exit status is not 0.
    mpiexec_args : sequence of str
        Extra options for ``mpiexec`` itself, placed before ``-n``.

    Raises
    ------
    AssertionError
        When ``check`` is true and the job failed or timed out.
    """
    cmd = [mpiexec_path(), *mpiexec_args, "-n", str(nprocs), sys.executable, "-m", module, *map(str, args)]
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    if env:
        full_env.update(env)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {' '.join(cmd)}\n{out}")
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, None)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit status {proc.returncode}: {' '.join(cmd)}\n{out}")
    return result
