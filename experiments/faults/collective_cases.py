"""The cases of the fault-and-mismatch suite, run under ``mpiexec`` by :mod:`experiments.faults.suite`.

Each case is an ordinary mistake a user makes with the collectives: ranks that disagree about the
count (small, or large enough to be sent in segments), op, algorithm, dtype or collective, about a
broadcast's or reduce's root, about all-gather's dtype, shape or form (with and without ``out=``),
one rank that makes an extra call or skips one. Every case runs on a fresh duplicate of ``COMM_WORLD``; every rank appends one JSON line
per case to ``OUT/rank-R.jsonl``: ``ok`` (returned the right value), ``error`` (raised; the message
is kept) or ``wrong`` (returned a value that is not the right one: a silent wrong answer), with the
seconds the case took on that rank. Ranks meet at a barrier between cases. A case whose right value
is undefined (the ranks' calls differ) must raise on every rank.
"""
import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import collectives as C
from collectives.schedules.schedule import SEGMENT_ELEMENTS
from training.settings.options import INT32_MAX, Parser, integer, outpath, real, text

__all__ = ["KINDS", "case_names", "run_case"]

_ALL_REDUCE = tuple(C.ALGORITHMS)


def _other(alg, choices):
    """Return an algorithm of ``choices`` other than ``alg`` (the next one, cyclically)."""
    i = choices.index(alg) if alg in choices else -1
    return choices[(i + 1) % len(choices)]


def _count(comm, alg, t):
    n = 10 if comm.rank == 0 else 8
    return C.allreduce(np.ones(n, np.float32), comm=comm, algorithm=alg, timeout=t), None


def _op(comm, alg, t):
    return C.allreduce(np.ones(8, np.float32) * (comm.rank + 1), comm=comm, op="max" if comm.rank == 0 else "sum",
                       algorithm=alg, timeout=t), None


def _algorithm(comm, alg, t):
    mine = alg if comm.rank == 0 else _other(alg, [a for a in _ALL_REDUCE if a != "auto"])
    return C.allreduce(np.ones(8, np.float32), comm=comm, algorithm=mine, timeout=t), None


def _dtype(comm, alg, t):
    dt = np.float64 if comm.rank == 0 else np.float32
    return C.allreduce(np.ones(8, dt), comm=comm, algorithm=alg, timeout=t), None


def _collective(comm, alg, t):
    x = np.ones(8, np.float32)
    if comm.rank == 0:
        return C.allreduce(x, comm=comm, algorithm=alg, timeout=t), None
    return C.broadcast(x, root=0, comm=comm, algorithm="mpi" if alg == "mpi" else "tree", timeout=t), None


def _extra_call(comm, alg, t):
    if comm.rank == 0:
        C.allreduce(np.full(8, 1000.0, np.float32), comm=comm, algorithm=alg, timeout=t)
    y = C.allreduce(np.full(8, 10.0, np.float32), comm=comm, algorithm=alg, timeout=t)
    return y, np.full(8, 10.0 * comm.size, np.float32)


def _skipped_call(comm, alg, t):
    if comm.rank != 0:
        try:
            C.allreduce(np.ones(1000), comm=comm, algorithm=alg, timeout=t)
        except C.CollectiveError:
            pass  # expected: rank 0 skipped it; the next call must still not return garbage
    return C.allreduce(np.ones(3), comm=comm, algorithm=alg, timeout=t), np.full(3, float(comm.size))


def _reduce_count(comm, alg, t):
    a = "tree" if alg != "mpi" else "mpi"
    y = C.reduce(np.ones(10 if comm.rank == 0 else 8, np.float32), root=0, comm=comm, algorithm=a, timeout=t)
    if comm.rank != 0:  # a non-root rank receives nothing: returning None is its whole (right) answer
        return np.zeros(0) if y is None else y, np.zeros(0)
    return y, None


def _reduce_scatter_count(comm, alg, t):
    a = "ring" if alg != "mpi" else "mpi"
    return C.reduce_scatter(np.ones(10 if comm.rank == 0 else 8, np.float32), comm=comm, algorithm=a, timeout=t), None


def _broadcast_count(comm, alg, t):
    a = "tree" if alg != "mpi" else "mpi"
    x = np.ones(10 if comm.rank == 0 else 8, np.float32) * (comm.rank + 1)
    y = C.broadcast(x, root=0, comm=comm, algorithm=a, timeout=t)
    return y, (np.ones(10, np.float32) if comm.rank == 0 else None)  # the root's answer is its own data


def _broadcast_root(comm, alg, t):
    a = "tree" if alg != "mpi" else "mpi"  # every rank takes itself for the root: each would only send
    return C.broadcast(np.full(8, comm.rank + 1.0, np.float32), root=comm.rank, comm=comm, algorithm=a, timeout=t), None


def _reduce_root(comm, alg, t):
    a = "tree" if alg != "mpi" else "mpi"  # rank 0 says root 0, the others root 1
    y = C.reduce(np.ones(8, np.float32), root=0 if comm.rank == 0 else 1, comm=comm, algorithm=a, timeout=t)
    return (np.zeros(0) if y is None else y), None


