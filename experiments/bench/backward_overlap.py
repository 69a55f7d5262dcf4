"""Overlap of the gradient all-reduce with the backward pass: step time against max(compute, comm).

``mpiexec -n P python -m experiments.bench.backward_overlap [--repeats 5] [--steps 8] [--hidden 2048,2048,2048,2048]
[--batch 256] [--bucket-bytes 16777216] [--algorithm auto]``

One data-parallel MLP (``--features`` inputs, ``--hidden`` widths, 10 classes, float32, SGD; random
data, each rank its ``--batch / P`` samples), measured in four ways in the same run, each as the
wall time of ``--steps`` steps between two barriers divided by the steps:

* ``compute``: forward, backward, the non-finite check and the optimizer step, no communication;
* ``comm``: the communication of a step alone, on the same gradient: the non-finite flag's
  all-reduce and the bucketed gradient all-reduce (``AllreduceHook``, blocking);
* ``serial``: ``training.dp.data_parallel.train_step`` without overlap (all-reduce after the backward pass);
* ``overlap``: ``train_step`` with overlap (each bucket started during the backward pass,
  :mod:`training.dp.overlap`).

Each repeat measures the four in a rotated order (so a drift in the machine's load hits all alike)
after one warm-up step each; ``compute`` and ``comm`` share one model, ``serial`` and ``overlap``
have one each, started from the same parameters. Printed: per mode the median and range of the per-repeat step times,
and the ratios per repeat -- overlap / max(compute, comm) (target <= 1.15), serial / max(compute,
comm), overlap / serial -- as median and range; the load average (1 minute) before and after; and
whether both runs ended bitwise equal (they take the same steps on the same data). Results go to
``--out`` (JSON) with the configuration, the MPI library and the ``provenance`` (:mod:`commlab.provenance`:
on a busy machine the benchmark refuses to start unless ``--allow-noisy`` marks its file noisy).
"""
import os
import statistics
import sys
import time

import numpy
from mpi4py import MPI

import collectives
import collectives.engine.context
from collectives import ALGORITHMS
from experiments import harness
from commlab.job_control import limit_threads
from commlab.run_files import run_info
from training.model.nn import SoftmaxCrossEntropy, build_mlp
from training.model.optim import SGD
from training.dp.hooks import AllreduceHook, bucket_bounds
from training.dp.data_parallel import any_rank, compute_gradient, is_finite, train_step
from training.settings.options import INT32_MAX, integer, real, text

__all__ = ["STUDY", "main", "MODES"]

#: Modes measured in each repeat, in the first repeat's order.
MODES = ("compute", "comm", "serial", "overlap")


def _options(p):
    p.add_argument("--steps", type=integer(1, INT32_MAX), default=8, help="timed steps per measurement (default: %(default)s)")
    p.add_argument("--features", type=integer(1, INT32_MAX), default=1024, help="input features (default: %(default)s)")
    p.add_argument("--hidden", type=text(), default="2048,2048,2048,2048", help="hidden widths, comma separated "
                   "(default: %(default)s)")
    p.add_argument("--batch", type=integer(1, INT32_MAX), default=256, help="global batch in samples, split over the P ranks "
                   "(default: %(default)s)")
    p.add_argument("--bucket-bytes", type=integer(1, INT32_MAX), default=16 << 20, help="gradient bucket size in bytes, "
                   "last layer first (default: %(default)s, one 2048 x 2048 layer)")
    p.add_argument("--algorithm", type=text(), default="auto", help="all-reduce algorithm (default: %(default)s)")
    p.add_argument("--timeout", type=real(0, 1e15), default=None, help="seconds any round may wait for a peer "
                   "(default: no limit)")
    p.add_argument("--threads", type=integer(0, INT32_MAX), default=0, help="BLAS threads per rank; 0: cores / ranks on the "
                   "node (default: %(default)s)")


def _check(args, comm):
    """Check the command line for the job's ranks (a ValueError names the option); ``--hidden`` becomes its
    list of widths."""
    try:
        args.hidden = [int(h) for h in args.hidden.split(",") if h.strip()]
    except ValueError:
        raise ValueError(f"--hidden must be comma-separated integers, got {args.hidden!r}") from None
    if min(args.hidden, default=1) < 1:
        raise ValueError("every --hidden width must be >= 1")
    if args.algorithm not in ALGORITHMS:
        raise ValueError(f"--algorithm must be one of {', '.join(ALGORITHMS)}, got {args.algorithm!r}")
    if args.timeout is not None and not 0 < args.timeout < float("inf"):
        raise ValueError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if args.batch % comm.size:
        raise ValueError(f"--batch {args.batch} must be a positive multiple of P = {comm.size}")


