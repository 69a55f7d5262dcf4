"""Rank-side body: repeated reduce-scatter and all-gather calls through their cached paths.

``mpiexec -n P python -m tests.mpi_repeated``. A repeated call of one signature reuses what the
first call cached (``collectives.library.scatter_plan.ScatterPlan``, ``collectives.calls.allgather._Signature`` and
``_EqualPlan``); every case
calls several times with new data and compares each result with MPI's own collective called here
(``Reduce_scatter_block`` in float64, or ``allgather`` of the blocks), checks that an earlier result
is not overwritten by a later call, and that ranks whose repeated calls differ raise on every rank.
Exits 0 when every case passes on every rank.
"""
import sys
import traceback

import numpy as np
from mpi4py import MPI

import collectives as C
from collectives.engine.context import last_stats
from collectives.schedules.schedule import chunk_bounds
from tests.mpicases import FAILS, check, report

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()
#: timeout= of the mismatch cases that accept a CollectiveTimeout (a ring whose tags differ waits it out)
MISMATCH_WAIT = 0.5


def scatter_oracle(x, op):
    """This rank's chunk of the reduction of every rank's ``x``, by MPI in float64 (exact for these inputs)."""
    wide = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    mine = np.empty(wide.size // P)
    comm.Reduce_scatter_block(wide, mine, {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX,
                                           "min": MPI.MIN}[op])
    if op == "avg":
        mine = mine / P if x.dtype.kind == "f" else np.floor_divide(mine, P)
    return mine.astype(x.dtype)


def case_reduce_scatter():
    for alg in ("mpi", "auto"):
        for dtype in ("float32", "float16", "float64", "int32"):
            for op in ("sum", "avg", "prod", "max"):
                for shape, view in (((3 * P,), False), ((2, 4 * P), True)):  # view: a non-contiguous half
                    results = []
                    for call in range(3):
                        base = (np.arange(int(np.prod(shape))) * (rank + 2) + 3 * call) % 5 + (op == "prod")
                        x = base.reshape(shape).astype(dtype)
                        if view:
                            x = np.concatenate([x, x], axis=1)[:, ::2]
                        got = C.reduce_scatter(x, op=op, algorithm=alg)
                        want = scatter_oracle(x, op)
                        check(got.dtype == x.dtype and np.array_equal(got, want),
                              f"reduce_scatter {alg} {dtype} {op} {shape} call {call}: {got} != {want}")
                        results.append((got, want.copy()))
                    check(all(np.array_equal(g, w) for g, w in results),
                          f"reduce_scatter {alg} {dtype} {op}: a later call overwrote an earlier result")
    C.reduce_scatter(np.ones(P * 4, np.float32), algorithm="auto")
    check(last_stats()["algorithm"] == "mpi", "auto reduce-scatter of 16 B per rank did not run mpi")
    limit = 16384 if P <= 2 else 262144  # bytes of input up to which auto runs the library
    for n, want in ((limit // 4, "mpi"), (limit // 4 + P, "ring")):
        C.reduce_scatter(np.ones(n, np.float32), algorithm="auto")
        check(last_stats()["algorithm"] == want, f"auto reduce-scatter of {4 * n} B on {P} ranks did not run {want}")


def case_allgather():
    for alg in ("mpi", "ring", "auto"):
        results = []
        for call, rows in enumerate([2, 2, rank + 1, 2, 3]):  # equal, equal, all-gather-v, equal again
            x = np.full((rows, 3), 10 * rank + call, np.int32)
            got = C.allgather(x, algorithm=alg)
            want = np.concatenate(comm.allgather(x))
            check(np.array_equal(got, want), f"allgather {alg} call {call}: {got.tolist()} != {want.tolist()}")
            results.append((got, want))
        check(all(np.array_equal(g, w) for g, w in results), f"allgather {alg}: a later call overwrote a result")
    C.allgather(np.ones(4, np.float32), algorithm="auto")
    check(last_stats()["algorithm"] == "mpi", "auto all-gather of a host array did not run mpi")


def case_out_buffers():
    """``out=``: the result lands in the caller's buffer (contiguous, strided, cast, a PyTorch tensor)."""
    for alg in ("mpi", "ring", "auto"):
        for dtype in ("float32", "float16", "int64"):
            x = ((np.arange(4 * P) + rank) % 7).astype(dtype)
            want = scatter_oracle(x, "sum")
            out = np.full(4, -1, dtype)
            for call in range(2):
                got = C.reduce_scatter(x, op="sum", algorithm=alg, out=out)
                check(got is out and np.array_equal(out, want), f"reduce_scatter out= {alg} {dtype} call {call}")
            strided = np.full(8, -1, dtype)[::2]
            C.reduce_scatter(x, op="sum", algorithm=alg, out=strided)
            check(np.array_equal(strided, want), f"reduce_scatter strided out= {alg} {dtype}")
        for shape in ((3,), (2, 5), (0, 4)):
            x = np.full(shape, rank + 1, np.int32)
            want = np.concatenate(comm.allgather(x))
            out = np.full((P * shape[0],) + shape[1:], -1, np.int32)
            for call in range(2):
                got = C.allgather(x, algorithm=alg, out=out)
                check(got is out and np.array_equal(out, want), f"allgather out= {alg} {shape} call {call}")
    import torch
    t, res = torch.full((2,), float(rank)), torch.empty(2 * P)
    got = C.allgather(t, out=res)
    check(got is res and res.tolist() == [float(r) for r in range(P) for _ in range(2)], "allgather torch out=")
    got = C.reduce_scatter(torch.ones(2 * P), algorithm="auto", out=torch.empty(2))
    check(isinstance(got, torch.Tensor) and got.tolist() == [float(P)] * 2, "reduce_scatter torch out=")
    for bad, what in ((np.empty(5, np.int32), "shape"), (np.empty(2 * P, np.float64), "dtype")):
        expect_on_every_rank((ValueError, TypeError), lambda: C.allgather(np.ones(2, np.int32), out=bad),
                             f"allgather out= of the wrong {what}")
        expect_on_every_rank((ValueError, TypeError), lambda: C.reduce_scatter(np.ones(2 * P, np.int32), out=bad[:3]),
                             f"reduce_scatter out= of the wrong {what}")
    if P > 1:  # equal-shape all-gather whose ranks' blocks differ: an error on every rank, never a value
        for alg in ("mpi", "ring"):
            for shape, what in ((((3, 2) if rank == 0 else (2, 2)), "rows differ"),
                                (((2, 3) if rank == 0 else (3, 2)), "shapes differ at equal counts")):
                sub = comm.Dup()
                out = np.empty((P * shape[0], shape[1]))
                expect_on_every_rank((C.CollectiveMismatch, C.CollectiveTimeout),  # ring: tags differ, so a timeout
                                     lambda: C.allgather(np.ones(shape), comm=sub, algorithm=alg, timeout=MISMATCH_WAIT, out=out),
                                     f"allgather out= {alg} {what}")
                sub.Free()


def case_library_plans():
    """The library plans at small and large counts (the 2,048-element limit of the all-reduce's in-data
    check is no limit here), uneven chunks, NaN under min/max; NumPy on every rank's input is the oracle."""
    for n in (3 * P + 1, 2 * P, 2049 + P, 1500 * P):  # uneven and even chunks, both sides of PIGGYBACK_MAX
        bounds = chunk_bounds(n, P)
        for dtype in ("float32", "int32"):
            for op in ("sum", "prod", "min", "max", "avg"):
                for call in range(2):
                    x = ((np.arange(n) + rank + call) % 3 + 1).astype(dtype)
                    if dtype == "float32" and op in ("min", "max"):
                        x[n // 2] = np.nan if rank == P - 1 else x[n // 2]
                    every = np.array(comm.allgather(x), np.float64)
                    want = {"sum": every.sum(0), "prod": every.prod(0), "min": every.min(0), "max": every.max(0),
                            "avg": every.sum(0) / P if dtype == "float32" else every.sum(0) // P}[op]
                    want = want[bounds[rank]:bounds[rank + 1]].astype(dtype)
                    got = C.reduce_scatter(x, op=op, algorithm="mpi")
                    check(got.dtype == x.dtype and np.array_equal(got, want, equal_nan=True),
                          f"reduce_scatter mpi n={n} {dtype} {op} call {call}")
    for shape in ((3,), (2, 5), (2100,)):  # 2100 float64: 16.8 KB, above the in-data fingerprint's limit
        for call in range(2):
            x = np.full(shape, 10.0 * rank + call)
            out = np.empty((P * shape[0],) + shape[1:])
            C.allgather(x, algorithm="mpi", out=out)
            check(np.array_equal(out, np.concatenate(comm.allgather(x))), f"allgather mpi out= {shape} call {call}")
    for n in (4 * P, 3000 * P):  # out= a view of x: the library must not receive into its own send buffer
        for call in range(2):
            x = ((np.arange(n) + rank + call) % 3 + 1).astype(np.float32)
            want = scatter_oracle(x.copy(), "sum")
            got = C.reduce_scatter(x, algorithm="mpi", out=x[:n // P])
            check(np.array_equal(got, want), f"reduce_scatter mpi n={n} into a view of its input, call {call}")
    x, view, out = np.zeros(2 * P, np.float32), np.zeros(4 * P, np.float32)[::2], np.empty(2 * P, np.float32)
    for call in range(3):  # the same arrays, changed in place between calls (the plans keep views of them)
        x[...], view[...] = call + rank, call * (rank + 1)
        for a in (x, view):
            check(np.array_equal(C.reduce_scatter(a, algorithm="mpi"), scatter_oracle(a, "sum")),
                  f"reduce_scatter of an array changed in place, call {call}")
        C.allgather(view[:2], algorithm="mpi", out=out)
        check(np.array_equal(out, np.concatenate(comm.allgather(view[:2]))), f"allgather into the same out, call {call}")
    if P > 1:  # a mismatch after correct calls of the same plan: what they left in its buffer is not taken
        sub = comm.Dup()
        for _ in range(2):
            C.allgather(np.ones(3, np.float32), comm=sub, algorithm="mpi", out=np.empty(3 * P, np.float32))
        rows = 2 if rank == 0 else 3
        out = np.empty(P * rows, np.float32)
        expect_on_every_rank((C.CollectiveMismatch, C.CollectiveTimeout),
                             lambda: C.allgather(np.ones(rows, np.float32), comm=sub, algorithm="mpi", timeout=MISMATCH_WAIT, out=out),
                             "allgather out= after correct calls: rows differ")
        sub.Free()


def case_fast_reduce_scatter():
    """Repeated library reduce-scatters into ``out=`` without a deadline (the plan's one-frame form):
    even and uneven chunks, a 2-D input, one rank whose input is a strided view (it copies, the others
    do not), then ops that differ after both were cached: an error on every rank, never a value."""
    for n, shape in ((4 * P, (4 * P,)), (3 * P + 1, (3 * P + 1,)), (6 * P, (2, 3 * P))):
        base = ((np.arange(2 * n) + rank) % 5).astype(np.float32)
        x = base[::2].reshape(shape) if rank == 0 else np.ascontiguousarray(base[::2]).reshape(shape)
        every = np.stack(comm.allgather(x.reshape(-1)))
        want = np.array_split(every.sum(axis=0), P)[rank]
        out = np.full(want.shape, -1, np.float32)
        for call in range(3):
            got = C.reduce_scatter(x, algorithm="mpi", out=out)
            check(got is out and np.array_equal(out, want), f"reduce_scatter fast n={n} {shape} call {call}")
    if P > 1:
        sub = comm.Dup()
        x, out = np.ones(2 * P, np.float32), np.empty(2, np.float32)
        for op in ("sum", "max", "sum", "max"):
            C.reduce_scatter(x, comm=sub, op=op, algorithm="mpi", out=out)
        expect_on_every_rank(C.CollectiveMismatch,
                             lambda: C.reduce_scatter(x, comm=sub, op="max" if rank == 0 else "sum", algorithm="mpi",
                                                      out=out), "reduce_scatter out= op mismatch, no deadline")
        sub.Free()


def case_mask_mismatch():
    """Float max on one rank against sum on the others, without a deadline: the max rank's NaN mask is
    posted only once its check passed, so every rank raises (before, the max rank waited forever for a
    mask call the others never posted): the small all-reduce (check in the data) on its first call and
    from its cached plan, the large one (fingerprint beside the data) and the reduce-scatter."""
    if P < 2:
        return
    op = "max" if rank == 0 else "sum"
    for n, cached in ((16, False), (16, True), (4096, False)):
        sub = comm.Dup()
        x = np.ones(n, np.float32)
        if cached:
            for each in ("max", "sum", "max", "sum"):
                C.allreduce(x, comm=sub, op=each, algorithm="mpi")
        expect_on_every_rank(C.CollectiveMismatch, lambda: C.allreduce(x, comm=sub, op=op, algorithm="mpi"),
                             f"allreduce mpi {n} elements, max against sum, cached {cached}")
        sub.Free()
    sub = comm.Dup()
    expect_on_every_rank(C.CollectiveMismatch, lambda: C.reduce_scatter(np.ones(4 * P, np.float32), comm=sub, op=op,
                                                                        algorithm="mpi"),
                         "reduce_scatter mpi, max against sum")
    sub.Free()


def case_dtype_mismatch():
    """float32 on one rank and float64 on the others through MPI's own all-reduce and reduce-scatter:
    odd counts that end a message inside a float64 (MPICH aborted the job in its datatype engine
    before any check was read), on a call's first use, from a cached plan or the one-frame form
    into ``out=``, with and without a deadline, and at creation of a persistent plan: every rank
    raises CollectiveMismatch. Then every rank switching types together gets MPI's own sums."""
    if P < 2:
        return
    wide = np.float32 if rank == 0 else np.float64
    for n in (1, 3, 511 * P, 1025 * P, 3001):
        for form in ("first", "cached", "out", "timeout", "persistent"):
            for coll in ("allreduce", "reduce_scatter"):
                if form == "persistent" and coll == "reduce_scatter":
                    continue
                size = n * P if coll == "reduce_scatter" else n
                sub = comm.Dup()
                run = getattr(C, coll)
                if form in ("cached", "out"):  # both signatures known on every rank first
                    for dtype in (np.float32, np.float64, np.float32, np.float64):
                        run(np.ones(size, dtype), comm=sub, algorithm="mpi")
                x = np.ones(size, wide)
                out = np.empty(size if coll == "allreduce" else n, wide)
                if form == "persistent":
                    call = lambda: C.allreduce_init(x, comm=sub, algorithm="mpi")
                else:
                    call = (lambda: run(x, comm=sub, algorithm="mpi", out=out if form == "out" else None,
                                        timeout=30 if form == "timeout" else None))
                expect_on_every_rank(C.CollectiveMismatch, call, f"{coll} {form} {n}: float32 against float64")
                sub.Free()
    sub = comm.Dup()
    for n in (3, 2049):
        for dtype in (np.float32, np.float64, np.float32, np.float16, np.float64):
            x = (np.arange(n * P) % 7 + rank).astype(dtype)
            want = np.empty(n * P)
            comm.Allreduce(x.astype(np.float64), want, MPI.SUM)
            got = C.allreduce(x, comm=sub, algorithm="mpi")
            check(got.dtype == x.dtype and np.array_equal(got, want.astype(dtype)), f"allreduce {dtype} {n} after a switch")
            got = C.reduce_scatter(x, comm=sub, algorithm="mpi", out=np.empty(n, dtype))
            check(np.array_equal(got, np.array_split(want, P)[rank].astype(dtype)), f"reduce_scatter {dtype} {n} after a switch")
    sub.Free()


def case_mismatch_across_forms():
    """Mismatches that once made ranks post different library collectives, which MPICH paired with
    each other and returned values on some ranks: counts on both sides of 2,048 elements, and a
    reduce-scatter on some ranks against an all-gather into ``out=`` on another, after matched calls."""
    if P < 2:
        return
    either = (C.CollectiveMismatch, C.CollectiveTimeout)
    sub = comm.Dup()
    n = 2049 if rank == P - 1 else 2048
    expect_on_every_rank(either, lambda: C.reduce_scatter(np.ones(n, np.float32), comm=sub, algorithm="mpi", timeout=MISMATCH_WAIT),
                         "reduce_scatter 2048 against 2049 elements")
    sub.Free()
    sub = comm.Dup()
    for _ in range(2):
        C.reduce_scatter(np.ones(16, np.float32), comm=sub, algorithm="mpi")
    if rank == P - 1:
        call = (lambda: C.allgather(np.ones(16, np.float32), comm=sub, algorithm="mpi", timeout=MISMATCH_WAIT, out=np.empty(16 * P, np.float32)))
    else:
        call = (lambda: C.reduce_scatter(np.ones(16, np.float32), comm=sub, algorithm="mpi", timeout=MISMATCH_WAIT))
    expect_on_every_rank(either, call, "reduce_scatter on some ranks, allgather out= on one")
    sub.Free()


def expect_on_every_rank(exc_type, fn, what):
    try:
        fn()
        raised = None
    except exc_type as exc:
        raised = str(exc)
    except Exception as exc:  # the wrong kind is a failure too
        raised = None
        FAILS.append(f"{what}: {type(exc).__name__}: {exc}")
    names = "/".join(e.__name__ for e in (exc_type if isinstance(exc_type, tuple) else (exc_type,)))
    check(raised is not None, f"{what}: no {names} on rank {rank}")


def case_mismatch_after_cache():
    """Both signatures cached on every rank first; then the ranks' calls differ."""
    if P < 2:
        return
    sub = comm.Dup()
    x = np.ones(2 * P, np.float32)
    for op in ("sum", "prod", "sum", "prod"):
        C.reduce_scatter(x, comm=sub, op=op, algorithm="mpi")
    expect_on_every_rank(C.CollectiveMismatch,
                         lambda: C.reduce_scatter(x, comm=sub, op="prod" if rank == 0 else "sum", algorithm="mpi",
                                                  timeout=20), "reduce_scatter op mismatch")
    sub.Free()
    sub = comm.Dup()
    for dtype in ("float32", "int32", "float32", "int32"):
        C.allgather(np.ones(3, dtype), comm=sub, algorithm="mpi")
    expect_on_every_rank(TypeError, lambda: C.allgather(np.ones(3, "int32" if rank == 0 else "float32"), comm=sub,
                                                        algorithm="mpi", timeout=20), "allgather dtype mismatch")
    sub.Free()


def case_repeated_allreduce():
    """The lean repeated all-reduce (one cached plan per signature, no timeout): every dtype's result in
    the input's dtype, out= or a new array, earlier results kept, a request in flight, and ranks whose
    cached calls differ; MPI's own all-reduce in float64 is the oracle."""
    red = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX}
    for alg in ("mpi", "auto"):
        for dtype in ("float16", "float32", "float64", "int32"):
            for op in ("sum", "avg", "prod", "max"):
                kept = []
                for call in range(3):
                    x = ((np.arange(5) + rank + call) % 3 + 1).astype(dtype)
                    want = np.empty(5)
                    comm.Allreduce(x.astype(np.float64), want, red[op])
                    if op == "avg":
                        want = want / P if x.dtype.kind == "f" else np.floor_divide(want, P)
                    out = np.empty_like(x) if call == 2 else None
                    got = C.allreduce(x, op=op, algorithm=alg, out=out)
                    check(got.dtype == x.dtype and np.array_equal(got, want.astype(dtype)) and (out is None or got is out),
                          f"repeated allreduce {alg} {dtype} {op} call {call}: {got} against {want}")
                    kept.append((got, want.astype(dtype)))
                check(all(np.array_equal(g, w) for g, w in kept), f"repeated allreduce {alg} {dtype} {op}: a later call overwrote a result")
    x = np.ones(6, np.float32)
    C.allreduce(x, algorithm="mpi")
    req = C.iallreduce(np.ones(3000, np.float32), algorithm="ring")  # in flight: the repeated call drives its progress
    check(np.array_equal(C.allreduce(x, algorithm="mpi"), np.full(6, float(P), np.float32)), "repeated allreduce with a request in flight")
    check(np.array_equal(req.wait(), np.full(3000, float(P), np.float32)), "the request in flight")
    if P > 1:  # cached on every rank, then the ranks' calls differ: the check in the data raises on every rank
        sub = comm.Dup()
        for op in ("sum", "prod", "sum", "prod"):
            C.allreduce(x, comm=sub, op=op, algorithm="mpi")
        expect_on_every_rank(C.CollectiveMismatch, lambda: C.allreduce(x, comm=sub, op="prod" if rank == 0 else "sum", algorithm="mpi"),
                             "repeated allreduce, op differs after both were cached")
        sub.Free()


def case_trainer_plans():
    """The trainer's gradient hook with a timeout plans each bucket's all-reduce once and starts it at every
    step; its averages equal MPI's, and a new gradient array gets new plans."""
    from training.dp.hooks import AllreduceHook

    for alg in ("auto", "ring"):
        hook = AllreduceHook(comm, alg, buckets=[(0, 5), (5, 3005)], timeout=30.0)
        grad = np.zeros(3005)
        for step in range(3):
            grad[...] = np.sin(np.arange(3005) * (rank + 1) + step)
            want = np.empty(3005)
            comm.Allreduce(grad, want, MPI.SUM)
            got, _ = hook(grad)
            plans = hook._plans
            check(got is grad and np.allclose(grad, want / P, rtol=1e-12, atol=1e-12), f"hook {alg} step {step}")
        check(plans is not None and hook._plans is plans, f"hook {alg}: the plans are made once")
        other = np.ones(3005)
        hook(other)
        check(hook._plans is not plans and np.array_equal(other, np.ones(3005)), f"hook {alg}: a new gradient array gets new plans")


def main():
    cases = (case_repeated_allreduce, case_trainer_plans, case_reduce_scatter, case_allgather, case_mismatch_after_cache, case_out_buffers, case_fast_reduce_scatter, case_mask_mismatch, case_library_plans,
             case_mismatch_across_forms, case_dtype_mismatch)
    chosen = sys.argv[1:]  # case names without "case_" (all of them when none is given)
    for case in (c for c in cases if not chosen or c.__name__[5:] in chosen):
        try:
            case()
        except Exception:  # report and keep every rank going; the hang guard is the test timeout
            FAILS.append(traceback.format_exc())
    sys.exit(report(comm, "mpi_repeated"))


if __name__ == "__main__":
    main()
