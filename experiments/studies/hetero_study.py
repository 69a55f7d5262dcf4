"""Unequal workers: step time against the ideal, time to a target accuracy and final accuracy, for
equal batch shares, ``--balance``, the parameter server (SSP, and BSP with ``--balance``) and local SGD.

    mpiexec -n 2 python -m experiments.studies.hetero_study --workers 2 --repeats 5
    mpiexec -n 3 python -m experiments.studies.hetero_study --workers 2 --repeats 5
    python -m plots.hetero results/hetero/hetero_w2_dp.json results/hetero/hetero_w2_ps.json

One launch trains every (method, condition, repeat) of one kind in turn, repeats outermost (so a slow
spell of a shared machine hits every variant alike): data-parallel methods on ``--workers`` ranks,
parameter-server methods on ``--workers`` + 1 (one server, rank 0). Conditions: ``even`` (no
injected slowness), ``slowF`` (the second worker slowed F times: it sleeps ``F - 1`` times its
compute, ``--straggler``) and ``jitterJ`` (every worker sleeps a uniform ``[0, J]`` seconds per step,
``--jitter``). Methods:

* ``equal``: data-parallel, the global batch B in equal shares; every rank waits for the slowest;
* ``balance``: data-parallel with ``--balance`` (LB-BSP: Chen et al., SoCC 2020): shares in
  proportion to the measured speeds, re-split every ``--balance-every`` steps (default 2);
* ``ssp2``: the parameter server with SSP, staleness 2 (Ho et al., NIPS 2013);
* ``ps-balance``: the parameter server, BSP with ``--balance``;
* ``localH``: local SGD, H steps between model averages (equal shares).

Reported per (method, condition), median and range over the repeats: ``step_s``, the wall time of
one global batch (B over the samples trained per second: data-parallel, the ranks' mean busy time
per step; parameter server, the job's samples per second); ``ideal_s``, B over the summed speeds of
the ranks, from the same repeat's ``equal`` run in condition ``even`` (rank 0's median seconds per
sample to reach the step's collective, ``t``): ``B / sum_r 1 / (F_r t)`` for a straggler, ``B t / W +
J / 2`` for jitter, the step of perfectly balanced computation without communication;
``efficiency``, ``ideal_s / step_s`` (the ideal leaves out communication and every per-step cost);
``speedup``, the same repeat's ``equal`` step over this one; ``time_to_target_s`` (first evaluation
at or above ``--target``: each epoch for data-parallel runs, each snapshot for the parameter server)
and ``accuracy`` (final test accuracy).

``--job compute`` (the default) is computation-bound; ``--job digits`` trains the main job (its model
and data, B = 64), whose step is mostly communication and fixed per-step costs.

Rank 0 writes ``hetero_wW_KIND.json`` (``hetero_wW_KIND_digits.json`` for ``--job digits``) into
``--out`` (every run, the per-(method, condition) medians and ranges, the study's and the training configuration, the ``provenance`` of
:mod:`commlab.provenance`). On a busy machine the study refuses to start unless ``--allow-noisy``
marks its file noisy (never published).
"""
import json
import os
import statistics
import sys
import time

from mpi4py import MPI

from experiments import harness
from training.settings.config import Config
from commlab.run_files import run_info
from training.driver.preflight import check_run
from training.ps_mode.run_records import time_to_accuracy
from training.train import run
from training.settings.options import INT32_MAX, Parser, integer, real, text

__all__ = ["DP_METHODS", "PS_METHODS", "CONDITIONS", "JOBS", "method_config", "condition_config", "run_study",
           "ideal_step", "aggregate", "main"]

DP_METHODS = "equal,balance,local4"
PS_METHODS = "ssp2,ps-balance"
CONDITIONS = "even,slow1.5,slow2,slow4,jitter0.02"
_RUN = dict(progress=False, checkpoint_every=0, keep_checkpoints=1)
#: ``--job``: ``compute``, computation ~93 % of a step at P = 2 (3 epochs, 1.4 s quiet); ``digits``, the
#: main job's model and data (``training.train``'s defaults: B = 64, communication 73-85 % of a step), 10
#: epochs.
JOBS = {"compute": dict(_RUN, data="synthetic", samples=6144, features=256, hidden=(1024, 1024), batch_size=512,
                        threads=1, epochs=3),
        "digits": dict(_RUN, epochs=10)}
_QUICK = dict(samples=600, features=16, hidden=(32,), batch_size=60, epochs=2, lr=0.01)


