"""Rank-side body of the persistent all-reduce tests: ``python -m tests.mpi_persistent``.

Oracle: MPI's own ``MPI_Allreduce`` on the same data (in float64 for float16 input, with NumPy's
division for ``avg``). Cases: plans of ``mpi`` and of a hand-made algorithm, started many times with
new contents; the blocking path's cached plans (taken, as ``Context.fast`` shows) under every op and
dtype; a count and an op mismatch on the cached path (every rank raises); persistent plans that
differ across ranks (made in another order, or one more on one rank: every rank's ``wait`` raises
a ``CollectiveError`` by its timeout); a tuning table naming
``mpi`` for ``auto`` and its replacement (the cached choice follows the table); plan misuse. Exits 0
on success, else prints the failures and exits 1.
"""
import json
import os
import sys
import tempfile

import numpy as np
from mpi4py import MPI

import collectives as C
from collectives.engine.context import free_context, last_stats
from collectives.model import auto as select
from collectives.engine.context import get_context
from tests.mpicases import check, report

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()
_MPI = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}


def oracle(x, op):
    """Return MPI's own all-reduce of ``x`` under commlab's rules (float16 summed in float64)."""
    wide = x.astype(np.float64) if x.dtype == np.float16 else x.copy()
    nan = np.isnan(wide) if wide.dtype.kind == "f" else None
    comm.Allreduce(MPI.IN_PLACE, wide, _MPI[op])
    if nan is not None and op in ("min", "max"):
        comm.Allreduce(MPI.IN_PLACE, nan, MPI.LOR)
        wide[nan] = np.nan
    if op == "avg":
        wide = wide / P if wide.dtype.kind == "f" else np.floor_divide(wide, P)
    return wide.astype(x.dtype)


def same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def data(n, dtype, op, step):
    x = ((np.arange(n) * 7 + 3 * rank + step) % 5 + 1).astype(dtype)
    if op in ("min", "max") and x.dtype.kind == "f" and n > 2 and rank == P - 1:
        x[2] = np.nan  # NaN propagates (NumPy's rule)
    return x


def plans():
    sub = comm.Dup()
    for alg in ("mpi", "ring"):
        for dtype, op, n in (("float32", "sum", 1), ("float32", "avg", 2048), ("float64", "max", 7),
                             ("int32", "avg", 5), ("float16", "sum", 9), ("int64", "prod", 3000),
                             ("float32", "min", 3000)):
            x = data(n, dtype, op, 0)
            plan = C.allreduce_init(x, comm=sub, op=op, algorithm=alg)
            check(plan.algorithm == alg, f"plan algorithm {plan.algorithm} != {alg}")
            for step in range(3):
                x[...] = data(n, dtype, op, step)  # the plan reads x's contents at every start
                plan.start()
                got = plan.wait(timeout=30.0 if step == 1 else None)
                check(got is plan.out and same(got, oracle(x, op)), f"plan {alg} {dtype} {op} n={n} step {step}")
            plan.free()
        y = np.arange(6, dtype=np.float32) + rank
        plan = C.allreduce_init(y, comm=sub, algorithm=alg, out=y)  # in place
        want = oracle(y, "sum")
        plan.start()
        check(same(plan.wait(), want) and same(y, want), f"in-place plan {alg}")
        for misuse, call in (("wait before start", plan.wait), ("start twice", lambda: (plan.start(), plan.start()))):
            try:
                call()
                check(False, f"{misuse}: no error")
            except RuntimeError:
                pass
        plan.wait()
        plan.free()
    free_context(sub)
    sub.Free()


def cached():
    sub = comm.Dup()
    ctx = get_context(sub)
    for dtype in ("float32", "float16", "float64", "int32", "int64"):
        for op in ("sum", "avg", "min", "max", "prod"):
            for n in (1, 33, 2048):
                for step in range(3):
                    x = data(n, dtype, op, step).reshape((1, n))
                    out = np.empty_like(x) if step == 1 else None
                    got = C.allreduce(x, comm=sub, op=op, algorithm="mpi", out=out, timeout=30.0 if step == 2 else None)
                    check(same(got, oracle(x, op)), f"cached mpi {dtype} {op} n={n} step {step}")
                    check(out is None or got is out, "out= not returned")
                check(("mpi", op, np.dtype(dtype), (1, n)) in ctx.fast, f"no cached plan for {dtype} {op} n={n}")
    stats = last_stats(sub)
    check(stats["algorithm"] == "mpi" and stats["count"] == 2048 and stats["estimated"], f"last_stats {stats}")
    check(all(plan.n <= 2048 for plan in ctx.plans.values()), "a plan above PIGGYBACK_MAX was cached")
    free_context(sub)
    sub.Free()


