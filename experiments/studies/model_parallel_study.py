"""Model-parallel study: every data x tensor x pipeline grid of P ranks on a wide MLP, and the
pipeline bubble and activation memory of GPipe and 1F1B against the number of micro-batches.

    mpiexec -n 4 python -m experiments.studies.model_parallel_study [--out results/model_parallel.json]
    python -m plots.model_parallel results/model_parallel.json

Grid part: for each factorization P = D x T x Q (data x tensor x pipeline), the hybrid trainer
(:mod:`training.model_parallel.grid_train`) takes ``--steps`` float32 Adam steps of an MLP ``--features`` ->
``--hidden`` -> 10 on synthetic data with global batch ``--batch`` (after one warm-up step).
Measured per grid: step time (the slowest rank's, after a barrier), bytes each rank sent per step
on each axis (data: gradient all-reduce; tensor: the Megatron all-reduces; pipeline: activations
and their gradients), parameters + Adam state per rank, and the pipeline bubble (the fraction of
the pipeline phase a stage spent waiting on its neighbours). Rounds interleave the grids, so every
grid sees the same machine load; each grid's step time is reported as a ratio to the pure
data-parallel grid (D = P) of the same round: median and range over ``--rounds``.

Bubble part: Q = P stages (D = T = 1), m = 1, 2, 4, 8 micro-batches, GPipe and 1F1B: measured
bubble against (Q - 1) / (m + Q - 1), and the activation bytes each stage holds.
Results carry the configuration, the MPI library, P, the host and the ``provenance`` (:mod:`commlab.provenance`:
on a busy machine the study refuses to start unless ``--allow-noisy`` marks its file noisy).
"""
import statistics
import sys
import time

import numpy
from mpi4py import MPI

from experiments import harness
from plots.tables.study_tables import model_parallel_table
from training.settings.config import Config
from training.model_parallel.grid_train import build_hybrid, hybrid_step
from training.model_parallel.grid_report import rank_memory
from commlab.job_control import limit_threads
from commlab.run_files import run_info
from training.model_parallel.pipeline import bubble_formula
from training.settings.options import INT32_MAX, integer, listof

__all__ = ["grids", "measure", "STUDY", "main"]


def _reduce(comm, value, op):
    buf = numpy.array([value], numpy.float64)
    comm.Allreduce(MPI.IN_PLACE, buf, op=op)
    return float(buf[0])


