"""Reference all-reduce calls that the collectives sweep times beside commlab's own.

``ring_direct`` is the ring algorithm written as a lean hand-written ``Sendrecv`` loop (the yardstick
for the schedule executor's overhead), ``ring_execute`` the cached ring schedule run by the executor
alone, ``mpi_persistent`` MPI's own persistent all-reduce (``MPI_Allreduce_init``, started and waited
directly), ``persistent`` commlab's plan (``collectives.allreduce_init`` with ``auto``, steady state),
``auto_timeout`` the ``auto`` all-reduce with ``timeout=60`` (what a deadline costs), and ``gloo``
PyTorch's ``torch.distributed.all_reduce`` on the gloo backend, when installed.
Each returns a zero-argument call that all-reduces ``x`` into ``out`` under commlab's rules.
"""
import os

import numpy as np
from mpi4py import MPI

import collectives
import collectives.schedules.registry
from collectives import backend
from collectives.engine.executor import Run, execute
from collectives.schedules.schedule import chunk_bounds

__all__ = ["finish", "ring_direct", "ring_execute", "mpi_persistent", "persistent", "auto_timeout", "limit", "gloo",
           "gloo_available", "gloo_finish"]

_MPI_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}


def finish(work, out, redop, P):
    """Apply ``avg``'s division to ``work`` and copy it into ``out`` when they differ."""
    if redop == "avg" and P > 1:
        (np.true_divide if work.dtype.kind == "f" else np.floor_divide)(work, P, out=work)
    if work is not out:
        np.copyto(out, work, casting="unsafe")
    return out


def ring_direct(comm, x, out, redop):
    """Return a call running ring all-reduce as a lean hand-written loop (the executor's yardstick).

    Patarasuk and Yuan 2009, section 3: P - 1 ``Sendrecv`` reduce-scatter rounds, each followed by an
    in-place ufunc into a preallocated chunk view, then P - 1 all-gather rounds received in place.
    """
    P, r = comm.Get_size(), comm.Get_rank()
    acc = backend.accumulation_dtype(x.dtype)
    work = out.reshape(-1) if out.dtype == acc else np.empty(x.size, acc)
    b = chunk_bounds(x.size, P)
    scratch = np.empty(b[1] - b[0], acc)
    ufunc = getattr(np, backend.OPS[redop])
    right, left = (r + 1) % P, (r - 1) % P
    rs = [(work[b[i]:b[i + 1]], scratch[:b[j + 1] - b[j]], work[b[j]:b[j + 1]])
          for i, j in (((r - s - 1) % P, (r - s - 2) % P) for s in range(P - 1))]
    ag = [(work[b[i]:b[i + 1]], work[b[j]:b[j + 1]]) for i, j in (((r - s) % P, (r - s - 1) % P) for s in range(P - 1))]

    def run():
        np.copyto(work, x.reshape(-1), casting="unsafe")
        for send, recv, target in rs:
            comm.Sendrecv(send, right, 0, recv, left, 0)
            ufunc(target, recv, out=target)
        for send, recv in ag:
            comm.Sendrecv(send, right, 0, recv, left, 0)
        return finish(work, out.reshape(-1), redop, P).reshape(out.shape)

    return run


def ring_execute(comm, x, out, redop):
    """Return a call running the cached ring schedule through the executor alone (no API layer)."""
    P, acc = comm.Get_size(), backend.accumulation_dtype(x.dtype)
    sched = collectives.schedules.registry.build_allreduce_schedule("ring", comm.Get_rank(), P, x.size)
    work = out.reshape(-1) if out.dtype == acc else np.empty(x.size, acc)
    scratch, ufunc = np.empty(max(sched.scratch, 1), acc), getattr(np, backend.OPS[redop])

    def run():
        np.copyto(work, x.reshape(-1), casting="unsafe")
        execute(Run(sched, comm, work, scratch=scratch, ufunc=ufunc))
        return finish(work, out.reshape(-1), redop, P).reshape(out.shape)

    return run


def mpi_persistent(comm, x, out, redop):
    """Return a call starting and waiting MPI's own persistent all-reduce of ``x`` into ``out`` (MPI 4.0, 6.13)."""
    req = comm.Allreduce_init(x, out, _MPI_OPS[redop])
    P = comm.Get_size()

    def run():
        req.Start()
        req.Wait()
        return finish(out, out, redop, P)

    run.free = req.Free
    return run


def persistent(comm, x, out, redop):
    """Return a call running commlab's persistent plan (``allreduce_init``, ``auto``) into ``out``."""
    plan = collectives.allreduce_init(x, comm=comm, op=redop, algorithm="auto", out=out)

    def run():
        plan.start()
        return plan.wait()

    run.free = plan.free
    return run


