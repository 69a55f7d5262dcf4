"""What a repeated small all-reduce costs, step by step, beside MPI's own calls made directly.

``mpiexec -n P python -m experiments.bench.breakdown [--sizes 8,512,4096] [--passes 7] [--out FILE]``

A repeated blocking :func:`collectives.allreduce` (``auto``, no timeout) of at most 2,048 elements
runs the cached plan of its call signature (:class:`collectives.library.plans.LibraryPlan`): it looks
the signature up, copies ``x`` in front of the 16 check elements, posts one ``MPI_Iallreduce`` and
waits, compares the reduced check elements, and copies the result out. This benchmark times each of
those steps alone, in loops of the same length on every rank, and the whole call, next to three
references called directly through mpi4py on the same data: ``MPI_Allreduce``, ``MPI_Iallreduce`` +
``MPI_Wait`` (the library call commlab posts) and ``MPI_Allreduce_init`` (started and waited), and
commlab's persistent plan (:func:`collectives.allreduce_init`). ``rest`` is the whole call less its
timed steps: the Python frames, the argument tests of the look-up and the statistics.

The rows of one pass take turns (interleaved), ``--passes`` passes are made, and each figure is the
median over passes with its range. Microseconds per call on rank 0 (every loop starts after a
barrier). Ratios: ``auto`` / ``MPI_Iallreduce``+``Wait`` (target <= 1.5x, geometric mean over the
sizes) and persistent plan / ``MPI_Allreduce`` (target <= 1.0x). The results file carries the
quiet-machine provenance (:mod:`experiments.results`).
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import collectives as C
from collectives.calls.signatures import cached_plan
from experiments import results as prov
from experiments.outputs import unwritable

__all__ = ["STEPS", "main"]

#: The timed rows: references first, then the call and its steps.
STEPS = ("MPI_Allreduce", "MPI_Iallreduce+Wait", "MPI_Allreduce_init", "persistent plan", "auto",
         "look-up", "copy in", "library call", "check", "copy out")


def _rows(comm, x, algorithm):
    """Return {row: zero-argument call} for ``x`` on ``comm`` (the plan of ``algorithm`` made and cached first)."""
    out = np.empty_like(x)
    for _ in range(3):
        C.allreduce(x, comm=comm, algorithm=algorithm)
    plan = cached_plan(x, comm=comm, algorithm=algorithm)
    if plan is None:
        raise ValueError(f"a {x.nbytes}-byte {algorithm} all-reduce on {comm.Get_size()} ranks has no cached "
                         "library plan (auto does not choose mpi at this size here, or debug mode is on)")
    dup = plan.ctx.comm
    init = dup.Allreduce_init(x, out, MPI.SUM)
    persistent = C.allreduce_init(x, comm=comm, algorithm=algorithm, out=out)
    work, recv, tail, want, shaped, result = plan.work, plan.recv, plan.tail, plan.want, plan.shaped, plan.shaped_result

    def pers():
        persistent.start()
        persistent.wait()

    def start_wait():
        init.Start()
        init.Wait()

    rows = {"MPI_Allreduce": lambda: dup.Allreduce(x, out, MPI.SUM),
            "MPI_Iallreduce+Wait": lambda: dup.Iallreduce(x, out, MPI.SUM).Wait(),
            "MPI_Allreduce_init": start_wait, "persistent plan": pers,
            "auto": lambda: C.allreduce(x, comm=comm, algorithm=algorithm),
            "look-up": lambda: cached_plan(x, comm=comm, algorithm=algorithm),
            "copy in": lambda: shaped.__setitem__(Ellipsis, x),
            "library call": lambda: dup.Iallreduce(work, recv, MPI.SUM).Wait(),
            "check": lambda: tail.tobytes() != want,
            "copy out": lambda: result.astype(x.dtype)}
    return rows, (init, persistent)


def _loop(comm, call, n):
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - t) / n * 1e6


def measure(comm, nbytes, passes, calls, algorithm="auto"):
    """Return {row: [microseconds per call, one per pass]} for a float32 all-reduce of ``nbytes``.

    Row ``auto`` is the all-reduce called with ``algorithm`` (``auto``, or ``mpi`` where ``auto``
    does not choose the library, as on one rank)."""
    x = np.arange(max(nbytes // 4, 1), dtype=np.float32)
    rows, keep = _rows(comm, x, algorithm)
    for call in rows.values():  # warm every row
        for _ in range(200):
            call()
    times = {k: [] for k in rows}
    for p in range(passes):
        names = list(rows) if p % 2 == 0 else list(reversed(rows))
        for k in names:
            times[k].append(comm.bcast(_loop(comm, rows[k], calls), 0))
    keep[0].Free()
    keep[1].free()
    return times


def summarize(times):
    """Return {row: (median, min, max)} and the row ``rest``: the whole call less its timed steps."""
    steps = ("look-up", "copy in", "library call", "check", "copy out")
    rest = [a - sum(times[s][i] for s in steps) for i, a in enumerate(times["auto"])]
    table = {k: (statistics.median(v), min(v), max(v)) for k, v in {**times, "rest": rest}.items()}
    return table


def _ratios(per_size):
    """Return the geometric means over sizes of the target ratios, per pass, as (median, min, max)."""
    def geo(num, den):
        n = len(next(iter(per_size.values()))[num])
        vals = [statistics.geometric_mean([t[num][i] / t[den][i] for t in per_size.values()]) for i in range(n)]
        return statistics.median(vals), min(vals), max(vals)

    return {"auto / MPI_Iallreduce+Wait": geo("auto", "MPI_Iallreduce+Wait"),
            "persistent plan / MPI_Allreduce": geo("persistent plan", "MPI_Allreduce"),
            "MPI_Iallreduce+Wait / MPI_Allreduce": geo("MPI_Iallreduce+Wait", "MPI_Allreduce"),
            "MPI_Allreduce_init / MPI_Allreduce": geo("MPI_Allreduce_init", "MPI_Allreduce")}


def _print(P, per_size, ratios):
    sizes = list(per_size)
    print(f"P = {P}, float32, microseconds per call: median [min-max] over passes")
    print(f"{'step':<22}" + "".join(f"{f'{n} B':>22}" for n in sizes))
    for k in STEPS[:5] + ("look-up", "copy in", "library call", "check", "copy out", "rest"):
        cells = "".join(f"{f'{m:.2f} [{lo:.2f}-{hi:.2f}]':>22}" for m, lo, hi in (per_size[n][k] for n in sizes))
        print(f"{k:<22}{cells}")
    print("geometric mean over the sizes, median [min-max] over passes:")
    for k, (m, lo, hi) in ratios.items():
        print(f"  {k:<38} {m:.2f}x [{lo:.2f}-{hi:.2f}]")


def main(argv=None):
    """Run the benchmark on ``COMM_WORLD``; return the exit status (2: bad arguments or a busy machine)."""
    ap = argparse.ArgumentParser(prog="mpiexec -n P python -m experiments.bench.breakdown",
                                 description="The steps of a repeated small all-reduce beside MPI's own calls.")
    ap.add_argument("--sizes", default="8,64,512,4096", help="message sizes in bytes, float32, comma-separated "
                    "(at most 8192: the cached path's limit)")
    ap.add_argument("--passes", type=int, default=7, help="interleaved passes (median and range; at least 3)")
    ap.add_argument("--calls", type=int, default=2000, help="calls per timed loop")
    ap.add_argument("--algorithm", default="auto", choices=("auto", "mpi"),
                    help="the all-reduce's algorithm (default auto; its row keeps the name auto)")
    ap.add_argument("--out", default="results/bench_breakdown.json", help="results file (JSON)")
    prov.add_options(ap)
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank0 = comm.Get_rank() == 0
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes {args.sizes!r}: expected comma-separated integers")
    if any(not 4 <= n <= 8192 for n in sizes):
        ap.error("--sizes: each between 4 and 8192 bytes")
    if args.passes < 3 or args.calls < 1:
        ap.error("--passes must be at least 3 and --calls at least 1")
    bad = unwritable(args.out) if rank0 else None
    bad = comm.bcast(bad, 0)
    if bad:
        ap.error(f"--out: {bad}")
    watch = prov.guard_or_say(args, comm)
    if watch is None:
        return 2
    try:
        times = {n: measure(comm, n, args.passes, args.calls, args.algorithm) for n in sizes}
    except ValueError as exc:
        if rank0:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    if rank0:
        per_size, ratios = {n: summarize(t) for n, t in times.items()}, _ratios(times)
        _print(comm.Get_size(), per_size, ratios)
        record = {"P": comm.Get_size(), "algorithm": args.algorithm, "sizes": {str(n): {k: list(v) for k, v in t.items()} for n, t in per_size.items()},
                  "ratios": {k: list(v) for k, v in ratios.items()}}
        record = prov.stamp(record, watch, P=comm.Get_size())
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
        print(f"wrote {args.out}" + (" (noisy: not for publication)" if record["provenance"]["noisy"] else ""))
    else:
        watch.summary()
    return 0


if __name__ == "__main__":
    sys.exit(main())
