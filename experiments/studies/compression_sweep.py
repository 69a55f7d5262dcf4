"""Compression study: train the default model on P ranks with every compressor and compare bytes on
the wire, accuracy and compress/decompress time.

    mpiexec -n 4 python -m experiments.studies.compression_sweep [--out results/compression] [--seeds 0,1,2]
    python -m plots.compression results/compression/compression_sweep.json

Each compressor spec ``NAME[:KEY=VALUE,...]`` is trained once per seed with ``training.train.run`` (the
default configuration unless ``--set KEY=VALUE`` changes it). Per run: final test accuracy, loss and
accuracy per epoch, and per step the payload bytes this rank sent (the hook's ``bytes_sent``, counted
from the payload buffers) and the compress + decompress seconds. For ``none`` the payload is the dense
gradient. A short benchmark then runs each hook on Gaussian gradients of the model's size and reads
the bytes the collectives really sent (``collectives.engine.context.last_stats``: ring forwarding of all-gathers and
float32 partial sums of fp16 included; DGC at its final sparsity; not for ``threshold``, whose size
depends on the data). Rank 0 writes ``compression_sweep.json`` (configuration, MPI
library, P, host, every run, the table, the targets, the ``provenance`` of :mod:`commlab.provenance`)
and ``compression_sweep.csv`` (the table). On a busy machine the study refuses to start unless
``--allow-noisy`` marks its results noisy.
"""
import argparse
import csv
import dataclasses
import io
import os
import re
import sys
import time
from contextlib import redirect_stderr
from dataclasses import dataclass
from functools import partial

import numpy as np
from mpi4py import MPI

from collectives.compression import make_compressor, make_hook, parse_compression_args, split_key_value
from experiments import harness
from training.runtime.build import build_model
from training.settings.cli import parse_args, parse_on_every_rank
from training.data.datasets import load_dataset
from training.driver.preflight import check_run
from commlab.file_formats import read_jsonl, write_json
from commlab.run_files import run_info
from training.runtime.progress import progress_bar
from training.train import run
from experiments.studies.compression_report import check_lines, markdown_table, table, targets
from training.settings.options import INT32_MAX, Parser, integer, listof, text

__all__ = ["SweepConfig", "STUDY", "parse_spec", "base_config", "check_study", "run_study", "main"]

#: The compressors of the study, as ``NAME[:KEY=VALUE,...]`` specs.
STUDY = ("none", "fp16", "int8", "qsgd:levels=127", "terngrad", "signsgd", "efsignsgd", "onebit",
         "topk:ratio=0.01", "randomk:ratio=0.01", "threshold:threshold=0.05",
         "dgc:ratio=0.01,warmup_steps=92", "powersgd:rank=1", "powersgd:rank=4")

@dataclass
class SweepConfig:
    """Configuration of the compression study."""

    compressors: tuple = STUDY        # compressor specs NAME[:KEY=VALUE,...]
    seeds: tuple = (0, 1, 2)          # training seeds; accuracies are averaged over them
    epochs: int = 20                  # epochs per training run
    out: str = "results/compression"  # directory of the results files and the run directories
    train_args: tuple = ()            # training flags as KEY=VALUE (e.g. "optimizer=sgd")
    bench_steps: int = 10             # steps of the wire-bytes benchmark per compressor
    progress: bool = True             # rank 0's bar of the runs (in place on a terminal, else a line per 30 s)
    max_load: float = None            # refuse to start above this load average (None: 0.25 x cores)
    allow_noisy: bool = False         # start on a busy machine anyway, the results marked noisy
    settle: float = 0.0               # seconds rank 0 may wait for the load average to fall below max_load


def parse_spec(spec):
    """Split ``NAME[:KEY=VALUE,...]`` into the name and its keyword arguments (values parsed).

    Raises
    ------
    ValueError
        If the name is not a registered compressor or an argument is malformed or unknown.
    """
    name, _, args = spec.partition(":")
    kwargs = parse_compression_args([a for a in args.split(",") if a])
    make_compressor(name, **kwargs)  # validates the name and the arguments
    return name, kwargs


