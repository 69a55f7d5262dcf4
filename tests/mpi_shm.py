"""Rank-side body of the shared-memory algorithm's tests: ``python -m tests.mpi_shm``.

Oracle: MPI's own collectives (``MPI_Allreduce``, ``MPI_Allgather(v)``, ``MPI_Bcast``) on the same
data, under commlab's rules (float16 and bfloat16 reduced in float64 and rounded once, NaN
propagated through min/max, integer ``avg`` floored). Inputs are small integers, so every exact
result is compared bitwise (a sum or mean of small integers is exact in every dtype, or rounded once
both ways), and random floats are compared within a stated tolerance; every result is also compared
bitwise across the ranks. Cases: all-reduce in every dtype and op at counts 0, 1, below P, odd, and
above ``SMALL_BYTES`` with several reduction chunks; out of place, in place, non-contiguous,
non-blocking, persistent, and zero-copy on shared buffers; reduce-scatter, all-gather (equal and
-v), broadcast and reduce from every root; mismatched calls (every rank raises
``CollectiveMismatch``) and a rank that skips a call (the others raise ``CollectiveTimeout``
naming it). Exits 0 when every case passes.
"""
import sys

import numpy as np
from mpi4py import MPI

import collectives as C
from collectives.backend import BFLOAT16
from collectives.engine.context import free_context, last_stats
from collectives.errors import CollectiveMismatch, CollectiveTimeout
from collectives.shm import algorithms as shm
from collectives.shm import shared_empty
from tests.mpicases import run_cases

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()
_MPI = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}
DTYPES = ("float16", BFLOAT16, "float32", "float64", "int32", "int64")
OPS = ("sum", "prod", "min", "max", "avg")
# 5003 and 23007 elements: above SMALL_BYTES in every dtype but float16 (5003); fewer counts from P = 4 (the
# suite's 2-core machines run 4 and 5 ranks several times slower)
COUNTS = sorted({0, 1, max(P - 1, 1), 7, 1001, 5003, 23007} if P <= 3 else {0, 1, P - 1, 7, 23007})
#: Relative tolerance of random float data against MPI's sum (another summation order).
RTOL = {"float16": 2e-2, "bfloat16": 2e-2, "float32": 1e-5, "float64": 1e-12}


def oracle(x, op):
    """Return MPI's own all-reduce of ``x`` under commlab's rules."""
    wide = x.astype(np.float64) if x.dtype in (np.float16, BFLOAT16) else x.copy()
    nan = np.isnan(wide) if wide.dtype.kind == "f" else None
    comm.Allreduce(MPI.IN_PLACE, wide, _MPI[op])
    if nan is not None and op in ("min", "max"):
        comm.Allreduce(MPI.IN_PLACE, nan, MPI.LOR)
        wide[nan] = np.nan
    if op == "avg":
        wide = wide / P if wide.dtype.kind == "f" else np.floor_divide(wide, P)
    return wide.astype(x.dtype)


def data(n, dtype, op, step=0):
    """Small integers (exact in every dtype), a NaN on the last rank for float min/max."""
    x = ((np.arange(n) * 7 + 3 * rank + step) % 5 + 1).astype(dtype)
    if op in ("min", "max") and np.dtype(dtype).kind in "fV" and n > 2 and rank == P - 1:
        x[2] = np.nan
    if op in ("min", "max") and np.dtype(dtype).kind == "f" and n > 3:
        x[3] = -0.0 if rank % 2 else 0.0  # signed zeros: the same bits on every rank all the same
    return x


def same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes() or (
        a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.astype(np.float64) if a.dtype == BFLOAT16 else a,
                                                                     b.astype(np.float64) if b.dtype == BFLOAT16 else b,
                                                                     equal_nan=a.dtype.kind in "fV"))


BAD = []  # this case's failures on this rank (asserted once at its end: every rank makes every call)


def expect(cond, what):
    """Record ``what`` as a failure unless ``cond`` holds."""
    if not cond:
        BAD.append(what)


def verdict():
    """End a case: raise ``AssertionError`` with this rank's failures, if any."""
    bad, BAD[:] = list(BAD), []
    assert not bad, bad[:10]


def agreed(a):
    """Return True when ``a`` has the same bytes on every rank."""
    mine = a.tobytes()
    return all(b == mine for b in comm.allgather(mine))


