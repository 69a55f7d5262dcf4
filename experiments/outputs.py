"""What the studies share around their runs: one way a multi-rank study ends on an error."""
import sys
import traceback

import collectives.engine.policy
from commlab.job_control import all_failed

__all__ = ["run_or_report"]


def run_or_report(body, comm):
    """Run ``body()`` on every rank of ``comm``; return 0, or 1 after one error line.

    An ``OSError``, ``ValueError`` or ``RuntimeError`` raised alike on every rank is printed once, by
    rank 0, as ``error: Type: message``; raised on some ranks only, each of those prints it with its
    rank and the job is aborted (:func:`collectives.engine.policy.abort`), so no rank waits for the others.
    Anything else prints its traceback on its rank, aborts a multi-rank job and is raised again.

    Parameters
    ----------
    body : callable
        The study's work, called with no argument.
    comm : mpi4py.MPI.Comm
    """
    try:
        body()
    except (OSError, ValueError, RuntimeError) as e:  # raised alike on every rank: one message
        everyone = all_failed(comm)
        if comm.Get_rank() == 0 or not everyone:
            where = "" if everyone else f"rank {comm.Get_rank()}: "
            print(f"error: {where}{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        if not everyone:
            collectives.engine.policy.abort(None, comm)
        return 1
    except Exception:  # noqa: BLE001 - anything else: report on this rank, abort the job (no hang)
        traceback.print_exc()
        if comm.Get_size() > 1:
            collectives.engine.policy.abort(None, comm)
        raise
    return 0
