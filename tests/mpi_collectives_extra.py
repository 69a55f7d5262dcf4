"""Rank-side body: device buffer paths, bad input, timeouts. ``python -m tests.mpi_collectives_extra CASE...``.

The CASEs run in the order given, in one launch, each ending with its own count line
(``mpi_collectives_extra CASE: N failures on P ranks``); ``timeout`` leaves requests behind, so it
comes last. CASE is ``device`` (staged and direct paths with a host-memory device array type, compared with
MPI's own all-reduce), ``badinput`` (every rank raises the documented error before any message:
no communicator context is even created; at P >= 2, ranks that disagree about a broadcast's or a
reduce's root raise ``CollectiveMismatch`` on every rank, hand-made and library paths) or ``timeout`` (2+ ranks; only rank 0 joins a ring all-reduce and gets a
``CollectiveTimeout`` naming its left neighbour P - 1 and round 0). Exits 0 on success.
"""
import os
import sys

import numpy as np
from mpi4py import MPI

import collectives as C
from collectives.schedules.schedule import chunk_bounds
from collectives.engine import context
from commlab.arrays import get_array_module
from tests.fakedevice import HostDeviceArray, to_device
from tests.mpicases import FAILS, check, report

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()


def device():
    for aware in ("0", "1"):
        os.environ["COMMLAB_CUDA_AWARE"] = aware
        sub = comm.Dup()  # a fresh context, so its transport reads the variable again
        for alg in C.ALGORITHMS:
            for dtype in ("float32", "float16", "int64"):
                x = (np.arange(1003) % 7 * (rank + 1)).astype(dtype)
                want = x.astype(np.float64)
                comm.Allreduce(MPI.IN_PLACE, want, MPI.SUM)
                y = C.allreduce(to_device(x), comm=sub, algorithm=alg)
                check(isinstance(y, HostDeviceArray), f"device {alg}: result left the device type")
                check(np.array_equal(np.asarray(y), want.astype(dtype)), f"device aware={aware} {alg} {dtype}")
        g = C.allgather(to_device(np.full((rank + 1, 2), rank, np.float32)), comm=sub)
        check(np.array_equal(np.asarray(g)[:, 0], np.repeat(np.arange(P), np.arange(1, P + 1))), "device allgather")
        rs = C.reduce_scatter(to_device(np.ones(10, np.float32)), comm=sub)
        check(np.all(np.asarray(rs) == P), "device reduce_scatter")
        library_reduce_scatter(sub, aware)
        b = C.broadcast(to_device(np.full(5, rank, np.int32)), root=P - 1, comm=sub)
        check(np.all(np.asarray(b) == P - 1), "device broadcast")
        t = context.get_context(sub).transport(get_array_module(to_device(np.ones(1))))
        check(t.direct == (aware == "1"), f"transport direct={t.direct} with COMMLAB_CUDA_AWARE={aware}")
        check(t.syncs > 0, "no stream synchronization before MPI")
        if P > 1:
            check((t.staged_bytes > 0) == (aware == "0"), f"staged bytes {t.staged_bytes} with aware={aware}")


def library_reduce_scatter(sub, aware):
    """``mpi`` reduce-scatter of device arrays: the library's own when MPI is CUDA-aware (uneven chunks,
    float16, NaN under max, ``out=``), against NumPy on every rank's input; refused on every rank otherwise."""
    bounds = chunk_bounds(10, P)
    for dtype, op in (("float32", "sum"), ("float16", "avg"), ("float32", "max")):
        x = (np.arange(10) % 4 + rank).astype(dtype)
        if op == "max":
            x[3] = np.nan if rank == 0 else x[3]
        every = np.array(comm.allgather(x), np.float64)
        want = {"sum": every.sum(0), "avg": every.sum(0) / P, "max": every.max(0)}[op]
        want = want[bounds[rank]:bounds[rank + 1]].astype(dtype)
        if aware == "0":
            expect(ValueError, ["CUDA-aware"], lambda: C.reduce_scatter(to_device(x), comm=sub, op=op, algorithm="mpi"))
            continue
        out = to_device(np.full(bounds[rank + 1] - bounds[rank], -1, dtype))
        for y in (C.reduce_scatter(to_device(x), comm=sub, op=op, algorithm="mpi"),
                  C.reduce_scatter(to_device(x), comm=sub, op=op, algorithm="mpi", out=out)):
            check(isinstance(y, HostDeviceArray) and np.array_equal(np.asarray(y), want, equal_nan=True),
                  f"device mpi reduce_scatter {dtype} {op}: {np.asarray(y)} != {want}")


