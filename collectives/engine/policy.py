"""The failure policy: a collective that failed ends the job, with one clear line.

After a :class:`~collectives.errors.CollectiveTimeout` or
:class:`~collectives.errors.CollectiveMismatch` the ranks no longer agree on what was sent: messages
of the failed call may still be in flight, a dead peer never answers, and ``MPI_Finalize`` on the
survivors would wait for it forever. As NCCL's watchdog does with ``NCCL_ASYNC_ERROR_HANDLING``, the
only safe continuation is to end the whole job: :func:`abort_on_failure` prints the error once per
failing rank and calls ``MPI_Abort``, which makes the launcher stop every rank.
"""
import contextlib
import sys
import time

from mpi4py import MPI

from collectives.errors import CollectiveError

__all__ = ["abort_on_failure", "abort"]


#: Seconds between the last printed line and ``MPI_Abort``. The launcher (Hydra, PRRTE) forwards a
#: rank's output through its proxy, and ``MPI_Abort`` makes it kill the proxies: without a pause the
#: line that says why the job ended can be lost on a loaded machine.
ABORT_GRACE_S = 0.5


def abort(message=None, comm=None, code=1):
    """Print ``error: rank R: message`` to stderr and end the whole job with ``MPI_Abort(code)``.

    Standard output and error are flushed and the process waits :data:`ABORT_GRACE_S` seconds before
    ``MPI_Abort``, so that the launcher forwards the message before it stops every rank.

    Parameters
    ----------
    message : str, optional
        The cause, one line; None prints nothing (the caller has reported already).
    comm : mpi4py.MPI.Comm, optional
        Communicator passed to ``MPI_Abort`` (default ``COMM_WORLD``: the whole job).
    code : int
        Exit status of the job.
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    if message is not None:
        print(f"error: rank {MPI.COMM_WORLD.Get_rank()}: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_S)
    comm.Abort(code)


@contextlib.contextmanager
def abort_on_failure(comm=None, code=1):
    """Context manager: a :class:`~collectives.errors.CollectiveError` inside ends the job (``MPI_Abort``).

    Use it around a training loop or a study, so that a dead or mismatched rank makes every rank exit
    instead of leaving the survivors waiting in ``MPI_Finalize``::

        with collectives.engine.policy.abort_on_failure():
            for step in range(steps):
                collectives.allreduce(grad, op="avg", timeout=60)

    Other exceptions pass through unchanged.
    """
    try:
        yield
    except CollectiveError as exc:
        abort(f"{type(exc).__name__}: {exc}; ending the job", comm, code)
