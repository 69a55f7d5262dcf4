"""All-reduce one float32 vector with every algorithm and print a check-and-time table.

Run: ``mpiexec -n 4 python -m experiments.demo [--mib 4] [--iters 10]``. Each algorithm's result is
checked against MPI's own ``MPI_Allreduce`` (max abs difference) and timed beside it: every algorithm
is warmed up first, then the algorithms take turns for ``--iters`` rounds (so load drifts hit them
alike) and each reports the median of its runs, a barrier before each, slowest rank;
``busbw = 2 (P-1)/P * bytes / time`` as nccl-tests reports, and ``time / mpi`` below 1 means faster
than MPI's own. For careful sweeps use ``experiments.bench.collectives``.
"""
import math
import statistics
import time
from functools import partial

import numpy as np
from mpi4py import MPI

import collectives
import collectives.engine.context
from commlab.provenance import mpi_library
from training.settings.cli import parse_on_every_rank
from training.settings.options import INT32_MAX, Parser, integer, real

__all__ = ["main"]


def _time(fn, comm, iters):
    times = []
    for _ in range(iters):
        comm.Barrier()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    worst = np.array([statistics.median(times)])
    comm.Allreduce(MPI.IN_PLACE, worst, MPI.MAX)  # the slowest rank's median
    return float(worst[0])


def _check(parser, argv):
    """Return the parsed ``argv``; a bad value is a usage error (exit 2)."""
    args = parser.parse_args(argv)
    if not (math.isfinite(args.mib) and args.mib >= 0):
        parser.error(f"--mib must be a finite number >= 0, got {args.mib}")
    if args.iters < 1:
        parser.error(f"--iters must be >= 1, got {args.iters}")
    return args


def main(argv=None):
    """Parse arguments, run every algorithm once for correctness and ``--iters`` times for speed."""
    parser = Parser(prog="python -m experiments.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=real(0, 1e15, low_open=True), default=4.0, help="message size in MiB (default 4)")
    parser.add_argument("--iters", type=integer(1, INT32_MAX), default=10, help="timed repetitions per algorithm (default 10)")
    comm = MPI.COMM_WORLD
    args = parse_on_every_rank(partial(_check, parser), argv, comm.Get_rank())  # rank 0 alone prints
    rank, size = comm.Get_rank(), comm.Get_size()
    count = int(args.mib * 2 ** 20) // 4
    x = np.random.default_rng(rank).standard_normal(count).astype(np.float32)
    ref = collectives.allreduce(x, algorithm="mpi")
    out = np.empty_like(x)
    errs, resolved = {}, {}
    one_node = collectives.engine.context.get_context(comm).nodes()[0] == 1
    algorithms = [a for a in collectives.ALGORITHMS if a != "shm" or one_node]  # shm serves one node only
    for alg in algorithms:  # correctness, and warm-up of schedules and buffers
        y = collectives.allreduce(x, algorithm=alg)
        err = np.array([float(np.max(np.abs(y - ref), initial=0.0))])
        comm.Allreduce(MPI.IN_PLACE, err, MPI.MAX)
        errs[alg], resolved[alg] = err[0], collectives.engine.context.last_stats()["algorithm"]
        collectives.allreduce(x, algorithm=alg, out=out)
    times = {alg: [] for alg in algorithms}
    for _ in range(args.iters):  # round-robin, so load drift hits every algorithm alike
        for alg in algorithms:
            times[alg].append(_time(lambda: collectives.allreduce(x, algorithm=alg, out=out), comm, 1))
    rows = [(alg if alg != "auto" else f"auto->{resolved[alg]}", errs[alg], statistics.median(times[alg]))
            for alg in algorithms]
    if rank == 0:
        nbytes = count * 4
        t_mpi = dict((r[0], r[2]) for r in rows)["mpi"]
        print(f"all-reduce of {nbytes / 2**20:.2f} MiB float32 on {size} ranks "
              f"({' '.join(mpi_library().split()[:3])}); median of {args.iters} runs")
        print(f"{'algorithm':<28}{'max |err| vs mpi':>18}{'check':>7}{'time (ms)':>11}{'busbw (GB/s)':>14}"
              f"{'time / mpi':>12}")
        for name, err, t in rows:
            ok = "ok" if err <= 1e-4 * max(1.0, size) else "FAIL"
            busbw = 2 * (size - 1) / size * nbytes / t / 1e9 if t > 0 and size > 1 else 0.0
            print(f"{name:<28}{err:>18.2e}{ok:>7}{t * 1e3:>11.2f}{busbw:>14.2f}{t / t_mpi:>11.2f}x")


if __name__ == "__main__":
    main()