def method_config(name, balance_every=2):
    """Return the training-configuration changes of method ``name``.

    Raises
    ------
    ValueError
        When the method is unknown.

    Examples
    --------
    >>> method_config("local4")
    {'local_steps': 4}
    >>> method_config("ps-balance")["consistency"]
    'bsp'
    """
    if name == "equal":
        return {}
    if name == "balance":
        return {"balance": True, "balance_every": balance_every}
    if name.startswith("local") and name[5:].isdigit() and int(name[5:]) > 1:
        return {"local_steps": int(name[5:])}
    if name.startswith("ssp") and name[3:].isdigit():
        return {"mode": "ps", "consistency": "ssp", "staleness": int(name[3:])}
    if name == "ps-balance":
        return {"mode": "ps", "consistency": "bsp", "balance": True, "balance_every": balance_every}
    raise ValueError(f"method must be equal, balance, localH (H > 1), sspS or ps-balance, got {name!r}")


def condition_config(name, kind):
    """Return the training-configuration changes of condition ``name`` for a ``kind`` ("dp", "ps") launch.

    The straggler is the second worker: rank 1 of a data-parallel job, rank 2 of a parameter-server
    job (rank 0 serves).

    Raises
    ------
    ValueError
        When the condition is not ``even``, ``slowF`` (F > 1) or ``jitterJ`` (J > 0 seconds).

    Examples
    --------
    >>> condition_config("slow2", "ps"), condition_config("jitter0.02", "dp")
    ({'straggler': '2:2.0'}, {'jitter': 0.02})
    """
    try:
        if name == "even":
            return {}
        if name.startswith("slow") and float(name[4:]) > 1:
            return {"straggler": f"{2 if kind == 'ps' else 1}:{float(name[4:])}"}
        if name.startswith("jitter") and float(name[6:]) > 0:
            return {"jitter": float(name[6:])}
    except ValueError:
        pass
    raise ValueError(f"condition must be even, slowF (F > 1) or jitterJ (J > 0 seconds), got {name!r}")


def _factors(condition, workers):
    """Each worker's slowdown factor and the per-step jitter bound (seconds) of ``condition``."""
    f = [1.0] * workers
    if condition.startswith("slow"):
        f[1 % workers] = float(condition[4:])
    return f, float(condition[6:]) if condition.startswith("jitter") else 0.0


def ideal_step(seconds_per_sample, batch, condition, workers):
    """Return the ideal step (seconds) of ``condition``: ``batch`` over the ranks' summed speeds.

    Parameters
    ----------
    seconds_per_sample : float
        A rank's compute per sample without injected slowness (the ``even`` run's median).
    batch : int
        Global batch B.
    condition : str
    workers : int

    Examples
    --------
    >>> round(ideal_step(1e-3, 512, "slow2", 2), 6)     # 512 / (1000 + 500) samples per second
    0.341333
    >>> round(ideal_step(1e-3, 512, "jitter0.02", 2), 6)  # 256 ms of compute, 10 ms of mean jitter
    0.266
    """
    f, jitter = _factors(condition, workers)
    return batch / sum(1.0 / (fr * seconds_per_sample) for fr in f) + jitter / 2