def base_config(cfg):
    """Return the training ``Config`` of the study: defaults, ``cfg.epochs`` and ``cfg.train_args``.

    Each ``KEY=VALUE`` is read by the trainer's own parser as ``--key value`` (``--key`` /
    ``--no-key`` for true / false).

    Raises
    ------
    ValueError
        If a training flag is malformed, unknown or out of range.
    """
    argv = ["--epochs", str(cfg.epochs)]
    for item in cfg.train_args:
        key, value = split_key_value(item, "training flag")
        flag = "--" + key.replace("_", "-")
        if value.lower() in ("true", "false"):
            argv.append(flag if value.lower() == "true" else "--no-" + flag[2:])
        else:
            argv += [flag, value]
    with redirect_stderr(io.StringIO()) as err:
        try:
            return parse_args(argv)
        except SystemExit:
            pass
    why = err.getvalue().strip().splitlines()[-1:] or ["rejected"]
    raise ValueError(f"--set {' '.join(cfg.train_args)}: {why[0].partition(' error: ')[2] or why[0]}")


#: Training fields each run of the study sets itself, so ``--set`` may not.
_STUDY_FIELDS = ("compression", "compression_arg", "compression_args", "seed", "run_dir", "name", "epochs")


def check_study(cfg, comm):
    """Check everything the study needs before the first run, on every rank; return the base ``Config``.

    Every compressor spec, the training flags (their names, values and the data-parallel mode the
    study compresses), and the job each run will be (:func:`training.driver.preflight.check_run`: the global
    batch divides among the P ranks, the data is there, ``algorithm="auto"`` has its table).

    Raises
    ------
    ValueError
        Naming the first spec, flag or field that cannot run, the same on every rank.
    """
    if cfg.epochs < 1 or cfg.bench_steps < 1:
        raise ValueError(f"--epochs ({cfg.epochs}) and --bench-steps ({cfg.bench_steps}) must be >= 1")
    if not cfg.seeds or not cfg.compressors:
        raise ValueError("--seeds and --compressor need at least one value")
    for item in cfg.train_args:
        key = item.partition("=")[0].strip().replace("-", "_")
        if key in _STUDY_FIELDS:
            raise ValueError(f"--set {item}: the study sets {key} itself "
                             f"(use --compressor, --seeds, --epochs or --out)")
    base = base_config(cfg)
    if base.mode != "dp":
        raise ValueError(f"--set mode={base.mode}: the study compresses the data-parallel all-reduce "
                         "(mode=dp); the parameter server has experiments.studies.staleness_sweep")
    for spec in cfg.compressors:
        try:
            name, kwargs = parse_spec(spec)
            base.replace(compression=name, compression_args=kwargs)  # validates the pair
        except ValueError as exc:
            raise ValueError(f"--compressor {spec}: {exc}") from None
    try:
        check_run(base, comm)
    except ImportError as exc:  # --set device=gpu without CuPy
        raise ValueError(str(exc)) from None
    return base


def _slug(spec):
    return re.sub(r"[^A-Za-z0-9.=-]+", "-", spec).strip("-")