def _large_count(comm, alg, t):
    n = 2 * SEGMENT_ELEMENTS + (8 if comm.rank == 0 else 16)  # above the segment size: cut into segments
    return C.allreduce(np.ones(n, np.float32), comm=comm, algorithm=alg, timeout=t), None


def _allgather_dtype(comm, alg, t):
    x = np.arange(6, dtype=np.float64 if comm.rank == 0 else np.float32)
    return C.allgather(x, comm=comm, algorithm=alg, timeout=t), None


def _allgather_shape(comm, alg, t):
    x = np.ones((2, 3 if comm.rank == 0 else 4), np.float32)  # trailing dimensions differ
    return C.allgather(x, comm=comm, algorithm=alg, timeout=t), None


def _allgather_collective(comm, alg, t):
    x = np.ones(8, np.float32)
    if comm.rank == 0:
        return C.allgather(x, comm=comm, algorithm=alg, timeout=t), None
    return C.allreduce(x, comm=comm, algorithm=alg, timeout=t), None


def _gather_into(comm, x, alg, t):
    out = np.empty((comm.size * x.shape[0],) + x.shape[1:], x.dtype)  # the equal-shape form (out=)
    return C.allgather(x, comm=comm, algorithm=alg, timeout=t, out=out)


def _allgather_out_count(comm, alg, t):
    return _gather_into(comm, np.ones(3 if comm.rank == 0 else 2, np.float32), alg, t), None


def _allgather_out_shape(comm, alg, t):
    x = np.arange(6, dtype=np.float32).reshape((2, 3) if comm.rank == 0 else (3, 2))  # same count, other shape
    return _gather_into(comm, x, alg, t), None


def _allgather_out_mixed(comm, alg, t):
    x = np.ones(2, np.float32)
    if comm.rank == 0:  # the equal-shape form on one rank, the signature exchange on the others
        return _gather_into(comm, x, alg, t), None
    return C.allgather(x, comm=comm, algorithm=alg, timeout=t), None


#: Mismatch kinds: name -> function(comm, algorithm, timeout) returning (result, right value or None).
KINDS = {"count": _count, "op": _op, "algorithm": _algorithm, "dtype": _dtype, "collective": _collective,
         "extra_call": _extra_call, "skipped_call": _skipped_call, "large_count": _large_count,
         "reduce_count": _reduce_count, "reduce_scatter_count": _reduce_scatter_count,
         "broadcast_count": _broadcast_count, "broadcast_root": _broadcast_root, "reduce_root": _reduce_root,
         "allgather_dtype": _allgather_dtype,
         "allgather_shape": _allgather_shape, "allgather_collective": _allgather_collective,
         "allgather_out_count": _allgather_out_count, "allgather_out_shape": _allgather_out_shape,
         "allgather_out_mixed": _allgather_out_mixed}
# kinds whose other collectives have only the tree/ring and mpi forms: run them for those two only
_FEW = {"reduce_count", "reduce_scatter_count", "broadcast_count", "broadcast_root", "reduce_root",
        "allgather_dtype", "allgather_shape",
        "allgather_collective", "allgather_out_count", "allgather_out_shape", "allgather_out_mixed"}


def case_names():
    """Return every case name ``KIND/ALGORITHM`` in run order."""
    return [f"{k}/{a}" for k in KINDS for a in _ALL_REDUCE if k not in _FEW or a in ("ring", "mpi")]


def run_case(name, timeout):
    """Run case ``name`` on a fresh duplicate of COMM_WORLD; return this rank's record (a dict)."""
    kind, alg = name.split("/")
    comm = MPI.COMM_WORLD.Dup()
    start = time.perf_counter()
    rec = {"case": name, "rank": comm.rank}
    try:
        got, want = KINDS[kind](comm, alg, timeout)
        ok = want is not None and np.array_equal(np.asarray(got), want)
        rec.update(outcome="ok" if ok else "wrong", value=np.asarray(got).ravel()[:6].tolist())
    except Exception as exc:  # noqa: BLE001 - every error is an outcome; its type and text are recorded
        rec.update(outcome="error", error=f"{type(exc).__name__}: {exc}")
    rec["seconds"] = round(time.perf_counter() - start, 3)
    return rec


def main(argv=None):
    """Run the cases from ``--start`` on, writing one JSON line per case and rank."""
    ap = Parser(prog="mpiexec -n P python -m experiments.faults.collective_cases",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=outpath(folder=True, empty=True), required=True, help="directory for rank-R.jsonl")
    ap.add_argument("--timeout", type=real(0, 1e15, low_open=True), default=None, help="timeout= of every call (seconds)")
    ap.add_argument("--start", type=integer(0, INT32_MAX), default=0, help="index of the first case to run")
    ap.add_argument("--only", type=text(), default=None, help="comma-separated KIND/ALGORITHM cases to run")
    args = ap.parse_args(argv)
    world = MPI.COMM_WORLD
    names = case_names()[args.start:] if not args.only else args.only.split(",")
    path = os.path.join(args.out, f"rank-{world.rank}.jsonl")
    for name in names:
        rec = run_case(name, args.timeout)
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        req = world.Ibarrier()  # the next case starts together; a rank stuck in a case stalls the job here
        while not req.Test():
            time.sleep(0.001)
    return 0


if __name__ == "__main__":
    sys.exit(main())
