"""Serving study: latency against offered load per balancing policy with one 4x-slow replica,
replicated against tensor-parallel replicas at equal rank count, the tensor-parallel all-reduce's
time per algorithm at the sizes the forward sends, and serving latency per all-reduce algorithm.

    mpiexec -n 4 python -m experiments.studies.serving_study [--out results/serving] [--repeats 3] [--parts ABCDE]
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
C. Groups of P = 2 (ranks 0-1), P = 3 (ranks 0-2) and P = 4: ``collectives.allreduce`` of float64 vectors of the sizes a
   tensor-parallel forward of T = P sends (T x padded batch rows x the row-parallel layer's outputs,
   the rank-order rule of :mod:`inference.replicas.tensor`) and of a plain all-reduce of the partial (padded
   rows x outputs), for every algorithm, interleaved, per-call median and range over repeats, and
   what ``auto`` picks at that size.
D. One tensor-parallel replica of T = 2 (ranks 0-2) and of T = 3 (ranks 0-3) under ``--tp-clients``
   closed-loop clients (default 1: each request alone, so latency is service time without queueing),
   for each of ``--tp-algorithms`` (interleaved in every repeat): latency p50/p99 and all-reduce
   time per request; median and range over repeats.
E. Front + one replica (ranks 0-1): throughput, mean batch size, p50/p99 and goodput against offered
   load from 0.2x to 3x the replica's capacity, with and without a latency objective
   (:mod:`experiments.studies.load_sweep`).

Rank 0 writes ``OUT/serving_study.json`` (configuration, MPI library, P, host, every point, the
``provenance`` of :mod:`commlab.provenance`) and prints the tables as markdown. On a busy machine the
study refuses to start unless ``--allow-noisy`` marks its results noisy.
"""
import argparse
import os
import shutil
import statistics
import sys
import time

import numpy
from mpi4py import MPI
from tabulate import tabulate

import collectives
from collectives.model.auto import select_allreduce
from experiments import harness
from experiments.studies.load_sweep import add_options as add_load_options
from experiments.studies.load_sweep import capacity, load_sweep
from plots.serving import load_table
from inference.policies.balance import POLICIES
from inference.serve_config import ServeConfig
from inference.replicas.predictor import forward_rows, load_spec
from inference.replicas.tensor import row_parallel_widths
from inference.serve import run as serve
from training.runtime.checkpoint import root_bytes
from training.settings.config import Config
from commlab.run_files import run_info
from training.train import run as train
from training.settings.options import INT32_MAX, Parser, integer, listof, parsed_by, real, text

__all__ = ["main", "policy_sweep", "replicated_vs_tensor", "allreduce_sizes", "tp_algorithms", "markdown"]

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


def allreduce_sizes(args, comm, widths):
    """Part C: per-call all-reduce time (us) of each algorithm and size on ``comm``, median of repeats.

    Sizes: for each row-parallel width ``c``, ``P * rows * c`` elements (what the rank-order rule
    sends at T = P) and ``rows * c`` (a plain all-reduce of the partial), ``rows`` the padded batch
    of :class:`inference.replicas.predictor.Predictor` (``--max-batch`` rounded up to 8).
    """
    rows_per_forward = forward_rows(args.max_batch)
    slotted = {comm.size * rows_per_forward * c for c in widths}
    sizes = sorted(slotted | {rows_per_forward * c for c in widths})
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
        rows.append({"P": comm.size, "elements": n, "bytes": n * 8, "rank_order": n in slotted, "us": med,
                     "range_us": {a: [min(v), max(v)] for a, v in times.items()}, "fastest": best,
                     "fastest_hand_made": made, "auto_picks": select_allreduce(comm.size, n * 8)})
        if comm.rank == 0:
            print(f"C P={comm.size} {n * 8} B: " + " ".join(f"{a} {med[a]:.0f}" for a in ALGOS)
                  + f" us; auto picks {rows[-1]['auto_picks']}", flush=True)
    return rows


def tp_algorithms(args, ckpt, comm, out):
    """Part D: one replica of T = P - 1 under ``--tp-clients`` closed-loop clients, per ``--tp-algorithms``; a point per repeat."""
    pts, T = [], comm.size - 1
    for rep in range(args.repeats):
        for a in args.tp_algorithms:  # interleaved: every algorithm sees the same load in every repeat
            cfg = ServeConfig(checkpoint=ckpt, replicas=1, tensor_parallel=T, max_batch=args.max_batch,
                              max_wait_ms=0.0, clients=args.tp_clients, requests=args.tp_requests, seed=rep,
                              algorithm=a, run_dir=os.path.join(out, "points"))
            p = _point(cfg, comm, part="tp-algorithm", tensor_parallel=T, algorithm=a, repeat=rep)
            if p:
                pts.append(p)
                print(f"D r{rep} T={T} {a:18s}: p50 {p['latency_p50_ms']:.2f} ms, p99 {p['latency_p99_ms']:.2f} ms, "
                      f"all-reduce {p['comm_mean_ms']:.3f} ms/request", flush=True)
    return pts