def _train_one(cfg, base, spec, seed, run_dir, comm):
    """Train one (compressor, seed) and return its record (complete on rank 0)."""

    name, kwargs = parse_spec(spec)
    tcfg = base.replace(compression=name, compression_args=kwargs, seed=seed, run_dir=run_dir,
                        name=f"{_slug(spec)}-seed{seed}", progress=False, checkpoint_every=0,
                        keep_checkpoints=1)
    os.makedirs(run_dir, exist_ok=True)
    summary = harness.logged(lambda: run(tcfg, comm), os.path.join(run_dir, f"{tcfg.name}.log"), comm)  # epoch table
    rec = {"spec": spec, "compressor": name, "args": kwargs, "seed": seed,
           "run_dir": summary["run_dir"], "final_test_acc": summary["final_test_acc"],
           "parameters": summary["parameters"], "wall_s": summary["wall_s"]}
    if comm.Get_rank() == 0:
        steps = read_jsonl(os.path.join(summary["run_dir"], "metrics.jsonl"))
        epochs = read_jsonl(os.path.join(summary["run_dir"], "epochs.jsonl"))
        itemsize = np.dtype(tcfg.dtype).itemsize
        sent = [s["bytes_sent"] for s in steps if not s["skipped"]]
        rec["bytes_per_step"] = (summary["parameters"] * itemsize if name == "none"
                                 else float(np.mean(sent)))
        rec["codec_ms"] = 1e3 * float(np.mean([s["compress_s"] + s["decompress_s"] for s in steps]))
        rec["epochs"] = [{k: e[k] for k in ("epoch", "loss", "train_acc", "test_acc")} for e in epochs]
    return rec


def _wire_benchmark(spec, n, shapes, algorithm, steps, comm):
    """Return the mean bytes per step the collectives sent for ``spec`` (Gaussian gradients, DGC
    without warm-up)."""
    name, kwargs = parse_spec(spec)
    if name == "dgc":
        kwargs["warmup_steps"] = 0  # steady state: the final sparsity from the first step
    hook = make_hook(name, comm=comm, algorithm=algorithm, shapes=shapes, **kwargs)
    rng = np.random.default_rng(comm.Get_rank())
    wire = []
    for _ in range(steps):
        _, info = hook(rng.standard_normal(n).astype(np.float32) * np.float32(0.01))
        wire.append(info.get("wire_bytes", float("nan")))
    hook.close()
    return float(np.mean(wire))


