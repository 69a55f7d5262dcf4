"""Rank-side body: ``inference.serve`` with replica rank 1 stopped (SIGSTOP) 0.4 s into its serving.

``mpiexec -n 3 python -m tests.mpi_serve_stop SERVE_FLAGS...``: every rank runs
``inference.serve.main(SERVE_FLAGS)``; rank 1 (replica 0) sends itself SIGSTOP from a timer thread, as
an operator's ``kill -STOP`` would, 0.4 s after it enters its serving loop (so a slow start on a busy
machine never moves the stop into the job's collective set-up), and is never continued. The front
removes it after ``--replica-timeout``, serves the rest on the other replica and ends the job.
"""
import os
import signal
import sys
import threading

from mpi4py import MPI

import inference.serve
from inference.serve import main

if __name__ == "__main__":
    if MPI.COMM_WORLD.Get_rank() == 1:
        serve_replica = inference.serve.serve_replica

        def stopped_while_serving(*args, **kwargs):
            threading.Timer(0.4, os.kill, (os.getpid(), signal.SIGSTOP)).start()
            return serve_replica(*args, **kwargs)

        inference.serve.serve_replica = stopped_while_serving
    sys.exit(main(sys.argv[1:]))