def grids(P, n_linear):
    """Return every (D, T, Q) with D T Q = P and at most ``n_linear`` stages, pure data-parallel first."""
    out = [(P // (t * q), t, q) for t in range(1, P + 1) for q in range(1, min(P, n_linear) + 1)
           if P % (t * q) == 0]
    return sorted(out, key=lambda g: (-g[0], g[2], g[1]))


def measure(cfg, comm, steps):
    """Build the hybrid trainer for ``cfg``, warm up one step, time ``steps`` steps.

    Returns
    -------
    dict
        ``step_s`` (median over steps of the slowest rank's step, seconds), per-axis bytes per
        rank per step (mean over ranks), ``max_state_bytes`` (parameters + optimizer state of the
        most loaded rank), ``bubble`` (mean over stages), ``activation_bytes`` per stage, all on
        every rank.
    """
    t = build_hybrid(cfg, comm)
    try:
        n, B = len(t.ds.y_train), cfg.batch_size // t.grid.D
        x, y = t.xp.asarray(t.ds.x_train, dtype=t.model.dtype), t.xp.asarray(t.ds.y_train)
        times, rows = [], []
        for k in range(steps + 1):
            lo = ((k * cfg.batch_size) + t.grid.d * B) % (n - B)
            comm.Barrier()
            t0 = time.perf_counter()
            r = hybrid_step(t, cfg, comm, x[lo:lo + B], y[lo:lo + B])
            dt = _reduce(comm, time.perf_counter() - t0, MPI.MAX)
            if k:  # the first step allocates buffers and warms caches
                times.append(dt)
                rows.append(r)
        mem = rank_memory(t)
        mine = {ax: statistics.fmean(r[f"{ax}_bytes"] for r in rows) for ax in ("data", "tensor", "pipeline")}
        P = comm.Get_size()
        per_axis = {ax: _reduce(comm, v, MPI.SUM) / P for ax, v in mine.items()}
        bubble = statistics.fmean(r["bubble"] for r in rows) if t.grid.Q > 1 else 0.0
        every = numpy.empty((P, 3))
        comm.Allgather(numpy.array([t.grid.q, bubble, rows[-1]["activation_bytes"]], numpy.float64), every)
        stage_bubble = [(int(q), b, int(a)) for q, b, a in every]
        Q = t.grid.Q
        return {"step_s": statistics.median(times), "bytes_per_rank_per_step": per_axis,
                "max_state_bytes": int(_reduce(comm, mem["param_bytes"] + mem["optimizer_bytes"], MPI.MAX)),
                "max_parameters": int(_reduce(comm, mem["parameters"], MPI.MAX)),
                "bubble": statistics.fmean(statistics.fmean(b for q, b, _ in stage_bubble if q == s)
                                           for s in range(Q)),
                "activation_bytes": [max(a for q, _, a in stage_bubble if q == s) for s in range(Q)]}
    finally:
        t.stage.free()
        t.grid.free()


def _ratio_summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _options(p):
    p.add_argument("--hidden", type=listof(integer(1, 1 << 20)), default="2048,2048,2048,2048", help="hidden widths (units), comma separated")
    p.add_argument("--features", type=integer(1, INT32_MAX), default=2048, help="input features of the synthetic data")
    p.add_argument("--batch", type=integer(1, INT32_MAX), default=64, help="global batch (samples)")
    p.add_argument("--micro-batches", type=integer(1, INT32_MAX), default=4, help="micro-batches per step when Q > 1")
    p.add_argument("--steps", type=integer(1, INT32_MAX), default=5, help="timed steps per grid and round")
    p.add_argument("--rounds", type=integer(1, INT32_MAX), default=3, help="rounds over all grids (median and range)")
    p.add_argument("--bubble-micro-batches", type=listof(integer(1, 4096), least=0), default="1,2,4,8", help="m values of the bubble part ('' skips it)")

    @p.check
    def _every_grid(args):  # each grid the study will measure is a valid training run: checked before any runs
        size = MPI.COMM_WORLD.Get_size()
        if args.batch % args.micro_batches:  # (the grid D = 1, Q = P splits the whole batch, on any P > 1)
            raise ValueError(f"--micro-batches {args.micro_batches} must divide --batch {args.batch}")
        base = _base(args)
        for g in grids(size, len(base.hidden) + 1):
            try:
                base.replace(tensor_parallel=g[1], pipeline_parallel=g[2],
                             micro_batches=args.micro_batches if g[2] > 1 else 1)
            except ValueError as e:
                raise ValueError(f"grid D={g[0]} T={g[1]} Q={g[2]}: {e}") from None
            if g[2] > 1 and (args.batch // g[0]) % args.micro_batches:
                raise ValueError(f"--micro-batches {args.micro_batches} must divide the local batch of every grid "
                                 f"with Q > 1: --batch {args.batch} / D={g[0]} = {args.batch // g[0]} samples")
            if args.batch % g[0]:
                raise ValueError(f"--batch {args.batch} must divide by every grid's data-parallel degree (D={g[0]})")
        for m in args.bubble_micro_batches:
            if args.batch % m:
                raise ValueError(f"--bubble-micro-batches: {m} must divide --batch {args.batch}")


def _base(args):
    """The study's training configuration before the grid is chosen (checked: a ValueError names the field)."""
    return Config(data="synthetic", samples=args.batch * 20 + 256, features=args.features, classes=10,
                  hidden=tuple(args.hidden), dtype="float32", batch_size=args.batch, progress=False, threads=1,
                  algorithm="ring", timeout=600.0)


def _grid_part(args, base, comm):
    """Measure every grid, the grids taking turns round by round; return the grids' result entries."""
    every = grids(comm.Get_size(), len(base.hidden) + 1)
    rows = {g: [] for g in every}
    for r in range(args.rounds):
        for g in every:
            m = args.micro_batches if g[2] > 1 else 1
            cfg = base.replace(tensor_parallel=g[1], pipeline_parallel=g[2], micro_batches=m)
            rows[g].append(measure(cfg, comm, args.steps))
            if comm.Get_rank() == 0:
                x = rows[g][-1]
                print(f"round {r} D={g[0]} T={g[1]} Q={g[2]} m={m}: step {x['step_s'] * 1e3:.1f} ms, bytes/step "
                      + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in x["bytes_per_rank_per_step"].items())
                      + f", state {x['max_state_bytes'] / 1e6:.1f} MB, bubble {x['bubble']:.2f}", flush=True)
    out = []
    for g, xs in rows.items():
        ratio = [x["step_s"] / b["step_s"] for x, b in zip(xs, rows[every[0]])]
        out.append({"D": g[0], "T": g[1], "Q": g[2], "micro_batches": args.micro_batches if g[2] > 1 else 1,
                    "step_s": _ratio_summary([x["step_s"] for x in xs]), "step_ratio_to_dp": _ratio_summary(ratio),
                    "bytes_per_rank_per_step": xs[-1]["bytes_per_rank_per_step"],
                    "max_state_bytes": xs[-1]["max_state_bytes"], "max_parameters": xs[-1]["max_parameters"],
                    "bubble": _ratio_summary([x["bubble"] for x in xs]),
                    "activation_bytes": xs[-1]["activation_bytes"]})
    return out


def _bubble_part(args, base, comm):
    """Measure GPipe and 1F1B on Q = P stages for each m of ``--bubble-micro-batches``; return the entries."""
    P, out = comm.Get_size(), []
    for m in args.bubble_micro_batches:
        for sched in ("gpipe", "1f1b"):
            cfg = base.replace(pipeline_parallel=P, micro_batches=m, schedule=sched)
            xs = [measure(cfg, comm, args.steps) for _ in range(args.rounds)]
            out.append({"Q": P, "micro_batches": m, "schedule": sched, "formula": bubble_formula(P, m),
                        "bubble": _ratio_summary([x["bubble"] for x in xs]),
                        "step_s": _ratio_summary([x["step_s"] for x in xs]),
                        "activation_bytes": xs[-1]["activation_bytes"]})
            if comm.Get_rank() == 0:
                b = out[-1]
                print(f"bubble Q={P} m={m} {sched}: measured {b['bubble']['median']:.2f} "
                      f"({b['bubble']['min']:.2f}-{b['bubble']['max']:.2f}), formula {b['formula']:.2f}, activation "
                      f"bytes per stage {[round(a / 1e6, 2) for a in b['activation_bytes']]} MB", flush=True)
    return out


def _run(args, comm):
    """Run the grid and bubble parts; return the record."""
    limit_threads(1)  # one BLAS thread per rank: the ranks share the cores
    hidden = tuple(args.hidden)
    base = _base(args)
    return {"config": {**vars(args), "hidden": list(hidden)}, "run": run_info(comm),
            "grids": _grid_part(args, base, comm), "bubble": _bubble_part(args, base, comm)}


#: The study as a unit of the harness; ``main(argv)`` runs the grid and bubble parts on ``MPI.COMM_WORLD``,
#: rank 0 writes the results and prints the table; 2 when an argument is bad, the results file cannot be
#: written or the machine is busy, found before anything runs, on every rank.
STUDY = harness.Study("experiments.studies.model_parallel_study", __doc__.split("\n\n")[0], _options, _run,
                      out="results/model_parallel.json", table=model_parallel_table)
main = STUDY.main


if __name__ == "__main__":
    sys.exit(main())