def _train_model(out, comm):
    path = os.path.join(out, "model")

    def clear():
        shutil.rmtree(path, ignore_errors=True)
        return b""

    root_bytes(comm, clear)
    train(Config(hidden=(1024,), epochs=5, run_dir=out, name="model", progress=False, checkpoint_every=0,
                 keep_checkpoints=1), comm)
    return path


def _algorithms(text):
    names = [a for a in text.split(",") if a]
    bad = [a for a in names if a not in collectives.ALGORITHMS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(collectives.ALGORITHMS)}, "
                                         f"got {text!r}")
    return names


def _parts(text):
    if not text or set(text) - set("ABCDE"):
        raise argparse.ArgumentTypeError(f"expected letters of ABCDE, got {text!r}")
    return text


def _parser():
    """Return the study's argument parser."""
    p = Parser(prog="mpiexec -n 4 python -m experiments.studies.serving_study", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=text(), default="", help="training run to serve (default: train OUT/model first)")
    p.add_argument("--parts", type=parsed_by(_parts, 'parts to run'), default="ABCDE", help="parts to run (letters of ABCDE)")
    p.add_argument("--fractions", type=listof(real(0, 100, low_open=True)),
                   default=[0.2, 0.4, 0.6, 0.7, 0.8, 0.9], help="offered load as fractions of capacity")
    p.add_argument("--seconds", type=real(0, 1e15, low_open=True), default=1.5, help="length of an open-loop point (s of arrivals)")
    p.add_argument("--slow", type=real(0, 1e15, low_open=True), default=4.0, help="service-time factor of the slow replica")
    p.add_argument("--service-ms", type=real(0, 1e15, low_open=True), default=4.0, help="emulated accelerator time per batch (ms)")
    p.add_argument("--max-batch", type=integer(1, INT32_MAX), default=4, help="dynamic batching: largest batch")
    p.add_argument("--max-wait-ms", type=real(0, 1e15), default=4.0, help="dynamic batching: longest wait (ms)")
    p.add_argument("--light-rps", type=real(0, 1e15, low_open=True), default=200.0, help="part B's light load (requests/s)")
    p.add_argument("--algorithm", type=text(), default="auto", help="part B's tensor-parallel all-reduce algorithm")
    p.add_argument("--iterations", type=integer(1, INT32_MAX), default=300, help="part C: all-reduce calls per timing")
    p.add_argument("--tp-algorithms", type=parsed_by(_algorithms, 'part D: all-reduce algorithms compared'), default=["auto", "mpi", "recursive_doubling", "ring"],
                   help="part D: all-reduce algorithms compared (comma-separated)")
    p.add_argument("--tp-requests", type=integer(1, INT32_MAX), default=300, help="part D: requests per point")
    p.add_argument("--tp-clients", type=integer(1, INT32_MAX), default=1,
                   help="part D: closed-loop clients (1: one request at a time, latency without queueing)")
    add_load_options(p)
    harness.add_options(p, out="results/serving", folder=True, repeats=3)
    return p


def main(argv=None):
    """Run the study on 4 ranks; return the exit status.

    0, or 2 after one error line (rank 0) before anything runs: a ``--checkpoint`` that is missing
    or unusable (:func:`inference.replicas.predictor.load_spec`'s checks), not 4 ranks, an unwritable results
    file, or a busy machine (:func:`experiments.harness.start`).
    """
    args = _parser().parse_args(argv)
    world = MPI.COMM_WORLD
    results = os.path.join(args.out, "serving_study.json")
    try:  # CheckpointError is a ValueError
        try:
            if args.checkpoint:
                load_spec(args.checkpoint, world)  # read and checked once, before hours of measurement
        except ValueError as e:
            raise ValueError(f"--checkpoint: {e}") from None
        if world.size != 4:
            raise ValueError("the serving study runs on 4 ranks (mpiexec -n 4)")
    except (RuntimeError, ValueError) as e:
        if world.rank == 0:
            print(f"error: {e}", file=sys.stderr)
        return 2
    watch = harness.start(args, world, paths=[results])  # before the model is trained
    if watch is None:
        return 2
    ckpt = args.checkpoint or _train_model(args.out, world)
    points, caps = policy_sweep(args, ckpt, world, args.out) if "A" in args.parts else ([], [])
    three = world.Split(0 if world.rank < 3 else MPI.UNDEFINED, world.rank)
    tp = replicated_vs_tensor(args, ckpt, three, args.out) if "B" in args.parts and three != MPI.COMM_NULL else []
    _idle(world)
    ar = []
    if "C" in args.parts:
        widths = row_parallel_widths(load_spec(ckpt, world)[0].weights)
        two = world.Split(0 if world.rank < 2 else MPI.UNDEFINED, world.rank)
        ar = allreduce_sizes(args, two, widths) if two != MPI.COMM_NULL else []
        _idle(world)
        ar += allreduce_sizes(args, three, widths) if three != MPI.COMM_NULL else []
        _idle(world)
        ar += allreduce_sizes(args, world, widths)
    if "D" in args.parts:
        tp += tp_algorithms(args, ckpt, three, args.out) if three != MPI.COMM_NULL else []
        _idle(world)
        tp += tp_algorithms(args, ckpt, world, args.out)
    load = []
    if "E" in args.parts:
        _idle(world)
        two = world.Split(0 if world.rank < 2 else MPI.UNDEFINED, world.rank)
        load = load_sweep(args, ckpt, two, args.out) if two != MPI.COMM_NULL else []
        _idle(world)
    doc = None if world.rank else {
        "study": vars(args), "checkpoint": ckpt, "run": run_info(world), "capacities_rps": caps,
        "load_capacity_rps": capacity(args), "points": points + tp + load, "allreduce": ar,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "ratios_at_80": ratios(points, 0.8)}
    harness.finish(doc, watch, results, comm=world, module="experiments.studies.serving_study", argv=argv,
                   show=markdown)
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


