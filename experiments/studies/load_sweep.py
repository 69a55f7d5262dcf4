"""Part E of the serving study: one replica under open-loop load from 0.2x to 3x its capacity, with and
without a latency objective.

One front and one replica (2 ranks); every batch costs ``--load-service-ms`` of emulated accelerator
time whatever its size, so a full batch of ``B = --load-max-batch`` gives the capacity
``B / s(B)`` (400 req/s at 8 and 20 ms). At each ``--load-fractions`` of it, Poisson arrivals for
``--load-seconds`` seconds, once without an objective and once with ``--slo-ms`` (interleaved, every
repeat). Reported per point: throughput, mean batch size, p50/p99 latency, goodput (answers within
the objective per second; for the run without one, against the same objective) and refused requests.
"""
import json
import os

from inference.serve_config import ServeConfig
from inference.serve import run as serve
from training.settings.options import INT32_MAX, integer, listof, real

__all__ = ["add_options", "load_sweep", "capacity"]

KEEP = ("requests", "answered", "correct", "refused", "latency_p50_ms", "latency_p99_ms", "throughput_rps",
        "mean_batch_size")


def add_options(p):
    """Add part E's options to the study's parser ``p``."""
    p.add_argument("--load-fractions", type=listof(real(0, 100, low_open=True)),
                   default=[0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.2, 1.5, 2.0, 3.0],
                   help="part E: offered load as fractions of the replica's capacity B / s(B)")
    p.add_argument("--load-seconds", type=real(0, 1e15, low_open=True), default=3.0, help="part E: seconds of arrivals per point")
    p.add_argument("--load-service-ms", type=real(0, 1e15, low_open=True), default=20.0, help="part E: emulated time per batch (ms)")
    p.add_argument("--load-max-batch", type=integer(1, INT32_MAX), default=8, help="part E: largest batch")
    p.add_argument("--slo-ms", type=real(0, 1e15, low_open=True), default=60.0, help="part E: latency objective of the runs with one (ms)")


def capacity(args):
    """Return the replica's capacity ``B / s(B)`` (requests/s) of part E."""
    return args.load_max_batch / (args.load_service_ms / 1e3)


def _goodput(cfg, slo_ms):
    """The run's answers within ``slo_ms`` per second, from its request records (rank 0)."""
    with open(os.path.join(cfg.run_dir, "requests.jsonl"), encoding="utf-8") as f:
        recs = [json.loads(line) for line in f]
    ok = [r for r in recs if r["status"] == "ok"]
    if not ok:
        return 0.0
    t0 = min(r["arrival_ms"] for r in recs)
    t1 = max(r["arrival_ms"] + r["latency_ms"] for r in ok)
    return sum(r["latency_ms"] <= slo_ms for r in ok) / max((t1 - t0) / 1e3, 1e-9)


def load_sweep(args, ckpt, comm, out):
    """Run part E on ``comm`` (2 ranks: front and one replica); return its points (rank 0; [] elsewhere)."""
    cap, pts = capacity(args), []
    for rep in range(args.repeats):
        for frac in args.load_fractions:
            for slo in (0.0, args.slo_ms):
                rate = frac * cap
                cfg = ServeConfig(checkpoint=ckpt, replicas=1, service_ms=args.load_service_ms,
                                  max_batch=args.load_max_batch, rate=rate, slo_ms=slo, seed=rep,
                                  requests=max(100, int(rate * args.load_seconds)), run_dir=os.path.join(out, "points"))
                s = serve(cfg, comm)
                if s is None:
                    continue
                p = {"part": "load", "fraction": frac, "offered_rps": rate, "capacity_rps": cap, "slo_ms": slo,
                     "repeat": rep, **{k: s[k] for k in KEEP},
                     "goodput_rps": round(_goodput(cfg, args.slo_ms), 3)}
                pts.append(p)
                print(f"E r{rep} {frac:.1f} x {cap:.0f} req/s {'slo ' + format(slo, 'g') + ' ms' if slo else 'no slo':10s}: "
                      f"{p['throughput_rps']:.0f} req/s, batch {p['mean_batch_size']:.2f}, p50 {p['latency_p50_ms']} ms, "
                      f"p99 {p['latency_p99_ms']} ms, goodput {p['goodput_rps']:.0f} req/s, refused {p['refused']}",
                      flush=True)
    return pts


