"""Serving study: latency against offered load per balancing policy with one 4x-slow replica,
replicated against tensor-parallel replicas at equal rank count, and the tensor-parallel
all-reduce's time per algorithm and message size.

    mpiexec -n 4 python -m experiments.serving_study [--out results/serving] [--repeats 3]
    python -m plots.serving results/serving/serving_study.json

Without ``--checkpoint`` the study first trains its model (digits, 64-1024-10, 5 epochs) into
``OUT/model``. Parts, each repeated ``--repeats`` times:

A. Front + 3 replicas, replica 2 ``--slow`` times slower, every batch costing ``--service-ms`` of
   emulated accelerator time (so the study measures queueing and balancing, not which process the
   two cores happen to run). Capacity = throughput of a closed loop of 32 clients under
   least-outstanding; then open-loop Poisson load at each ``--fractions`` of it, for every policy
   (policies interleaved at each load). Reported: p50/p95/p99 per point, and p99(round-robin) /
   p99(policy) at 80 % of capacity.
B. Ranks 0-2: 2 replicated replicas against 1 tensor-parallel replica of T = 2 (same 3 ranks, real
   forward, no emulated time, batches sent without waiting): capacity (closed loop, 16 clients) and latency at a light load.
C. Ranks 0-1: ``collectives.allreduce`` of float64 vectors of the sizes the tensor-parallel forward
   sends (batch x classes, batch x hidden) for every algorithm, per-call median over repeats, and
   what ``auto`` picks at that size.

Rank 0 writes ``OUT/serving_study.json`` (configuration, MPI library, P, host, every point) and
prints the tables as markdown.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

import numpy
from mpi4py import MPI

import collectives
from collectives.select import select_allreduce
from experiments.outputs import unwritable
from inference.balance import POLICIES
from inference.config import ServeConfig
from inference.serve import run as serve
from training.checkpoint import root_bytes
from training.config import Config
from training.metrics import run_info
from training.train import run as train

__all__ = ["main", "policy_sweep", "replicated_vs_tensor", "allreduce_sizes"]

KEEP = ("requests", "answered", "correct", "failed", "latency_p50_ms", "latency_p95_ms", "latency_p99_ms",
        "throughput_rps", "mean_batch_size", "comm_mean_ms", "compute_mean_ms", "queue_mean_ms")
ALGOS = ("ring", "tree", "recursive_doubling", "rabenseifner", "mpi", "auto")


def _point(cfg, comm, **tags):
    s = serve(cfg, comm)
    return None if s is None else {**tags, **{k: s[k] for k in KEEP}}


def _idle(comm):
    """Wait for the other ranks at a barrier without spinning a core."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def policy_sweep(args, ckpt, comm, out):
    """Part A: return the points of every policy at every load fraction, and the capacities."""
    base = ServeConfig(checkpoint=ckpt, replicas=3, straggler=f"2:{args.slow}", service_ms=args.service_ms,
                       max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, run_dir=os.path.join(out, "points"))
    points, caps = [], []
    for rep in range(args.repeats):
        cap = _point(ServeConfig(**{**base.to_dict(), "clients": 32, "requests": 3000, "seed": rep}), comm)
        cap = root_float(comm, cap["throughput_rps"] if cap else 0.0)
        caps.append(cap)
        for frac in args.fractions:
            rate = frac * cap
            for pol in POLICIES:
                cfg = ServeConfig(**{**base.to_dict(), "balance": pol, "rate": rate, "seed": rep,
                                     "requests": max(300, int(rate * args.seconds))})
                p = _point(cfg, comm, part="policies", policy=pol, fraction=frac, offered_rps=rate,
                           capacity_rps=cap, repeat=rep)
                if p:
                    points.append(p)
                    print(f"A r{rep} {pol:18s} {frac:.2f} x {cap:.0f} req/s: p50 {p['latency_p50_ms']:.2f} ms "
                          f"p99 {p['latency_p99_ms']:.2f} ms", flush=True)
    return points, caps


def root_float(comm, value):
    """Broadcast rank 0's float to every rank of ``comm``."""
    buf = numpy.array([value], numpy.float64)
    comm.Bcast(buf, root=0)
    return float(buf[0])