def mismatch():
    for kind in ("count", "op"):
        sub = comm.Dup()
        for _ in range(2):  # every rank caches count 8, op sum
            C.allreduce(np.ones(8, np.float32), comm=sub, algorithm="mpi")
        n = 10 if kind == "count" and rank == 0 else 8
        op = "max" if kind == "op" and rank == 0 else "sum"
        try:
            got = C.allreduce(np.ones(n, np.float32), comm=sub, op=op, algorithm="mpi", timeout=1.5)
            check(False, f"{kind} mismatch on the cached path returned {got[:3]}")
        except C.CollectiveTimeout:
            check(kind == "op" and rank == 0, f"{kind}: timed out instead of naming the mismatch")
            # (rank 0's float max posts a NaN-mask all-reduce the sum ranks never post: it times out)
        except C.CollectiveError as exc:
            check("disagree" in str(exc) or "differ" in str(exc), f"{kind}: unclear error {exc}")
        try:
            C.allreduce(np.ones(8, np.float32), comm=sub, algorithm="mpi")
            check(False, f"{kind}: the communicator was still usable after the mismatch")
        except RuntimeError:
            pass


def differ():
    """Ranks whose persistent plans differ -- made in another order, or one plan more on rank 0: the
    plans' fingerprints are compared as they are made, so every rank raises CollectiveMismatch there
    (or, where they were made, ``wait(timeout=1.5)`` ends every rank in a CollectiveError); never a
    hang (the test's own timeout would catch one)."""
    for kind in ("order", "extra"):
        sub = comm.Dup()
        get_context(sub)  # the context (its duplicate communicator) made on every rank first
        a, b = np.ones(8, np.float32), np.ones(24, np.float32)
        if kind == "order":
            made = [("b", b), ("a", a)] if rank == 0 else [("a", a), ("b", b)]
        else:
            made = ([("b", b)] if rank == 0 else []) + [("a", a)]
        try:
            plans = {name: C.allreduce_init(x, comm=sub, algorithm="mpi") for name, x in made}
            plans["a"].start()
            got = plans["a"].wait(timeout=1.5)
            check(False, f"persistent plans made in another {kind}: wait returned {got[:3]}")
        except C.CollectiveError as exc:
            check("allreduce" in str(exc), f"{kind}: the error does not name the call: {exc}")
        try:
            C.allreduce(np.ones(8, np.float32), comm=sub, algorithm="mpi")
            check(False, f"{kind}: the communicator was still usable after the plans' timeout")
        except RuntimeError:
            pass


def table():
    sub = comm.Dup()
    path = os.path.join(tempfile.gettempdir(), f"commlab-persistent-{os.getpid()}.json")
    rules = [{"size": P, "max_bytes": 4096, "algorithm": "mpi"}, {"size": P, "max_bytes": None, "algorithm": "ring"}]
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"allreduce": rules}, f)
    try:
        select.load_table(path, check_library=False)
        x = np.arange(5, dtype=np.float32) + rank
        for _ in range(2):
            check(same(C.allreduce(x, comm=sub), oracle(x, "sum")), "auto -> mpi from the table")
            check(last_stats(sub)["algorithm"] == "mpi", f"auto resolved to {last_stats(sub)['algorithm']}")
        select.clear_table()
        check(same(C.allreduce(x, comm=sub), oracle(x, "sum")), "auto after the table changed")
        check(last_stats(sub)["algorithm"] != "mpi", "the cached plan outlived the table that chose it")
    finally:
        os.remove(path)
        select.reset_table()  # back to the shipped table
    free_context(sub)
    sub.Free()


def main():
    cases = sys.argv[1:] or ["plans", "cached", "mismatch", "differ", "table"]
    for name in cases:
        globals()[name]()
    sys.exit(report(comm, "mpi_persistent " + " ".join(cases)))


if __name__ == "__main__":
    main()
