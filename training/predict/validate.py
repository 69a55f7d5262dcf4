"""Validate the predictor on the emulated cluster: measured against predicted step time, 26 configurations.

    python -m training.predict.validate --out results/predict/validation [--epochs 3] [--repeats 3]
        [--only K,...] [--dry-run]

1. profiles the job once on this machine, one rank, one BLAS thread (``training.train --trace``,
   then :mod:`training.predict.profile` with the fp16, top-k and PowerSGD codecs, timed on a
   gradient of the magnitudes of that run's, :func:`training.predict.profile.gradient_rms`);
2. calibrates each layout of :func:`plan` once (``training.emulator.emulate --calibrate``) and turns
   it into a topology (:func:`training.predict.topology.from_calibration`: every rank on this
   host, so the host's oversubscription scales compute and copies), whose ``round_us`` is the least
   duration of a round at the job's ranks per core, fitted on the three-level study's sweeps
   (``--sweeps``, :mod:`training.predict.floor`; none of the validation's own runs);
3. runs each configuration on the emulated cluster (``training.train`` under
   ``training.emulator.emulate``) ``--repeats`` times, the configurations taking turns (every
   configuration once, then again), and takes each run's step time: the median over its epochs after
   the first (:func:`epoch_times`; a parameter server's from its
   workers' ``push`` events); a configuration's measured time is the median over its runs and its
   range the run-to-run range (the host's speed drifts between runs by more than between epochs);
4. predicts each from the one profile and its layout's calibration, and reports
   (:func:`compare`): the share within 15 % among the configurations whose predicted exposed
   communication is at least half the step (target >= 90 %), within 25 % over all (>= 75 %), and
   Kendall's tau over the pairs whose measured medians differ by more than both ranges (>= 0.8).

Writes OUT.json (every row, the commands, the targets, the round floors) and OUT.md (the table), and
keeps the profile with its codec times in ``OUT_runs/profile.json``, which ``--reuse`` reads again.
``--dry-run`` prints the commands and runs nothing. Run it on a quiet machine: the measured numbers are step times.
"""
import json
import os
import statistics
import subprocess
import sys
import time

from training.runtime.checkpoint import epoch_checkpoints

from commlab import provenance

from training.predict import job_config as cfgmod
from training.predict import floor as floormod
from training.predict import profile as profmod
from training.predict import topology as topomod
from training.predict.step import predict
from training.settings.options import INT32_MAX, Parser, integer, outpath, real, text

__all__ = ["JOB", "plan", "train_flags", "epoch_times", "compare", "run", "main"]

#: The job: a 256-1024-1024-10 MLP on synthetic data (1.3 M parameters, 5.3 MB of gradient).
JOB = ["--data", "synthetic", "--samples", "6144", "--features", "256", "--hidden", "1024,1024",
       "--batch-size", "512", "--checkpoint-every", "0", "--lr-schedule", "constant"]
_L3 = {"racks": 2, "nodes": 2, "ranks_per_node": 2}
_L2 = {"racks": 1, "nodes": 4, "ranks_per_node": 2}
MiB = 1 << 20
PS_BATCH = 504  # a parameter server's runs: a multiple of 6 and of 7 workers (8 ranks less 2 or 1 servers)


