"""Parameter-server study: the claims the SSP papers make, measured on the trainer's digits model.

    mpiexec -n 5 python -m experiments.studies.ps_study [--out results/ps_study] [--repeats 3]
    python -m plots.staleness results/ps_study/ps_study.json

Three parts, every variant trained ``--repeats`` times (repeats interleaved, so slow spells of a
shared machine hit every variant alike), one server and ``P - 1`` workers unless a variant says
otherwise. Every ratio is formed within one repeat and reported as the median and the range over
the repeats.

``transient``
    Transient, random delays as Cui et al. (USENIX ATC 2014) inject them: each worker, each clock,
    sleeps ``--delay-s`` seconds with probability ``--delay-prob`` (the same draws for every
    protocol). BSP waits at every clock for the slowest worker of that clock; SSP(s) lets a worker
    run up to ``s`` clocks ahead, so a delay shorter than about ``s`` clocks is absorbed (Ho et al.,
    NIPS 2013, section 2; Cui et al. 2014). Reported: time to the target test accuracy (95 %) and
    updates per second of BSP, SSP(0), SSP(2), SSP(4) and ASP, and BSP's time over each protocol's
    (``> 1``: faster than BSP). SSP(0) is BSP by construction (:mod:`ps.serving.consistency`), a control.
``straggler``
    A persistent straggler (worker rank ``--straggler``, slowed by its factor): its rate bounds BSP
    and, in the long run, SSP (a worker runs at most ``s`` clocks ahead of it), so neither is the
    remedy; ASP (no bound) and BSP with ``--balance`` (the straggler gets a smaller share of each
    global batch, re-split every 2 clocks) are. Reported: samples and updates per second of each
    against BSP's run without a straggler (``even``). The part trains its own settings
    (``--straggler-set``; by default 1024 synthetic samples per worker and step), since a step of
    the digits model computes for 0.4 ms against 10-15 ms of protocol per clock on a 2-core host,
    and a 4x straggler there barely slows anything.
``conflict``
    ASP under the persistent straggler (the straggler part's settings) and under the transient
    delays (the transient part's), with each conflict policy (:data:`ps.job.settings.CONFLICTS`):
    ``accept``, ``cas`` with lag ``W - 1`` (a push computed before more than one round of the other
    workers' updates is refused and recomputed) and ``scale`` (the step divided by the staleness).
    Reported: refusals per push, compute wasted on refused gradients, updates per second against
    ``accept``, and the test accuracy at equal wall time (the shortest run of the condition).
``retries``
    BSP without faults (``clean``) and with the servers dropping 10 % of their pull replies and
    sending 5 % late (0.2 s, beyond the workers' 0.05 s retry wait; 5 retries). Reported: resends,
    updates per second against ``clean``, and whether the final parameters equal the clean run's bit
    for bit (a resent push applied once, a resent pull answered from the kept reply).
``servers``
    BSP with 1, 2 and 4 servers (those that leave at least one worker on ``P`` ranks; the global
    batch rounded down to a multiple of the ``P - S`` workers): samples and updates per second,
    and their ratio to one server.

Rank 0 writes ``ps_study.json`` (settings, every variant's resolved training configuration and
parameter-server extras, MPI library, P, host, every run with its curve and staleness histogram,
the ratio tables, the ``provenance`` of :mod:`commlab.provenance`) and prints the tables as Markdown.
A rerun replaces the previous study in ``--out``. On a busy machine the study refuses to start (and
leaves the previous study in place) unless ``--allow-noisy`` marks its results noisy.
"""
import hashlib
import os
import shutil
import sys
import time

import numpy as np
from mpi4py import MPI

from commlab import tracing
from experiments import harness
from plots.tables.ps_tables import conflict_table, markdown, ratio_table
from experiments.studies.staleness_sweep import base_config, parse_protocol
from training.runtime.checkpoint import make_run_dir, root_bytes
from training.job import set_threads
from training.driver.preflight import check_run
from commlab.run_files import run_info, write_config
from training.ps_mode.worker import ps_options, run_ps
from training.settings.options import INT32_MAX, Parser, integer, real, text

__all__ = ["PARTS", "variants", "train_ps", "run_study", "main"]

