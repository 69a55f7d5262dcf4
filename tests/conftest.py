"""Session set-up: the launcher's environment for every job the tests start.

The tests launch ``mpiexec`` through :func:`tests.mpirun.run_mpi`, but also through programs that
launch it themselves (the fault suite, the emulated cluster, the README's commands). So that all of
them run under the same launcher settings, :func:`tests.mpirun.launcher_env` is applied to this
process's environment once, here (under Open MPI: more ranks than cores, and running as root).
"""
import os

from tests.mpirun import launcher_env

os.environ.update(launcher_env())
