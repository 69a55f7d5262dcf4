"""Sweep commlab's collectives against MPI's own, size by size, the way OSU and nccl-tests measure.

    mpiexec [-bind-to core] -n 4 python -m experiments.bench.collectives [--ops allreduce,reduce_scatter,allgather]
        [--algorithms ring,mpi] [--min-bytes 8] [--max-bytes 64M] [--iters N] [--repeats 3] [--out results/bench]
        [--format table|nccl-tests] [--max-load L] [--allow-noisy]
    python -m plots.bench results/bench.json
    python -m experiments.bench.tune results/bench.json --out results/tuning.json

For each message size (doubling from ``--min-bytes`` to ``--max-bytes``) and each op, every
algorithm -- MPI's own (``mpi``) included, in the same process -- runs in turn:

1. once on integer-valued check data, compared with MPI's own collective called directly on a
   duplicated communicator (``#wrong``: elements that differ, summed over ranks; floats within
   rtol = atol = 1e-3 / 1e-5 / 1e-12 for float16 / float32 / float64, integers exactly);
2. ``warmup`` uncounted calls, then ``iters`` timed calls (OSU Micro-Benchmarks): a barrier before
   each call, outside the timed region; each rank's mean; then min, mean and max over ranks (and
   the slowest rank's median, robust to the spikes of a shared machine). With ``--rounds R`` the
   timed calls come in R segments and the algorithms take turns segment by segment;
3. the whole sweep is made ``--repeats`` times (passes, one after another, default 3): each row holds
   the median pass's times with every pass's time, their spread and an ``unstable`` flag (spread above
   20 %), and every summary ratio is reported as median and range over the passes
   (:func:`experiments.bench.output.combine`). The results record the load average before and after.

The default table's columns follow nccl-tests' definitions: size is the whole vector in bytes
(all-reduce and reduce-scatter input, all-gather output made of P blocks of size / P, broadcast
buffer); time is the slowest rank's mean (nccl-tests reports the mean over ranks, also stored, as
``time_mean_us``); algbw = size / time; busbw = algbw x 2(P-1)/P for all-reduce, (P-1)/P for
reduce-scatter and all-gather, 1 for broadcast. Reference rows: MPI's own call made directly (``MPI_Allreduce``,
``MPI_Reduce_scatter``, ``MPI_Allgather``, ``MPI_Bcast``), which prices commlab's layer around its
``mpi`` algorithm; and for all-reduce two loops that price the schedule executor: ``ring-direct``,
the ring algorithm hand-written on ``Sendrecv`` with preallocated views and in-place ufuncs, and
``ring-execute``, the cached ring schedule run by ``collectives.engine.executor.execute`` alone.
``--baseline gloo`` adds ``torch.distributed`` all-reduce on gloo.

``--format nccl-tests`` prints, at the end, one table per op and algorithm in nccl-tests' layout
(:func:`experiments.bench.output.nccl_tests`): size, count, type, redop, root, then time, algbw,
busbw and #wrong for the out-of-place and the in-place call, time being the mean over ranks as
nccl-tests reports it, and the ``# Avg bus bandwidth`` footer. The in-place calls are then measured
too, where commlab has them (:mod:`experiments.bench.cases`); elsewhere the group reads N/A.

Rank 0 prints the table as it goes and writes PREFIX.csv and PREFIX.json (configuration, MPI
library, P, host, date, versions, rows, and the ratio summary of :func:`experiments.bench.output.summarize`);
the complete sweep's JSON its ``provenance`` (:mod:`commlab.provenance`: on a busy machine the sweep
refuses to start unless ``--allow-noisy`` marks it noisy).
"""
import os
import sys
import time
from functools import partial

import numpy as np
from mpi4py import MPI

import collectives
import collectives.backend
import collectives.engine.context
from collectives.engine import timeline
import collectives.schedules.registry
from experiments.bench.cases import case, poison
from experiments.bench.oracle import count_wrong, first_wrong
from commlab import provenance as prov
from commlab.provenance import command_line
from experiments import harness
from experiments.bench.output import HEAD, bus_factor, header, library, line, report, write
from experiments.bench.references import gloo_available, gloo_finish
from training.settings.cli import parse_on_every_rank

from experiments.bench.sweep_options import NO_TORCH, default_algorithms, parse_args, sweep_plan

__all__ = ["run_sweep", "main", "wrong_rows"]