def case_allreduce_every_dtype_op_count(comm_):
    shm.CHUNK_BYTES = 8192  # several reduction chunks per slice at the larger counts
    bad = []
    for dtype in DTYPES:
        for op in OPS:
            for n in COUNTS:
                x = data(n, dtype, op)
                want = oracle(x, op)
                got = C.allreduce(x, op=op, algorithm="shm")
                if not (same(got, want) and agreed(got)):
                    bad.append(f"out of place {np.dtype(dtype).name} {op} n={n}")
                y = x.copy()
                if C.allreduce(y, op=op, algorithm="shm", out=y) is not y or not same(y, want):
                    bad.append(f"in place {np.dtype(dtype).name} {op} n={n}")
    assert last_stats()["algorithm"] == "shm"
    assert not bad, bad[:10]


def case_random_floats_within_tolerance(comm_):
    rng = np.random.default_rng(rank)
    for dtype in ("float16", BFLOAT16, "float32", "float64"):
        for n in (5, 9001):
            x = rng.standard_normal(n).astype(dtype)
            want = oracle(x, "sum").astype(np.float64)
            got = C.allreduce(x, op="sum", algorithm="shm")
            expect(agreed(got), f"{dtype} n={n}: ranks differ")
            expect(np.allclose(got.astype(np.float64), want, rtol=RTOL[np.dtype(dtype).name], atol=1e-2 if np.dtype(dtype).itemsize == 2 else 1e-6),
                   f"{np.dtype(dtype).name} n={n}: beyond the tolerance")
            again = C.allreduce(x, op="sum", algorithm="shm")
            expect(again.tobytes() == got.tobytes(), f"{dtype}: not reproducible")
    verdict()


def case_non_contiguous_and_shapes(comm_):
    x = (np.arange(60, dtype=np.float64).reshape(6, 10) + rank)[:, ::3]  # strided
    out = np.empty((6, 8))[:, ::2]
    got = C.allreduce(x, op="max", algorithm="shm", out=out)
    expect(got is out and np.array_equal(out, oracle(np.ascontiguousarray(x), "max")), "strided x and out")
    big = (np.arange(40000, dtype=np.float32).reshape(200, 200) % 7 + rank)[::2]
    expect(np.array_equal(C.allreduce(big, algorithm="shm"), oracle(np.ascontiguousarray(big), "sum")), "2-D strided")
    verdict()


def case_nonblocking_and_persistent(comm_):
    for n in (3, 20000):
        x = data(n, "float32", "sum")
        req = C.iallreduce(x, algorithm="shm")
        want = oracle(x, "sum")
        expect(np.array_equal(req.wait(timeout=30.0), want), f"iallreduce n={n}")
        a = C.iallreduce(x, op="max", algorithm="shm")
        b = C.iallreduce(x, op="min", algorithm="shm")  # two in flight, completed in either order
        expect(np.array_equal(b.wait(), oracle(x, "min")) and np.array_equal(a.wait(), oracle(x, "max")), f"two in flight n={n}")
        for op, dtype in (("sum", "float32"), ("avg", "int64"), ("min", "float16")):
            x = data(n, dtype, op)
            plan = C.allreduce_init(x, op=op, algorithm="shm")
            for step in range(3):
                x[...] = data(n, dtype, op, step)
                want = oracle(x, op)
                plan.start()
                got = plan.wait(timeout=30.0 if step == 1 else None)
                expect(got is plan.out and same(got, want), f"plan {dtype} {op} n={n} step {step}")
            plan.free()
    for n in (5, 30000):  # another shm call between a plan's start and wait completes the plan first
        x, z = data(n, "float64", "sum"), data(7, "int64", "max")
        plan = C.allreduce_init(x, algorithm="shm")
        want_x, want_z = oracle(x, "sum"), oracle(z, "max")
        plan.start()
        got_z = C.allreduce(z, op="max", algorithm="shm")
        expect(same(plan.wait(), want_x) and same(got_z, want_z), f"a call between start and wait, n={n}")
        plan.free()
    verdict()


def case_zero_copy_shared_buffer(comm_):
    for n, dtype, op in ((70001, "float32", "avg"), (50000, "int64", "sum"), (40000, "float16", "sum"), (10, "float64", "max")):
        g = shared_empty(n, dtype)
        plan = C.allreduce_init(g, op=op, algorithm="shm", out=g)
        expect(plan._core.zero_copy == (g.nbytes > shm.SMALL_BYTES), "zero-copy only above SMALL_BYTES")
        for step in range(3):
            g[...] = data(n, dtype, op, step)
            want = oracle(g.copy(), op)
            plan.start()
            expect(plan.wait() is g and same(g, want) and agreed(g), f"zero-copy {dtype} {op} step {step}")
        plan.free()
        g[...] = data(n, dtype, op, 5)
        want = oracle(g.copy(), op)
        expect(C.allreduce(g, op=op, algorithm="shm", out=g) is g and same(g, want), "blocking, in place on shared")
        view = g[8:n - 8]  # a view at the same offset on every rank
        view[...] = data(view.size, dtype, op, 1)
        want = oracle(view.copy(), op)
        expect(same(C.allreduce(view, op=op, algorithm="shm", out=view), want), "view of a shared buffer")
    verdict()