PARTS = ("transient", "straggler", "servers", "conflict", "retries")
#: Faults of the retries part: PSOptions fields given as the run's extra settings.
RETRY_FAULTS = {"drop_replies": 0.1, "late_replies": 0.05, "late_s": 0.2, "retry_s": 0.05}
#: Default training settings of the straggler part: a large batch on the synthetic set, so that a
#: worker's compute per step (about 30 ms here, 1024 samples) outweighs the per-clock protocol
#: overhead (10-15 ms on this 2-core machine); with the digits model's 0.4 ms steps a 4x straggler
#: adds 1 ms to a 15 ms clock and nothing recovers.
STRAGGLER_SET = ("data=synthetic", "batch_size=4096", "stop_after=10")
BALANCE_EVERY = 2  # clocks between the speed reports of --balance in the straggler part
RESULTS = "ps_study.json"
_KEYS = ("updates_per_s", "samples_per_s", "time_to_target_s", "final_test_acc", "wall_s", "pushes",
         "epochs", "staleness_histogram", "staleness_max", "staleness_mean", "curve", "run_dir",
         "worker_stats", "servers", "workers", "refused_per_push", "wasted_compute_s", "resends",
         "server_counts", "conflict")


def variants(part, size, straggler):
    """Return the variants of ``part`` as ``[(name, config changes, baseline name)]``.

    Parameters
    ----------
    part : {"transient", "straggler", "servers"}
    size : int
        Ranks of the job (servers plus workers).
    straggler : str
        ``RANK:FACTOR`` of the persistent straggler.

    Raises
    ------
    ValueError
        When ``part`` is unknown.
    """
    if part == "transient":
        return [(p, dict(zip(("consistency", "staleness"), parse_protocol(p))), "bsp")
                for p in ("bsp", "ssp0", "ssp2", "ssp4", "asp")]
    if part == "straggler":
        slow = dict(straggler=straggler)
        return [("even", dict(consistency="bsp"), "even"),
                ("bsp", dict(consistency="bsp", **slow), "even"),
                ("ssp2", dict(consistency="ssp", staleness=2, **slow), "even"),
                ("asp", dict(consistency="asp", **slow), "even"),
                ("bsp-balance", dict(consistency="bsp", balance=True, **slow), "even")]
    if part == "servers":
        return [(f"s{S}", dict(consistency="bsp", servers=S), "s1") for S in (1, 2, 4) if S < size]
    if part == "conflict":
        lag = max(0, size - 2)  # W - 1 with one server: older than one round of the others' updates
        out = []
        for cond in ("straggler", "transient"):
            slow = dict(straggler=straggler) if cond == "straggler" else {}
            out += [(f"{cond}-{pol}", dict(consistency="asp", ps_conflict=pol, **slow,
                                           **({"ps_conflict_lag": lag} if pol == "cas" else {})), f"{cond}-accept")
                    for pol in ("accept", "cas", "scale")]
        return out
    if part == "retries":
        return [("clean", dict(consistency="bsp"), "clean"), ("faults", dict(consistency="bsp", ps_retries=5), "clean")]
    raise ValueError(f"part must be one of {PARTS}, got {part!r}")


def train_ps(cfg, comm, extra=None):
    """Train ``cfg`` (``--mode ps``) as ``training.train.run`` does, with settings beyond the flags.

    The trainer's job checks, its run directory and ``config.json``, then
    :func:`training.ps_mode.worker.run_ps` with ``extra`` (:data:`training.ps_mode.worker.PS_EXTRA`: the
    transient delays and the curve's resolution) on a duplicate of ``comm``.

    Returns
    -------
    dict
        The run's summary on rank 0 (``summary.json``'s content); what the other ranks know elsewhere.

    Raises
    ------
    ValueError
        When the configuration or ``extra`` cannot run on ``comm`` (every rank, before anything
        is created).
    """
    comm = comm.Dup()
    try:
        set_threads(cfg, comm)
        xp = check_run(cfg, comm)
        ps_options(cfg, comm, 1, cfg.run_dir, extra)  # checked before the run directory exists
        run_dir = make_run_dir(cfg, comm)
        if comm.rank == 0:
            write_config(run_dir, cfg.to_dict(), run_info(comm))
        return run_ps(cfg, comm, run_dir, xp, extra)
    finally:
        tracing.stop()
        comm.Free()


