"""What a repeated small all-reduce or reduce-scatter costs, step by step, beside MPI's own calls made directly.

``mpiexec -n P python -m experiments.bench.breakdown [--op allreduce|reduce_scatter] [--sizes 8,512,4096]
[--passes 7] [--calls 2000] [--out FILE]``

``--op allreduce`` (default): a repeated blocking :func:`collectives.allreduce` (``auto``, no
timeout) of at most 2,048 elements runs the cached plan of its call signature
(:class:`collectives.library.plans.LibraryPlan`): the public function tests its arguments, looks the
signature up and calls ``plan.run``, which copies ``x`` in front of the 16 check elements, posts one
``MPI_Iallreduce`` and waits, compares the reduced check elements, copies the result out and records
the statistics. References called directly through mpi4py on the same data: ``MPI_Allreduce``,
``MPI_Iallreduce`` + ``MPI_Wait`` (the library call commlab posts) and ``MPI_Allreduce_init``
(started and waited), and commlab's persistent plan (:func:`collectives.allreduce_init`).

``--op reduce_scatter``: a repeated blocking :func:`collectives.reduce_scatter` into ``out=`` (as the
sweep calls it) runs its :class:`~collectives.library.scatter_plan.ScatterPlan`'s one-frame form: the
public function's tests, the look-up, then two library calls posted together -- the 16-byte
fingerprint ``MPI_Iallreduce`` and ``MPI_Ireduce_scatter_block`` -- the fingerprint's check and the
statistics. References: ``MPI_Reduce_scatter``, ``MPI_Ireduce_scatter_block`` + ``MPI_Wait``, the
fingerprint's ``MPI_Iallreduce`` + ``MPI_Wait`` alone, and both library calls (the floor of a call
that checks its fingerprint).

Each row is timed alone, in loops of ``--calls`` calls of the same length on every rank
(:mod:`experiments.bench.breakdown_rows`): the whole call, entry points into it (``plan.run``; for
the reduce-scatter the plan's one-frame form, ``fast form``), its steps, and calibration rows -- ``loop`` (a call that does nothing:
what the loop adds to every row), ``empty call`` (an empty function with the collective's
keyword-only signature, called as the benchmark calls the collective) and ``call and tests`` (the
same with the collective's first argument tests). The derived rows are what no row times alone:
``public entry`` (the call less its look-up and ``plan.run``, for the reduce-scatter ``fast form``:
the collective's frame and tests),
``in the plan`` / ``in the fast form`` (an entry point less its timed steps: frames,
``try``, flags), ``rest`` (the call less all its timed steps; the sum of the ones before) and the
calibration rows less ``loop``, each per pass as ``whole - sum(parts) + (len(parts) - 1) * loop``.

The rows of one pass take turns (interleaved, the order reversed every other pass), ``--passes``
passes are made, and each figure is the median over passes with its range. Microseconds per call
on rank 0 (every loop starts after a barrier). A pass in which a derived row comes out negative
(its parts took longer than the whole: one of their loops was disturbed) is inconsistent for that
row: it is left out of that row's median and range, and the record lists it under ``dropped``
({size: {row: [pass index from 0]}}); the timed rows and the ratios keep every pass. Ratios, geometric means over the sizes per pass: ``auto`` /
``MPI_Iallreduce``+``Wait`` (target <= 1.5x) and persistent plan / ``MPI_Allreduce`` (target <= 1.0x);
reduce-scatter ``auto`` / ``MPI_Ireduce_scatter_block``+``Wait`` (target <= 2.2x) and both library
calls over the same (the floor). The results file records ``op``, ``passes`` and ``calls`` and
carries the quiet-machine provenance (:mod:`commlab.provenance`).
"""
import statistics
import sys
import time

import numpy as np

from experiments import harness
from experiments.bench.breakdown_rows import OPS
from training.settings.options import INT32_MAX, integer, text

__all__ = ["STEPS", "measure", "summarize", "STUDY", "main"]

#: The timed rows of ``--op allreduce``: references first, then the call, its entry points, its steps, calibration.
STEPS = ("MPI_Allreduce", "MPI_Iallreduce+Wait", "MPI_Allreduce_init", "persistent plan", "auto",
         "look-up", "plan.run", "copy in", "library call", "check", "copy out", "statistics",
         "loop", "empty call", "call and tests")


def _loop(comm, call, n):
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - t) / n * 1e6


