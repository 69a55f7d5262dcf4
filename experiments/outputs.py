"""What the studies share around their runs: results files checked writable before any measurement,
the command line their provenance names, and one way a multi-rank study ends on an error."""
import os
import shlex
import sys
import traceback

import collectives.engine.policy
from training.job import all_failed

__all__ = ["unwritable", "command_line", "run_or_report"]


def unwritable(*paths):
    """Return why one of ``paths`` cannot be written (folders made if missing), or None.

    Each file is really opened for writing (a new one is removed again, an existing one is left as it
    is): permission bits say little to root or on a read-only file system.

    Parameters
    ----------
    *paths : str
        Results files an experiment will write.
    """
    for path in paths:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        except OSError as exc:
            return f"cannot make the folder of {path!r}: {exc.strerror or exc}"
        if os.path.isdir(path):
            return f"{path!r} is a folder, give a file path"
        try:
            if os.path.exists(path):
                open(path, "a", encoding="utf-8").close()  # leaves the contents as they are
            else:
                open(path, "x", encoding="utf-8").close()
                os.remove(path)
        except OSError as exc:
            return f"{path!r} is not writable: {exc.strerror or exc}"
    return None


def command_line(module, argv=None):
    """Return ``python -m MODULE ARGV...`` for an entry point's ``main(argv)``, or None when ``argv`` is None.

    A results file's provenance names the command that made it (:func:`experiments.results.stamp`);
    when ``main`` is called with its own ``argv`` (a test, another program) this process's command
    line is not that command. With ``argv`` None the entry point parsed ``sys.argv``, and None lets
    :func:`experiments.results.provenance` read it from there.

    Parameters
    ----------
    module : str
        The entry point's module, e.g. ``"experiments.bench.trainer"``.
    argv : list of str, optional
        The arguments ``main`` parsed.

    Returns
    -------
    str or None
    """
    return None if argv is None else shlex.join(["python", "-m", module, *map(str, argv)])


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