def _configs(args, size):
    """Return ``{part: [(name, cfg, extra, baseline)]}``, every configuration checked on every rank."""
    out = {}
    base = base_config(args.epochs, "", 0.0, args.set).replace(stop_after=args.stop_after)
    sets = list(STRAGGLER_SET if args.straggler_set is None else args.straggler_set)
    slow_base = base_config(args.epochs, "", 0.0, args.set + sets).replace(
        **({} if any(kv.startswith("stop_after=") for kv in sets) else {"stop_after": args.stop_after}))
    for part in args.parts:
        extra = {"snapshots_per_epoch": args.snapshots}
        if part == "transient":
            extra.update(delay_prob=args.delay_prob, delay_s=args.delay_s)
        if part == "straggler":  # a 10-epoch run has 40 clocks: re-split early and often
            extra.update(balance_every=BALANCE_EVERY)
        rows = []
        for name, changes, baseline in variants(part, size, args.straggler):
            mine = dict(extra)
            if part == "servers":  # the global batch, rounded down to a multiple of the workers
                W = size - changes["servers"]
                changes = dict(changes, batch_size=max(W, base.batch_size // W * W))
            if name.startswith("transient-"):
                mine.update(delay_prob=args.delay_prob, delay_s=args.delay_s)
            if name == "faults":
                mine.update(RETRY_FAULTS)
            slow = part == "straggler" or name.startswith("straggler-")
            cfg = (slow_base if slow else base).replace(run_dir=os.path.join(args.out, "runs"), name=name, **changes)
            ps_options(cfg, size, 1, cfg.run_dir, mine)
            rows.append((name, cfg, mine, baseline))
        out[part] = rows
    return out


def _train(part, name, cfg, extra, repeat, comm):
    """Train one variant once; return its record (complete on rank 0, None elsewhere)."""
    cfg = cfg.replace(name=f"{part}-{name}-r{repeat}")
    summary = harness.logged(lambda: train_ps(cfg, comm, extra), os.path.join(cfg.run_dir, f"{cfg.name}.log"), comm)
    if comm.Get_rank() != 0:
        return None
    with np.load(os.path.join(summary["run_dir"], "ps_model.npz"), allow_pickle=False) as f:
        sha = hashlib.sha256(f["params"].tobytes()).hexdigest()
    return {"part": part, "variant": name, "repeat": repeat, "consistency": cfg.consistency, "params_sha": sha,
            "staleness_bound": cfg.staleness, "straggler": cfg.straggler, "balance": cfg.balance,
            "delay_prob": extra.get("delay_prob", 0.0), "delay_s": extra.get("delay_s", 0.0),
            **{k: summary[k] for k in _KEYS}}


def run_study(configs, repeats, comm, echo=print):
    """Train every variant of every part ``repeats`` times (interleaved); return the records (rank 0).

    Parameters
    ----------
    configs : dict
        ``{part: [(name, Config, extra, baseline)]}``, checked on every rank.
    repeats : int
        Runs per variant; repeat ``r`` of every variant of a part runs before repeat ``r + 1``.
    comm : MPI.Comm
        Every rank of the job.
    echo : callable
        Prints one line per finished run (rank 0).

    Returns
    -------
    list of dict
        Rank 0: one record per run (the run's summary fields plus part, variant, repeat and the
        injected delays); other ranks: an empty list.
    """
    runs = []
    for part, rows in configs.items():
        for r in range(repeats):
            for name, cfg, extra, _ in rows:
                rec = _train(part, name, cfg, extra, r, comm)
                if rec is not None:
                    runs.append(rec)
                    ttt = rec["time_to_target_s"]
                    echo(f"{part:>9} {name:>11} #{r}: {rec['updates_per_s']:7.1f} updates/s, "
                         f"{rec['samples_per_s']:7.0f} samples/s, to 95% "
                         f"{'never' if ttt is None else f'{ttt:.2f} s'}, test acc {rec['final_test_acc']:.2%}")
    return runs


def _clean(out):
    """Rank 0: remove the previous study's results file and run directories; create ``out/runs``."""
    removed = 0
    path = os.path.join(out, RESULTS)
    if os.path.isfile(path):
        os.remove(path)
        removed += 1
    runs = os.path.join(out, "runs")
    if os.path.isdir(runs):
        shutil.rmtree(runs)
        removed += 1
    os.makedirs(runs)
    return removed


def _parser():
    p = Parser(
        prog="python -m experiments.studies.ps_study",
        description="Parameter-server study on the trainer's digits model: SSP against BSP under transient "
                    "random delays (time to 95 % test accuracy), ASP and --balance under a persistent "
                    "straggler (throughput against no straggler), and 1, 2, 4 servers. Run it under MPI: "
                    "mpiexec -n 5 python -m experiments.studies.ps_study. A rerun replaces the previous study in --out.")
    p.add_argument("--parts", type=text(), default=",".join(PARTS), metavar="LIST",
                   help="comma-separated parts: transient, straggler, servers, conflict, retries "
                        "(default: %(default)s)")
    p.add_argument("--epochs", type=integer(1, INT32_MAX), default=20,
                   help="epochs of the learning-rate schedule (the trainer's cosine) (default: 20)")
    p.add_argument("--stop-after", type=integer(0, INT32_MAX), default=5,
                   help="epochs each run trains, 0 for all --epochs: the target is reached within the first "
                        "few, and the schedule stays the trainer's 20-epoch one (default: 5)")
    p.add_argument("--delay-prob", type=real(0, 1), default=0.3,
                   help="transient part: probability that a worker sleeps in a clock (default: 0.3)")
    p.add_argument("--delay-s", type=real(0, 1e15), default=0.03,
                   help="transient part: length of one delay, seconds (default: 0.03)")
    p.add_argument("--straggler", type=text(), default="2:4",
                   help="straggler part: slow worker RANK:FACTOR (its step takes FACTOR x its compute time) "
                        "(default: %(default)s)")
    p.add_argument("--snapshots", type=integer(1, INT32_MAX), default=16,
                   help="points per epoch of the accuracy-versus-time curve, which sets the resolution of "
                        "the time to 95 %% (default: 16)")
    p.add_argument("--set", type=text(), action="append", default=[], metavar="KEY=VALUE",
                   help="change a training setting of every run (repeatable), e.g. --set hidden=64")
    p.add_argument("--straggler-set", type=text(), action="append", default=None, metavar="KEY=VALUE",
                   help="training settings of the straggler part on top of --set (repeatable); the default "
                        "makes a step's compute outweigh the protocol's overhead, so that a slow worker "
                        "is slow: " + " ".join(f"--straggler-set {kv}" for kv in STRAGGLER_SET))
    harness.add_options(p, out="results/ps_study", folder=True, repeats=3)
    return p


def main(argv=None):
    """Parse the command line, run the study and write the results (rank 0).

    Returns
    -------
    int
        0 on success, 2 after a bad argument or on a busy machine (one message from rank 0,
        :func:`experiments.harness.start`, before the previous study is removed), 1 after an error
        raised on every rank alike; an error on some ranks only aborts the job so that nothing hangs.
    """
    comm = MPI.COMM_WORLD
    rank0 = comm.Get_rank() == 0
    parser = _parser()

    def check(args):
        args.parts = list(dict.fromkeys(p.strip() for p in args.parts.split(",") if p.strip()))
        bad = [p for p in args.parts if p not in PARTS]
        if bad or not args.parts:
            raise ValueError(f"--parts must name some of {', '.join(PARTS)}, got {bad or 'none'}")
        configs = _configs(args, comm.Get_size())
        for rows in configs.values():
            for _, cfg, _, _ in rows:
                check_run(cfg, comm)
        return configs

    args, configs = harness.parse(parser, argv, comm, check)
    echo = harness.echo(comm)
    watch = harness.start(args, comm, paths=[os.path.join(args.out, RESULTS)], prog=parser.prog)
    if watch is None:  # before anything is removed
        return 2

    def body():
        started = time.strftime("%Y-%m-%dT%H:%M:%S")
        root_bytes(comm, lambda: str(_clean(args.out)).encode(), OSError)
        echo(f"parameter-server study on {comm.Get_size()} ranks: parts {', '.join(args.parts)} x "
             f"{args.repeats} repeats -> {args.out}")
        runs = run_study(configs, args.repeats, comm, echo)
        if rank0:
            _write(args, configs, runs, started, comm, watch, argv)
        else:
            watch.summary()  # stops this rank's sampling: rank 0 alone writes

    return harness.run_or_report(body, comm)


def _write(args, configs, runs, started, comm, watch, argv):
    """Rank 0: write ``ps_study.json``, stamped with ``watch`` and the command of ``argv``, and print one table
    per part."""
    tables = {part: (conflict_table if part in ("conflict", "retries") else
                     lambda rs, names, p=part: ratio_table(rs, p, names))(runs, [(name, base) for name, _, _, base in rows])
              for part, rows in configs.items()}
    settings = {k: v for k, v in vars(args).items()}
    results = {"experiment": "ps_study", "study": settings,
               "train_config": next(iter(configs.values()))[0][1].to_dict(),
               "part_configs": {part: {name: dict(cfg.to_dict(), ps_extra=extra) for name, cfg, extra, _ in rows}
                                for part, rows in configs.items()},
               "run": run_info(comm),
               "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "runs": runs,
               "tables": tables}
    path = os.path.join(args.out, RESULTS)
    harness.finish(results, watch, path, comm=comm, module="experiments.studies.ps_study", argv=argv,
                   show=lambda _: "".join(f"\n{part} (median (min-max) over {args.repeats} repeats):\n"
                                          f"{markdown(part, rows)}\n" for part, rows in tables.items())
                   + f"\ndraw with: python -m plots.staleness {path}")


if __name__ == "__main__":
    sys.exit(main())
