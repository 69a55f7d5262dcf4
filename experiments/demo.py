"""All-reduce one float32 vector with every algorithm and print a check-and-time table.

Run: ``mpiexec -n 4 python -m experiments.demo [--mib 4] [--iters 5]``. Each algorithm's result is
checked against MPI's own ``MPI_Allreduce`` (max abs difference) and timed beside it (median of
``--iters`` runs, a barrier before each); ``busbw = 2 (P-1)/P * bytes / time`` as nccl-tests reports.
"""
import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import collectives

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


def main(argv=None):
    """Parse arguments, run every algorithm once for correctness and ``--iters`` times for speed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=4.0, help="message size in MiB (default 4)")
    parser.add_argument("--iters", type=int, default=5, help="timed repetitions per algorithm (default 5)")
    args = parser.parse_args(argv)
    if args.mib < 0 or args.iters < 1:
        parser.error("--mib must be >= 0 and --iters >= 1")
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    count = int(args.mib * 2 ** 20) // 4
    x = np.random.default_rng(rank).standard_normal(count).astype(np.float32)
    ref = collectives.allreduce(x, algorithm="mpi")
    rows = []
    for alg in collectives.ALGORITHMS:
        y = collectives.allreduce(x, algorithm=alg)  # also warms caches
        err = np.array([float(np.max(np.abs(y - ref), initial=0.0))])
        comm.Allreduce(MPI.IN_PLACE, err, MPI.MAX)
        resolved = collectives.last_stats()["algorithm"]
        out = np.empty_like(x)
        t = _time(lambda: collectives.allreduce(x, algorithm=alg, out=out), comm, args.iters)
        rows.append((alg if alg != "auto" else f"auto->{resolved}", err[0], t))
    if rank == 0:
        nbytes = count * 4
        t_mpi = dict((r[0], r[2]) for r in rows)["mpi"]
        print(f"all-reduce of {nbytes / 2**20:.2f} MiB float32 on {size} ranks "
              f"({MPI.Get_library_version().splitlines()[0].strip()})")
        print(f"{'algorithm':<28}{'max |err| vs mpi':>18}{'check':>7}{'time (ms)':>11}{'busbw (GB/s)':>14}{'vs mpi':>8}")
        for name, err, t in rows:
            ok = "ok" if err <= 1e-4 * max(1.0, size) else "FAIL"
            busbw = 2 * (size - 1) / size * nbytes / t / 1e9 if t > 0 and size > 1 else 0.0
            print(f"{name:<28}{err:>18.2e}{ok:>7}{t * 1e3:>11.2f}{busbw:>14.2f}{t_mpi / t:>7.2f}x")


if __name__ == "__main__":
    main()
