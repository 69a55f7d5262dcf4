"""Overhead of ``--trace`` on the trainer's step time: the same training with and without it.

``mpiexec -n P python -m experiments.bench.trace [--repeats 7] [--epochs 4] [--bucket-bytes 16384]``

Each repeat trains the same data-parallel run twice on the ranks, once with the timeline recorder
on and once off (order alternating between repeats, so a drift in the machine's load hits both
alike), and takes each run's step time as the median of its steps' durations on rank 0 (consecutive
``wall_s`` of ``metrics.jsonl``: the whole loop body, the trace's recording included; its gathering
and writing come after the loop). Printed: the ratio traced / untraced per repeat, its median and
range (target: <= 1.03), the ratio of the median durations of all traced and all untraced steps
pooled, the events per step, and the recorder's own cost per event measured in the same process (a ``span`` with
the recorder on and off). Results go to ``results/bench_trace.json`` with the configuration and the
``provenance`` (:mod:`commlab.provenance`: on a busy machine the benchmark refuses to start unless
``--allow-noisy`` marks its file noisy).
"""
import json
import os
import statistics
import sys
import time

from commlab import tracing
from experiments import harness
from training.settings.config import Config
from commlab.file_formats import read_jsonl
from commlab.run_files import run_info
from training.train import run
from training.settings.options import INT32_MAX, integer

__all__ = ["STUDY", "main", "event_cost"]


def event_cost(n=200_000):
    """Return seconds per ``tracing.span`` of an empty body: (recorder off, recorder on).

    Parameters
    ----------
    n : int
        Spans timed in each state.
    """
    out = []
    for on in (False, True):
        tracing.start() if on else tracing.stop()
        t0 = time.perf_counter()
        for _ in range(n):
            with tracing.span("allreduce", "comm"):
                pass
        out.append((time.perf_counter() - t0) / n)
    tracing.stop()
    tracing.start()  # drops the events just made
    tracing.stop()
    return tuple(out)


def _options(p):
    p.add_argument("--epochs", type=integer(1, INT32_MAX), default=4, help="epochs per run (default: %(default)s)")
    p.add_argument("--bucket-bytes", type=integer(1, INT32_MAX), default=16384,
                   help="gradient bucket size in bytes: more buckets, more events per step (default: %(default)s)")


def _step_times(path):
    """Return the step durations (seconds) of a run from its ``metrics.jsonl``.

    A step's duration is the difference of consecutive ``wall_s`` within an epoch (the first step
    of an epoch, which follows the evaluation, is left out).
    """
    rows = read_jsonl(path)
    return [b["wall_s"] - a["wall_s"] for a, b in zip(rows, rows[1:]) if a["epoch"] == b["epoch"]]


def _runs(base, repeats, comm, tmp):
    """Train ``base`` twice per repeat, traced and not; return per-step seconds, steps and events."""
    times, pooled = {"off": [], "on": []}, {"off": [], "on": []}
    steps = events = 0
    run(base.replace(name="warmup", epochs=1), comm)
    for i in range(repeats):
        for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
            path = os.path.join(tmp, f"trace{i}.json")
            s = run(base.replace(name=f"{mode}{i}", trace=path if mode == "on" else ""), comm)
            steps = s["steps"]
            if comm.Get_rank() == 0:
                durations = _step_times(os.path.join(tmp, f"{mode}{i}", "metrics.jsonl"))
                times[mode].append(statistics.median(durations))  # a few steps slowed by other load do not decide
                pooled[mode] += durations
            if mode == "on" and comm.Get_rank() == 0:
                with open(path, encoding="utf-8") as f:
                    events = sum(e["ph"] == "X" for e in json.load(f)["traceEvents"])
    return times, pooled, steps, events


def _run(args, comm):
    """Train the pairs; rank 0 prints the ratios and returns the record."""
    with harness.scratch_folder(comm, "bench_trace-") as tmp:
        base = Config(epochs=args.epochs, bucket_bytes=args.bucket_bytes, run_dir=tmp, progress=False,
                      checkpoint_every=0, keep_checkpoints=1, lr_schedule="constant")
        times, pooled, steps, events = harness.logged(lambda: _runs(base, args.repeats, comm, tmp), os.devnull)
    if comm.Get_rank() != 0:
        return None
    ratios = [on / off for on, off in zip(times["on"], times["off"])]
    off_s, on_s = event_cost()
    per_step = events / (comm.Get_size() * steps) if steps else 0.0
    med = statistics.median(ratios)
    print(f"P={comm.Get_size()}, {base.data}, hidden {list(base.hidden)}, {base.dtype}, batch {base.batch_size}, "
          f"bucket {args.bucket_bytes} B, {args.epochs} epochs ({steps} steps) per run, {args.repeats} repeats")
    print(f"step time off: median {statistics.median(times['off']) * 1e3:.3f} ms, "
          f"on: median {statistics.median(times['on']) * 1e3:.3f} ms")
    both = statistics.median(pooled["on"]) / statistics.median(pooled["off"])
    print(f"traced / untraced step time, per pair: median {med:.3f}, range {min(ratios):.3f}-{max(ratios):.3f} "
          f"(target <= 1.03) {'ok' if med <= 1.03 else 'above target'}; all steps pooled: {both:.3f}")
    print(f"events per step per rank: {per_step:.1f}; span cost: {on_s * 1e6:.2f} us on, {off_s * 1e9:.0f} ns off; "
          f"expected overhead {per_step * on_s / statistics.median(times['off']):.2%} of the step")
    result = {"config": {**base.to_dict(), "repeats": args.repeats}, "run": run_info(comm),
              "step_s_off": times["off"], "step_s_on": times["on"], "ratios": ratios, "ratio_median": med,
              "ratio_min": min(ratios), "ratio_max": max(ratios), "ratio_pooled": both,
              "events_per_step_per_rank": per_step, "span_s_on": on_s, "span_s_off": off_s}
    return result


#: The benchmark as a unit of the harness; ``main(argv)`` returns 0, or 2 after one error line on a bad
#: argument, an unwritable ``--out`` or a busy machine, before any measurement.
STUDY = harness.Study("experiments.bench.trace", "Step time with --trace against without, same run, repeated.",
                      _options, _run, out="results/bench_trace.json", repeats=7)
main = STUDY.main


if __name__ == "__main__":
    sys.exit(main())
