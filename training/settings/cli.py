"""Command line of ``python -m training.train``: flags mapped onto :class:`training.settings.config.Config`.

Every flag is a field of the configuration (help text with units in :data:`HELP`); only flags
actually given override the defaults, or the saved configuration of a run being resumed; unknown
keys are rejected.
"""
import argparse
import contextlib
import dataclasses
import io
import json
import os
import sys

import numpy

from collectives import ALGORITHMS
from collectives.compression import COMPRESSORS, parse_compression_arg
from collectives.schedules.registry import verify_share
from commlab.run_files import never_configured
from training.settings.config import CHOICES, Config
from training.settings.options import INT32_MAX, Parser, as_flags, field_type, parsed_by

__all__ = ["HELP", "build_parser", "parse_args", "parse_on_every_rank"]


_METAVARS = {
    "data_dir": "DIR", "test_fraction": "FRACTION", "samples": "N", "features": "N", "classes": "N",
    "epochs": "N", "stop_after": "EPOCH", "batch_size": "SAMPLES", "lr": "LR", "momentum": "MU",
    "weight_decay": "WD", "beta1": "B1", "beta2": "B2", "eps": "EPS", "seed": "N",
    "algorithm": "NAME", "bucket_bytes": "BYTES", "compression": "NAME", "servers": "N", "elastic_min": "N",
    "staleness": "CLOCKS", "straggler": "RANK:FACTOR", "jitter": "SECONDS", "ps_timeout": "SECONDS", "timeout": "SECONDS",
    "ps_conflict_lag": "K", "ps_retries": "N", "ps_replicas": "R",
    "fail_worker": "RANK:STEP", "run_dir": "DIR", "name": "NAME", "checkpoint_every": "EPOCHS",
    "keep_checkpoints": "N", "resume": "PATH", "eval_batch": "SAMPLES", "threads": "N",
    "tensor_parallel": "T", "pipeline_parallel": "Q", "micro_batches": "M", "trace": "FILE",
    "log_level": "LEVEL", "partition": "SPEC", "shared_fraction": "FRACTION", "local_steps": "H",
    "post_local_epoch": "EPOCH", "metrics_port": "PORT", "metrics_host": "ADDRESS", "tensorboard": "DIR",
    "metrics_every": "STEPS", "metrics_interval": "SECONDS", "straggler_factor": "K", "straggler_intervals": "N",
    "stall_seconds": "SECONDS", "ctr_rows": "ROWS", "ctr_tables": "F", "ctr_dim": "D", "ctr_bag": "IDS",
    "ctr_train": "SAMPLES", "ctr_test": "SAMPLES", "ctr_hot": "ROWS", "memory_gb": "GIB",
    "balance_every": "K", "balance_gain": "FRACTION",
}

