"""Rank-side body: a call refused on one rank only (a bad argument there) never leaves the others waiting unnamed.

``mpiexec -n 3 python -m tests.mpi_refusals MODE...`` runs, for each MODE in turn, every case of
:data:`CASES` -- the five collectives on each route (hand-made schedules, ``mpi``, ``shm``), blocking,
non-blocking and persistent-init forms, with a bad ``out``, ``op``, ``root``, ``counts`` or ``x`` on
rank :data:`BAD` only -- each on a fresh communicator, and checks every rank's exception type and text:

* ``detail`` (``set_debug("detail")``, no ``timeout=``): rank :data:`BAD` raises its own
  ``ValueError``/``TypeError``; every other rank raises ``CollectiveMismatch`` naming it and its
  reason (``rank 1 refused its call ... (ValueError: ...)``). Then every rank makes the same bad call
  (each raises its own error) and a good all-reduce on the same communicator still returns the sum.
* ``timeout`` (default mode, ``timeout=`` :data:`T`, after good calls made the context and the
  shared-memory node, so that the call itself is what waits): rank
  :data:`BAD` raises its own error at once; the others raise ``CollectiveTimeout`` within ``T`` (plus
  :data:`SLACK`), except all-gather without ``out``, whose signature exchange carries the bad
  ``x`` (``ValueError`` naming rank :data:`BAD` on every other rank). ``timeout`` leaves requests
  behind, so it comes last.

Each MODE ends with ``mpi_refusals MODE: N failures on P ranks``; exits 0 when every case passed.
"""
import sys
import time

import numpy as np
from mpi4py import MPI

import collectives as C
from collectives.engine.fingerprint import set_debug
from tests.mpicases import FAILS, check, report

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()
#: The rank whose arguments are bad.
BAD = 1
#: timeout= of the ``timeout`` mode's calls, seconds.
T = 0.5
#: Seconds beyond ``T`` a timed-out rank may take to raise (a loaded two-core machine).
SLACK = 6.0


def _x():
    return np.arange(6, dtype=np.float64) + rank


def _allreduce(alg, what):
    def run(sub, bad, timeout):
        kw = {"out": np.empty(5)} if bad and what == "out" else {}
        op = "mean" if bad and what == "op" else "sum"
        return C.allreduce(_x(), op=op, comm=sub, algorithm=alg, timeout=timeout, **kw)
    return run


def _iallreduce(alg):
    def run(sub, bad, timeout):
        return C.iallreduce(_x(), op="mean" if bad else "sum", comm=sub, algorithm=alg).wait(timeout=timeout)
    return run


def _allreduce_init(alg):
    def run(sub, bad, timeout):
        plan = C.allreduce_init(_x(), comm=sub, algorithm=alg, out=np.empty(5) if bad else None)
        plan.start()
        return plan.wait(timeout=timeout)
    return run


def _reduce_scatter(alg, what):
    def run(sub, bad, timeout):
        kw = {}
        if bad and what == "out":
            kw["out"] = np.empty(5)
        if bad and what == "counts":
            kw["counts"] = [6] if alg == "ring" else [2, 2, 2]  # ring: a count per rank missing; shm: takes none
        op = "mean" if bad and what == "op" else "sum"
        return C.reduce_scatter(_x(), op=op, comm=sub, algorithm=alg, timeout=timeout, **kw)
    return run


def _allgather(alg, what):
    def run(sub, bad, timeout):
        if what == "out":
            return C.allgather(_x()[:2], comm=sub, algorithm=alg, timeout=timeout,
                               out=np.empty(5) if bad else np.empty(2 * P))
        return C.allgather(np.float64(1.0) if bad else _x()[:2], comm=sub, algorithm=alg, timeout=timeout)
    return run


def _broadcast(alg):
    def run(sub, bad, timeout):
        return C.broadcast(_x(), root=5 if bad else 0, comm=sub, algorithm=alg, timeout=timeout)
    return run


def _reduce(alg, what):
    def run(sub, bad, timeout):
        root = 5 if bad and what == "root" else 0
        return C.reduce(_x(), op="mean" if bad and what == "op" else "sum", root=root, comm=sub, algorithm=alg,
                        timeout=timeout)
    return run