def _case(op, nbytes, cfg, comm):
    """Return the :class:`experiments.bench.cases.Case` of ``op`` at ``nbytes`` (None if it holds no element).

    In-place calls are built with ``--format nccl-tests``, whose second group of columns they fill.
    """
    return case(op, nbytes, cfg, comm, default_algorithms, in_place=cfg.format == "nccl-tests")


def _segment(call, comm, iters, warmup, times):
    """Run ``warmup`` uncounted then ``iters`` timed calls, a barrier before each; append the seconds."""
    for _ in range(warmup):
        comm.Barrier()
        call()
    for _ in range(iters):
        comm.Barrier()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)


def _iterations(calls, comm, iters, max_time):
    """Return each algorithm's timed-call count: ``iters``, cut to fit ``max_time`` (the same on every rank)."""
    if max_time <= 0:
        return {alg: iters for alg in calls}
    est = []
    for call in calls.values():
        _segment(call, comm, 1, 0, est)
    est = np.array(est)
    comm.Allreduce(MPI.IN_PLACE, est, MPI.MAX)  # the slowest rank's estimate, so every rank agrees
    return {alg: max(3, min(iters, int(max_time / max(e, 1e-9)))) for alg, e in zip(calls, est)}


def _check(c, comm):
    """Return (#wrong per out-of-place call, #wrong per in-place call, resolved names, where wrong).

    The counts are summed over ranks; ``where`` maps each call found wrong (the algorithm, or
    ``(algorithm, "in-place")``) to ``[(rank, first wrong element, expected, got), ...]`` of the ranks
    it was wrong on (gathered on every rank in one ``MPI_Allgather`` of numbers).
    """
    n = len(c.calls) + len(c.in_place)
    wrong, resolved, first = np.zeros(n, np.int64), {}, np.full((n, 4), np.nan)  # (calls, [flag, i, want, got])
    for i, (alg, call) in enumerate(c.calls.items()):
        poison(c.poisoned)
        got = None if getattr(call, "unchecked", False) else call()
        wrong[i] = 0 if got is None else count_wrong(got, c.ref)
        if wrong[i]:
            first[i] = (1, *first_wrong(got, c.ref))
        resolved[alg] = collectives.engine.context.last_stats(comm)["algorithm"] if alg == "auto" else alg
    for i, call in enumerate(c.in_place.values(), len(c.calls)):
        c.reset()
        got = call()
        wrong[i] = count_wrong(got, c.ref)
        if wrong[i]:
            first[i] = (1, *first_wrong(got, c.ref))
    every = np.empty((comm.Get_size(), n, 4))
    comm.Allgather(first, every)  # (P, calls, 4)
    comm.Allreduce(MPI.IN_PLACE, wrong, MPI.SUM)
    keys = list(c.calls) + [(alg, "in-place") for alg in c.in_place]
    where = {key: [(r, int(every[r, i, 1]), every[r, i, 2], every[r, i, 3]) for r in range(every.shape[0])
                   if every[r, i, 0] == 1] for i, key in enumerate(keys) if wrong[i]}
    return dict(zip(c.calls, wrong[:len(c.calls)])), dict(zip(c.in_place, wrong[len(c.calls):])), resolved, where