#: Flag help text, with units; defaults are appended from :class:`Config`.
HELP = {
    "mode": "dp: data-parallel all-reduce; ps: parameter server; hybrid (--model ctr): embeddings on the "
            "parameter server, the dense layers all-reduced among the workers",
    "model": "mlp: the MLP on --data; ctr: embedding tables and an MLP on synthetic click data (docs/guide/ctr.md)",
    "ctr_rows": "ctr: embedding rows in all tables together",
    "ctr_tables": "ctr: categorical features, one embedding table each",
    "ctr_dim": "ctr: embedding dimension",
    "ctr_bag": "ctr: ids per feature and sample, mean-pooled",
    "ctr_train": "ctr: synthetic training samples",
    "ctr_test": "ctr: synthetic test samples (AUC and log loss)",
    "ctr_sharding": "ctr: rows over the servers by hash of the row id, or by key range",
    "ctr_hot": "ctr: the hottest rows (counted on the training ids) split column-wise over all servers",
    "memory_gb": "GiB a rank may use. ctr: 0 is what the node has free, a larger model is refused before "
                 "allocating; data-parallel: bounds each rank's batch share (0: no bound)",
    "data": "data set: digits (scikit-learn's embedded 8x8 digits), mnist (IDX files in --data-dir), "
            "synthetic (Gaussian classes, size set by --samples/--features/--classes)",
    "data_dir": "directory with train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
                "t10k-labels-idx1-ubyte (each raw or .gz)",
    "test_fraction": "fraction of samples held out for test, for digits and synthetic (0..1)",
    "samples": "synthetic data: number of samples",
    "features": "synthetic data: features per sample",
    "classes": "synthetic data: number of classes",
    "hidden": "hidden layer widths in units, comma separated (e.g. 256,128); '' for a linear model",
    "activation": "hidden activation (relu uses He init, tanh Glorot init)",
    "dtype": "parameter, gradient and activation dtype",
    "device": "cpu (NumPy) or gpu (CuPy; one GPU per rank)",
    "epochs": "number of passes over the training set",
    "stop_after": "stop after this epoch, 0 to run all --epochs. Continue later with --resume, which "
                  "runs on to --epochs (--stop-after is not inherited; give it again to stop early "
                  "again); with --epochs unchanged the result is bitwise identical to an "
                  "uninterrupted run",
    "batch_size": "global batch in samples, shared among the P ranks: any size of at least P (equal "
                  "shares by the largest remainder, 64 over 3 ranks is 22, 21, 21; by speed with --balance)",
    "optimizer": "adam, sgd with momentum, or adagrad",
    "lr": "learning rate (dimensionless step size)",
    "lr_schedule": "constant, or cosine decay from --lr to 0 over --epochs",
    "momentum": "SGD momentum coefficient (0 disables)",
    "weight_decay": "L2 penalty coefficient, added to the gradient as weight_decay * w",
    "beta1": "Adam first-moment decay rate",
    "beta2": "Adam second-moment decay rate",
    "eps": "Adam denominator floor",
    "seed": "seed for initialization, train/test split and per-epoch shuffling (seed + epoch)",
    "shuffle": "reshuffle the training set each epoch",
    "drop_last": "drop the tail of the shuffled training set instead of padding to a multiple of P",
    "algorithm": "all-reduce algorithm for the gradient (auto chooses by P and message size; 2d places "
                 "the ranks on a grid chosen automatically: nodes x ranks per node when the job spans "
                 "several nodes, else the squarest factorization of P)",
    "bucket_bytes": "gradient bucket size in bytes, all-reduced last layer first; 0: one fused all-reduce",
    "elastic": "data-parallel under ULFM (Open MPI's mpiexec --with-ft ulfm): when ranks die, the survivors "
               "shrink the job, redo the failed step and keep training from memory; the epoch's remaining "
               "samples are split over them, the local batch is kept and the learning rate scaled by "
               "survivors / P (docs/guide/elastic.md)",
    "elastic_min": "--elastic: fewest ranks that keep training; with fewer survivors the job writes a "
                   "checkpoint and stops",
    "elastic_respawn": "--elastic: start a replacement for each lost rank (MPI_Comm_spawn of the same command), "
                       "which takes the parameters, optimizer and compressor state from rank 0; the job is back to "
                       "P ranks at the step after the recovery, or goes on with the survivors if none starts",
    "overlap": "data-parallel: start each gradient bucket's all-reduce (non-blocking) as soon as the "
               "backward pass has written its gradients, during the rest of the backward pass, last layer "
               "first, as PyTorch DDP does; all complete before the optimizer step, with bitwise the same "
               "parameters. Needs --bucket-bytes > 0 to overlap anything; a compressor (--compression) and "
               "the model-parallel grid all-reduce after the backward pass either way; --no-overlap: "
               "always after it",
    "compression": "gradient compressor from collectives.compression, 'none' for a plain all-reduce",
    "compression_args": "compressor argument KEY=VALUE (repeatable; VALUE read as true/false, none, a number "
                        "or a Python literal, else as text)",
    "timeout": "data-parallel: seconds any collective (run set-up and checkpoint broadcasts, the model "
               "check, gradient all-reduce or the compressor's exchanges, non-finite flag, evaluation "
               "and epoch sums) may wait for a peer; a rank silent this long (crashed or hung) ends "
               "the job on every rank with one line naming it (MPI_Abort); a positive number",
    "tensor_parallel": "model parallelism: ranks T that split each layer (column-parallel then row-parallel "
                       "linear layers, Megatron-LM); the data-parallel degree is P / (T x Q) ranks; "
                       "hidden widths must be >= T",
    "pipeline_parallel": "model parallelism: pipeline stages Q, each holding consecutive layers (at most "
                         "number of hidden layers + 1); T x Q must divide P",
    "micro_batches": "pipeline micro-batches M per step; must divide the local batch of "
                     "batch_size / (P / (T x Q)) samples",
    "schedule": "pipeline schedule: 1f1b (one forward one backward, at most Q micro-batches of "
                "activations held per stage) or gpipe (all forwards then all backwards)",
    "servers": "parameter server: number of server ranks",
    "consistency": "parameter server consistency model",
    "staleness": "parameter server SSP staleness bound in clocks",
    "staleness_lr": "parameter server: divide each update's step by max(1, its staleness in clocks)",
    "straggler": "slow rank (data-parallel) or worker (parameter server) as RANK:FACTOR: it sleeps FACTOR-1 "
                 "times its compute time each step (fault injection); data-parallel, a slowdown that moves: "
                 "RANK:FACTOR,RANK:FACTOR@STEP,... (each entry from global step STEP on)",
    "jitter": "extra delay per step of every data-parallel rank or parameter-server worker, uniform in "
              "[0, JITTER] seconds (fault injection)",
    "ps_timeout": "parameter server: drop a worker silent this long (seconds); ASP/SSP continue, BSP stops every rank",
    "fail_worker": "parameter server: worker RANK stops communicating before step STEP (fault injection), as RANK:STEP",
    "ps_conflict": "parameter server, asp/ssp: what a server does with a push computed from an old version of its "
                   "shard: accept it, cas (refuse it when its base version is more than --ps-conflict-lag "
                   "versions behind; the worker pulls, recomputes and pushes again; judged per shard, so the "
                   "worker recomputes only for the shards that refused), or scale its step by 1/staleness",
    "ps_conflict_lag": "parameter server, --ps-conflict cas: largest accepted lag of a push's base version "
                       "(versions: updates applied to the shard since the worker read it)",
    "ps_retries": "parameter server: resend a push/pull that gets no answer within 1 s (then 2, 4, ... s) up to N "
                  "times; the servers apply a resent push once and answer a resent pull from the reply they kept",
    "ps_replicas": "parameter server: server ranks holding each shard, a chain of a primary and R-1 backups "
                   "(R divides --servers; --servers/R shards); a push is acknowledged once every live replica "
                   "applied it, and the workers fail over to the next replica when a primary stays silent",
    "balance": "give faster ranks (data-parallel) or workers (parameter server) larger shares of each global "
               "batch in proportion to their measured speed, at least one sample each and at most what "
               "--memory-gb allows; the gradient stays the global batch's mean (docs/guide/heterogeneity.md)",
    "balance_every": "--balance: steps (parameter server: clocks) between two gathers of the ranks' measured "
                     "seconds per sample; a rank whose speed changes is followed within this many steps",
    "balance_gain": "--balance, data-parallel: re-split only when the new shares shorten the predicted step by "
                    "at least this fraction (noise between ranks of equal speed moves nothing)",
    "partition": "how the training samples are split over the workers (data-parallel ranks or PS workers): iid; "
                 "dirichlet:alpha=A (each class spread by Dirichlet(A) proportions, A > 0); classes:k=K (each "
                 "worker holds K classes); quantity:alpha=A (IID labels, Dirichlet(A) shard sizes). Seeded by "
                 "--seed; a draw leaving a worker less than one batch is redrawn with the next seed. With a "
                 "skewed partition an epoch is N / batch-size steps, each worker wrapping around its shard",
    "resample": "class-balanced batches: each worker's batch holds each of its classes equally often",
    "shared_fraction": "fraction of the training set (a seeded IID subset) that every worker holds besides its "
                       "shard (Zhao et al. 2018 use 0.05); 0: none",
    "local_steps": "local SGD: optimizer steps H each rank takes on its own batches between model averages "
                   "(with --algorithm, or --compression on the change since the last average); 1: data-parallel",
    "post_local_epoch": "post-local SGD: train data-parallel up to and including this epoch, then local SGD "
                        "with --local-steps; 0: local from the start",
    "average_optimizer": "local SGD: average the optimizer state (SGD velocity, Adam moments) with the model",
    "weighted_average": "weight each rank by its shard's samples n_w instead of equally (data-parallel only): "
                        "every step scales the rank's gradient by W n_w / sum n before the all-reduce; local SGD "
                        "weights the models alike (FedAvg); needs --compression none",
    "monitor": "gather every rank's step, compute, sync, wait and compression times and bytes to rank 0 while "
               "the job runs, and name stragglers and stalls (log warning, metric, events.jsonl); implied by "
               "--metrics-port and --tensorboard (docs/guide/monitoring.md)",
    "metrics_port": "serve the live metrics in Prometheus' text format on this TCP port of rank 0 "
                    "(http://HOST:PORT/metrics); 0: no endpoint. A port in use stops the job before training",
    "metrics_host": "address the metrics endpoint binds (0.0.0.0: every interface)",
    "tensorboard": "write the live metrics as TensorBoard scalars into DIR (rank 0; tensorboard --logdir DIR)",
    "metrics_every": "steps between two gathers of the metrics to rank 0 (data-parallel and the grid)",
    "metrics_interval": "seconds between two reports of a worker or server to server 0 (--mode ps)",
    "straggler_factor": "K: a rank whose time to reach the step's collective (its compute) is above K x the "
                        "median over the ranks...",
    "straggler_intervals": "...for N gathers (or PS report rounds) in a row is named a straggler",
    "stall_seconds": "name a rank that has not reached a step's collective this many seconds after the first rank "
                     "did (a PS worker: that has sent no report); keep it below --timeout so the warning comes "
                     "before the job ends; 0: never. Only while the job is monitored (--monitor, --metrics-port "
                     "or --tensorboard)",
    "run_dir": "parent directory of run directories",
    "name": "run directory name; '' picks TIMESTAMP-MODE-DATA-pP (DATA is ctr for --model ctr)",
    "checkpoint_every": "save a checkpoint every N epochs; 0 saves only after the last epoch",
    "keep_checkpoints": "number of most recent checkpoints kept",
    "resume": "run directory or checkpoint .npz to continue from; its saved configuration is the "
              "base, flags given here override it (except --stop-after, which is not inherited). With "
              "--epochs unchanged the result is bitwise identical to an uninterrupted run; a different "
              "--epochs recomputes the cosine learning-rate schedule for the new length. A run stopped "
              "before it wrote its configuration starts there with the flags given (none: refused)",
    "allow_foreign_checkpoint": "with --resume: accept a checkpoint that another run wrote (copied into this "
                                "run's directory, or given as a file of another run); refused by default",
    "eval_batch": "evaluation batch per rank in samples",
    "threads": "BLAS threads per rank; 0: cores on the node / ranks on the node",
    "progress": "show a progress bar on rank 0: redrawn in place when the output (or mpiexec's) is a "
                "terminal, else one status line every 30 s; --no-progress turns it off",
    "log_level": "level of the log messages, [rank R] LEVEL: message on stderr: debug, info, warning, error or "
                 "critical; '' reads $COMMLAB_LOG_LEVEL, else info",
    "trace": "write a timeline of every rank (forward, backward, waits, each bucket's all-reduce, "
             "compression, PS push/pull) to FILE in Chrome trace format, for https://ui.perfetto.dev or "
             "chrome://tracing; not inherited by --resume",
}