_OUT, _OP, _ROOT = "out has shape (5,)", "unknown op 'mean'", "root=5 is out of range"
#: (name, call(sub, bad, timeout), bad rank's error type, text in it, the others' error in the timeout mode
#: (None: CollectiveTimeout), modes it runs in)
CASES = [
    *[(f"allreduce {a} out", _allreduce(a, "out"), ValueError, _OUT, None, "both") for a in ("ring", "tree", "rabenseifner", "2d", "mpi", "shm", "auto")],
    *[(f"allreduce {a} op", _allreduce(a, "op"), ValueError, _OP, None, "both") for a in ("recursive_doubling", "mpi", "shm")],
    *[(f"iallreduce {a} op", _iallreduce(a), ValueError, _OP, None, "both") for a in ("ring", "mpi", "shm")],
    *[(f"allreduce_init {a} out", _allreduce_init(a), ValueError, _OUT, None, "detail") for a in ("ring", "mpi", "shm")],
    *[(f"reduce_scatter {a} out", _reduce_scatter(a, "out"), ValueError, "out has shape (5,), expected (2,)", None, "both")
      for a in ("ring", "mpi", "shm")],
    *[(f"reduce_scatter {a} op", _reduce_scatter(a, "op"), ValueError, _OP, None, "both") for a in ("ring", "mpi")],
    ("reduce_scatter ring counts on one rank", _reduce_scatter("ring", "counts"), ValueError, "counts must be 3 ints",
     None, "detail"),
    ("reduce_scatter shm counts on one rank", _reduce_scatter("shm", "counts"), ValueError, "does not take counts",
     None, "both"),
    *[(f"allgather {a} out", _allgather(a, "out"), ValueError, "out has shape (5,), expected (6,)", None, "both")
      for a in ("ring", "mpi", "shm")],
    *[(f"allgather {a} 0-d x", _allgather(a, "x"), ValueError, "x must have 1 to", (ValueError, "rank(s) 1"), "both")
      for a in ("ring", "mpi")],
    ("allgather shm 0-d x", _allgather("shm", "x"), ValueError, "x must have 1 to", None, "detail"),
    *[(f"broadcast {a} root", _broadcast(a), ValueError, _ROOT, None, "both")
      for a in ("tree", "mpi", "shm")],
    *[(f"reduce {a} root", _reduce(a, "root"), ValueError, _ROOT, None, "both")
      for a in ("tree", "mpi", "shm")],
    *[(f"reduce {a} op", _reduce(a, "op"), ValueError, _OP, None, "both")
      for a in ("tree", "mpi")],
]


def _outcome(call, sub, bad, timeout):
    """Return (the exception or None, seconds the call took)."""
    start = time.perf_counter()
    try:
        call(sub, bad, timeout)
    except Exception as exc:  # noqa: BLE001 - the case checks the type
        return exc, time.perf_counter() - start
    return None, time.perf_counter() - start


def _sum_works(sub, name):
    """A good all-reduce on ``sub`` returns the sum of every rank's input (the communicator is still usable)."""
    try:
        got = C.allreduce(_x(), comm=sub, algorithm="ring")
    except Exception as exc:  # noqa: BLE001
        check(False, f"{name}: after every rank refused, a good all-reduce raised {exc!r}")
        return
    want = np.arange(6, dtype=np.float64) * P + P * (P - 1) / 2
    check(np.array_equal(got, want), f"{name}: after every rank refused, the all-reduce returned {got}")


def detail():
    set_debug("detail")
    try:
        for name, call, kind, text, _, modes in CASES:
            sub = comm.Dup()
            exc, _ = _outcome(call, sub, rank == BAD, None)
            if rank == BAD:
                check(type(exc) is kind and text in str(exc), f"{name}: refusing rank raised {exc!r}")
            else:
                want = f"rank {BAD} refused its call"
                check(isinstance(exc, C.CollectiveMismatch) and want in str(exc) and text in str(exc)
                      and exc.field == "arguments", f"{name}: rank {rank} raised {exc!r}")
            every = comm.Dup()  # every rank refuses alike: each raises its own error, the communicator stays usable
            exc, _ = _outcome(call, every, True, None)
            check(type(exc) is kind and text in str(exc), f"{name}, every rank bad: raised {exc!r}")
            _sum_works(every, name)
    finally:
        set_debug("off")


def timeout():
    for name, call, kind, text, others, modes in CASES:
        if modes != "both":
            continue
        sub = comm.Dup()
        for alg in ("ring", "shm"):  # the context and the node's windows exist: the call itself is what waits
            C.allreduce(np.ones(1), comm=sub, algorithm=alg)
        exc, took = _outcome(call, sub, rank == BAD, T)
        if rank == BAD:
            check(type(exc) is kind and text in str(exc), f"{name}: refusing rank raised {exc!r}")
        elif others is None:
            check(isinstance(exc, C.CollectiveTimeout) and took < T + SLACK,
                  f"{name}: rank {rank} raised {exc!r} after {took:.1f} s")
        else:
            check(isinstance(exc, others[0]) and others[1] in str(exc), f"{name}: rank {rank} raised {exc!r}")


def main():
    """Run each MODE named on the command line in turn (one launch); each reports its own count line."""
    modes = {"detail": detail, "timeout": timeout}
    failed = 0
    for name in sys.argv[1:]:
        modes[name]()
        failed |= report(comm, f"mpi_refusals {name}")
        FAILS.clear()
    sys.exit(failed)


if __name__ == "__main__":
    main()
