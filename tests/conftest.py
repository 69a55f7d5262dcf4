"""Session set-up: the launcher's environment for every job the tests start, and no process left behind.

The tests launch ``mpiexec`` through :func:`tests.mpirun.run_mpi`, but also through programs that
launch it themselves (the fault suite, the emulated cluster, the README's commands). So that all of
them run under the same launcher settings, :func:`tests.mpirun.launcher_env` is applied to this
process's environment once, here (under Open MPI: more ranks than cores, and running as root).

Each test also runs with its own marker in the environment (``COMMLAB_TEST``), which every process
it starts inherits, ranks included. After the test, any marked process still alive (a rank whose
launcher was killed, or a job a test abandoned when pytest-timeout stopped it) is killed, and the
test gets a warning naming it, so no job outlives its test.
"""
import os
import signal
import uuid
import warnings

import pytest

from commlab.job_control import job_processes
from tests.mpirun import launcher_env

os.environ.update(launcher_env())

_VAR = "COMMLAB_TEST"


def _argv(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


@pytest.fixture(autouse=True)
def _no_process_left(request):
    """Mark the processes this test starts; kill (and warn about) those still alive after it."""
    mark = uuid.uuid4().hex
    os.environ[_VAR] = mark
    yield
    os.environ.pop(_VAR, None)
    if not os.path.isdir("/proc/self"):
        return
    left = job_processes(var=_VAR, value=mark)
    if left:
        names = [f"{pid}: {_argv(pid)[:120]}" for pid in sorted(left)]
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        warnings.warn(f"{request.node.nodeid} left {len(left)} process(es) running, killed: {names}")