def _med(vals, fmt=".2f"):
    return f"{statistics.median(vals):{fmt}} ({min(vals):{fmt}}-{max(vals):{fmt}})"


def _table(cells, head):
    """Markdown (tabulate's pipe format): first column left, the others right."""
    return tabulate(cells, head, tablefmt="pipe", disable_numparse=True, colalign=("left",) + ("right",) * (len(head) - 1))


def markdown(doc):
    """Return the study's tables (medians over repeats, range in parentheses) as markdown; parts not run are left out."""
    pts, tables = doc["points"], []
    pol = [p for p in pts if p["part"] == "policies"]
    if pol:
        cells = []
        for f in sorted({p["fraction"] for p in pol}):
            row = [f"{f:.2f}"]
            for name in POLICIES:
                g = [p for p in pol if p["policy"] == name and p["fraction"] == f]
                row.append(f"{statistics.median(p['latency_p50_ms'] for p in g):.2f} / {_med([p['latency_p99_ms'] for p in g])}"
                           if g else "")
            cells.append(row)
        tables.append(_table(cells, ["load (x capacity)"] + [f"{name} p50 / p99 ms" for name in POLICIES]))
    cells = []
    for R, T in ((2, 1), (1, 2)):
        cap = [p for p in pts if p["part"] == "tp-capacity" and p["replicas"] == R]
        light = [p for p in pts if p["part"] == "tp-light" and p["replicas"] == R]
        if cap and light:
            cells.append([f"{R} x {T}", _med([p["throughput_rps"] for p in cap]), _med([p["latency_p50_ms"] for p in light]),
                          _med([p["latency_p99_ms"] for p in light]),
                          f"{statistics.median(p['comm_mean_ms'] for p in light):.3f}"])
    if cells:
        tables.append(_table(cells, ["replicas x T", "capacity req/s", "light-load p50 ms", "light-load p99 ms",
                                     "all-reduce ms/request"]))
    if doc["allreduce"]:
        algos = list(doc["allreduce"][0]["us"])
        cells = [[str(r["P"]), f"{r['elements']} ({r['bytes']})", "rank order" if r["rank_order"] else "plain"]
                 + [f"{r['us'][a]:.1f}" for a in algos] + [r["fastest"], r["fastest_hand_made"], r["auto_picks"]]
                 for r in doc["allreduce"]]
        tables.append(_table(cells, ["P", "elements (bytes)", "message"] + [f"{a} us" for a in algos]
                             + ["fastest", "fastest hand-made", "auto picks"]))
    d = [p for p in pts if p["part"] == "tp-algorithm"]
    if d:
        cells = []
        for T in sorted({p["tensor_parallel"] for p in d}):
            for a in dict.fromkeys(p["algorithm"] for p in d):
                g = [p for p in d if p["tensor_parallel"] == T and p["algorithm"] == a]
                if g:
                    cells.append([f"T = {T}", a, _med([p["latency_p50_ms"] for p in g]), _med([p["latency_p99_ms"] for p in g]),
                                  _med([p["comm_mean_ms"] for p in g], ".3f"), f"{sum(p['correct'] for p in g)}/"
                                  f"{sum(p['answered'] for p in g)}"])
        tables.append(_table(cells, ["replica", "all-reduce", "p50 ms", "p99 ms", "all-reduce ms/request",
                                     "correct/answered"]))
    load = load_table(pts)
    if load:
        tables.append(load)
    return "\n\n".join(tables)


if __name__ == "__main__":
    sys.exit(main())