def _seconds_per_sample(folder, workers):
    """The median over steps of the mean over ranks of seconds per sample to reach the collective (rank 0's file)."""
    per = []
    with open(os.path.join(folder, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r.get("arrival_s") and r.get("samples"):
                per.append(r["arrival_s"] / r["samples"])
    return statistics.median(per) if per else None


def _one(base, method, condition, repeat, runs_dir, comm, target, balance_every):
    """Train one (method, condition, repeat); return its record on rank 0 (None elsewhere)."""
    kind = "ps" if method_config(method).get("mode") == "ps" else "dp"
    workers = comm.Get_size() - (1 if kind == "ps" else 0)
    name = f"{method}-{condition}-r{repeat}"
    cfg = base.replace(seed=repeat, run_dir=runs_dir, name=name, **method_config(method, balance_every),
                       **condition_config(condition, kind))
    summary = harness.logged(lambda: run(cfg, comm), os.path.join(runs_dir, f"{name}.log"), comm)
    if comm.Get_rank() != 0:
        return None
    folder = os.path.join(runs_dir, name)
    if kind == "ps":
        curve, per_sample = summary["curve"], None
        step_s = cfg.batch_size / summary["samples_per_s"] if summary["samples_per_s"] else None
        shares = None
    else:
        with open(os.path.join(folder, "epochs.jsonl"), encoding="utf-8") as f:
            curve = [json.loads(line) for line in f if line.strip()]
        step_s = (summary["compute_s"] + summary["comm_s"]) / max(summary["steps"], 1)
        per_sample, shares = _seconds_per_sample(folder, workers), summary["shares"]
    return {"method": method, "condition": condition, "repeat": repeat, "kind": kind, "workers": workers,
            "accuracy": summary["final_test_acc"], "target": target, "time_to_target_s": time_to_accuracy(curve, target),
            "step_s": step_s, "seconds_per_sample": per_sample, "shares": shares, "wall_s": summary["wall_s"],
            "run_dir": folder}


def run_study(base, methods, conditions, repeats, runs_dir, comm, target=0.9, balance_every=2, echo=print):
    """Train every (method, condition, repeat), repeats outermost; return the records (rank 0)."""
    out = []
    for repeat in range(repeats):
        for condition in conditions:
            for method in methods:
                rec = _one(base, method, condition, repeat, runs_dir, comm, target, balance_every)
                if rec is not None:
                    out.append(rec)
                    ttt = rec["time_to_target_s"]
                    echo(f"{method:>11} {condition:<11} repeat {repeat}: step {rec['step_s'] * 1e3:.1f} ms, accuracy "
                         f"{rec['accuracy']:.2%}, to {target:.0%} {'never' if ttt is None else f'{ttt:.2f} s'}"
                         + (f", shares {rec['shares']}" if rec["shares"] else ""))
    return out


def _spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None, None
    return statistics.median(values), min(values), max(values)


def aggregate(runs, reference=None, batch=None):
    """Return one row per (method, condition): median, min and max over repeats of each figure.

    ``reference``: the runs of a data-parallel launch (default ``runs``) whose ``equal`` runs give each
    repeat's seconds per sample (condition ``even``) and equal-share step (each condition). ``batch``:
    the global batch B. Ratios are formed within one repeat.
    """
    reference = runs if reference is None else reference
    t = {r["repeat"]: r["seconds_per_sample"] for r in reference if (r["method"], r["condition"]) == ("equal", "even")}
    eq = {(r["repeat"], r["condition"]): r["step_s"] for r in reference if r["method"] == "equal"}
    rows = []
    for key in dict.fromkeys((r["method"], r["condition"]) for r in runs):
        rs = [r for r in runs if (r["method"], r["condition"]) == key]
        ideal = [ideal_step(t[r["repeat"]], batch, key[1], r["workers"]) if batch and t.get(r["repeat"]) else None
                 for r in rs]
        eff = [i / r["step_s"] if i and r["step_s"] else None for i, r in zip(ideal, rs)]
        speed = [eq[(r["repeat"], key[1])] / r["step_s"] if eq.get((r["repeat"], key[1])) and r["step_s"] else None
                 for r in rs]
        ttt = [r["time_to_target_s"] for r in rs]
        row = {"method": key[0], "condition": key[1], "runs": len(rs), "reached_target": sum(v is not None for v in ttt)}
        for name, values in (("step_s", [r["step_s"] for r in rs]), ("ideal_s", ideal), ("efficiency", eff),
                             ("speedup", speed), ("accuracy", [r["accuracy"] for r in rs]),
                             ("time_to_target_s", ttt if None not in ttt else [])):
            row[name], row[name + "_min"], row[name + "_max"] = _spread(values)
        rows.append(row)
    return rows


def _parser():
    p = Parser(prog="python -m experiments.studies.hetero_study", description=__doc__.split("\n\n")[0])
    harness.add_worker_options(p, DP_METHODS, PS_METHODS)
    p.add_argument("--conditions", type=text(), default=CONDITIONS, metavar="LIST",
                   help="comma-separated conditions: even, slowF, jitterJ (default: %(default)s)")
    p.add_argument("--job", choices=sorted(JOBS), default="compute",
                   help="compute: computation-bound (synthetic, 256 features, hidden 1024,1024, B = 512, one "
                        "BLAS thread, 3 epochs); digits: the main job (training.train's defaults, 10 epochs), "
                        "communication most of its step (default: %(default)s)")
    p.add_argument("--epochs", type=integer(1, INT32_MAX), default=None, help="epochs per run (default: the job's)")
    p.add_argument("--balance-every", type=integer(1, INT32_MAX), default=2, metavar="K",
                   help="--balance: steps (clocks) between two gathers of the speeds (default: %(default)s: the "
                        "compute job's 3 epochs are 30 steps, so the training's default 10 would keep equal shares "
                        "for a third of the run)")
    p.add_argument("--target", type=real(0, 1e15, low_open=True), default=0.9, help="target test accuracy (default: %(default)s)")
    p.add_argument("--reference", type=text(), default=None, metavar="FILE",
                   help="a parameter-server launch: the data-parallel results file whose equal runs give the "
                        "ideal step and the speedup, of the same job (default: the data-parallel launch's file "
                        "in --out)")
    p.add_argument("--quick", action="store_true", help="a check of the whole path, one repeat: the compute job "
                   "shrunk to 600 samples of 32 hidden units and 2 epochs; digits for 1 epoch")
    harness.add_options(p, out="results/hetero", folder=True, repeats=3)
    return p


def _name(workers, kind, job):
    """The results file's name of one launch: ``hetero_wW_KIND.json``, ``hetero_wW_KIND_JOB.json`` for a
    job other than ``compute`` (so that two jobs' launches never overwrite, nor borrow, each other's)."""
    return f"hetero_w{workers}_{kind}{'' if job == 'compute' else '_' + job}.json"


def _reference(args, base):
    """Return the path of a parameter-server launch's data-parallel reference; raise ValueError when the
    file exists but was measured on another job (its training configuration differs from ``base``)."""
    path = args.reference or os.path.join(args.out, _name(args.workers, "dp", args.job))
    if not os.path.exists(path):
        return path
    try:
        with open(path, encoding="utf-8") as f:
            theirs = json.load(f).get("train_config") or {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"--reference {path}: not a results file of this study ({exc})") from None
    ours = base.to_dict()
    differ = [k for k in ("data", "samples", "features", "hidden", "batch_size", "epochs", "threads")
              if k in theirs and json.loads(json.dumps(ours.get(k))) != theirs[k]]
    if differ:
        raise ValueError(f"--reference {path} was measured on another job "
                         f"({', '.join(f'{k} {theirs[k]!r}' for k in differ)}; "
                         f"this launch: {', '.join(f'{k} {ours.get(k)!r}' for k in differ)})")
    return path


def _settings(args, size):
    """Return (kind, methods, conditions, base configuration) of the parsed options; raise ValueError."""
    W = args.workers
    kind, methods = harness.worker_methods(args, size, DP_METHODS, PS_METHODS,
                                           lambda m: method_config(m).get("mode") == "ps")
    conditions = [c for c in args.conditions.split(",") if c]
    for c in conditions:
        condition_config(c, kind)
    if W < 2 or args.repeats < 1 or args.balance_every < 1 or not 0 < args.target <= 1:
        raise ValueError(f"--workers must be >= 2, --repeats and --balance-every >= 1, --target in (0, 1]; got "
                         f"{W}, {args.repeats}, {args.balance_every}, {args.target}")
    quick = (_QUICK if args.job == "compute" else {"epochs": 1}) if args.quick else {}
    train = dict(JOBS[args.job], **quick)
    if args.epochs:
        train["epochs"] = args.epochs
    return kind, methods, conditions, Config().replace(**train)


def main(argv=None):
    """Parse the command line, run the study, write the results (rank 0); return the exit status."""
    comm = MPI.COMM_WORLD
    parser = _parser()

    def check(args):
        kind, methods, conditions, base = _settings(args, comm.Get_size())
        for m in methods:
            for c in conditions:  # the trainer's own checks, every rank, before anything is trained
                check_run(base.replace(**method_config(m, args.balance_every), **condition_config(c, kind)), comm)
        return kind, methods, conditions, base, _reference(args, base) if kind == "ps" else None

    args, (kind, methods, conditions, base, ref) = harness.parse(parser, argv, comm, check)
    echo = harness.echo(comm)
    runs_dir = os.path.join(args.out, "runs", os.path.splitext(_name(args.workers, kind, args.job))[0])
    repeats = 1 if args.quick else args.repeats
    path = os.path.join(args.out, _name(args.workers, kind, args.job))
    watch = harness.start(args, comm, paths=[path], prog=parser.prog)
    if watch is None:
        return 2

    def body():
        started = time.strftime("%Y-%m-%dT%H:%M:%S")
        harness.fresh_folder(runs_dir, comm)
        echo(f"heterogeneity study: {args.workers} workers ({kind}), {len(methods)} methods x {len(conditions)} "
             f"conditions x {repeats} repeats, {base.epochs} epochs -> {args.out}")
        runs = run_study(base, methods, conditions, repeats, runs_dir, comm, args.target, args.balance_every, echo)
        reference = runs
        if kind == "ps" and comm.Get_rank() == 0:
            reference = json.load(open(ref, encoding="utf-8"))["runs"] if os.path.exists(ref) else []
        result = {"experiment": "hetero_study", "kind": kind, "workers": args.workers, "study": vars(args),
                  "methods": methods, "conditions": conditions, "repeats": repeats, "train_config": base.to_dict(),
                  "run": run_info(comm), "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                  "runs": runs, "table": aggregate(runs, reference, base.batch_size)}
        harness.finish(result, watch, path, comm=comm, module="experiments.studies.hetero_study", argv=argv,
                       show=lambda _: f"draw with: python -m plots.hetero {path}")

    return harness.run_or_report(body, comm)


if __name__ == "__main__":
    sys.exit(main())
