"""What the default mismatch checks cost: all-reduce time with the checks on / off, in one run.

``mpiexec -n P python -m experiments.bench.checks [--sizes 8,4194304] [--repeats 7]``

The default checks (:mod:`collectives.engine.fingerprint`) are the call fingerprint in every message tag,
the received-size check of every message, and, for ``algorithm="mpi"``, the fingerprint carried in
the reduction (8 extra elements up to 2,048 elements, else a 16-byte all-reduce posted alongside).
This study times the same all-reduce with :func:`collectives.engine.fingerprint.set_checks` on and off,
alternating on/off blocks within each repeat so that the machine's drift hits both alike, and prints
per algorithm and size the median ratio on/off over the repeats and its range. Target: <= 1.05x.
Rank 0 prints; ``--out`` writes the rows as JSON.
"""
import json
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import collectives as C
from commlab.provenance import mpi_library
from collectives.engine.fingerprint import set_checks
from training.settings.options import INT32_MAX, Parser, integer, listof, names, outpath, real


def _time(comm, x, alg, calls):
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(calls):
        C.allreduce(x, comm=comm, algorithm=alg)
    return (time.perf_counter() - t) / calls


def main(argv=None):
    """Run the study; return the exit status."""
    ap = Parser(prog="mpiexec -n P python -m experiments.bench.checks",
                                 description="All-reduce time with the default mismatch checks on and off.")
    ap.add_argument("--sizes", type=listof(integer(1, 2 ** 34)), default="8,4194304", help="comma-separated message sizes in bytes (float32)")
    ap.add_argument("--algorithms", type=names(C.ALGORITHMS), default="ring,recursive_doubling,mpi", help="comma-separated algorithms")
    ap.add_argument("--repeats", type=integer(1, INT32_MAX), default=7, help="on/off pairs per point (median and range reported)")
    ap.add_argument("--max-time", type=real(0, 1e15), default=0.2, help="seconds per timed block (sets the call count)")
    ap.add_argument("--out", type=outpath(empty=True), default=None, help="JSON file for the rows")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    rows = []
    for nbytes in args.sizes:
        x = np.ones(max(nbytes // 4, 1), np.float32)
        for alg in args.algorithms:
            for _ in range(20):
                C.allreduce(x, comm=comm, algorithm=alg)  # warm: schedules, buffers, page faults
            one = comm.allreduce(_time(comm, x, alg, 3), MPI.MAX)
            calls = max(3, min(20000, int(args.max_time / max(one, 1e-7))))
            calls = comm.bcast(calls, 0)
            ratios, on_t, off_t = [], [], []
            for rep in range(args.repeats):
                order = (True, False) if rep % 2 == 0 else (False, True)
                got = {}
                for flag in order:
                    set_checks(flag)
                    got[flag] = comm.allreduce(_time(comm, x, alg, calls), MPI.MAX)
                set_checks(True)
                ratios.append(got[True] / got[False])
                on_t.append(got[True])
                off_t.append(got[False])
            row = {"P": comm.size, "bytes": x.nbytes, "algorithm": alg, "calls": calls,
                   "on_us": statistics.median(on_t) * 1e6, "off_us": statistics.median(off_t) * 1e6,
                   "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
            rows.append(row)
            if comm.rank == 0:
                print(f"P={comm.size} {x.nbytes:>9d} B {alg:20s} on {row['on_us']:9.1f} us  off {row['off_us']:9.1f} us"
                      f"  ratio {row['ratio_median']:.3f} (range {row['ratio_min']:.3f}-{row['ratio_max']:.3f})",
                      flush=True)
    if comm.rank == 0 and args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"library": mpi_library(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