def case_reduce_scatter(comm_):
    bad = []
    for dtype in ("float32", "int64", "float16"):
        for op in ("sum", "avg", "max"):
            for n in COUNTS:
                x = data(n, dtype, op)
                lo, hi = np.cumsum([0] + [c.size for c in np.array_split(np.arange(n), P)])[rank:rank + 2]
                want = oracle(x, op)[lo:hi]  # (every rank calls the oracle)
                got = C.reduce_scatter(x, op=op, algorithm="shm")
                out = np.empty(hi - lo, x.dtype)
                if not (same(got, want) and C.reduce_scatter(x, op=op, algorithm="shm", out=out) is out
                        and same(out, want)):
                    bad.append(f"reduce_scatter {dtype} {op} n={n}")
    assert not bad, bad[:10]


def case_allgather_equal_and_v(comm_):
    for dtype in ("float32", "uint8", "int64"):
        for rows in (0, 1, 3, 3000):
            x = (np.arange(rows * 4).reshape(rows, 4) + 100 * rank).astype(dtype)
            want = np.concatenate(comm.allgather(x))
            out = np.empty((P * rows, 4), dtype)
            expect(C.allgather(x, algorithm="shm", out=out) is out and np.array_equal(out, want), f"equal {dtype} {rows}")
            v = x[:max(rows - rank, 0)]  # blocks of different lengths
            expect(np.array_equal(C.allgather(v, algorithm="shm"), np.concatenate(comm.allgather(v))), f"-v {dtype}")
    verdict()


def case_broadcast_and_reduce_every_root(comm_):
    for root in range(P):
        for n in (0, 5, 30000):
            x = (np.arange(n) * (rank + 1)).astype(np.float64)
            want = x.copy()
            comm.Bcast(want, root=root)
            expect(C.broadcast(x, root=root, algorithm="shm") is x and np.array_equal(x, want), f"bcast {root} {n}")
            for op in ("sum", "min", "avg"):
                y = data(n, "int32" if op == "avg" else "float32", op)
                want = oracle(y, op)
                got = C.reduce(y, op=op, root=root, algorithm="shm")
                expect((got is None) == (rank != root) and (got is None or same(got, want)), f"reduce {root} {op} {n}")
    verdict()


def _raises(call, kind):
    try:
        call()
    except kind as exc:
        return exc
    return None


def case_mismatch_raises_on_every_rank(comm_):
    if P == 1:
        return
    for first in (True, False):  # on the node's first call (windows not made yet) and on a later one
        for field in ("count", "op", "collective", "large count"):
            sub = comm.Dup()
            if not first:
                C.allreduce(np.ones(4), comm=sub, algorithm="shm")
            n = 20000 if field == "large count" else 10
            x = np.ones(n + (rank == 0), np.float32) if "count" in field else np.ones(n, np.float32)
            if field == "collective" and rank == 0:
                call = lambda: C.reduce_scatter(x, comm=sub, algorithm="shm", timeout=20.0)  # noqa: E731
            else:
                op = "max" if field == "op" and rank == 0 else "sum"
                call = lambda: C.allreduce(x, comm=sub, op=op, algorithm="shm", timeout=20.0)  # noqa: E731
            exc = _raises(call, CollectiveMismatch)
            expect(exc is not None, f"{field} (first call {first}): no CollectiveMismatch on rank {rank}")
            free_context(sub)
            sub.Free()
    verdict()


def case_free_shared_that_differs_raises_on_every_rank(comm_):
    """free_shared of different buffers, or of a non-shared array on one rank: an error everywhere, no hang."""
    if P == 1:
        return
    from collectives.shm import free_shared
    for wrong in ("another buffer", "not a shared buffer"):
        sub = comm.Dup()
        a, b = shared_empty(8, comm=sub), shared_empty(8, comm=sub)
        mine = a if rank else (b if wrong == "another buffer" else np.ones(8, np.float32))
        kind = ValueError if (rank == 0 and wrong == "not a shared buffer") else CollectiveMismatch
        exc = _raises(lambda: free_shared(mine, comm=sub), kind)
        expect(exc is not None, f"free_shared of {wrong} on rank 0: no {kind.__name__} on rank {rank}")
        free_context(sub)
        sub.Free()
    sub = comm.Dup()
    a = shared_empty(8, comm=sub)
    free_shared(a, comm=sub)  # alike on every rank: freed, and the communicator stays usable
    expect(C.allreduce(np.ones(3), comm=sub, algorithm="shm")[0] == P, "a call after free_shared")
    free_context(sub)
    sub.Free()
    verdict()


