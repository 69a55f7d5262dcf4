"""A job killed at its hard timeout leaves no process behind, under MPICH's and Open MPI's launcher.

Both launchers start the ranks outside the launcher's process group (Hydra: a session per rank;
PRRTE: a process group per rank), so killing that group alone left the ranks running, re-parented
to init. Here :func:`tests.mpirun.run_mpi` launches 2 ranks that ignore SIGTERM and sleep
(:mod:`tests.mpi_sleep`); its timeout must end them. The oracle is ``/proc``: no process whose
command line carries this test's marker (an argument, independent of the environment marker the
harness itself searches for) may be left alive.

The same harness ends a job ``ABORT_GRACE`` seconds after Open MPI's report of an ``MPI_Abort``
(its launcher may never exit after one under ``--enable-recovery``): ranks that print the report's
first line and then sleep must come back as a failed job long before the timeout, none left.
"""
import os
import time
import uuid

import pytest

from tests.mpirun import ABORT_GRACE, run_mpi


def _survivors(mark):
    """Return the command lines of live processes (zombies excluded) whose argv contains ``mark``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if mark.encode() in argv and state != b"Z":
            found.append(b" ".join(argv).decode(errors="replace"))
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc (Linux)")
def test_timeout_ends_every_rank_of_the_job(tmp_path):
    mark = "commlab-sleeper-" + uuid.uuid4().hex
    with pytest.raises(AssertionError, match="timed out after"):
        run_mpi(2, "tests.mpi_sleep", mark, str(tmp_path), timeout=3)
    started = sorted(os.listdir(tmp_path))
    assert started == ["rank-0", "rank-1"], f"the ranks did not start before the timeout: {started}"
    deadline = time.monotonic() + 3  # SIGKILL is asynchronous: give the kernel a moment
    while _survivors(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _survivors(mark) == []


def test_a_job_hung_after_an_abort_report_is_ended_soon(tmp_path):
    mark = "commlab-sleeper-" + uuid.uuid4().hex
    start = time.monotonic()
    res = run_mpi(2, "tests.mpi_sleep", mark, str(tmp_path), "abort", timeout=60, check=False)
    seconds = time.monotonic() - start
    assert res.returncode != 0 and "MPI_ABORT was invoked on rank 1" in res.stderr, res.stderr
    assert seconds < ABORT_GRACE + 20, seconds  # start-up + grace, far below the timeout
    assert _survivors(mark) == []