def plan():
    """Return the validation's ``[{"layout": {...}, "config": {...}}]``: 26 configurations, 4 layouts."""
    c = {
        "ring": {"algorithm": "ring"}, "2d": {"algorithm": "2d"}, "rab": {"algorithm": "rabenseifner"},
        "torus": {"algorithm": "torus", "grid": "topology"},
        "ring-b": {"algorithm": "ring", "bucket_bytes": MiB},
        "ring-b-ov": {"algorithm": "ring", "bucket_bytes": MiB, "overlap": True},
        "torus-b-ov": {"algorithm": "torus", "grid": "topology", "bucket_bytes": MiB, "overlap": True},
        "fp16": {"algorithm": "ring", "compression": "fp16"},
        "topk": {"algorithm": "ring", "compression": "topk", "compression_args": {"ratio": 0.01}},
        "powersgd": {"algorithm": "ring", "compression": "powersgd", "compression_args": {"matrix_rank": 4}},
        "ps1": {"mode": "ps", "servers": 1}, "ps2": {"mode": "ps", "servers": 2},
        "tp2": {"algorithm": "ring", "tensor_parallel": 2},
        "pp2": {"algorithm": "ring", "pipeline_parallel": 2, "micro_batches": 4},
    }
    sets = [(_L3, "1gbit", list(c)), (_L3, "100mbit", ["ring", "torus", "ring-b-ov", "fp16", "ps2"]),
            (_L2, "1gbit", ["ring", "2d", "torus", "ps1"]), (_L2, "100mbit", ["ring", "torus", "topk"])]
    out = []
    for layout, link, names in sets:
        for n in names:
            out.append({"layout": {**layout, "link": link, "uplink": link if layout["racks"] > 1 else "unlimited"},
                        "name": n, "config": dict(c[n], name=n)})
    return out


def train_flags(cfg):
    """Return ``training.train`` flags for a configuration dict (the fields the predictor reads)."""
    f = ["--mode", cfg.get("mode", "dp")]
    if cfg.get("mode") == "ps":
        return f + ["--servers", str(cfg["servers"]), "--batch-size", str(PS_BATCH)]
    f += ["--algorithm", cfg.get("algorithm", "ring"), "--bucket-bytes", str(cfg.get("bucket_bytes", 0))]
    if cfg.get("overlap"):
        f.append("--overlap")
    if cfg.get("compression", "none") != "none":
        f += ["--compression", cfg["compression"]]
        for k, v in cfg.get("compression_args", {}).items():
            f += ["--compression-arg", f"{k}={v}"]
    for key, flag in (("tensor_parallel", "--tensor-parallel"), ("pipeline_parallel", "--pipeline-parallel"),
                      ("micro_batches", "--micro-batches")):
        if key in cfg:
            f += [flag, str(cfg[key])]
    return f


def _emulate(layout):
    e = [sys.executable, "-m", "training.emulator.emulate", "--racks", str(layout["racks"]), "--nodes",
         str(layout["nodes"]), "--ranks-per-node", str(layout["ranks_per_node"]), "--link", layout["link"]]
    return e + (["--uplink", layout["uplink"]] if layout["racks"] > 1 else [])


def _key(layout):
    return f"{layout['racks']}x{layout['nodes']}x{layout['ranks_per_node']}-{layout['link']}"


def commands(out, epochs, entries, repeats=1):
    """Return the commands of a validation: ``{"profile": [...], "calibrate": {key: [...]}, "runs": [...]}``.

    ``runs`` holds ``repeats`` runs of every entry, in turns (all entries, then all again); each run
    names its entry (``entry``, the index in ``entries``) and has its own run directory (``NAME-rK``)."""
    d = out + "_runs"
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    prof = [mpiexec, "-n", "1", sys.executable, "-m", "training.train", *JOB, "--threads", "1", "--epochs", "2",
            "--run-dir", d, "--name", "profile", "--trace", os.path.join(d, "profile.trace.json")]
    cal = {_key(e["layout"]): _emulate(e["layout"]) + ["--calibrate", "--settle", "120", "--out",
                                                   os.path.join(d, f"cal-{_key(e['layout'])}.json")]
           for e in entries}
    runs = []
    for k, (i, e) in ((k, ie) for k in range(repeats) for ie in enumerate(entries)):
        name = f"{_key(e['layout'])}-{e['name']}-r{k + 1}"
        cmd = _emulate(e["layout"]) + ["--", sys.executable, "-m", "training.train", *JOB, *train_flags(e["config"]),
                                       "--threads", "1", "--epochs", str(epochs), "--run-dir", d, "--name", name]
        if e["config"].get("mode") == "ps":
            cmd += ["--trace", os.path.join(d, name + ".trace.json")]
        grid = "tensor_parallel" in e["config"] or "pipeline_parallel" in e["config"]
        runs.append({"name": name, "entry": i, "command": cmd, "run_dir": os.path.join(d, name), "grid": grid})
    return {"profile": prof, "calibrate": cal, "runs": runs}


