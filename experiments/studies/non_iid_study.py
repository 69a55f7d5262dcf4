"""Skewed data across workers: accuracy after a fixed number of samples, and time to a target
accuracy, for each training method under each label skew, with and without the remedies.

    mpiexec -n 4 python -m experiments.studies.non_iid_study --workers 4 --seeds 3
    mpiexec -n 5 python -m experiments.studies.non_iid_study --workers 4 --seeds 3 --methods asp,ssp2,ssp2+resample,ssp2+shared
    python -m plots.non_iid results/non_iid/non_iid_w4_dp.json results/non_iid/non_iid_w4_ps.json

One launch trains every (method, skew, seed) of one kind in turn (the launch's cost is paid once):
data-parallel methods on ``--workers`` ranks, parameter-server methods on ``--workers`` + 1 (one
server). Every run trains the same model (digits, SGD with momentum, cosine schedule) for the same
number of epochs, so every method sees the same number of samples; ``accuracy`` is the final test
accuracy (load-independent), ``time_to_target_s`` the wall time to the first evaluation at or above
``--target`` (default 0.95; it depends on the machine's load) and ``epochs_to_target`` the epochs
trained by then (load-independent): data-parallel runs are evaluated once per epoch (whole epochs),
parameter-server runs at each snapshot (a quarter of an epoch). ``bytes_per_sample`` is the bytes a
rank sent per sample it trained on.

Methods: ``bsp`` (data-parallel all-reduce), ``topk`` (top-k 1 % with error feedback), ``dgc`` (deep
gradient compression, 1 %), ``localH`` (local SGD, H steps between averages), ``asp`` and ``sspS``
(parameter server); a suffix ``+resample`` (class-balanced batches) or ``+shared`` (a shared IID subset
of 5 % of the training set on every worker) adds a remedy. Skews: any ``--partition`` value.

Rank 0 writes ``non_iid_wW_KIND.json`` into ``--out`` (every run, the per-(method, skew) medians and
ranges, the study's and the training configuration, the ``provenance`` of :mod:`commlab.provenance`).
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
from training.data.partition import parse_partition
from training.driver.preflight import check_run
from training.ps_mode.run_records import time_to_accuracy
from training.train import run
from training.settings.options import INT32_MAX, Parser, integer, real, text

__all__ = ["METHODS", "REMEDIES", "SKEWS", "method_config", "run_study", "aggregate", "main"]

#: Base methods: their changes to the study's training configuration.
METHODS = {
    "bsp": {}, "topk": {"compression": "topk", "compression_args": {"ratio": 0.01}},
    "dgc": {"compression": "dgc", "compression_args": {"ratio": 0.01}},
    "asp": {"mode": "ps", "consistency": "asp"},
}
REMEDIES = {"resample": {"resample": True}, "shared": {"shared_fraction": 0.05}}
#: Default skews per worker count.
SKEWS = {4: ("iid", "dirichlet:alpha=1", "dirichlet:alpha=0.1", "classes:k=5", "classes:k=3"),
         8: ("iid", "dirichlet:alpha=0.1", "classes:k=2")}
DP_METHODS = "bsp,topk,dgc,local4,local16,bsp+resample,bsp+shared,local16+resample,local16+shared"
PS_METHODS = "asp,ssp2,ssp2+resample,ssp2+shared"
_TRAIN = dict(data="digits", hidden=(128,), optimizer="sgd", lr=0.05, momentum=0.9, lr_schedule="cosine",
              batch_size=64, progress=False, checkpoint_every=0, keep_checkpoints=1)


def method_config(name):
    """Return the configuration changes of a method name (``bsp``, ``local16+shared``, ``ssp2`` ...).

    Raises
    ------
    ValueError
        When the base method or a remedy is unknown.

    Examples
    --------
    >>> method_config("local16+resample")
    {'local_steps': 16, 'resample': True}
    >>> method_config("ssp2")["staleness"]
    2
    """
    base, *remedies = name.split("+")
    if base in METHODS:
        changes = dict(METHODS[base])
    elif base.startswith("local") and base[5:].isdigit() and int(base[5:]) >= 1:
        changes = {"local_steps": int(base[5:])}
    elif base.startswith("ssp") and base[3:].isdigit():
        changes = {"mode": "ps", "consistency": "ssp", "staleness": int(base[3:])}
    else:
        raise ValueError(f"method must be bsp, topk, dgc, localH, asp or sspS (+resample, +shared), got {name!r}")
    for r in remedies:
        if r not in REMEDIES:
            raise ValueError(f"method {name}: remedy must be resample or shared, got {r!r}")
        changes.update(REMEDIES[r])
    return changes


def _tag(skew):
    return skew.replace(":", "-").replace("=", "")


def _one(base, method, skew, seed, runs_dir, comm, target):
    """Train one (method, skew, seed); return its record on rank 0 (None elsewhere)."""
    name = f"{method}-{_tag(skew)}-s{seed}"
    cfg = base.replace(partition=skew, seed=seed, run_dir=runs_dir, name=name, **method_config(method))
    summary = harness.logged(lambda: run(cfg, comm), os.path.join(runs_dir, f"{name}.log"), comm)
    if comm.Get_rank() != 0:
        return None
    folder = os.path.join(runs_dir, name)
    with open(os.path.join(folder, "epochs.jsonl"), encoding="utf-8") as f:
        epochs = [json.loads(line) for line in f if line.strip()]
    if cfg.mode == "ps":
        per_epoch = summary["pushes"] / summary["epochs"]  # pushes of all workers per epoch
        curve = [dict(p, epochs=p["pushes"] / per_epoch) for p in summary["curve"]]
        sent, samples = None, None
    else:
        curve = [{"wall_s": e["wall_s"], "test_acc": e["test_acc"], "epochs": e["epoch"]} for e in epochs]
        samples = summary["steps"] * cfg.batch_size // comm.Get_size()
        sent = summary["bytes_sent_per_rank"] / samples
    first = next((p for p in curve if p["test_acc"] >= target), None)  # the first evaluation at the target
    return {"method": method, "skew": skew, "seed": seed, "accuracy": summary["final_test_acc"], "target": target,
            "time_to_target_s": time_to_accuracy(curve, target),
            "epochs_to_target": None if first is None else round(first["epochs"], 4), "wall_s": summary["wall_s"],
            "bytes_per_sample": sent, "samples_per_rank": samples, "run_dir": folder}


def run_study(base, methods, skews, seeds, runs_dir, comm, target=0.95, echo=print):
    """Train every (method, skew, seed), seeds outermost; return the records (rank 0).

    ``target`` is the test accuracy whose first crossing each record keeps: its wall time
    (``time_to_target_s``) and the epochs trained by then (``epochs_to_target``).
    """
    out = []
    for seed in seeds:
        for skew in skews:
            for method in methods:
                rec = _one(base, method, skew, seed, runs_dir, comm, target)
                if rec is not None:
                    out.append(rec)
                    ttt, ept = rec["time_to_target_s"], rec["epochs_to_target"]
                    echo(f"{method:>17} {skew:<20} seed {seed}: accuracy {rec['accuracy']:.2%}, to "
                         f"{target:.0%} {'never' if ttt is None else f'{ttt:.2f} s (epoch {ept:g})'}")
    return out


def aggregate(runs):
    """Return one row per (method, skew): median, min and max of accuracy; medians of time and epochs to target.

    A median to the target is None when a seed never reached it (``reached_target`` counts those that did).
    """
    rows = []
    for key in dict.fromkeys((r["method"], r["skew"]) for r in runs):
        rs = [r for r in runs if (r["method"], r["skew"]) == key]
        acc = [r["accuracy"] for r in rs]
        ttt = [r["time_to_target_s"] for r in rs if r["time_to_target_s"] is not None]
        ept = [r["epochs_to_target"] for r in rs if r.get("epochs_to_target") is not None]
        sent = [r["bytes_per_sample"] for r in rs if r["bytes_per_sample"] is not None]
        rows.append({"method": key[0], "skew": key[1], "runs": len(rs), "accuracy": statistics.median(acc),
                     "accuracy_min": min(acc), "accuracy_max": max(acc),
                     "time_to_target_s": statistics.median(ttt) if len(ttt) == len(rs) else None,
                     "epochs_to_target": statistics.median(ept) if len(ept) == len(rs) else None,
                     "reached_target": len(ttt), "bytes_per_sample": statistics.median(sent) if sent else None})
    return rows


def _parser():
    p = Parser(prog="python -m experiments.studies.non_iid_study", description=__doc__.split("\n\n")[0])
    harness.add_worker_options(p, DP_METHODS, PS_METHODS)
    p.add_argument("--skews", type=text(), default=None, metavar="LIST",
                   help="semicolon-separated partitions (default: " + "; ".join(f"W={w}: {', '.join(s)}"
                                                                           for w, s in SKEWS.items()) + ")")
    p.add_argument("--seeds", type=integer(1, INT32_MAX), default=3, help="seeds 0..N-1 per (method, skew) (default: 3)")
    p.add_argument("--epochs", type=integer(1, INT32_MAX), default=5, help="epochs per run: the fixed number of samples (default: 5)")
    p.add_argument("--target", type=real(0, 1e15, low_open=True), default=0.95, help="target test accuracy whose first crossing each run "
                   "records, time and epochs (default: 0.95, where the methods' medians spread)")
    p.add_argument("--quick", action="store_true", help="a check of the whole path: 2 epochs, one seed, "
                   "a 32-unit model, skews iid and classes:k=W's smallest")
    harness.add_options(p, out="results/non_iid", folder=True)
    return p


def _settings(args, size):
    """Return (kind, methods, skews, seeds, base configuration) of the parsed options; raise ValueError."""
    W = args.workers
    kind, methods = harness.worker_methods(args, size, DP_METHODS, PS_METHODS,
                                           lambda m: method_config(m).get("mode") == "ps")
    skews = [s.strip() for s in (args.skews or ";".join(SKEWS.get(W, ("iid",)))).split(";") if s.strip()]
    train = dict(_TRAIN, epochs=args.epochs)
    if args.quick:
        skews, train = ["iid", f"classes:k={-(-10 // W)}"], dict(train, epochs=2, hidden=(32,))
    for s in skews:
        parse_partition(s)
    if not args.target <= 1:
        raise ValueError(f"--target must be in (0, 1], got {args.target}")
    base = Config().replace(**train)
    return kind, methods, skews, list(range(1 if args.quick else args.seeds)), base


def main(argv=None):
    """Parse the command line, run the study, write the results (rank 0); return the exit status."""
    comm = MPI.COMM_WORLD
    parser = _parser()

    def check(args):
        kind, methods, skews, seeds, base = _settings(args, comm.Get_size())
        for m in methods:
            for s in skews:  # the trainer's own checks, every rank, before anything is trained
                check_run(base.replace(partition=s, **method_config(m)), comm)
        return kind, methods, skews, seeds, base

    args, (kind, methods, skews, seeds, base) = harness.parse(parser, argv, comm, check)
    echo = harness.echo(comm)
    runs_dir = os.path.join(args.out, "runs", f"w{args.workers}-{kind}")
    path = os.path.join(args.out, f"non_iid_w{args.workers}_{kind}.json")
    watch = harness.start(args, comm, paths=[path], prog=parser.prog)
    if watch is None:
        return 2

    def body():
        started = time.strftime("%Y-%m-%dT%H:%M:%S")
        harness.fresh_folder(runs_dir, comm)
        echo(f"non-IID study: {args.workers} workers ({kind}), {len(methods)} methods x {len(skews)} skews x "
             f"{len(seeds)} seeds, {base.epochs} epochs -> {args.out}")
        runs = run_study(base, methods, skews, seeds, runs_dir, comm, args.target, echo)
        result = {"experiment": "non_iid_study", "kind": kind, "workers": args.workers, "study": vars(args),
                  "methods": methods, "skews": skews, "seeds": seeds, "train_config": base.to_dict(),
                  "run": run_info(comm), "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                  "runs": runs, "table": aggregate(runs)}
        harness.finish(result, watch, path, comm=comm, module="experiments.studies.non_iid_study", argv=argv,
                       show=lambda _: f"draw with: python -m plots.non_iid {path}")

    return harness.run_or_report(body, comm)


if __name__ == "__main__":
    sys.exit(main())
