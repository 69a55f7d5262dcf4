"""Staleness study: train the default model with a parameter server under BSP, SSP(s) and ASP while
one worker straggles, and compare update throughput, time to accuracy and final accuracy.

    mpiexec -n 5 python -m experiments.staleness_sweep [--out results/staleness] [--repeats 2]
    python -m plots.staleness results/staleness/staleness_sweep.json

Every protocol trains the trainer's default configuration (``--set KEY=VALUE`` changes it) in
``--mode ps`` with one server and the other ranks as workers, worker rank ``--straggler`` slowed by
its factor (it sleeps ``FACTOR - 1`` times its compute time each step). Per run the results keep
updates per second (worker gradients folded in by the servers per second of training), samples per
second, the time to 95 % test accuracy, the final test accuracy, the staleness histogram and the
accuracy-versus-time curve. Rank 0 writes ``staleness_sweep.json`` (sweep and training
configuration, MPI library, P, host, every run, the table, the target) and prints the table as
markdown. Target on the digits default: SSP with s >= 2 reaches at least 1.8x BSP's update
throughput, with final test accuracy within 1 point of BSP.
"""
import argparse
import os
import statistics
import sys
from contextlib import redirect_stderr, redirect_stdout

from mpi4py import MPI

__all__ = ["PROTOCOLS", "parse_protocol", "base_config", "run_sweep", "markdown_table", "main"]

#: Protocols of the study: "bsp", "asp" or "sspS" (SSP with staleness bound S clocks).
PROTOCOLS = ("bsp", "ssp1", "ssp2", "ssp4", "ssp8", "asp")
TARGET_RATIO, TARGET_POINTS, TARGET_MIN_S = 1.8, 1.0, 2


def parse_protocol(name):
    """Return ``(consistency, staleness)`` of ``"bsp"``, ``"asp"`` or ``"sspS"``.

    Raises
    ------
    ValueError
        When ``name`` is none of these.
    """
    if name in ("bsp", "asp"):
        return name, 0
    if name.startswith("ssp") and name[3:].isdigit():
        return "ssp", int(name[3:])
    raise ValueError(f"protocol must be bsp, asp or sspS (e.g. ssp2), got {name!r}")


def base_config(epochs, straggler, jitter, sets):
    """Return the training ``Config`` of the study (trainer defaults plus the study's settings).

    Raises
    ------
    ValueError
        When a ``KEY=VALUE`` is malformed or rejected by the trainer's configuration.
    """
    from training.config import Config

    changes = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set must look like KEY=VALUE, got {item!r}")
        key = key.strip().replace("-", "_")
        changes[key] = [int(t) for t in value.split(",") if t.strip()] if key == "hidden" else _value(value)
    changes.update(mode="ps", servers=changes.get("servers", 1), epochs=epochs, straggler=straggler,
                   jitter=jitter, progress=False, checkpoint_every=0, keep_checkpoints=1)
    return Config().replace(**changes)


def _value(text):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _train(base, protocol, repeat, out, comm):
    """Train one protocol once; return its record (complete on rank 0)."""
    from training.train import run

    consistency, s = parse_protocol(protocol)
    name = f"{protocol}-r{repeat}"
    cfg = base.replace(consistency=consistency, staleness=s, run_dir=os.path.join(out, "runs"), name=name)
    if comm.Get_rank() == 0:
        os.makedirs(cfg.run_dir, exist_ok=True)
    comm.Barrier()
    log = os.devnull if comm.Get_rank() else os.path.join(cfg.run_dir, f"{name}.log")
    with open(log, "w", encoding="utf-8") as f, redirect_stdout(f), redirect_stderr(f):
        summary = run(cfg, comm)
    if comm.Get_rank() != 0:
        return None
    keys = ("updates_per_s", "samples_per_s", "time_to_target_s", "final_test_acc", "wall_s", "pushes",
            "epochs", "staleness_histogram", "staleness_max", "staleness_mean", "curve", "run_dir",
            "worker_stats")
    return {"protocol": protocol, "consistency": consistency, "staleness_bound": s, "repeat": repeat,
            **{k: summary[k] for k in keys}}


def run_sweep(base, protocols, repeats, out, comm, echo=print):
    """Train every protocol ``repeats`` times (interleaved) and return the records (rank 0)."""
    runs = []
    for r in range(repeats):
        for p in protocols:
            rec = _train(base, p, r, out, comm)
            if rec is not None:
                runs.append(rec)
                ttt = rec["time_to_target_s"]
                echo(f"{p:>5} #{r}: {rec['updates_per_s']:7.1f} updates/s, test acc "
                     f"{rec['final_test_acc']:.2%}, to 95% {'never' if ttt is None else f'{ttt:.2f} s'}, "
                     f"staleness max {rec['staleness_max']}")
    return runs