def _measured(run):
    """Per-epoch step seconds of a finished run (the first epoch left out)."""
    trace = run["command"][run["command"].index("--trace") + 1] if "--trace" in run["command"] else None
    if trace:
        with open(trace, encoding="utf-8") as f:
            ev = [e for e in json.load(f)["traceEvents"] if e.get("name") == "push"]
        per = {}
        for e in sorted(ev, key=lambda e: e["ts"]):
            per.setdefault(e["pid"], []).append(e["ts"] * 1e-6)
        gaps = [b - a for ts in per.values() for a, b in zip(ts[len(ts) // 4:], ts[len(ts) // 4 + 1:])]
        return [statistics.median(gaps[i::3]) for i in range(3) if gaps[i::3]]
    if run.get("grid"):  # a model-parallel run records each step's own wall seconds
        per = {}
        with open(os.path.join(run["run_dir"], "metrics.jsonl"), encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                per.setdefault(rec["epoch"], []).append(rec["wall_s"])
        return [statistics.median(per[e]) for e in sorted(per)][1:]
    return [s for s, _, _ in epoch_times(run["run_dir"])][1:]


def epoch_times(run_dir):
    """Return ``[(step seconds, cumulative wall seconds, test accuracy)]`` per epoch of a training run.

    The step time of an epoch is the spread of its steps' wall clocks (``metrics.jsonl``) over the
    steps between them, so the evaluation at the end of each epoch is left out; the cumulative wall
    time (``epochs.jsonl``) keeps it, as the time to accuracy should.
    """
    clocks = {}
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            s = json.loads(line)
            clocks.setdefault(s["epoch"], []).append(s["wall_s"])
    out = []
    with open(os.path.join(run_dir, "epochs.jsonl"), encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            c = clocks.get(e["epoch"], [])
            step = (c[-1] - c[0]) / (len(c) - 1) if len(c) > 1 else float("nan")
            out.append((step, e["wall_s"], e["test_acc"]))
    return out


def compare(rows):
    """Return the validation's figures from rows with ``measured`` (list of s), ``predicted_s``, ``comm_s``.

    Returns
    -------
    dict
        ``within15_comm_heavy`` and ``within25_all`` (fractions), ``kendall_tau`` (over the pairs whose
        measured medians differ by more than both rows' run-to-run ranges, rows with one run left out;
        None without such pairs), ``pairs``,
        ``comm_heavy`` (count) and ``misses`` (names beyond 25 %).

    Examples
    --------
    >>> rows = [{"name": "a", "measured": [1.0, 1.1], "predicted_s": 1.0, "comm_s": 0.8},
    ...         {"name": "b", "measured": [2.0, 2.1], "predicted_s": 2.6, "comm_s": 0.1}]
    >>> r = compare(rows)
    >>> r["within15_comm_heavy"], r["within25_all"], r["kendall_tau"], r["misses"]
    (1.0, 0.5, 1.0, ['b'])
    """
    for r in rows:
        r["measured_s"] = statistics.median(r["measured"])
        r["range_s"] = max(r["measured"]) - min(r["measured"]) if len(r["measured"]) > 1 else None
        r["error"] = r["predicted_s"] / r["measured_s"] - 1
    heavy = [r for r in rows if r["comm_s"] >= 0.5 * r["predicted_s"]]
    conc = disc = 0
    ranged = [r for r in rows if r["range_s"] is not None]  # a configuration measured once has no range
    for i, a in enumerate(ranged):
        for b in ranged[i + 1:]:
            if abs(a["measured_s"] - b["measured_s"]) <= max(a["range_s"], b["range_s"]):
                continue
            s = (a["measured_s"] - b["measured_s"]) * (a["predicted_s"] - b["predicted_s"])
            conc, disc = conc + (s > 0), disc + (s < 0)
    return {"within15_comm_heavy": sum(abs(r["error"]) <= 0.15 for r in heavy) / len(heavy) if heavy else None,
            "within25_all": sum(abs(r["error"]) <= 0.25 for r in rows) / len(rows),
            "kendall_tau": (conc - disc) / (conc + disc) if conc + disc else None, "pairs": conc + disc,
            "comm_heavy": len(heavy), "misses": [r["name"] for r in rows if abs(r["error"]) > 0.25]}


def _wait_quiet(limit, pause, most=600.0):
    """Wait (at most ``most`` s) for the 1-minute load average to fall below ``limit``; no wait when ``pause`` is 0."""
    end = time.monotonic() + (most if pause else 0.0)
    while os.getloadavg()[0] > limit and time.monotonic() < end:
        time.sleep(5.0)


_CODECS = [("fp16", {}), ("topk", {"ratio": 0.01}), ("powersgd", {"matrix_rank": 4})]


def _profile(d, reuse):
    """The job's profile with its codec times: ``d/profile.json`` when reused and complete, else measured
    (on a gradient of the profile run's magnitudes when its last checkpoint holds Adam's moments)."""
    path = os.path.join(d, "profile.json")
    if reuse and os.path.exists(path):
        prof = profmod.load(path)
        if all(profmod.codec_key(name, args) in prof.codecs for name, args in _CODECS):
            return prof
    ckpts = epoch_checkpoints(os.path.join(d, "profile"))
    scale = profmod.gradient_rms(ckpts[-1]) if ckpts else None  # the profile run's gradient magnitudes
    prof = profmod.measure_codecs(profmod.from_trace(os.path.join(d, "profile.trace.json")), _CODECS, scale=scale)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(prof.to_dict(), f, indent=1)
    return prof


def run(out, epochs, entries, execute=subprocess.run, pause=0.0, reuse=False, sweeps=floormod.DEFAULT_DIR, repeats=1):
    """Profile, calibrate, measure and predict ``entries``; return the rows and :func:`compare`'s figures.

    With ``reuse`` a profile, calibration or run whose output exists under ``OUT_runs`` is not run again
    (a validation whose configurations partly failed measures only those). ``sweeps``: the directory of
    the all-reduce sweeps the round floor is fitted on (:func:`training.predict.floor.floors`).
    """
    cmds = commands(out, epochs, entries, repeats)
    d = out + "_runs"
    os.makedirs(d, exist_ok=True)
    reused = []
    if not (reuse and os.path.exists(os.path.join(d, "profile.trace.json"))):
        execute(cmds["profile"], check=True)
    prof = _profile(d, reuse)
    table = floormod.floors(sweeps, prof.reduce_s_per_byte or 1 / 4e9)
    topos, rounds_us, cals = {}, {}, {}
    for key, cmd in cmds["calibrate"].items():
        if not (reuse and os.path.exists(cmd[-1])):
            _wait_quiet(provenance.default_max_load() * 0.9, pause)  # the calibration refuses a busy machine
            execute(cmd, check=True)
        e = next(x for x in entries if _key(x["layout"]) == key)["layout"]
        P = e["racks"] * e["nodes"] * e["ranks_per_node"]
        with open(cmd[-1], encoding="utf-8") as f:
            cal = json.load(f)
        cores = int((cal.get("provenance") or {}).get("cores") or os.cpu_count() or 1)
        rounds_us[key] = floormod.round_s(table, max(1.0, P / cores)) * 1e6
        topos[key] = topomod.parse(topomod.from_calibration(cal, e["racks"], e["nodes"], e["ranks_per_node"], cores,
                                                            rounds_us[key]))
        cals[key] = {"date": (cal.get("provenance") or {}).get("date"), "duplex": topos[key].net.duplex,
                     "fanout": topos[key].fanout}
    runs, failed = {}, []
    for r in cmds["runs"]:  # in turns: every configuration once, then again
        if reuse and os.path.exists(os.path.join(r["run_dir"], "summary.json")):
            reused.append(r["name"])
        elif time.sleep(pause) or execute(r["command"]).returncode != 0:  # sleep: the last job's ranks leave  # reported, not fatal: the other configurations still run
            failed.append(r["name"])
            continue
        runs.setdefault(r["entry"], []).append(r)
    rows = []
    for i, done in sorted(runs.items()):
        e = entries[i]
        batch = PS_BATCH if e["config"].get("mode") == "ps" else 512
        cfg = cfgmod.parse({**e["config"], "batch_size": batch})
        p = predict(prof, topos[_key(e["layout"])], cfg)
        epochs_s = [_measured(r) for r in done]
        # per run what _measured gives: its epochs' step times (a parameter server's: three medians of push gaps)
        rows.append({"name": f"{_key(e['layout'])}-{e['name']}", "measured": [statistics.median(m) for m in epochs_s],
                     "per_run": epochs_s, "runs": len(done), "predicted_s": p["step_s"], "comm_s": p["breakdown"]["comm"],
                     "breakdown": p["breakdown"], "command": done[0]["command"]})
    floors = {"sweeps": sweeps, "by_ranks_per_core_us": {f"{o:g}": f * 1e6 for o, f in table.items()},
              "round_us": rounds_us}
    return rows, {**compare(rows), "failed": failed, "reused": reused, "round_floor": floors, "calibrations": cals}


def _ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def main(argv=None):
    p = Parser(prog="python -m training.predict.validate", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=outpath(), default="results/predict/validation", help="prefix of OUT.json and OUT.md")
    p.add_argument("--epochs", type=integer(1, INT32_MAX), default=3, help="epochs per measured run (default 3; the first is left out)")
    p.add_argument("--repeats", type=integer(1, INT32_MAX), default=3, help="runs of every configuration, in turns (default 3): "
                   "its measured time is their median, its range theirs")
    p.add_argument("--only", type=text(), default="", help="indices of plan() entries to run, comma-separated (default all)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--reuse", action="store_true", help="keep the profile, calibrations and runs already under "
                   "OUT_runs (measure only the missing ones)")
    p.add_argument("--sweeps", type=text(), default=floormod.DEFAULT_DIR, help="all-reduce sweeps the round floor is "
                   f"fitted on (default {floormod.DEFAULT_DIR})")
    provenance.add_options(p, real)
    a = p.parse_args(argv)
    if a.repeats < 1 or a.epochs < 2:
        p.error(f"--repeats must be at least 1 and --epochs at least 2 (the first is left out); got "
                f"{a.repeats} and {a.epochs}")
    entries = plan()
    if a.only:
        entries = [entries[int(i)] for i in a.only.split(",")]
    if a.dry_run:
        cmds = commands(a.out, a.epochs, entries, a.repeats)
        for line in [cmds["profile"], *cmds["calibrate"].values(), *(r["command"] for r in cmds["runs"])]:
            print(" ".join(line))
        return 0
    earlier = None
    if a.reuse and os.path.exists(a.out + ".json"):  # the reused runs were measured under this provenance
        with open(a.out + ".json", encoding="utf-8") as f:
            old = json.load(f)
        earlier = old.get("provenance_of_reused_runs") or old.get("provenance")  # a re-prediction keeps the runs'
    try:
        watch = provenance.guard(a)  # quiet before the first job; each job's own 8 ranks are allowed for (P = 8)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows, figures = run(a.out, a.epochs, entries, pause=5.0, reuse=a.reuse, sweeps=a.sweeps, repeats=a.repeats)
    record = {"rows": rows, "figures": figures, "targets": {"within15_comm_heavy": 0.9, "within25_all": 0.75,
                                                            "kendall_tau": 0.8}}
    provenance.stamp(record, watch, P=8)
    if earlier is not None and figures["reused"]:
        record["provenance_of_reused_runs"] = earlier
        record["provenance"]["noisy"] = record["provenance"]["noisy"] or earlier.get("noisy", True)
    with open(a.out + ".json", "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    lines = ["| configuration | measured ms | run-to-run range ms | predicted ms | error |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['name']} | {r['measured_s'] * 1e3:.1f} | {_ms(r['range_s'])} | {r['predicted_s'] * 1e3:.1f} | "
              f"{r['error']:+.0%} |" for r in rows]
    with open(a.out + ".md", "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