def expect(exc_type, words, fn):
    try:
        fn()
    except exc_type as e:
        check(all(w in str(e) for w in words), f"{exc_type.__name__} message {e!s} lacks {words}")
        return
    except Exception as e:  # the wrong type is a failure too
        FAILS.append(f"expected {exc_type.__name__}, got {type(e).__name__}: {e}")
        return
    FAILS.append(f"expected {exc_type.__name__} for {words}")


def badinput():
    fresh = comm.Dup()
    x = np.ones(8, np.float32)
    expect(ValueError, ["bogus"], lambda: C.allreduce(x, comm=fresh, algorithm="bogus"))
    expect(ValueError, ["xor"], lambda: C.allreduce(x, comm=fresh, op="xor"))
    expect(TypeError, ["complex64"], lambda: C.allreduce(x.astype(np.complex64), comm=fresh, op="min"))
    expect(TypeError, ["uint8"], lambda: C.allreduce(x.astype(np.uint8), comm=fresh))
    expect(TypeError, ["uint8"], lambda: C.reduce_scatter(x.astype(np.uint8), comm=fresh))
    expect(ValueError, ["root"], lambda: C.broadcast(x, root=P, comm=fresh))
    expect(ValueError, ["root"], lambda: C.reduce(x, root=-1, comm=fresh))
    expect(ValueError, ["grid"], lambda: C.allreduce(x, comm=fresh, algorithm="2d", grid=(P + 1, 1)))
    expect(ValueError, ["grid"], lambda: C.allreduce(x, comm=fresh, algorithm="2d", grid=(0, P)))
    expect(ValueError, ["grid=(2, 2, 2)", "8 ranks"], lambda: C.allreduce(x, comm=fresh, algorithm="torus",
                                                                           grid=(2, 2, 2) if P != 8 else (2, 2, 3)))
    for bad in ((0, P), (-1, -P), (), (P, 1.0), "rows"):
        expect(ValueError, ["grid"], lambda: C.allreduce(x, comm=fresh, algorithm="torus", grid=bad))
    expect(ValueError, ["topology", "torus"], lambda: C.allreduce(x, comm=fresh, algorithm="ring", grid="topology"))
    expect(ValueError, ["timeout"], lambda: C.allreduce(x, comm=fresh, timeout=-1))
    expect(ValueError, ["out"], lambda: C.allreduce(x, comm=fresh, out=np.ones(3, np.float32)))
    expect(TypeError, ["out"], lambda: C.allreduce(x, comm=fresh, out=np.ones(8)))
    expect(TypeError, ["root"], lambda: C.broadcast(x, root=0.0, comm=fresh))
    shared = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape=(8,), strides=(0,), writeable=True)
    expect(ValueError, ["zero stride"], lambda: C.allreduce(x, comm=fresh, out=shared))
    # a broadcast writes into x: one memory place under several indices is refused as out= is, on every
    # rank (the root's data would arrive whole and be read back as its first element repeated)
    columns = np.lib.stride_tricks.as_strided(np.zeros(3, np.float32), shape=(3, 4), strides=(4, 0), writeable=True)
    for alg in ("tree", "mpi", "auto"):
        expect(ValueError, ["zero stride", "x"], lambda: C.broadcast(shared, comm=fresh, algorithm=alg))
        expect(ValueError, ["zero stride"], lambda: C.broadcast(columns, comm=fresh, algorithm=alg))
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:  # the tensor is read in place through DLPack
        expect(ValueError, ["zero stride"], lambda: C.broadcast(torch.zeros(1).expand(10), comm=fresh))
    planned = comm.Dup()  # a valid plan's own communicator: no call on `fresh` may send anything
    plan = C.allreduce_init(x, comm=planned, algorithm="mpi")
    plan.start()
    plan.wait()
    plan.free()
    for call in ("start", "test", "wait"):
        expect(RuntimeError, ["freed plan"], getattr(plan, call))
    ro = np.ones(8, np.float32)
    ro.flags.writeable = False
    expect(ValueError, ["read-only"], lambda: C.allreduce(x, comm=fresh, out=ro))
    expect(ValueError, ["writable"], lambda: C.broadcast(ro, comm=fresh))
    expect(TypeError, ["comm"], lambda: C.allreduce(x, comm=5))
    expect(ValueError, ["reduce_scatter algorithm"], lambda: C.reduce_scatter(x, comm=fresh, algorithm="tree"))
    # more than the data positionally: Python's TypeError (everything after the data is keyword-only), before any message
    expect(TypeError, ["allreduce() takes 1 positional argument"], lambda: C.allreduce(x, fresh))
    expect(TypeError, ["iallreduce() takes 1 positional argument"], lambda: C.iallreduce(x, fresh, "sum"))
    expect(TypeError, ["allreduce_init() takes 1 positional argument"], lambda: C.allreduce_init(x, fresh))
    expect(TypeError, ["reduce_scatter() takes 1 positional argument"], lambda: C.reduce_scatter(x, fresh))
    expect(TypeError, ["allgather() takes 1 positional argument"], lambda: C.allgather(x, fresh))
    expect(TypeError, ["broadcast() takes 1 positional argument"], lambda: C.broadcast(x, 0, fresh))
    expect(TypeError, ["reduce() takes 1 positional argument"], lambda: C.reduce(x, 0, fresh))
    check(not context.has_context(fresh), "a bad call created a context (sent a message)")
    cached = comm.Dup()  # the same bad calls once the signature's plan is cached: its look-up lets none through
    for _ in range(3):
        C.allreduce(x, comm=cached, algorithm="mpi")
    seq = context.get_context(cached)._seq
    expect(ValueError, ["unknown algorithm"], lambda: C.allreduce(x, comm=cached, algorithm=["mpi"]))
    expect(ValueError, ["read-only"], lambda: C.allreduce(x, comm=cached, algorithm="mpi", out=ro))
    expect(ValueError, ["out"], lambda: C.allreduce(x, comm=cached, algorithm="mpi", out=np.ones(3, np.float32)))
    expect(TypeError, ["out"], lambda: C.allreduce(x, comm=cached, algorithm="mpi", out=np.ones(8)))
    expect(ValueError, ["timeout"], lambda: C.allreduce(x, comm=cached, algorithm="mpi", timeout=-1))
    expect(TypeError, ["allreduce() takes 1 positional argument"], lambda: C.allreduce(x, cached))
    check(context.get_context(cached)._seq == seq, "a bad call after a cached one started a call")
    check(np.all(C.allreduce(x, comm=cached, algorithm="mpi") == P), "the cached call after bad calls")
    cached.Free()
    # all-gather checks x during its signature exchange (so one bad rank cannot hang the others)
    expect(TypeError, ["complex64"], lambda: C.allgather(x.astype(np.complex64), comm=fresh))
    expect(ValueError, ["dimensions"], lambda: C.allgather(np.float32(1), comm=fresh))
    if P == 1:
        return
    expect(TypeError if rank == 1 else ValueError, ["complex64"] if rank == 1 else ["rank(s) 1"],
           lambda: C.allgather(x.astype(np.complex64 if rank == 1 else np.float32), comm=fresh))
    expect(TypeError if rank == 1 else ValueError, ["array"] if rank == 1 else ["rank(s) 1"],
           lambda: C.allgather(None if rank == 1 else x, comm=fresh))
    # Errors that need every rank's view are raised on every rank after the signature exchange.
    expect(C.CollectiveMismatch, ["disagree about the call's dtype", "float32", "float64"],
           lambda: C.allgather(np.ones(2, np.float32 if rank else np.float64), comm=fresh))
    expect(ValueError, ["beyond the first dimension"],
           lambda: C.allgather(np.ones((2, 3 if rank else 4), np.float32), comm=fresh))
    # The communicator still works afterwards.
    check(np.all(C.allreduce(x, comm=fresh) == P), "collective after bad calls")
    # Ranks that disagree about a broadcast's or a reduce's root raise on every rank, on both paths
    # (each rank taking itself for the root would only send: no message would reveal it)
    for alg in ("tree", "mpi"):
        for name in ("broadcast", "reduce"):
            own = comm.Dup()  # a mismatch leaves its communicator unusable
            if name == "broadcast":
                def call():
                    return C.broadcast(np.full(8, rank + 1.0, np.float32), root=rank, comm=own, algorithm=alg,
                                       timeout=30)
            else:
                def call():
                    return C.reduce(x, root=0 if rank == 0 else 1, comm=own, algorithm=alg, timeout=30)
            expect(C.CollectiveMismatch, ["disagree about the call's root"], call)
            own.Free()