def run_study(cfg, comm=None, watch=None, argv=None):
    """Run the study on ``comm`` and write the results files (rank 0); return the results dict.

    Parameters
    ----------
    cfg : SweepConfig
    comm : mpi4py.MPI.Comm, optional
        Default ``MPI.COMM_WORLD``.
    watch : commlab.provenance.LoadWatch, optional
        Every rank's :func:`experiments.harness.start`: rank 0's results then carry their
        ``provenance`` (:func:`experiments.harness.finish`), and the other ranks stop sampling.
    argv : list of str, optional
        The arguments of the command line the provenance names (default: this process's).

    Returns
    -------
    dict or None
        The results on rank 0, None on the other ranks.
    """
    comm = comm if comm is not None else MPI.COMM_WORLD
    rank = comm.Get_rank()
    base = check_study(cfg, comm)
    stamp = comm.bcast(time.strftime("%Y%m%d-%H%M%S"), root=0)
    run_dir = os.path.join(cfg.out, "runs", stamp)
    jobs = [(spec, seed) for spec in cfg.compressors for seed in cfg.seeds]
    bar = None
    if rank == 0:
        bar = progress_bar(len(jobs), "run", cfg.progress)
    runs = []
    for spec, seed in jobs:
        runs.append(_train_one(cfg, base, spec, seed, run_dir, comm))
        if bar is not None:
            bar.set_postfix_str(f"{spec} seed {seed}: {runs[-1]['final_test_acc']:.2%}")
            bar.update()
    if bar is not None:
        bar.close()
    ds = load_dataset(base)
    shapes = [tuple(p.shape) for p, _ in build_model(base, ds.n_features, ds.n_classes).parameters()]
    n = sum(int(np.prod(s)) for s in shapes)
    wire = {spec: _wire_benchmark(spec, n, shapes, base.algorithm, cfg.bench_steps, comm)
            for spec in cfg.compressors if not spec.startswith("threshold")}  # threshold: data-dependent
    if rank != 0:
        if watch is not None:
            watch.summary()  # stops this rank's sampling: rank 0 alone writes
        return None
    rows = table(runs, wire)
    results = {"study": "compression_sweep", "config": dataclasses.asdict(cfg),
               "train_config": base.to_dict(), "run": run_info(comm), "parameters": n,
               "shapes": [list(s) for s in shapes], "runs": runs, "table": rows,
               "targets": targets(rows)}
    path = os.path.join(cfg.out, "compression_sweep.json")
    if watch is not None:
        harness.finish(results, watch, path, P=comm.Get_size(), module="experiments.studies.compression_sweep",
                       argv=argv, show=lambda r: "\n".join([markdown_table(r["table"]), *check_lines(r)]))
    else:
        os.makedirs(cfg.out, exist_ok=True)
        write_json(path, results)
    keys = ["spec", "bits_per_element", "bytes_per_step", "ratio_to_none", "wire_bytes_per_step",
            "wire_ratio_to_none", "test_acc_mean", "test_acc_min", "test_acc_max", "delta_points",
            "codec_ms", "seeds"]
    with open(os.path.join(cfg.out, "compression_sweep.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return results


def _build_parser():
    """Return the argument parser."""
    p = Parser(
        prog="python -m experiments.studies.compression_sweep",
        description="Train the default model with every compressor on the MPI ranks (run it as "
                    "mpiexec -n P python -m experiments.studies.compression_sweep); write compression_sweep.json "
                    "and .csv into --out (draw with python -m plots.compression).")
    p.add_argument("--compressor", type=text(), action="append", dest="compressors", metavar="NAME[:K=V,...]",
                   help="compressor spec, repeatable (default: the study list: %s)" % " ".join(STUDY))
    p.add_argument("--seeds", type=listof(integer(0, INT32_MAX)), default="0,1,2", help="training seeds, comma separated (default: 0,1,2)")
    p.add_argument("--epochs", type=integer(1, INT32_MAX), default=20, help="epochs per training run (default: 20)")
    p.add_argument("--set", type=text(), action="append", default=[], metavar="KEY=VALUE", dest="train_args",
                   help="training flag of python -m training.train as KEY=VALUE, repeatable "
                        "(e.g. optimizer=sgd, lr=0.05, hidden=64,32)")
    p.add_argument("--bench-steps", type=integer(1, INT32_MAX), default=10,
                   help="steps of the wire-bytes benchmark per compressor (default: 10)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="rank 0's bar of the runs: redrawn in place on a terminal (mpiexec's included), "
                        "else one line every 30 s (default: on)")
    harness.add_options(p, out="results/compression", folder=True)
    return p


def _configure(argv, comm):
    """Return the :class:`SweepConfig` of ``argv``, checked (:func:`check_study`); exit 2 when it is bad."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    seeds = tuple(args.seeds)
    cfg = SweepConfig(compressors=tuple(args.compressors or STUDY), seeds=seeds, epochs=args.epochs,
                      out=args.out, train_args=tuple(args.train_args), bench_steps=args.bench_steps,
                      progress=args.progress, max_load=args.max_load, allow_noisy=args.allow_noisy,
                      settle=args.settle)
    try:
        check_study(cfg, comm)
    except ValueError as e:  # the same on every rank: rank 0 prints one line, every rank exits 2
        parser.error(str(e))
    return cfg


def main(argv=None):
    """Command-line entry point (every rank); returns 0, or exits with status 2 on a configuration error.

    A busy machine or an unwritable results file (:func:`experiments.harness.start`) exits 2 too, with
    one error line from rank 0, before any run; ``--allow-noisy`` runs anyway and marks the results noisy.
    """
    comm = MPI.COMM_WORLD
    cfg = parse_on_every_rank(partial(_configure, comm=comm), argv, comm.Get_rank())  # errors once
    paths = [os.path.join(cfg.out, f"compression_sweep.{ext}") for ext in ("json", "csv")]
    watch = harness.start(cfg, comm, paths=paths, prog=_build_parser().prog)
    if watch is None:
        return 2
    run_study(cfg, comm, watch, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
