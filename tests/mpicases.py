"""The one harness of the multi-rank test bodies (``tests/mpi_*.py``, launched by :mod:`tests.mpirun`).

A body checks on every rank and reports once, with the rank of each failure, in one of two ways:

* :func:`check` records a failed condition on this rank and :func:`report` ends the body: every
  rank's failures are gathered, rank 0 prints each as ``rank R: FAIL what`` and one line
  ``LABEL: N failures on P ranks``, and every rank gets the same exit status (0 or 1);
* :func:`run_cases` runs case functions that raise ``AssertionError``: after each case the ranks
  agree whether it passed, rank 0 prints ``case_NAME: ok`` or ``FAILED`` (a failing rank prints its
  assertion), and an unexpected exception prints its traceback and aborts the job, so nothing hangs.

The pytest side asserts on those lines and on the exit status.
"""
import contextlib
import io
import os
import sys
import traceback

import numpy as np
from mpi4py import MPI

__all__ = ["FAILS", "check", "report", "run_cases", "quiet", "shared_dir"]

#: This rank's failed checks, in order.
FAILS = []


def check(cond, what):
    """Record ``what`` as a failure of this rank unless ``cond`` holds."""
    if not cond:
        FAILS.append(what)


def report(comm, label, limit=40):
    """Gather every rank's :data:`FAILS`; rank 0 prints them and the count. Return the exit status.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The job's communicator (collective: every rank calls this).
    label : str
        What ran, at the start of the count line.
    limit : int
        Failures printed at most (the count covers all).

    Returns
    -------
    int
        1 on every rank when any rank failed, else 0.
    """
    fails = comm.gather(list(FAILS), root=0)
    bad = 0
    if comm.rank == 0:
        flat = [f"rank {r}: FAIL {f}" for r, fs in enumerate(fails) for f in fs]
        for line in flat[:limit]:
            print(line, flush=True)
        print(f"{label}: {len(flat)} failures on {comm.size} ranks", flush=True)
        bad = int(bool(flat))
    return int(comm.bcast(bad, root=0))


def run_cases(comm, cases, *args):
    """Run each of ``cases`` as ``case(comm, *args)`` on every rank; return how many failed.

    A case fails when it raises ``AssertionError`` on any rank; another exception prints its
    traceback and aborts the job (``MPI_Abort``), since the ranks may no longer meet.
    """
    failed = 0
    for case in cases:
        try:
            case(comm, *args)
            ok = 1
        except AssertionError as e:
            print(f"rank {comm.rank}: {case.__name__} FAILED: {e}", flush=True)
            ok = 0
        except Exception:  # noqa: BLE001 - anything unexpected: report and abort, never hang
            traceback.print_exc()
            sys.stdout.flush()
            comm.Abort(2)
        flag = np.array([ok], np.int32)
        comm.Allreduce(MPI.IN_PLACE, flag, op=MPI.MIN)
        failed += not flag[0]
        if comm.rank == 0:
            print(f"{case.__name__}: {'ok' if flag[0] else 'FAILED'}", flush=True)
    return failed


def quiet(fn, *args):
    """Return ``fn(*args)`` with its standard output discarded (a trainer's table in a test body)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args)


def shared_dir(comm, base, name):
    """Create ``base/name`` on rank 0 and return its path on every rank once it exists."""
    path = os.path.join(base, name)
    if comm.rank == 0:
        os.makedirs(path, exist_ok=True)
    comm.Barrier()
    return path