def replicated_vs_tensor(args, ckpt, comm, out):
    """Part B on 3 ranks: 2 x T=1 against 1 x T=2; capacity and light-load latency per repeat."""
    pts = []
    for rep in range(args.repeats):
        for R, T in ((2, 1), (1, 2)):
            base = ServeConfig(checkpoint=ckpt, replicas=R, tensor_parallel=T, max_batch=args.max_batch,
                               max_wait_ms=0.0, seed=rep, run_dir=os.path.join(out, "points"),
                               algorithm=args.algorithm)
            cap = _point(ServeConfig(**{**base.to_dict(), "clients": 16, "requests": 6000}), comm,
                         part="tp-capacity", replicas=R, tensor_parallel=T, repeat=rep)
            light = _point(ServeConfig(**{**base.to_dict(), "rate": args.light_rps, "requests": 500}), comm,
                           part="tp-light", replicas=R, tensor_parallel=T, repeat=rep)
            for p in (cap, light):
                if p:
                    pts.append(p)
                    print(f"B r{rep} R={R} T={T} {p['part']}: {p['throughput_rps']:.0f} req/s, "
                          f"p50 {p['latency_p50_ms']:.2f} ms, p99 {p['latency_p99_ms']:.2f} ms", flush=True)
    return pts


def allreduce_sizes(args, comm, hidden):
    """Part C on 2 ranks: per-call all-reduce time (us) of each algorithm and size, median of repeats."""
    sizes = sorted({b * c for b in (1, args.max_batch) for c in (10, hidden)})
    rows = []
    for n in sizes:
        x = numpy.random.default_rng(comm.rank).standard_normal(n)
        times = {a: [] for a in ALGOS}
        for a in ALGOS:
            collectives.allreduce(x, comm=comm, algorithm=a)  # warm-up: context and schedule cache
        for _ in range(args.repeats + 2):
            for a in ALGOS:  # interleaved, so every algorithm sees the same load
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(args.iterations):
                    collectives.allreduce(x, comm=comm, algorithm=a)
                times[a].append((time.perf_counter() - t0) / args.iterations * 1e6)
        med = {a: statistics.median(v) for a, v in times.items()}
        best = min((a for a in ALGOS if a != "auto"), key=med.get)
        made = min((a for a in ALGOS if a not in ("auto", "mpi")), key=med.get)
        rows.append({"elements": n, "bytes": n * 8, "us": med, "range_us": {a: [min(v), max(v)] for a, v in times.items()},
                     "fastest": best, "fastest_hand_made": made, "auto_picks": select_allreduce(comm.size, n * 8)})
    return rows


def _train_model(out, comm):
    path = os.path.join(out, "model")

    def clear():
        shutil.rmtree(path, ignore_errors=True)
        return b""

    root_bytes(comm, clear)
    train(Config(hidden=(1024,), epochs=5, run_dir=out, name="model", progress=False, checkpoint_every=0,
                 keep_checkpoints=1), comm)
    return path


