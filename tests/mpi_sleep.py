"""Ranks that start, say so, and sleep (SIGTERM ignored): the job :mod:`tests.test_launch_cleanup` kills.

``mpiexec -n P python -m tests.mpi_sleep MARK DIR [abort]``: each rank creates ``DIR/rank-R`` once
it runs, then sleeps 600 s; with ``abort``, rank 1 first prints the first line of Open MPI's
``MPI_Abort`` report. No MPI is used (a rank its launcher cannot reach), only the standard library,
so that the ranks start within a fraction of a second. MARK is only there to be found in ``/proc``.
"""
import os
import signal
import sys
import time

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
    with open(os.path.join(sys.argv[2], f"rank-{rank}"), "w", encoding="utf-8"):
        pass
    if sys.argv[3:] == ["abort"] and rank == "1":
        print("MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD", flush=True)
    time.sleep(600)