def measure(comm, nbytes, passes, calls, algorithm="auto", op="allreduce"):
    """Return ({row: [microseconds per call, one per pass]}, :class:`~experiments.bench.breakdown_rows.Rows`)
    for a float32 ``op`` of ``nbytes``.

    Row ``auto`` is the collective called with ``algorithm`` (``auto``, or ``mpi`` where ``auto``
    does not choose the library, as the all-reduce on one rank)."""
    x = np.arange(max(nbytes // 4, 1), dtype=np.float32)
    spec = OPS[op](comm, x, algorithm)
    rows = spec.rows
    for call in rows.values():  # warm every row
        for _ in range(200):
            call()
    times = {k: [] for k in rows}
    for p in range(passes):
        names = list(rows) if p % 2 == 0 else list(reversed(rows))
        for k in names:
            times[k].append(comm.bcast(_loop(comm, rows[k], calls), 0))
    spec.free()
    return times, spec


def summarize(times, derived):
    """Return ({row: (median, min, max)}, {derived row: dropped passes}) with the ``derived`` rows added.

    ``derived`` is {name: (whole row, part rows)}; per pass each is
    ``whole - sum(parts) + (len(parts) - 1) * loop``. A pass in which a derived row is negative is
    left out of that row (its index is listed); a row negative in every pass is left out.
    """
    n = len(times["loop"])
    table = {k: (statistics.median(v), min(v), max(v)) for k, v in times.items()}
    dropped = {}
    for name, (whole, parts) in derived.items():
        per = [times[whole][i] - sum(times[p][i] for p in parts) + (len(parts) - 1) * times["loop"][i]
               for i in range(n)]
        kept = [v for v in per if v >= 0]
        if len(kept) < n:
            dropped[name] = [i for i, v in enumerate(per) if v < 0]
        if kept:
            table[name] = (statistics.median(kept), min(kept), max(kept))
    return table, dropped


def _ratios(per_size, ratios):
    """Return the geometric means over sizes of ``ratios`` ({name: (row, row)}), per pass, as (median, min, max)."""
    def geo(num, den):
        n = len(next(iter(per_size.values()))[num])
        vals = [statistics.geometric_mean([t[num][i] / t[den][i] for t in per_size.values()]) for i in range(n)]
        return statistics.median(vals), min(vals), max(vals)

    return {name: geo(num, den) for name, (num, den) in ratios.items()}


def _print(P, op, per_size, dropped, ratios):
    sizes = list(per_size)
    cell = {(n, k): f"{m:.2f} [{lo:.2f}-{hi:.2f}]" for n in sizes for k, (m, lo, hi) in per_size[n].items()}
    w = max(map(len, cell.values())) + 2
    print(f"{op}, P = {P}, float32, microseconds per call: median [min-max] over passes")
    print(f"{'row':<32}" + "".join(f"{f'{n} B':>{w}}" for n in sizes))
    for k in dict.fromkeys(k for n in sizes for k in per_size[n]):
        print(f"{k:<32}" + "".join(f"{cell.get((n, k), '-'):>{w}}" for n in sizes))
    for n in sizes:
        for row, passes in dropped[n].items():
            print(f"{n} B, {row}: left out pass(es) {', '.join(str(i + 1) for i in passes)} (negative)")
    print("geometric mean over the sizes, median [min-max] over passes:")
    for k, (m, lo, hi) in ratios.items():
        print(f"  {k:<56} {m:.2f}x [{lo:.2f}-{hi:.2f}]")


def _options(ap):
    ap.add_argument("--op", default="allreduce", choices=tuple(OPS), help="the collective (default allreduce)")
    ap.add_argument("--sizes", type=text(), default="8,64,512,4096", help="message sizes in bytes, float32, comma-separated "
                    "(at most 8192: the cached path's limit)")
    ap.add_argument("--passes", type=integer(1, INT32_MAX), default=7, help="interleaved passes (median and range; at least 3)")
    ap.add_argument("--calls", type=integer(1, INT32_MAX), default=2000, help="calls per timed loop")
    ap.add_argument("--algorithm", default="auto", choices=("auto", "mpi"),
                    help="the collective's algorithm (default auto; its row keeps the name auto)")


def _sizes(args):
    """Return ``--sizes`` as a list of byte counts; raise ValueError when one is not an integer in 4..8192."""
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        raise ValueError(f"--sizes {args.sizes!r}: expected comma-separated integers") from None
    if any(not 4 <= n <= 8192 for n in sizes):
        raise ValueError("--sizes: each between 4 and 8192 bytes")
    if args.passes < 3:
        raise ValueError("--passes must be at least 3")
    return sizes


def _run(args, comm):
    """Time every size; rank 0 prints the table and returns the record."""
    measured = {n: measure(comm, n, args.passes, args.calls, args.algorithm, args.op) for n in _sizes(args)}
    record = None
    if comm.Get_rank() == 0:
        spec = next(iter(measured.values()))[1]
        times = {n: t for n, (t, _) in measured.items()}
        summary = {n: summarize(t, spec.derived) for n, t in times.items()}
        per_size, dropped = {n: s[0] for n, s in summary.items()}, {n: s[1] for n, s in summary.items()}
        ratios = _ratios(times, spec.ratios)
        _print(comm.Get_size(), args.op, per_size, dropped, ratios)
        record = {"P": comm.Get_size(), "collective": args.op, "algorithm": args.algorithm, "passes": args.passes,
                  "calls": args.calls,
                  "sizes": {str(n): {k: list(v) for k, v in t.items()} for n, t in per_size.items()},
                  "dropped": {str(n): d for n, d in dropped.items()},
                  "derived": {k: [w, list(parts)] for k, (w, parts) in spec.derived.items()},
                  "ratios": {k: list(v) for k, v in ratios.items()}}
    return record


#: The benchmark as a unit of the harness; ``main(argv)`` runs it on ``COMM_WORLD`` and returns the exit
#: status (2: a bad argument or a busy machine, one error line before any measurement).
STUDY = harness.Study("experiments.bench.breakdown", "The steps of a repeated small all-reduce or reduce-scatter "
                      "beside MPI's own calls.", _options, _run, out="results/bench_breakdown.json",
                      check=lambda args, comm: _sizes(args))
main = STUDY.main


if __name__ == "__main__":
    sys.exit(main())
