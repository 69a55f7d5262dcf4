"""Rank-side body of the written-algorithm tests: ``mpiexec -n P python -m tests.mpi_algorithms``.

The guide's two example algorithms (``docs/examples/``), loaded from their files as the trainer's
``--algorithm FILE.py:FUNCTION`` loads them, after a collective has already run, are compared with
MPI's own ``MPI_Allreduce`` bitwise on int64: blocking in place (``out=x``) and out of place,
non-blocking, and persistent, at counts 0, 1, P - 1, P + 1, 3P + 2 and 1000. A schedule whose round
sends a region its own copying receive writes (a swap) runs under MPI as the simulator replays it.
Exits 0 on success, else prints the failures and exits 1.
"""
import os

import numpy as np
from mpi4py import MPI

import collectives as C
from collectives.engine.context import get_context
from collectives.engine.executor import Run, execute
from collectives.model.simulate import replay
from collectives.schedules import Round, Schedule, load_algorithm
from tests.mpicases import check, report

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()
HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "examples")


def main():
    C.allreduce(np.ones(3), algorithm="ring")  # a collective before the registration
    names = [load_algorithm(os.path.join(HERE, f"{f}.py:{f}_allreduce"), sizes=range(1, 9))
             for f in ("alltoall", "bidirectional_ring")]
    rng = np.random.default_rng(rank)
    for name in names:
        for count in sorted({0, 1, max(P - 1, 1), P + 1, 3 * P + 2, 1000}):
            x = rng.integers(-2 ** 40, 2 ** 40, count)
            want = np.empty_like(x)
            comm.Allreduce(x, want, MPI.SUM)
            got = C.allreduce(x.copy(), algorithm=name)
            check(np.array_equal(got, want), f"{name} out of place count={count}: {got[:6]} != {want[:6]}")
            y = x.copy()
            C.allreduce(y, algorithm=name, out=y)
            check(np.array_equal(y, want), f"{name} in place count={count}: {y[:6]} != {want[:6]}")
            got = C.iallreduce(x, algorithm=name).wait()
            check(np.array_equal(got, want), f"{name} non-blocking count={count}")
            plan = C.allreduce_init(x, algorithm=name)
            for _ in range(2):
                plan.start()
                got = plan.wait()
                check(np.array_equal(got, want), f"{name} persistent count={count}")
    # a swap: each rank sends [0, 4) to its partner and copies the partner's [0, 4) over it in one round
    partner = rank ^ 1
    if partner < P:
        ctx = get_context()
        sched = Schedule("swap", rank, P, 4, [Round([(partner, 0, 4)], [(partner, 0, 4, False)])])
        mine = np.arange(4) + 10 * rank
        work = mine.copy()
        execute(Run(sched, ctx.comm, work, scratch=np.empty(sched.scratch, work.dtype), ufunc=np.add))
        data = [np.arange(4) + 10 * r for r in range(P)]
        replay([Schedule("swap", r, P, 4, [Round([(r ^ 1, 0, 4)], [(r ^ 1, 0, 4, False)])] if r ^ 1 < P else [])
                for r in range(P)], data)
        check(np.array_equal(work, data[rank]) and np.array_equal(work, np.arange(4) + 10 * partner),
              f"swap: {work} (simulator {data[rank]})")
    comm.Barrier()


if __name__ == "__main__":
    main()
    raise SystemExit(report(comm, f"algorithms P={P}"))