def _table(runs, protocols):
    """One row per protocol: medians of throughput and times, mean accuracy, ratios to BSP."""
    rows = []
    for p in protocols:
        rs = [r for r in runs if r["protocol"] == p]
        ttt = [r["time_to_target_s"] for r in rs if r["time_to_target_s"] is not None]
        rows.append({"protocol": p, "runs": len(rs),
                     "updates_per_s": statistics.median(r["updates_per_s"] for r in rs),
                     "samples_per_s": statistics.median(r["samples_per_s"] for r in rs),
                     "time_to_target_s": statistics.median(ttt) if len(ttt) == len(rs) else None,
                     "final_test_acc": statistics.fmean(r["final_test_acc"] for r in rs),
                     "wall_s": statistics.median(r["wall_s"] for r in rs),
                     "staleness_max": max(r["staleness_max"] for r in rs),
                     "staleness_mean": statistics.fmean(r["staleness_mean"] for r in rs)})
    bsp = next((r for r in rows if r["protocol"] == "bsp"), None)
    for row in rows:
        row["throughput_vs_bsp"] = row["updates_per_s"] / bsp["updates_per_s"] if bsp else None
        row["acc_points_vs_bsp"] = 100 * (row["final_test_acc"] - bsp["final_test_acc"]) if bsp else None
    return rows


def _targets(rows):
    out = []
    for row in rows:
        consistency, s = parse_protocol(row["protocol"])
        if consistency == "ssp" and s >= TARGET_MIN_S and row["throughput_vs_bsp"] is not None:
            met = row["throughput_vs_bsp"] >= TARGET_RATIO and abs(row["acc_points_vs_bsp"]) <= TARGET_POINTS
            out.append({"protocol": row["protocol"], "throughput_vs_bsp": row["throughput_vs_bsp"],
                        "acc_points_vs_bsp": row["acc_points_vs_bsp"], "met": bool(met)})
    return out


def markdown_table(rows):
    """Return the study table as GitHub markdown."""
    lines = ["| protocol | updates/s | vs BSP | samples/s | time to 95 % (s) | final test acc | "
             "vs BSP (points) | staleness max / mean | wall (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ttt = "never" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f}"
        ratio = "" if r["throughput_vs_bsp"] is None else f"{r['throughput_vs_bsp']:.2f}x"
        pts = "" if r["acc_points_vs_bsp"] is None else f"{r['acc_points_vs_bsp']:+.2f}"
        lines.append(f"| {r['protocol'].upper().replace('SSP', 'SSP s=')} | {r['updates_per_s']:.0f} | "
                     f"{ratio} | {r['samples_per_s']:.0f} | {ttt} | {r['final_test_acc']:.2%} | {pts} | "
                     f"{r['staleness_max']} / {r['staleness_mean']:.2f} | {r['wall_s']:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    """Parse the command line, run the sweep and write the results (rank 0)."""
    parser = argparse.ArgumentParser(prog="mpiexec -n 5 python -m experiments.staleness_sweep",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/staleness", help="results directory (default: %(default)s)")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS),
                        help="comma-separated bsp, asp, sspS (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per protocol, interleaved (default: 1)")
    parser.add_argument("--epochs", type=int, default=20, help="epochs per run (default: 20)")
    parser.add_argument("--straggler", default="2:4", help="slow worker RANK:FACTOR, '' for none (default: %(default)s)")
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="extra random delay per step, uniform in [0, JITTER] seconds (default: 0)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="change a training setting (repeatable), e.g. --set optimizer=sgd")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    try:
        protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
        for p in protocols:
            parse_protocol(p)
        if args.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
        base = base_config(args.epochs, args.straggler, args.jitter, args.set)
    except ValueError as e:
        parser.error(str(e))
    rank0 = comm.Get_rank() == 0
    echo = (lambda *a: print(*a, flush=True)) if rank0 else (lambda *a: None)
    echo(f"staleness sweep on {comm.Get_size()} ranks ({base.servers} server), straggler {args.straggler}, "
         f"{args.epochs} epochs, protocols {', '.join(protocols)} x {args.repeats} -> {args.out}")
    runs = run_sweep(base, protocols, args.repeats, args.out, comm, echo)
    if not rank0:
        return 0
    from training.metrics import run_info, write_json

    rows = _table(runs, protocols)
    results = {"experiment": "staleness_sweep", "sweep": vars(args), "train_config": base.to_dict(),
               "run": run_info(comm), "runs": runs, "table": rows, "targets": _targets(rows),
               "target": {"ssp_min_s": TARGET_MIN_S, "throughput_vs_bsp": TARGET_RATIO,
                          "acc_points_vs_bsp": TARGET_POINTS}}
    path = os.path.join(args.out, "staleness_sweep.json")
    write_json(path, results)
    print(markdown_table(rows))
    for t in results["targets"]:
        print(f"target {t['protocol']}: {t['throughput_vs_bsp']:.2f}x BSP throughput (>= {TARGET_RATIO}), "
              f"{t['acc_points_vs_bsp']:+.2f} points (within {TARGET_POINTS}): {'met' if t['met'] else 'NOT met'}")
    print(f"wrote {path}; draw with: python -m plots.staleness {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