def parse_on_every_rank(parse, argv, rank):
    """Run ``parse(argv)`` on every rank of a job, so that ``--help`` and usage errors print once.

    Every rank parses (and checks) the same command line and so ends alike, but only rank 0's
    output is shown: on the other ranks stdout and stderr go to ``os.devnull`` while ``parse``
    runs. The trainer, the studies and the benchmark all parse this way under ``mpiexec -n P``.
    A schedule builder named as ``FILE.py:FUNCTION`` is verified in shares
    (:func:`collectives.schedules.registry.verify_share`): rank r of P checks every P-th size from
    the r-th on, and a violation on any rank ends every rank here, as any other failed check.

    Parameters
    ----------
    parse : callable
        ``argv -> configuration``; may exit through ``SystemExit`` (argparse's ``--help``, status 0,
        and usage errors, status 2, or an exit with a message string).
    argv : list of str or None
        The command line, None for ``sys.argv[1:]``.
    rank : int
        This process's rank in the job.

    Returns
    -------
    object
        What ``parse`` returns.

    Raises
    ------
    SystemExit
        As ``parse`` raised it, on rank 0; on other ranks with the same status, or 1 in place of a
        message (which only rank 0 prints). When the ranks' outcomes differ (a flag that parses on
        some ranks only, a path that exists on some nodes only), every rank exits with status 2 and
        the failing ranks other than 0 print their own message, prefixed with their rank: no rank is
        left waiting in the job's first collective.
    """
    from mpi4py import MPI

    captured = io.StringIO()
    exited, code, message, result = False, 0, None, None
    world = MPI.COMM_WORLD
    try:
        with verify_share(rank, world.Get_size()):  # a FILE.py:FUNCTION builder: each rank verifies its share
            if rank == 0:
                result = parse(argv)
            else:
                with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                    result = parse(argv)
    except SystemExit as e:
        exited = True
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        message = e.code if isinstance(e.code, str) else None
    outcomes = numpy.empty(world.Get_size(), numpy.int64)  # -1: parsed; else the exit status
    world.Allgather(numpy.array([code if exited else -1], numpy.int64), outcomes)
    outcomes = outcomes.tolist()
    if len(set(outcomes)) == 1:  # every rank ended alike: parsed, --help, or the same usage error
        if not exited:
            return result
        raise SystemExit(message if rank == 0 and message is not None else code)
    failed = [r for r, c in enumerate(outcomes) if c not in (-1, 0)]
    if exited and code and rank == 0 and message:
        print(message, file=sys.stderr, flush=True)
    if exited and code and rank != 0 and outcomes[0] in (-1, 0):
        text = (captured.getvalue().strip() or (message or "")).splitlines()
        print(f"error: rank {rank}: " + (text[-1] if text else f"exit status {code}"), file=sys.stderr, flush=True)
    if rank == 0 and not (exited and code):
        print(f"error: the command line fails on rank(s) {', '.join(map(str, failed))} only (see their "
              "lines): every rank must be given the same, valid arguments (a schedule builder's P are "
              "verified in shares, one per rank)", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _hidden(text):
    text = text.strip()
    try:
        widths = tuple(int(t) for t in text.split(",") if t.strip()) if text else ()
    except ValueError:
        raise argparse.ArgumentTypeError(f"hidden must be comma-separated integers, got {text!r}")
    if any(not 1 <= w <= INT32_MAX for w in widths):
        raise argparse.ArgumentTypeError(f"hidden widths must be in [1, {INT32_MAX}], got {text!r}")
    return widths


def _kv(text):
    try:
        return parse_compression_arg(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def build_parser(prog="python -m training.train"):
    """Return the ``argparse`` parser with one flag per :class:`Config` field.

    Flags not given are absent from the parsed namespace (``argparse.SUPPRESS``), so that only
    what the user wrote overrides the defaults or a resumed run's configuration.
    """
    p = Parser(
        prog=prog, argument_default=argparse.SUPPRESS,
        description="Train an MLP across the MPI ranks (launch with mpiexec -n P): data-parallel by "
                    "default (every rank holds a replica; the gradient is averaged by all-reduce, see "
                    "--algorithm, --bucket-bytes, --compression), or with --mode ps through a parameter "
                    "server (--servers ranks hold the parameter shards, the others are workers; see "
                    "--consistency), or with --tensor-parallel/--pipeline-parallel on a data x tensor x "
                    "pipeline grid of the ranks (layers split over tensor groups, consecutive layers on "
                    "pipeline stages, --micro-batches per step). Writes runs/NAME/ with config.json, "
                    "metrics.jsonl, epochs.jsonl, summary.json and checkpoints; runs/latest points at the "
                    "newest run.")
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        text = f"{HELP[f.name]} (default: {','.join(map(str, default)) if f.name == 'hidden' else default!r})"
        if f.name == "compression_args":
            p.add_argument("--compression-arg", dest="compression_args", action="append",
                           type=parsed_by(_kv, "KEY=VALUE", ["novalue", "=1"]), metavar="KEY=VALUE", help=HELP[f.name])
        elif f.name == "hidden":
            p.add_argument(flag, type=parsed_by(_hidden, f"comma-separated widths in [1, {INT32_MAX}]",
                                                ["0", "-1", "abc", "1e30", "64,x"]), metavar="W1,W2,...", help=text)
        elif f.type in (bool, "bool"):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, help=text)
        else:
            typ = {"int": int, "float": float, "str": str}.get(f.type, f.type)
            choices = CHOICES.get(f.name)
            if f.name in ("algorithm", "compression"):
                names = ALGORITHMS if f.name == "algorithm" else COMPRESSORS
                text = f"{text[:-1]}; one of {', '.join(names)})"
            p.add_argument(flag, type=typ if choices else field_type(typ), choices=choices, help=text,
                           metavar=None if choices else _METAVARS.get(f.name))
    return p


def parse_args(argv=None):
    """Parse the command line into a validated :class:`Config`.

    With ``--resume``, the ``config.json`` of the run being resumed is the base; the flags given
    override it. ``stop_after`` is never inherited: it applies only when given again.

    Parameters
    ----------
    argv : list of str, optional
        Arguments without the program name (default: ``sys.argv[1:]``).

    Returns
    -------
    Config

    Raises
    ------
    SystemExit
        On a malformed flag or an invalid value (argparse prints the usage and the reason, status
        2), or when the run to resume cannot be read, or has no configuration yet and no flag but
        where to write and what to show says which job to start (the exit message is ``error: --resume
        PATH: ...``, status 1).

    Examples
    --------
    >>> cfg = parse_args(["--optimizer", "sgd", "--lr", "0.05", "--hidden", "64,32"])
    >>> cfg.optimizer, cfg.lr, cfg.hidden, cfg.epochs  # the others keep their defaults
    ('sgd', 0.05, (64, 32), 40)
    """
    parser = build_parser()
    given = vars(parser.parse_args(argv))
    if "compression_args" in given:
        given["compression_args"] = dict(given["compression_args"])
    base = {}
    if given.get("resume"):
        base = _saved_config(given["resume"], given)
        base.pop("resume", None)
        base.pop("stop_after", None)  # a stop applies to the job that asked for it
        base.pop("trace", None)  # so does a trace file: a resume must not overwrite the first job's
        base.pop("allow_foreign_checkpoint", None)  # so does accepting another run's checkpoint
        if "compression_args" in given:
            base.pop("compression_args", None)
    base.update(given)
    try:
        cfg = Config.from_dict(base)
    except ValueError as e:
        parser.error(as_flags(e, [f.name for f in dataclasses.fields(Config)]))
    unused = [f"--{n.replace('_', '-')}" for n in ("balance_every", "balance_gain") if n in given]
    if unused and not cfg.balance:  # a tuning of --balance given without it would change nothing
        parser.error(f"{' and '.join(unused)} tune --balance, which is off: add --balance or drop "
                     f"{'it' if len(unused) == 1 else 'them'}")
    return cfg


#: Flags that do not say which job to run (where it writes, what it shows, when it stops, how many threads):
#: a resume of a run with no configuration yet given only these has no job to start.
_NOT_THE_JOB = frozenset(("resume", "stop_after", "trace", "log_level", "progress", "allow_foreign_checkpoint",
                          "run_dir", "name", "threads", "metrics_host", "timeout"))


def _saved_config(path, given):
    if os.path.isdir(path):
        run = path
    elif os.path.isfile(path):
        run = os.path.dirname(path) or "."
    else:
        raise SystemExit(f"error: --resume {path}: no such run directory or checkpoint")
    cfg_path = os.path.join(run, "config.json")
    if never_configured(run):  # killed before it wrote its configuration: it starts again with the flags given
        if not set(given) - _NOT_THE_JOB:  # none: the defaults would be a run nobody asked for
            raise SystemExit(f"error: --resume {path}: the run has no configuration yet (no config.json: it "
                             "stopped before writing one), so there is nothing to continue; give the run's "
                             "flags with --resume to start it there")
        return {}  # (training.train says so: the run ended before its first checkpoint)
    try:
        with open(cfg_path, encoding="utf-8") as f:
            saved = dict(json.load(f)["config"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        reason = "no such file" if isinstance(e, FileNotFoundError) else f"{type(e).__name__}: {e}"
        raise SystemExit(f"error: --resume {path}: cannot read the run's configuration {cfg_path} ({reason})")
    try:  # a hand-edited or damaged file: name it and the key, once, before any rank goes further
        Config.from_dict({k: v for k, v in saved.items() if k != "resume"})
    except ValueError as e:
        raise SystemExit(f"error: --resume {path}: bad configuration in {cfg_path}: {e}") from None
    return saved
