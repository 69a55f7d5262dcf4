"""Rank-side body of the trainer's crash tests: ``python -m tests.mpi_train_fault RANK STEP [FLAGS...]``.

Runs ``training.train.main(FLAGS)`` with one change: rank RANK leaves the job with ``os._exit(3)``
(no MPI_Finalize, no message: as a killed process) when it begins its step STEP (1-based), so the
other ranks are left waiting in a collective. The fault stays out of the trainer's command line.
"""
import os
import sys

from mpi4py import MPI

import training.train


def _crash_at(rank, step):
    """Replace ``training.train.train_step`` with one that ends rank ``rank`` at step ``step``."""
    real, calls = training.train.train_step, [0]

    def train_step(*args, **kwargs):
        calls[0] += 1
        if MPI.COMM_WORLD.rank == rank and calls[0] == step:
            print(f"rank {rank}: exiting at step {step} (injected crash)", flush=True)
            os._exit(3)
        return real(*args, **kwargs)

    training.train.train_step = train_step


if __name__ == "__main__":
    _crash_at(int(sys.argv[1]), int(sys.argv[2]))
    sys.exit(training.train.main(sys.argv[3:]))
