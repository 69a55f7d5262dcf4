"""Where the ``shm`` all-reduce's time goes, step by step, beside the ``limit`` row's memory work.

``mpiexec -n P python -m experiments.bench.shm_breakdown [--sizes 256K,4M,64M] [--passes 5] [--calls 20]
[--out FILE]``

For each size (float32, sum) every rank times, in loops of ``--calls`` calls started together after
a barrier, the steps of :mod:`collectives.shm.algorithms`' all-reduce above ``SMALL_BYTES`` run one
at a time on the node's real windows:

* ``copy in``: ``x`` into this rank's stage (what the zero-copy plan skips);
* ``point``: one synchronisation point alone (flag store, ``MPI_Win_sync``, polling until every
  rank's flag arrived): the cost of the flags, two per call;
* ``reduce slice``: this rank's slice reduced from every rank's stage in rank order, chunk by
  chunk, and written into every stage (the cache misses of reading peers' memory and the ufunc's
  speed live here);
* ``reduce slice, one chunk``: the same with the whole slice as one chunk (what the cache-sized
  chunks change);
* ``copy out``: the stage into ``out``;
* ``call``: the whole ``collectives.allreduce(x, algorithm="shm")`` and ``plan``: the zero-copy
  persistent plan's start and wait on a shared buffer;
* ``limit``: :func:`experiments.bench.references.limit`'s local memory work.

``rest`` is the call less its timed steps (two points, copy in, reduce slice, copy out): Python
frames, checks, the generator. The rows of a pass take turns; ``--passes`` passes; each figure is
the median over passes of rank 0's microseconds per call, with the range. The file records the
figures and the quiet-machine provenance (:mod:`commlab.provenance`).
"""
import statistics
import sys
import time

import numpy as np

import collectives
from collectives.engine.context import get_context
from collectives.engine.fingerprint import key_code
from collectives.schedules.schedule import chunk_bounds
from collectives.shm import algorithms as shm
from collectives.shm import free_shared, shared_empty
from collectives.shm.node import node_of
from experiments import harness
from experiments.bench.references import limit
from training.settings.options import INT32_MAX, integer, text
from commlab.byte_sizes import parse_bytes

__all__ = ["ROWS", "measure", "STUDY", "main"]

#: The timed rows, in the order printed.
ROWS = ("call", "plan", "copy in", "point", "reduce slice", "reduce slice, one chunk", "copy out", "limit")


def _loop(comm, fn, calls):
    """Return seconds per call of ``fn`` over ``calls`` calls, every rank starting after a barrier."""
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def _steps(comm, n):
    """Return ``{row: zero-argument call}`` for an all-reduce of ``n`` float32 elements."""
    ctx = get_context(comm)
    P, r = ctx.size, ctx.rank
    x = (np.arange(n) % 7 + r).astype(np.float32)
    out = np.empty_like(x)
    key = ("allreduce", "shm", n, x.dtype, "sum", None, None)
    collectives.allreduce(x, comm=comm, algorithm="shm", out=out)  # the windows made and grown to this size
    node = node_of(ctx, key, None, "allreduce")
    code = key_code(key)
    views = node.stage(x.nbytes)
    peers = [v.view(np.float32) for v in views]
    mine = peers[r]
    bounds = chunk_bounds(n, P)
    lo, hi = bounds[r], bounds[r + 1]
    buf = shared_empty(n, np.float32, comm=comm)
    buf[...] = x
    plan = collectives.allreduce_init(buf, comm=comm, algorithm="shm", out=buf)

    def point():
        node.wait(node.post(code), key, ctx, None, None, 0, "breakdown")

    def fold(chunk):
        saved = shm.CHUNK_BYTES
        shm.CHUNK_BYTES = chunk
        try:
            shm.fold(peers, lo, hi, shm.Reduction(np.add, np.dtype(np.float32)), peers, node)
        finally:
            shm.CHUNK_BYTES = saved

    def run_plan():
        plan.start()
        plan.wait()

    rows = {"call": lambda: collectives.allreduce(x, comm=comm, algorithm="shm", out=out), "plan": run_plan,
            "copy in": lambda: np.copyto(mine, x), "point": point,
            "reduce slice": lambda: fold(shm.CHUNK_BYTES),
            "reduce slice, one chunk": lambda: fold(max(4 * (hi - lo), 4)),
            "copy out": lambda: np.copyto(out, mine), "limit": limit(comm, x, out, "sum")}

    def free():
        plan.free()
        free_shared(buf, comm=comm)
    return rows, free