def auto_timeout(comm, x, out, redop):
    """Return a call of the ``auto`` all-reduce with ``timeout=60`` (the deadline never fires)."""
    def run():
        return collectives.allreduce(x, comm=comm, op=redop, algorithm="auto", out=out, timeout=60.0)

    return run


def limit(comm, x, out, redop):
    """Return a call timing the local memory work an all-reduce of ``x`` cannot avoid (the "limit" row).

    Whatever the algorithm, each rank combines (P-1)/P of the vector with what the others sent (at
    least (P-1)/P n reductions, each reading two operands and writing one) and writes the n elements
    of the result (at least one copy of n elements); here both run as NumPy calls on preallocated
    buffers, on every rank at once, so the ranks share the memory bandwidth as they do in the
    collective. Its time is a lower bound for an all-reduce on one machine; the call returns
    nothing to check (its row's ``wrong`` is 0 by construction).
    """
    P, acc = comm.Get_size(), backend.accumulation_dtype(x.dtype)
    m = x.size * (P - 1) // P
    a, b = np.ones(max(m, 1), acc), np.ones(max(m, 1), acc)
    src, dst = np.ones(x.size, acc), np.empty(x.size, acc)
    ufunc = getattr(np, backend.OPS[redop])

    def run():
        ufunc(a[:m], b[:m], out=a[:m])
        np.copyto(dst, src)

    run.unchecked = True
    return run


def shm_persistent(comm, x, out, redop):
    """Return a call running the zero-copy ``shm`` plan: an in-place persistent all-reduce on a shared buffer.

    The buffer (:func:`collectives.shm.shared_empty`) holds ``x`` when the call is made, so the first
    call (the sweep's check) returns the all-reduce of ``x``; each later call reduces the previous
    result in place, as a trainer's step reduces the gradient its backward pass wrote where it lies
    (nothing is copied in or out). ``free`` releases the plan and the buffer.
    """
    from collectives.shm import free_shared, shared_empty

    buf = shared_empty(x.shape, x.dtype, comm=comm)
    buf[...] = x
    plan = collectives.allreduce_init(buf, comm=comm, op=redop, algorithm="shm", out=buf)

    def run():
        plan.start()
        return plan.wait()

    def free():
        plan.free()
        free_shared(buf, comm=comm)

    run.free = free
    return run


def limit_reduce_scatter(comm, x, out, redop):
    """Return a call timing the local memory work a reduce-scatter of ``x`` cannot avoid (its "limit" row).

    Each rank combines P chunks of n/P elements into its own: (P-1)/P n reductions, each reading two
    operands and writing one, on every rank at once (as :func:`limit` for the all-reduce, without
    the result's copy: the reduced chunk is the result). Returns nothing to check.
    """
    P, acc = comm.Get_size(), backend.accumulation_dtype(x.dtype)
    m = x.size * (P - 1) // P
    a, b = np.ones(max(m, 1), acc), np.ones(max(m, 1), acc)
    ufunc = getattr(np, backend.OPS[redop])

    def run():
        ufunc(a[:m], b[:m], out=a[:m])

    run.unchecked = True
    return run


def limit_allgather(comm, x, out):
    """Return a call timing the local memory work an all-gather into ``out`` cannot avoid (its "limit" row).

    Each rank writes the P blocks of the result (n elements, ``out``'s size), reading them once: one
    copy of n elements, on every rank at once. Returns nothing to check.
    """
    src, dst = np.ones(out.size, out.dtype), np.empty(out.size, out.dtype)

    def run():
        np.copyto(dst, src)

    run.unchecked = True
    return run


def gloo(comm, x, out, redop):
    """Return a call to ``torch.distributed.all_reduce`` on gloo (the process group is made once)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        port = np.zeros(1, np.int64)
        if comm.Get_rank() == 0:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port[0] = s.getsockname()[1]
        comm.Bcast(port, 0)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(int(port[0]))
        dist.init_process_group("gloo", init_method="env://", rank=comm.Get_rank(), world_size=comm.Get_size())
    import torch

    red = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
           "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[redop]
    t = torch.from_numpy(out)

    def run():
        np.copyto(out, x)
        dist.all_reduce(t, op=red)
        return finish(out, out, redop, comm.Get_size())

    return run


def gloo_finish():
    """Destroy the gloo process group, if one was made: gloo's worker threads left running at
    interpreter exit end the process with ``terminate called without an active exception``."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def gloo_available(comm):
    """Return True when every rank can import torch.distributed (agreed by all ranks)."""
    try:
        import torch.distributed as dist

        ok = bool(dist.is_available())
    except ImportError:
        ok = False
    flag = np.array([int(ok)])
    comm.Allreduce(MPI.IN_PLACE, flag, MPI.MIN)
    return bool(flag[0])