def _time(timed, cfg, comm, size):
    """Time every call of ``timed``; return (iterations, every rank's mean and median: (P, calls, 2) seconds).

    The timed calls of each are split into ``cfg.rounds`` segments (each with its share of the
    warm-up) and the calls take turns segment by segment, so slow drifts of a shared machine's load
    fall on all of them alike.
    """
    iters = _iterations(timed, comm, cfg.iters_small if size <= cfg.large_bytes else cfg.iters_large, cfg.max_time)
    warmup, R = cfg.warmup_small if size <= cfg.large_bytes else cfg.warmup_large, cfg.rounds
    times = {key: [] for key in timed}
    for k in range(R):
        for key, call in timed.items():
            _segment(call, comm, iters[key] * (k + 1) // R - iters[key] * k // R,
                     warmup * (k + 1) // R - warmup * k // R, times[key])
    for call in timed.values():
        getattr(call, "free", lambda: None)()  # persistent requests of the reference rows
    local = np.array([[np.mean(times[key]), np.median(times[key])] for key in timed])  # (calls, 2)
    every = np.empty((comm.Get_size(),) + local.shape)
    comm.Allgather(local, every)  # (P, calls, 2): each rank's mean and median
    return iters, every


def _timelines(c, op, size, cfg, comm, calls=10):
    """Record ``calls`` more calls of each algorithm of case ``c`` round by round; rank 0 prints and writes them.

    Rows that run no schedule (``mpi``, the references) record no round and are passed over.
    """
    for alg, call in c.calls.items():
        with timeline.record() as rec:
            for _ in range(calls):
                call()
        per_rank = timeline.gather(rec, comm)
        if comm.Get_rank() == 0 and any(per_rank):
            path = f"{cfg.timeline}-{op}-{alg}-{size}.json"
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            timeline.write(path, per_rank)
            print(f"# timeline of {op} {alg} at {size} B ({calls} calls), written to {path}\n"
                  + "\n".join("# " + ln for ln in timeline.table(per_rank, np.dtype(cfg.dtype).itemsize).splitlines()),
                  flush=True)


def _measure(op, nbytes, cfg, comm):
    """Check and time every algorithm of ``op`` at ``nbytes``; return the rows (complete on every rank).

    A row's times are those of the out-of-place call; with ``--format nccl-tests`` the in-place call,
    where there is one (:mod:`experiments.bench.cases`), adds ``inplace_time_us`` (slowest rank's
    mean), ``inplace_time_mean_us`` (mean over ranks) and ``inplace_wrong``.
    """
    c = _case(op, nbytes, cfg, comm)
    if c is None:
        return []
    P, dt = comm.Get_size(), np.dtype(cfg.dtype)
    wrong, wrong_in_place, resolved, where = _check(c, comm)
    size = c.count * dt.itemsize
    timed = {**c.calls, **{(alg, "in-place"): call for alg, call in c.in_place.items()}}
    iters, every = _time(timed, cfg, comm, size)
    if cfg.timeline:
        _timelines(c, op, size, cfg, comm)
    t = {key: every[:, i, :] for i, key in enumerate(timed)}  # (P, 2) per call
    rows = []
    for alg in c.calls:
        t_min, t_mean, t_max = t[alg][:, 0].min(), t[alg][:, 0].mean(), t[alg][:, 0].max()
        algbw = size / t_max / 1e9 if t_max > 0 else 0.0
        row = {"collective": op, "bytes": size, "count": c.count, "type": dt.name,
               "redop": cfg.redop if op in ("allreduce", "reduce_scatter") else "none",
               "algorithm": alg, "resolved": resolved[alg], "P": P, "iters": iters[alg],
               "time_us": t_max * 1e6, "time_min_us": t_min * 1e6, "time_mean_us": t_mean * 1e6,
               "time_median_us": t[alg][:, 1].max() * 1e6, "algbw_GBps": algbw,
               "busbw_GBps": algbw * bus_factor(op, P), "wrong": int(wrong[alg]), "time_s": float(t_max)}
        if alg in c.in_place:
            ip = t[(alg, "in-place")][:, 0]
            row.update(inplace_time_us=ip.max() * 1e6, inplace_time_mean_us=ip.mean() * 1e6,
                       inplace_wrong=int(wrong_in_place[alg]))
        for key, form in ((alg, "out of place"), ((alg, "in-place"), "in place")):
            if key in where:
                row.setdefault("wrong_at", []).extend(
                    {"form": form, "rank": r, "element": i, "expected": e, "got": g} for r, i, e, g in where[key])
        rows.append(row)
    return rows


def run_sweep(cfg, comm=None, watch=None, command=None):
    """Run the sweep described by ``cfg`` on ``comm`` and return the results dict (on every rank).

    Rank 0 prints each row as it is measured (with ``--format nccl-tests``, one comment line per size
    and nccl-tests' tables at the end) and rewrites the results files after every size, so an
    interrupted sweep leaves what it measured (``complete`` false). With ``watch`` (every rank's
    :func:`commlab.provenance.guard`) rank 0's complete results carry their ``provenance`` naming
    ``command`` (default: this process's command line), and the other ranks stop sampling.

    Raises
    ------
    ValueError
        No size of ``cfg`` holds one element (P elements for all-gather), or no op (on every rank).
    RuntimeError
        ``cfg.baseline == "gloo"`` and torch.distributed cannot be imported (on every rank).
    """
    plan = sweep_plan(cfg, (MPI.COMM_WORLD if comm is None else comm).Get_size())
    if not plan:
        raise ValueError(f"no sizes/ops to measure: ops={cfg.ops}, max_bytes={cfg.max_bytes} ({cfg.dtype})")
    comm = (MPI.COMM_WORLD if comm is None else comm).Dup()
    if cfg.baseline == "gloo" and not gloo_available(comm):
        comm.Free()
        raise RuntimeError(NO_TORCH)
    rank0, passes, nccl = comm.Get_rank() == 0, [], cfg.format == "nccl-tests"
    if rank0:
        stat = "mean over ranks of each rank's mean" if nccl else "slowest rank's mean"
        print(f"# commlab collectives on P={comm.Get_size()} ({library()})"
              f", {cfg.dtype}, time = {stat}, {cfg.repeats} passes" + ("" if nccl else f"\n#{HEAD[1:]}"), flush=True)
    for k in range(cfg.repeats):
        rows = []
        passes.append(rows)
        for nbytes in dict.fromkeys(n for n, _ in plan):
            for op in (o for n, o in plan if n == nbytes):
                for row in _measure(op, nbytes, cfg, comm):
                    row["pass"] = k
                    rows.append(row)
                    if rank0 and not nccl:
                        print(line(row), flush=True)
            if rank0:
                write(cfg, header(cfg, comm, False, passes))
                if nccl:
                    print(f"# pass {k + 1} of {cfg.repeats}: {nbytes} B measured", flush=True)
    results = header(cfg, comm, True, passes)
    if watch is not None:  # rank 0 writes the provenance; the others stop sampling
        prov.stamp(results, watch, P=comm.Get_size(), command=command) if rank0 else watch.summary()
    if rank0:
        write(cfg, results)
        report(cfg, results)
    gloo_finish()
    collectives.engine.context.free_context(comm)
    comm.Free()
    return results


def _fail(comm, message):
    """Print ``message`` as an argument error from rank 0 and exit with status 2 on every rank."""
    if comm.Get_rank() == 0:
        print(f"python -m experiments.bench.collectives: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def main(argv=None):
    """Parse the command line, run the sweep, exit non-zero if any result was wrong.

    A bad argument, an unwritable ``--out`` or a busy machine (:func:`experiments.harness.start`) exit 2
    with one error line from rank 0, before any measurement.
    """
    comm = MPI.COMM_WORLD
    cfg = parse_on_every_rank(partial(parse_args, size=comm.Get_size()), argv, comm.Get_rank())  # errors once
    if cfg.baseline == "gloo" and not gloo_available(comm):
        _fail(comm, NO_TORCH)
    watch = harness.start(cfg, comm, paths=[cfg.out + ".json", cfg.out + ".csv"],
                          prog="python -m experiments.bench.collectives")
    if watch is None:
        sys.exit(2)
    results = run_sweep(cfg, comm, watch, command_line("experiments.bench.collectives", argv))
    bad = [r for r in results["rows"] if r["wrong"] or r.get("inplace_wrong")]
    if bad and comm.Get_rank() == 0:
        print(wrong_rows(bad), file=sys.stderr, flush=True)
    sys.exit(1 if bad else 0)


def wrong_rows(rows, limit=4):
    """Return the lines that say where each wrong row was wrong: rank, first wrong element, expected, got.

    Parameters
    ----------
    rows : list of dict
        Result rows with ``wrong`` or ``inplace_wrong`` above 0 (and ``wrong_at``, from the check).
    limit : int
        Ranks named per row at most.

    Examples
    --------
    >>> print(wrong_rows([{"collective": "allreduce", "algorithm": "alltoall", "bytes": 24, "P": 3, "wrong": 6,
    ...                    "wrong_at": [{"form": "out of place", "rank": 0, "element": 0, "expected": 300.0,
    ...                                  "got": 200.0}]}]))
    wrong results (6 elements in 1 row):
      allreduce alltoall 24 B P=3 out of place: rank 0 element 0 expected 300 got 200
    """
    total = sum(r["wrong"] + r.get("inplace_wrong", 0) for r in rows)
    out = [f"wrong results ({total} elements in {len(rows)} row{'s' if len(rows) != 1 else ''}):"]
    for r in rows:
        at = r.get("wrong_at", [])
        head = f"  {r['collective']} {r['algorithm']} {r['bytes']} B P={r['P']}"
        for w in at[:limit]:
            out.append(f"{head} {w['form']}: rank {w['rank']} element {w['element']} expected {w['expected']:g} "
                       f"got {w['got']:g}")
        if len(at) > limit:
            out.append(f"{head}: and {len(at) - limit} more rank(s)")
    return "\n".join(out)


if __name__ == "__main__":
    main()
