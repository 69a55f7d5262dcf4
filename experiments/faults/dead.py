"""A rank dies before an all-reduce; the survivors must end the job (``python -m experiments.faults.dead ALG T [large]``).

Run under ``mpiexec -disable-auto-cleanup`` (Open MPI: ``--enable-recovery``) by
:mod:`experiments.faults.suite`: rank P-1 dies after a first all-reduce (:func:`vanish`); the others call
``allreduce(timeout=T)`` inside :func:`collectives.engine.policy.abort_on_failure`, which prints the
:class:`~collectives.CollectiveTimeout` once per survivor and calls ``MPI_Abort``. With ``large``,
rank P-1 first starts the all-reduce of a 4 MiB array (``iallreduce``: its first messages are
posted) and dies in the middle of it; a survivor's receive from it then fails inside the MPI
library (MPICH's shared-memory copy from a process that is gone), which must end the job with a
:class:`~collectives.errors.PeerLost` line naming the dead rank, not a traceback.
"""
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import collectives as C
from collectives.engine.policy import abort_on_failure

__all__ = ["vanish", "main"]


def vanish(rank):
    """Leave the job at once, without ``MPI_Finalize`` or a word to the peers, as a crashed process does.

    First it prints ``rank R: exiting (injected crash at T, HOW)``, ``T`` the wall-clock time
    (``time.time()``), from which the caller measures how long the survivors take to end the job, and
    ``HOW`` ``SIGKILL`` or ``exit status 3``, as below.

    The two launchers keep the survivors running after different deaths: MPICH's
    ``-disable-auto-cleanup`` after a non-zero exit (a rank killed by a signal still ends the job),
    Open MPI's ``--enable-recovery`` after a signal (a non-zero exit ends the job at once). So the
    rank exits with status 3, or under Open MPI's launcher (``PRTE_LAUNCHED=1``) sends itself ``SIGKILL``.
    """
    kill = os.environ.get("PRTE_LAUNCHED") == "1"
    print(f"rank {rank}: exiting (injected crash at {time.time():.3f}, {'SIGKILL' if kill else 'exit status 3'})",
          flush=True)
    if kill:
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)


def main(argv=None):
    """Run the case; the job's exit status and duration are what the suite checks."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        alg, timeout = argv[0], float(argv[1])
        if argv[2:] not in ([], ["large"]):
            raise ValueError(argv[2])
    except (IndexError, ValueError):
        print("usage: mpiexec -disable-auto-cleanup -n P python -m experiments.faults.dead ALGORITHM TIMEOUT [large] "
              "(run by experiments.faults.suite)", file=sys.stderr)
        return 2
    comm = MPI.COMM_WORLD
    n = (1 << 19) if argv[2:] else 4  # float64: 4 MiB, or 32 bytes
    C.allreduce(np.ones(n), comm=comm, algorithm=alg, timeout=30)  # everyone alive: context made
    if comm.rank == comm.size - 1:
        if argv[2:]:
            C.iallreduce(np.ones(n), comm=comm, algorithm=alg)  # its first messages are out
        vanish(comm.rank)
    if argv[2:]:
        time.sleep(1.0)  # the peer is gone before this rank's receive reads its message
    with abort_on_failure():
        C.allreduce(np.ones(n), comm=comm, algorithm=alg, timeout=timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