def main(argv=None):
    """Run the study on 4 ranks; return the exit status."""
    p = argparse.ArgumentParser(prog="mpiexec -n 4 python -m experiments.serving_study", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/serving", help="results folder")
    p.add_argument("--checkpoint", default="", help="training run to serve (default: train OUT/model first)")
    p.add_argument("--repeats", type=int, default=3, help="repeats of every point")
    p.add_argument("--fractions", type=lambda s: [float(v) for v in s.split(",")],
                   default=[0.2, 0.4, 0.6, 0.7, 0.8, 0.9], help="offered load as fractions of capacity")
    p.add_argument("--seconds", type=float, default=1.5, help="length of an open-loop point (s of arrivals)")
    p.add_argument("--slow", type=float, default=4.0, help="service-time factor of the slow replica")
    p.add_argument("--service-ms", type=float, default=4.0, help="emulated accelerator time per batch (ms)")
    p.add_argument("--max-batch", type=int, default=4, help="dynamic batching: largest batch")
    p.add_argument("--max-wait-ms", type=float, default=4.0, help="dynamic batching: longest wait (ms)")
    p.add_argument("--light-rps", type=float, default=200.0, help="part B's light load (requests/s)")
    p.add_argument("--algorithm", default="auto", help="part B's tensor-parallel all-reduce algorithm")
    p.add_argument("--iterations", type=int, default=300, help="part C: all-reduce calls per timing")
    args = p.parse_args(argv)
    world = MPI.COMM_WORLD
    if world.size != 4:
        if world.rank == 0:
            print("error: the serving study runs on 4 ranks (mpiexec -n 4)", file=sys.stderr)
        return 2
    results = os.path.join(args.out, "serving_study.json")

    def check():
        why = unwritable(results)
        if why:
            raise OSError(why)
        return b""

    try:
        root_bytes(world, check)
    except RuntimeError as e:
        if world.rank == 0:
            print(f"error: {e}", file=sys.stderr)
        return 2
    ckpt = args.checkpoint or _train_model(args.out, world)
    points, caps = policy_sweep(args, ckpt, world, args.out)
    three = world.Split(0 if world.rank < 3 else MPI.UNDEFINED, world.rank)
    tp = replicated_vs_tensor(args, ckpt, three, args.out) if three != MPI.COMM_NULL else []
    _idle(world)
    two = world.Split(0 if world.rank < 2 else MPI.UNDEFINED, world.rank)
    hidden = json.load(open(os.path.join(ckpt, "config.json")))["config"]["hidden"][0] if world.rank == 0 else 0
    hidden = int(root_float(world, hidden))
    ar = allreduce_sizes(args, two, hidden) if two != MPI.COMM_NULL else []
    _idle(world)
    if world.rank == 0:
        doc = {"study": vars(args), "checkpoint": ckpt, "run": run_info(world), "capacities_rps": caps,
               "points": points + tp, "allreduce": ar, "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
        doc["ratios_at_80"] = ratios(points, 0.8)
        with open(results, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
        print(markdown(doc))
        print(f"wrote {results}")
    return 0


def ratios(points, frac):
    """Return p99(round-robin) / p99(policy) at load ``frac`` per policy: median and range over repeats."""
    out = {}
    for pol in POLICIES[1:]:
        r = [a["latency_p99_ms"] / b["latency_p99_ms"] for a in points for b in points
             if a["policy"] == "round-robin" and b["policy"] == pol and a["repeat"] == b["repeat"]
             and a["fraction"] == b["fraction"] == frac]
        out[pol] = {"median": statistics.median(r), "min": min(r), "max": max(r)} if r else None
    return out


def _med(vals):
    return f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"


def markdown(doc):
    """Return the study's tables (medians over repeats, range in parentheses) as markdown."""
    pts, lines = doc["points"], []
    fracs = sorted({p["fraction"] for p in pts if p["part"] == "policies"})
    lines += ["| load (x capacity) | " + " | ".join(f"{pol} p50 / p99 ms" for pol in POLICIES) + " |",
              "|---:|" + "---:|" * len(POLICIES)]
    for f in fracs:
        cells = []
        for pol in POLICIES:
            g = [p for p in pts if p["part"] == "policies" and p["policy"] == pol and p["fraction"] == f]
            cells.append(f"{statistics.median(p['latency_p50_ms'] for p in g):.2f} / "
                         f"{_med([p['latency_p99_ms'] for p in g])}")
        lines.append(f"| {f:.2f} | " + " | ".join(cells) + " |")
    lines += ["", "| replicas x T | capacity req/s | light-load p50 ms | light-load p99 ms | all-reduce ms/request |",
              "|---|---:|---:|---:|---:|"]
    for R, T in ((2, 1), (1, 2)):
        cap = [p for p in pts if p["part"] == "tp-capacity" and p["replicas"] == R]
        light = [p for p in pts if p["part"] == "tp-light" and p["replicas"] == R]
        if cap and light:
            lines.append(f"| {R} x {T} | {_med([p['throughput_rps'] for p in cap])} | "
                         f"{_med([p['latency_p50_ms'] for p in light])} | {_med([p['latency_p99_ms'] for p in light])} | "
                         f"{statistics.median(p['comm_mean_ms'] for p in light):.3f} |")
    lines += ["", "| elements (bytes) | " + " | ".join(ALGOS) + " | fastest | fastest hand-made | auto picks |",
              "|---|" + "---:|" * (len(ALGOS) + 3)]
    for r in doc["allreduce"]:
        lines.append(f"| {r['elements']} ({r['bytes']}) | " + " | ".join(f"{r['us'][a]:.1f}" for a in ALGOS)
                     + f" | {r['fastest']} | {r['fastest_hand_made']} | {r['auto_picks']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
