"""A rank dies before an all-reduce; the survivors must end the job (``python -m experiments.fault_dead ALG T``).

Run under ``mpiexec -disable-auto-cleanup`` by :mod:`experiments.fault_suite`: rank P-1 exits at
once; the others call ``allreduce(timeout=T)`` inside :func:`collectives.abort_on_failure`, which
prints the :class:`~collectives.CollectiveTimeout` once per survivor and calls ``MPI_Abort``.
"""
import os
import sys

import numpy as np
from mpi4py import MPI

import collectives as C


def main(argv=None):
    """Run the case; the job's exit status and duration are what the suite checks."""
    argv = sys.argv[1:] if argv is None else argv
    alg, timeout = argv[0], float(argv[1])
    comm = MPI.COMM_WORLD
    C.allreduce(np.ones(4), comm, algorithm=alg, timeout=30)  # everyone alive: context and schedules made
    if comm.rank == comm.size - 1:
        os._exit(3)  # dies without a word, as a crashed process does
    with C.abort_on_failure():
        C.allreduce(np.ones(4), comm, algorithm=alg, timeout=timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