def case_arrays_stay_valid_after_their_shared_memory_is_freed(comm_):
    """A use after free_shared or free_context reads its values: the memory is unmapped only once no array views it.

    Before, free_shared and free_context unmapped the window at once, and touching the array (or a
    view, or a plan's view) afterwards killed the process (SIGSEGV): here the process would die.
    """
    from collectives.engine.context import get_context
    from collectives.shm import free_shared
    from collectives.shm.node import existing_node
    sub = comm.Dup()
    a = shared_empty(3000, comm=sub)
    a[:] = rank + 1
    view = a[10:20]
    free_shared(a, comm=sub)
    a += 1  # an ordinary array now: written and read after the free
    expect(a.sum() == 3000 * (rank + 2) and view.sum() == 10 * (rank + 2), "values after free_shared")
    y = C.allreduce(a, out=a, comm=sub, algorithm="shm")  # copied in and out as any array
    expect(y is a and (a == P * (P + 3) // 2).all(), "an all-reduce on a freed buffer")
    node = existing_node(get_context(sub))
    expect(len(node.released) == 1 and not node.buffers, "free_shared left the memory of a viewed array mapped")
    keep = a[:5] if rank == 0 else None  # rank 0 alone keeps a view: no rank unmaps it
    del a, view, y
    b = shared_empty(8, comm=sub)
    expect(len(node.released) == 1, f"rank {rank}: a buffer still viewed on rank 0 was unmapped")
    expect(keep is None or keep.sum() == 5 * P * (P + 3) // 2, "rank 0's view after another allocation")
    del keep
    free_shared(b, comm=sub)  # every view of the first buffer is gone: it is freed now, on every rank
    expect(len(node.released) == 1 and node.released[0][0] == 2, f"rank {rank}: released {node.released}")
    c = shared_empty(4, comm=sub)
    c[:] = rank
    plan = C.allreduce_init(c, out=c, comm=sub, algorithm="shm")
    free_context(sub)  # the context's windows go, but c's memory stays mapped while c lives
    expect(c.tolist() == [rank] * 4, "an array after its context was freed")
    try:  # a plan of the freed context: one clear error, not the MPI library's on a freed window
        plan.start()
        expect(False, "a plan started after free_context")
    except RuntimeError as exc:
        expect("free_context" in str(exc), f"a plan started after free_context: {exc}")
    c[:] = -1
    sub.Free()
    verdict()


def case_timeout_names_the_missing_rank(comm_):
    if P == 1:
        return
    sub = comm.Dup()
    C.allreduce(np.ones(4), comm=sub, algorithm="shm")  # the node's windows are made
    if rank != P - 1:  # the last rank skips the call
        exc = _raises(lambda: C.allreduce(np.ones(8), comm=sub, algorithm="shm", timeout=0.5), CollectiveTimeout)
        expect(exc is not None and exc.peer == P - 1 and "arrival" in str(exc), f"timeout: {exc!r}")
    comm.Barrier()
    free_context(sub)
    sub.Free()
    verdict()


def case_trainer_gradient_in_shared_memory(comm_):
    """``--algorithm shm``: the flat gradient lives in shared memory and every bucket's plan is zero-copy."""
    from collectives.engine.context import get_context
    from collectives.shm.node import node_of
    from training.settings.cli import parse_args
    from training.driver.trainer import build_trainer

    t = build_trainer(parse_args(["--algorithm", "shm", "--hidden", "64", "--no-progress", "--timeout", "30"]), comm)
    g = t.model.grads
    ctx = get_context(comm)
    expect(node_of(ctx, None, None, "allreduce").find(g) is not None, "the gradient is not in a shared buffer")
    expect(t.opt.grads is g, "the optimizer holds another gradient array")
    g[...] = np.arange(g.size) % 7 + rank
    want = oracle(g.copy(), "avg")
    avg, _ = t.hook(g)
    expect(avg is g and np.array_equal(g, want) and agreed(g), "the hook's average")
    expect(all(plan._core.zero_copy for plan in t.hook._plans), "a bucket's plan copies")
    t.hook.close()
    verdict()


def case_bad_arguments_before_any_message(comm_):
    try:
        C.allreduce(np.ones(3), op="mean", algorithm="shm")
        raise AssertionError("no error for op='mean'")
    except ValueError:
        pass
    try:
        shared_empty(-1)
        raise AssertionError("no error for a negative shape")
    except ValueError:
        pass


if __name__ == "__main__":
    cases = [v for k, v in sorted(globals().items()) if k.startswith("case_")]
    sys.exit(1 if run_cases(comm, cases) else 0)