def timeout():
    sub, sub2, sub3 = comm.Dup(), comm.Dup(), comm.Dup()
    for c in (sub, sub2, sub3):  # the first call duplicates the communicator (collective, no timeout)
        C.allreduce(np.ones(1), comm=c)
    if rank == 0:
        req = C.iallreduce(np.ones(1000), comm=sub3, algorithm="ring")
        try:
            req.wait(timeout=0.3)
            FAILS.append("no CollectiveTimeout from Request.wait")
        except C.CollectiveTimeout:
            pass
        for again in (req.wait, req.test):
            try:
                again()
                FAILS.append("a timed-out request answered again")
            except RuntimeError as e:
                check("failed earlier" in str(e), f"request message {e}")
        expect(ValueError, ["timeout"], lambda: C.iallreduce(np.ones(2), comm=sub2).wait(timeout=-1))
        try:
            C.allreduce(np.ones(16, np.float32), comm=sub, algorithm="ring", timeout=0.5)
            FAILS.append("no CollectiveTimeout")
        except C.CollectiveTimeout as e:
            check(e.peer == P - 1 and e.round == 0 and e.collective == "allreduce", f"timeout names {e}")
            check(f"rank {P - 1}" in str(e) and "round 0" in str(e), f"timeout message {e}")
        try:
            C.allreduce(np.ones(1, np.float32), comm=sub)
            FAILS.append("a context with a timed-out collective still accepted calls")
        except RuntimeError as e:
            check("unusable" in str(e), f"broken-context message {e}")
        try:
            C.allreduce(np.ones(4, np.float32), comm=sub2, algorithm="mpi", timeout=0.2)
            FAILS.append("no CollectiveTimeout from mpi")
        except C.CollectiveTimeout as e:
            check("inside the MPI library" in str(e), f"mpi timeout message {e}")
    subs = [comm.Dup() for _ in range(3)]
    for c in subs:
        C.allreduce(np.ones(1), comm=c)
    if rank == 0:  # the library's own collectives honour timeout= too
        calls = [lambda c: C.reduce_scatter(np.ones(8), comm=c, algorithm="mpi", timeout=0.3),
                 lambda c: C.broadcast(np.ones(8), root=P - 1, comm=c, algorithm="mpi", timeout=0.3),
                 lambda c: C.reduce(np.ones(8), root=0, comm=c, algorithm="mpi", timeout=0.3)]
        for c, call in zip(subs, calls):
            try:
                call(c)
                FAILS.append("an mpi-algorithm call ignored timeout=")
            except C.CollectiveTimeout:
                pass
    comm.Barrier()  # rank 1 never called the collectives; everyone still gets here


def main():
    """Run each CASE named on the command line in turn (one launch); each reports its own count line."""
    cases = {"device": device, "badinput": badinput, "timeout": timeout}
    failed = 0
    for name in sys.argv[1:]:
        aware = os.environ.get("COMMLAB_CUDA_AWARE")
        cases[name]()
        if aware is None:  # device() sets the variable: the next case starts from the launch's environment
            os.environ.pop("COMMLAB_CUDA_AWARE", None)
        else:
            os.environ["COMMLAB_CUDA_AWARE"] = aware
        failed |= report(comm, f"mpi_collectives_extra {name}")
        FAILS.clear()
    sys.exit(failed)


if __name__ == "__main__":
    main()
