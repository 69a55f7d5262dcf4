"""Rank-side body of the parameter-server crash tests:
``python -m tests.mpi_ps_fault RANK CALL [FLAGS...]`` runs ``training.train.main(FLAGS)`` (``--mode ps``)
with one change: rank RANK leaves the job with ``os._exit(3)`` (no MPI_Finalize, no message: as a
killed process) at its CALL-th (1-based) protocol step: a worker at its CALL-th push, a server at the
CALL-th message it handles. The crash line carries the wall-clock time (``time.time()``) so that a
test can measure how long the others take to end. The fault stays out of the trainer's command line.
"""
import os
import sys
import time

from mpi4py import MPI

import ps.client
import ps.server
import training.train


def _crash_at(rank, call):
    """Wrap ``Client.push`` and ``Server._handle`` so that rank ``rank`` exits at call ``call``."""
    calls = [0]
    for cls, name in ((ps.client.Client, "push"), (ps.server.Server, "_handle")):
        real = getattr(cls, name)

        def wrapped(self, *args, _real=real, **kwargs):
            calls[0] += 1
            if MPI.COMM_WORLD.rank == rank and calls[0] == call:
                print(f"rank {rank}: exiting (injected crash at {time.time():.3f})", flush=True)
                os._exit(3)
            return _real(self, *args, **kwargs)

        setattr(cls, name, wrapped)


if __name__ == "__main__":
    _crash_at(int(sys.argv[1]), int(sys.argv[2]))
    sys.exit(training.train.main(sys.argv[3:]))