class _Setup:
    """One model, optimizer and data for a mode; the same initial parameters for every mode."""

    def __init__(self, args, comm, overlap):
        sizes = [args.features, *args.hidden, 10]
        self.model = build_mlp(sizes, dtype="float32", seed=0)
        self.opt = SGD(self.model.params, self.model.grads, lr=1e-3, momentum=0.9)
        self.ce = SoftmaxCrossEntropy()
        buckets = bucket_bounds(self.model.slices, 4, args.bucket_bytes)
        self.hook = AllreduceHook(comm, args.algorithm, buckets, args.timeout, overlap)
        rng = numpy.random.default_rng(comm.rank)
        local = args.batch // comm.size
        self.x = rng.standard_normal((local, args.features)).astype(numpy.float32)  # (B / P, F)
        self.y = rng.integers(0, 10, local)


def _one(mode, s, comm, timeout):
    """Run one step of ``mode`` on setup ``s``."""
    if mode == "compute":
        loss = compute_gradient(s.model, s.ce, s.x, s.y)
        is_finite(loss, s.model.grads)
        s.opt.step()
    elif mode == "comm":
        any_rank(False, comm, timeout)
        s.hook(s.model.grads)
    else:
        r = train_step(s.model, s.ce, s.opt, s.hook, comm, s.x, s.y)
        assert not r["skipped"], "a step was skipped: the benchmark's data or learning rate is off"


def _timed(mode, s, comm, steps, timeout):
    """Return seconds per step of ``mode`` over ``steps`` steps, between barriers (after one warm-up)."""
    _one(mode, s, comm, timeout)
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        _one(mode, s, comm, timeout)
    comm.Barrier()
    return (time.perf_counter() - t0) / steps


def _span(values, fmt="{:.3f}"):
    return f"median {fmt.format(statistics.median(values))} (range {fmt.format(min(values))}-{fmt.format(max(values))})"


def _run(args, comm):
    """Time the four modes, interleaved; rank 0 prints the figures and returns the record."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    threads = args.threads or max(1, (os.cpu_count() or 1) // node.size)
    node.Free()
    limit_threads(threads)
    alone = _Setup(args, comm, False)  # compute and comm alone share one model
    setups = {"compute": alone, "comm": alone, "serial": _Setup(args, comm, False),
              "overlap": _Setup(args, comm, True)}
    load0 = os.getloadavg()[0]
    times = {m: [] for m in MODES}
    for i in range(args.repeats):
        order = MODES[i % len(MODES):] + MODES[:i % len(MODES)]
        for m in order:
            times[m].append(_timed(m, setups[m], comm, args.steps, args.timeout))
    load1 = os.getloadavg()[0]
    alone.hook(alone.model.grads)
    resolved = collectives.engine.context.last_stats(comm).get("algorithm")  # what the last bucket ran (auto resolved)
    same = bool(numpy.array_equal(setups["serial"].model.params, setups["overlap"].model.params))
    same = comm.allreduce(same, op=MPI.LAND)
    if comm.Get_rank() != 0:
        return None
    bound = [max(c, m) for c, m in zip(times["compute"], times["comm"])]
    ratios = {"overlap_vs_bound": [o / b for o, b in zip(times["overlap"], bound)],
              "serial_vs_bound": [s / b for s, b in zip(times["serial"], bound)],
              "overlap_vs_serial": [o / s for o, s in zip(times["overlap"], times["serial"])]}
    model = setups["compute"].model
    nb = len(setups["serial"].hook.buckets or [0])
    print(f"P={comm.size}, MLP {args.features}-{'-'.join(map(str, args.hidden))}-10 float32 "
          f"({model.size * 4 / 2**20:.1f} MiB of gradient, {nb} buckets of >= {args.bucket_bytes} B), batch "
          f"{args.batch}, algorithm {args.algorithm} ({resolved}), {threads} BLAS thread(s) per rank, {args.steps} steps x "
          f"{args.repeats} repeats; load average {load0:.2f} before, {load1:.2f} after")
    for m in MODES:
        print(f"{m:>8} step: {_span([t * 1e3 for t in times[m]], '{:.1f}')} ms")
    print(f"overlap / max(compute, comm): {_span(ratios['overlap_vs_bound'])} (target <= 1.15: "
          f"{'met' if statistics.median(ratios['overlap_vs_bound']) <= 1.15 else 'not met'})")
    print(f" serial / max(compute, comm): {_span(ratios['serial_vs_bound'])}")
    print(f"overlap / serial:             {_span(ratios['overlap_vs_serial'])}")
    print(f"overlap and serial runs ended bitwise equal: {same}")
    result = {"config": {k: v for k, v in vars(args).items()}, "run": run_info(comm), "threads": threads,
              "load_average_before": load0, "load_average_after": load1, "step_s": times, "ratios": ratios,
              "bitwise_equal": same, "resolved_algorithm": resolved, "gradient_bytes": model.size * 4, "buckets": nb}
    return result


#: The benchmark as a unit of the harness; ``main(argv)`` returns 0, or 2 after one error line from rank 0 on a
#: bad argument or a busy machine, before any measurement.
STUDY = harness.Study("experiments.bench.backward_overlap", "Step time with and without overlap of the gradient all-reduce "
                      "and the backward pass, against max(compute, communication) measured in the same run.",
                      _options, _run, out="results/bench_overlap.json", repeats=5, check=_check)
main = STUDY.main


if __name__ == "__main__":
    sys.exit(main())
