"""The failure policy: a collective that failed ends the job, with one clear line.

After a :class:`~collectives.errors.CollectiveTimeout` or
:class:`~collectives.errors.CollectiveMismatch` the ranks no longer agree on what was sent: messages
of the failed call may still be in flight, a dead peer never answers, and ``MPI_Finalize`` on the
survivors would wait for it forever. As NCCL's watchdog does with ``NCCL_ASYNC_ERROR_HANDLING``, the
only safe continuation is to end the whole job: :func:`abort_on_failure` prints the error once per
failing rank and calls ``MPI_Abort``, which makes the launcher stop every rank. The line says what
to do (:func:`failure_line`): after a silent or lost peer, read that rank's own output for why it
stopped, then restart (a trainer adds how: ``--resume RUN_DIR``).
"""
import contextlib
import os
import sys
import time

from mpi4py import MPI

from collectives.errors import CollectiveError, CollectiveTimeout

__all__ = ["abort_on_failure", "abort", "failure_line"]


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

    Notes
    -----
    Never returns: should ``MPI_Abort`` come back (MPICH's can, when its launcher is already ending
    the job), the process exits with ``code`` at once rather than run on past the failure.
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    if message is not None:
        print(f"error: rank {MPI.COMM_WORLD.Get_rank()}: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_S)
    comm.Abort(code)
    os._exit(code)  # MPI_Abort can return while the launcher already ends the job: never run on past it


def failure_line(exc, hint=None):
    """Return the one line that ends the job after the collective error ``exc``: what failed, what to do.

    After a :class:`~collectives.errors.CollectiveTimeout` (a :class:`~collectives.errors.PeerLost`
    too) the line says that the silent peer may have died and where to look, then ``hint`` (how to
    restart, from the caller that knows: a trainer's ``--resume RUN_DIR``). A mismatch is the
    program's own doing and says so itself.

    Examples
    --------
    >>> from collectives.errors import CollectiveTimeout
    >>> line = failure_line(CollectiveTimeout("allreduce", 1, 4, 3.0), "restart with --resume runs/a")
    >>> print(line.replace("; ", ";\\n"))
    CollectiveTimeout: allreduce timed out after 3 s in round 4: no answer from rank 1;
    ending the job: rank 1 may have died or hung (its own output says why);
    then restart with --resume runs/a
    """
    line = f"{type(exc).__name__}: {exc}; ending the job"
    if isinstance(exc, CollectiveTimeout):
        who = f"rank {exc.peer}" if exc.peer is not None else "another rank"
        line += f": {who} may have died or hung (its own output says why)" + (f"; then {hint}" if hint else "")
    return line


@contextlib.contextmanager
def abort_on_failure(comm=None, code=1, hint=None):
    """Context manager: a :class:`~collectives.errors.CollectiveError` inside ends the job (``MPI_Abort``).

    Use it around a training loop or a study, so that a dead or mismatched rank makes every rank exit
    instead of leaving the survivors waiting in ``MPI_Finalize``::

        with collectives.engine.policy.abort_on_failure(hint="restart with --resume runs/a"):
            for step in range(steps):
                collectives.allreduce(grad, op="avg", timeout=60)

    The line printed is :func:`failure_line`'s, with ``hint`` (how to restart) after a lost peer.
    Other exceptions pass through unchanged.
    """
    try:
        yield
    except CollectiveError as exc:
        abort(failure_line(exc, hint), comm, code)