def measure(comm, n, passes, calls):
    """Return ``{row: [seconds per call on this rank, one per pass]}`` for ``n`` float32 elements.

    The folds run while other ranks may run other rows' steps: every loop starts after a barrier
    and every rank runs the same row at once, so the ranks share the memory as in the collective.
    """
    rows, free = _steps(comm, n)
    times = {k: [] for k in ROWS}
    for p in range(passes):
        for name in (ROWS if p % 2 == 0 else ROWS[::-1]):
            times[name].append(_loop(comm, rows[name], calls))
    free()
    times["rest"] = [c - 2 * pt - ci - rs - co for c, pt, ci, rs, co in
                     zip(times["call"], times["point"], times["copy in"], times["reduce slice"], times["copy out"])]
    return times


def _summary(times):
    """Return ``{row: (median, min, max)}`` in microseconds."""
    return {k: tuple(1e6 * f(v) for f in (statistics.median, min, max)) for k, v in times.items()}


def _options(ap):
    ap.add_argument("--sizes", type=text(), default="256K,4M,64M", help="all-reduce sizes in bytes, float32, "
                    "comma-separated, above 16 KiB (suffixes K, M)")
    ap.add_argument("--passes", type=integer(1, INT32_MAX), default=5, help="interleaved passes (median and range)")
    ap.add_argument("--calls", type=integer(1, INT32_MAX), default=20, help="calls per timed loop")


def _sizes(args):
    """Return ``--sizes`` in bytes; raise ValueError unless each is a multiple of 4 above the small path's."""
    try:
        sizes = [parse_bytes(s) for s in args.sizes.split(",")]
    except ValueError as exc:
        raise ValueError(f"--sizes {args.sizes!r}: {exc}") from None
    if any(n <= shm.SMALL_BYTES or n % 4 for n in sizes):
        raise ValueError(f"--sizes: each a multiple of 4 bytes above {shm.SMALL_BYTES} (the two-point all-reduce)")
    return sizes


def _run(args, comm):
    """Time every size; rank 0 prints the table and returns the record."""
    sizes = _sizes(args)
    per_size = {n: _summary(measure(comm, n // 4, args.passes, args.calls)) for n in sizes}
    record = None
    if comm.Get_rank() == 0:
        print(f"P = {comm.Get_size()}, float32 sum, microseconds per call on rank 0: median [min-max] over "
              f"{args.passes} passes")
        print(f"{'row':<26}" + "".join(f"{n:>26,}" for n in sizes))
        for row in ROWS + ("rest",):
            print(f"{row:<26}" + "".join(f"{'%.1f [%.1f-%.1f]' % per_size[n][row]:>26}" for n in sizes))
        record = {"P": comm.Get_size(), "passes": args.passes, "calls": args.calls, "chunk_bytes": shm.CHUNK_BYTES,
                  "sizes": {str(n): {k: list(v) for k, v in s.items()} for n, s in per_size.items()}}
    return record


#: The breakdown as a unit of the harness; ``main(argv)``: rank 0 prints the table and writes ``--out``.
STUDY = harness.Study("experiments.bench.shm_breakdown", __doc__.split("\n")[0], _options, _run,
                      out="results/bench_shm_breakdown.json", check=lambda args, comm: _sizes(args), launcher="")
main = STUDY.main


if __name__ == "__main__":
    sys.exit(main())
