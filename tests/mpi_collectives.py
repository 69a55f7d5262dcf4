"""Rank-side body of the collectives tests: ``mpiexec -n P python -m tests.mpi_collectives [--big]``.

Every case compares a hand-made collective with two oracles: MPI's own collective (``comm.Allreduce``
etc. called directly here) and NumPy applied to the inputs gathered with ``comm.Allgather`` (for
counts above 100,000, on every 1009th element).
Tolerances: integers exact; float64 rtol 1e-12; float32 rtol 1e-5; float16 compared after the
float32 oracle is rounded once to float16 (the documented accumulation rule), within 1 ulp.
Exits 0 when every case passes on every rank, 1 otherwise (the failing cases are printed).
"""
import sys
import traceback

import numpy as np
from mpi4py import MPI

import collectives as C
from collectives.engine.context import last_stats, total_stats
from collectives.schedules.registry import build_allreduce_schedule
from collectives.schedules.schedule import chunk_bounds
from collectives.engine.buffers import MPI_OPS
from tests.mpicases import FAILS, check, report

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()
ALGS = list(C.ALGORITHMS)
DTYPES = ["float16", "float32", "float64", "int32", "int64"]
OPS = ["sum", "prod", "min", "max", "avg"]
NP_OPS = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}


def close(a, b, dtype):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if np.dtype(dtype).kind == "i":
        return np.array_equal(a, b)
    tol = {"float16": 1e-3, "float32": 1e-5, "float64": 1e-12}[np.dtype(dtype).name]
    scale = max(1.0, float(np.nanmax(np.abs(b.astype(np.float64)), initial=0.0)))
    return np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol * scale, equal_nan=True)


def make(count, dtype, op, salt=0):
    rng = np.random.default_rng(1000 * rank + 7 * count + salt)
    if np.dtype(dtype).kind == "i":
        lo, hi = (-3, 4) if op != "prod" else (-2, 3)
        return rng.integers(lo, hi, count).astype(dtype)
    if op == "prod":
        return rng.uniform(0.5, 1.5, count).astype(dtype)
    return rng.standard_normal(count).astype(dtype)


def numpy_oracle(x, op):
    """Reduce the inputs gathered from every rank with NumPy, in float32 for float16 (the rule)."""
    allx = np.empty((P,) + x.shape, dtype=x.dtype)
    comm.Allgather(x, allx) if x.dtype != np.float16 else comm.Allgather(x.view(np.uint16), allx.view(np.uint16))
    acc = allx.astype(np.float32) if x.dtype == np.float16 else allx
    if op == "avg":
        s = np.sum(acc, axis=0, dtype=acc.dtype)
        r = s / P if x.dtype.kind == "f" else np.floor_divide(s, P)
    else:
        r = NP_OPS[op](acc, axis=0)
    return np.asarray(r).astype(x.dtype)


def mpi_oracle(x, op):
    acc = x.astype(np.float32) if x.dtype == np.float16 else x.copy()
    comm.Allreduce(MPI.IN_PLACE, acc, MPI_OPS[op])
    if op == "avg":
        acc = acc / P if x.dtype.kind == "f" else np.floor_divide(acc, P)
    return np.asarray(acc).astype(x.dtype)


def case_matrix(counts):
    for count in counts:
        for dtype in DTYPES:
            for op in OPS:
                x = make(count, dtype, op)
                # Large counts: the NumPy oracle checks every 1009th element (gathering all of them
                # costs more than the algorithms); MPI's oracle checks every element.
                sample = slice(None, None, 1009 if count > 100_000 else 1)
                ref_np, ref_mpi = numpy_oracle(np.ascontiguousarray(x[sample]), op), mpi_oracle(x, op)
                check(close(ref_np, ref_mpi[sample], dtype), f"oracles disagree {count} {dtype} {op}")
                for alg in ALGS:
                    y = C.allreduce(x, op=op, algorithm=alg)
                    check(close(y, ref_mpi, dtype) and close(y[sample], ref_np, dtype),
                          f"allreduce {alg} count={count} {dtype} {op}")
                rs = C.reduce_scatter(x, op=op)
                lo, hi = chunk_bounds(count, P)[rank:rank + 2]
                check(close(rs, ref_mpi[lo:hi], dtype), f"reduce_scatter count={count} {dtype} {op}")


def case_identical_on_ranks():
    """Hand-made algorithms give bitwise identical results on every rank (training relies on it)."""
    x = make(1001, "float32", "sum", salt=3)
    for alg in ALGS:
        y = C.allreduce(x, algorithm=alg, op="avg")
        first = y.copy()
        comm.Bcast(first, root=0)
        check(np.array_equal(y, first), f"{alg} results differ across ranks")


def case_public_reports():
    # count 1, P-1, P+1 with arange(count) * (rank + 1): the exact sum, no hang.
    for count in sorted({1, max(P - 1, 0), P + 1}):
        x = np.arange(count, dtype=np.float32) * (rank + 1)
        want = np.arange(count, dtype=np.float32) * (P * (P + 1) // 2)
        for alg in ALGS:
            check(np.array_equal(C.allreduce(x, algorithm=alg), want), f"arange count={count} {alg}")
    # 73 float64 values reduce-scattered over 4 ranks: 19, 18, 18, 18.
    x = make(73, "float64", "sum", salt=5)
    full = numpy_oracle(x, "sum")
    chunk = C.reduce_scatter(x)
    sizes = [len(c) for c in np.array_split(np.empty(73), P)]
    check(chunk.shape == (sizes[rank],), f"reduce_scatter 73: chunk {chunk.shape} != {sizes[rank]}")
    if P == 4:
        check(sizes == [19, 18, 18, 18], "73 over 4 ranks should split 19, 18, 18, 18")
    lo = sum(sizes[:rank])
    check(close(chunk, full[lo:lo + sizes[rank]], "float64"), "reduce_scatter 73: chunk != slice of the sum")
    rebuilt = C.allgather(chunk)
    check(close(rebuilt, C.allreduce(x, algorithm="ring"), "float64"), "allgather(reduce_scatter) != allreduce")
    # Zero-length arrays on every rank, for every collective.
    for dtype in DTYPES:
        z = np.zeros(0, dtype=dtype)
        for alg in ALGS:
            check(C.allreduce(z, algorithm=alg).shape == (0,), f"empty allreduce {alg} {dtype}")
        for alg in ("ring", "mpi"):
            check(C.reduce_scatter(z, algorithm=alg).shape == (0,), f"empty reduce_scatter {alg}")
            check(C.allgather(z, algorithm=alg).shape == (0,), f"empty allgather {alg}")
        for alg in ("tree", "mpi"):
            check(C.broadcast(z, algorithm=alg).shape == (0,), f"empty broadcast {alg}")
            r = C.reduce(z, algorithm=alg)
            check((r is None) if rank else r.shape == (0,), f"empty reduce {alg}")
    # All-gather-v where rank 0 sends shape (0, 2) and the others (1, 2).
    for alg in ("ring", "mpi"):
        x = np.zeros((0, 2)) if rank == 0 else np.full((1, 2), float(rank))
        g = C.allgather(x, algorithm=alg)
        want = np.repeat(np.arange(1, P, dtype=float), 2).reshape(P - 1, 2)
        check(g.shape == (P - 1, 2) and np.array_equal(g, want), f"allgather-v (0,2)/(1,2) {alg}")
    # float16 [60000] + [60000] + [-60000] on 3 ranks: 60000 (accumulated in float32).
    if P == 3:
        x = np.array([60000 if rank < 2 else -60000], dtype=np.float16)
        for alg in ALGS:
            y = C.allreduce(x, algorithm=alg)
            check(y.dtype == np.float16 and y[0] == 60000, f"float16 60000 case {alg}: {y}")
    # avg: float32 [1]*4 and [3]*4 on 2 ranks gives [2]*4; int32 [-3] and [0] gives floor(-1.5) = -2.
    if P == 2:
        for alg in ALGS:
            y = C.allreduce(np.full(4, 1.0 if rank == 0 else 3.0, np.float32), op="avg", algorithm=alg)
            check(np.array_equal(y, np.full(4, 2.0, np.float32)), f"avg float32 {alg}: {y}")
            y = C.allreduce(np.array([-3 if rank == 0 else 0], np.int32), op="avg", algorithm=alg)
            check(y.dtype == np.int32 and y[0] == -2, f"avg int32 {alg}: {y}")
    # min / max with a NaN on one rank give NaN everywhere, for every NaN rank and position.
    for nan_rank in range(P):
        for pos in range(5):
            x = np.arange(5, dtype=np.float32) + rank
            if rank == nan_rank:
                x[pos] = np.nan
            for alg in ALGS:
                for op in ("min", "max"):
                    y = C.allreduce(x, op=op, algorithm=alg)
                    ok = np.isnan(y[pos]) and not np.isnan(np.delete(y, pos)).any()
                    check(ok, f"NaN {op} {alg} nan_rank={nan_rank} pos={pos}: {y}")
            for alg in ("tree", "mpi"):
                y = C.reduce(x, root=P - 1, op="max", algorithm=alg)
                check(y is None or (np.isnan(y[pos]) and np.isnan(y).sum() == 1), f"NaN reduce {alg}: {y}")
            for alg in ("ring", "mpi"):
                full = np.concatenate(comm.allgather(C.reduce_scatter(x, op="min", algorithm=alg)))
                check(np.isnan(full[pos]) and np.isnan(full).sum() == 1, f"NaN reduce_scatter {alg}: {full}")
    # +0.0 / -0.0: min and max pick by argument order, so every rank must combine in the same order
    # (hand-made algorithms only: MPI's own MPI_MIN/MPI_MAX give rank-dependent signs here)
    z = np.array([0.0, -0.0, 0.0, -0.0]) * (1 if rank % 2 else -1)
    for alg in [a for a in ALGS if a != "mpi"]:
        for op in ("min", "max"):
            y = C.allreduce(z, op=op, algorithm=alg)
            first = y.copy()
            comm.Bcast(first, root=0)
            check(np.array_equal(np.signbit(y), np.signbit(first)), f"signed zero {op} {alg} differs across ranks")


def case_other_collectives():
    for dtype in DTYPES:
        for root in sorted({0, P - 1, P // 2}):
            x = make(37, dtype, "sum", salt=11)
            ref = numpy_oracle(x, "sum")
            for alg in ("tree", "mpi"):
                r = C.reduce(x, root=root, algorithm=alg)
                check(close(r, ref, dtype) if rank == root else r is None, f"reduce {alg} root={root} {dtype}")
                b = make(37, dtype, "sum", salt=13)
                want = b.copy()
                comm.Bcast(want.view(np.uint8), root=root)
                check(np.array_equal(C.broadcast(b, root=root, algorithm=alg), want), f"broadcast {alg} {dtype}")
    for dtype in ("uint8", "bool", "int16"):  # copy-only collectives move raw bytes of any width
        x = (np.arange(rank + 3) % 2).astype(dtype)
        check(np.array_equal(C.allgather(x), np.concatenate(comm.allgather(x))), f"allgather {dtype}")
        b = np.full(5, rank % 2, dtype=dtype)
        check(np.array_equal(C.broadcast(b, root=P - 1), np.full(5, (P - 1) % 2, dtype)), f"broadcast {dtype}")
    for dtype in DTYPES:
        x = make(rank + 2, dtype, "sum").reshape(-1, 1).repeat(3, axis=1)  # (rank + 2, 3): all-gather-v
        parts = comm.allgather(x)
        for alg in ("ring", "mpi"):
            check(np.array_equal(C.allgather(x, algorithm=alg), np.concatenate(parts)), f"allgather-v {alg} {dtype}")


def case_float16_native():
    """accumulate="native": float16 on the wire (half the bytes), each hop rounded to float16."""
    x = (np.arange(301) % 11 * 0.125 * (rank + 1)).astype(np.float16)  # sums exact in float16
    want = numpy_oracle(x, "sum")
    for alg in ALGS:
        y = C.allreduce(x, algorithm=alg, accumulate="native")
        check(np.array_equal(y, want), f"float16 native {alg}")
        if alg not in ("mpi", "auto") and P > 1:
            st = last_stats()
            check(st["dtype"] == "float16", f"float16 native {alg} sent {st['dtype']}")


def case_stats():
    """last_stats counts what the schedule sent: ring sends 2 (P-1) chunks of n / P elements."""
    before = total_stats()["bytes_sent"]
    C.allreduce(np.ones(10 * P, np.float32), algorithm="ring")
    st = last_stats()
    check(st["algorithm"] == "ring" and st["bytes_sent"] == 2 * (P - 1) * 10 * 4, f"ring stats {st}")
    check(st["messages"] == 2 * (P - 1) and not st["estimated"], f"ring messages {st}")
    check(total_stats()["bytes_sent"] - before == st["bytes_sent"], "total_stats does not add up")
    check(st["collective"] == "allreduce" and "op" not in st, f"the collective's name is collective: {st}")
    C.allreduce(np.ones(8, np.float32), algorithm="auto")
    check(last_stats()["algorithm"] in C.ALGORITHMS and last_stats()["algorithm"] != "auto", "auto unresolved")
    # a call's own record: the request's and the persistent plan's, the same as last_stats
    req = C.iallreduce(np.ones(10 * P, np.float32), algorithm="ring")
    req.wait()
    check(req.record.as_dict() == last_stats() and req.record.bytes_sent == 2 * (P - 1) * 10 * 4, f"{req.record}")
    plan = C.allreduce_init(np.ones(10 * P, np.float32), algorithm="mpi")
    plan.start()
    plan.wait()
    check(plan.record.as_dict() == last_stats() and plan.record.collective == "allreduce", f"plan {plan.record}")
    plan.free()


def case_grid_and_nonblocking():
    x = make(1001, "float64", "sum", salt=17)
    ref = numpy_oracle(x, "sum")
    for rows in range(1, P + 1):
        if P % rows == 0:
            check(close(C.allreduce(x, algorithm="2d", grid=(rows, P // rows)), ref, "float64"), f"2d grid rows={rows}")
    # the N-dimensional torus on every ordered factorization of P (dimensions of 1 included), against
    # MPI's own MPI_Allreduce (int64: bitwise) and NumPy (float64)
    def factorizations(n, depth):
        if depth == 1:
            return [(n,)]
        return [(d,) + rest for d in range(1, n + 1) if n % d == 0 for rest in factorizations(n // d, depth - 1)]

    ints = ((np.arange(37) * (rank + 3)) % 11 - 5).astype(np.int64)
    want = np.empty_like(ints)
    comm.Allreduce(ints, want, op=MPI.SUM)
    for dims in sorted({f for depth in (1, 2, 3) for f in factorizations(P, depth)}):
        check(np.array_equal(C.allreduce(ints, algorithm="torus", grid=dims), want), f"torus grid={dims} vs MPI")
        check(close(C.allreduce(x, algorithm="torus", grid=dims), ref, "float64"), f"torus grid={dims} float64")
    check(np.array_equal(C.allreduce(ints, algorithm="torus"), want), "torus default grid (the job's levels)")
    # Two non-blocking all-reduces in flight, progressed in opposite orders on odd and even ranks.
    a, b = make(5000, "float32", "sum", salt=19), make(3, "int64", "sum", salt=23)
    ra, rb = C.iallreduce(a, algorithm="ring"), C.iallreduce(b, algorithm="recursive_doubling", op="max")
    order = [ra, rb] if rank % 2 else [rb, ra]
    while not all(r.done for r in order):
        for r in order:
            r.test()
    check(close(ra.wait(), numpy_oracle(a, "sum"), "float32"), "iallreduce ring")
    check(np.array_equal(rb.wait(), numpy_oracle(b, "max")), "iallreduce recursive_doubling")
    # Waited in opposite orders on odd and even ranks, with a blocking call in between on some ranks:
    # waiting advances every request in flight, so nothing deadlocks.
    for alg in ("ring", "rabenseifner", "tree"):
        ra, rb = C.iallreduce(a, algorithm=alg), C.iallreduce(b, algorithm=alg, op="max")
        if rank % 2:
            ya, yb = ra.wait(), rb.wait()
            z = C.allreduce(a, algorithm=alg)
        else:
            z = C.allreduce(a, algorithm=alg)
            yb, ya = rb.wait(), ra.wait()
        check(close(ya, numpy_oracle(a, "sum"), "float32") and close(z, ya, "float32"), f"wait order {alg}")
        check(np.array_equal(yb, numpy_oracle(b, "max")), f"wait order {alg} (max)")
    # Polled with test() in different orders, and a blocking mpi-algorithm call with a request in flight
    ra, rb = C.iallreduce(a, algorithm="ring"), C.iallreduce(a, algorithm="ring")
    first, second = (ra, rb) if rank == 0 else (rb, ra)
    while not first.test():
        pass
    check(close(second.wait(), numpy_oracle(a, "sum"), "float32"), "test() polled in different orders")
    req = C.iallreduce(a, algorithm="ring")
    if rank == 0:
        z, w = C.allreduce(a, algorithm="mpi"), req.wait()
    else:
        w, z = req.wait(), C.allreduce(a, algorithm="mpi")
    check(close(w, z, "float32"), "mpi all-reduce with a request in flight")
    y = np.array(x)
    check(C.allreduce(y, out=y, algorithm="rabenseifner") is y and close(y, ref, "float64"), "out=x in place")


def case_segmented_bitwise():
    """Cutting messages into segments (collectives.schedules.schedule.segmented) changes no bit of any result."""
    from collectives.engine.executor import Run, execute
    from collectives.schedules.schedule import segmented
    for count in (1001, 4 * P + 3):
        x = make(count, "float32", "sum", salt=5)
        for alg in [a for a in ALGS if a not in ("mpi", "auto", "shm")]:  # (the ones with a schedule)
            whole = build_allreduce_schedule(alg, rank, P, count)
            cut = segmented(whole, 7)
            results = []
            for sched in (whole, cut):
                work = x.copy()
                execute(Run(sched, comm, work, scratch=np.empty(max(sched.scratch, 1), np.float32), ufunc=np.add, tag=11))
                results.append(work)
            check(cut is whole or cut.messages > whole.messages, f"{alg} count={count}: nothing was cut")
            check(np.array_equal(results[0], results[1]) and close(results[0], mpi_oracle(x, "sum"), "float32"),
                  f"{alg} count={count}: segmented result differs")


def main():
    counts = [0, 1, max(P - 1, 0), P + 1, 1001] + ([2 ** 20 + 3] if "--big" in sys.argv else [])
    cases = [lambda: case_matrix(sorted(set(counts))), case_identical_on_ranks, case_public_reports,
             case_other_collectives, case_float16_native, case_stats,
             case_grid_and_nonblocking, case_segmented_bitwise]
    for case in cases:
        try:
            case()
        except Exception:  # report and keep every rank going; the collective hang guard is the test timeout
            FAILS.append(traceback.format_exc())
    sys.exit(report(comm, "mpi_collectives"))


if __name__ == "__main__":
    main()
