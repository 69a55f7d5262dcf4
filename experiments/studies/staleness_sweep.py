"""Staleness study: train the default model with a parameter server under BSP, SSP(s) and ASP while
one worker straggles, and compare update throughput, time to accuracy and final accuracy.

    mpiexec -n 5 python -m experiments.studies.staleness_sweep [--out results/staleness] [--repeats 3]
    python -m plots.staleness results/staleness/staleness_sweep.json

Every protocol trains the trainer's default configuration (``--set KEY=VALUE`` changes it) in
``--mode ps`` with one server and the other ranks as workers, worker rank ``--straggler`` slowed by
its factor (it sleeps ``FACTOR - 1`` times its compute time each step). Per run the results keep
updates per second (worker gradients folded in by the servers per second of training), samples per
second, the time to 95 % test accuracy, the final test accuracy, the staleness histogram and the
accuracy-versus-time curve. Rank 0 writes ``staleness_sweep.json`` (sweep and training
configuration, MPI library, P, host, every run, the table, a summary per protocol, the
``provenance`` of :mod:`commlab.provenance`) and prints the table as markdown and one summary
line per protocol: throughput and accuracy against BSP, maximum staleness against the bound.

Under a persistent straggler SSP's long-run throughput is bounded by the straggler by construction:
a worker may run at most s clocks ahead of the slowest one, so every worker ends up advancing at the
straggler's clock rate and SSP only gains over BSP by absorbing transient delays (``--jitter``).

A rerun replaces the previous sweep in ``--out``: rank 0 first removes its run directories
(``runs/PROTOCOL-rN``), their logs, ``staleness_sweep.json`` and ``staleness.png``, so a sweep that
stops early leaves no results file of an earlier sweep behind to be plotted. On a busy machine the
sweep refuses to start (and leaves the previous sweep in place) unless ``--allow-noisy`` marks its
results noisy.
"""
import dataclasses
import os
import re
import shutil
import statistics
import sys
import textwrap
import time

from mpi4py import MPI
from tabulate import tabulate

from collectives.compression import parse_literal, split_key_value
from experiments import harness
from training.runtime.checkpoint import root_bytes
from training.settings.config import Config
from training.driver.preflight import check_run
from commlab.run_files import run_info
from training.train import run
from training.settings.options import INT32_MAX, Parser, integer, real, text

__all__ = ["PROTOCOLS", "parse_protocol", "base_config", "clean_previous", "run_sweep", "markdown_table",
           "summary_lines", "main"]

#: Protocols of the study: "bsp", "asp" or "sspS" (SSP with staleness bound S clocks).
PROTOCOLS = ("bsp", "ssp1", "ssp2", "ssp4", "ssp8", "asp")
RESULTS, FIGURE = "staleness_sweep.json", "staleness.png"  # file names in --out
_RUN_NAME = re.compile(r"^(bsp|asp|ssp\d+)-r\d+(\.log)?$")  # run directories and logs of a sweep


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
    text_fields = {f.name for f in dataclasses.fields(Config) if isinstance(f.default, str)}
    changes = {}
    for item in sets:
        key, value = split_key_value(item, "--set")
        key = key.replace("-", "_")
        if key == "hidden":
            changes[key] = [int(t) for t in value.split(",") if t.strip()]
        else:  # a text field keeps its text ("none" is a name there, not None)
            changes[key] = value if key in text_fields else parse_literal(value)
    changes.update(mode="ps", servers=changes.get("servers", 1), epochs=epochs, straggler=straggler,
                   jitter=jitter, progress=False, checkpoint_every=0, keep_checkpoints=1)
    return Config().replace(**changes)


def clean_previous(out):
    """Remove what an earlier sweep left in ``out`` and create ``out/runs`` (rank 0 only, first).

    Removed: ``staleness_sweep.json``, ``staleness.png``, and in ``out/runs`` every run directory
    and log named ``PROTOCOL-rN`` (``.log``) and the ``latest`` pointer. Other files stay.

    Parameters
    ----------
    out : str
        The sweep's results directory (need not exist).

    Returns
    -------
    list of str
        The removed paths.

    Raises
    ------
    OSError
        When an entry cannot be removed or ``out/runs`` cannot be created.
    """
    removed = []
    for path in (os.path.join(out, RESULTS), os.path.join(out, FIGURE)):
        if os.path.isfile(path):
            os.remove(path)
            removed.append(path)
    runs = os.path.join(out, "runs")
    if os.path.isdir(runs):
        for name in sorted(os.listdir(runs)):
            path = os.path.join(runs, name)
            if not (_RUN_NAME.match(name) or name == "latest"):
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
            removed.append(path)
    os.makedirs(runs, exist_ok=True)
    return removed


def _train(base, protocol, repeat, out, comm):
    """Train one protocol once; return its record (complete on rank 0)."""
    consistency, s = parse_protocol(protocol)
    name = f"{protocol}-r{repeat}"
    cfg = base.replace(consistency=consistency, staleness=s, run_dir=os.path.join(out, "runs"), name=name)
    summary = harness.logged(lambda: run(cfg, comm), os.path.join(cfg.run_dir, f"{name}.log"), comm)
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


def _summary(rows):
    """Per protocol: throughput and accuracy against BSP, maximum staleness against its bound."""
    out = []
    for row in rows:
        consistency, s = parse_protocol(row["protocol"])
        out.append({"protocol": row["protocol"], "updates_per_s": row["updates_per_s"],
                    "throughput_vs_bsp": row["throughput_vs_bsp"], "final_test_acc": row["final_test_acc"],
                    "acc_points_vs_bsp": row["acc_points_vs_bsp"], "staleness_max": row["staleness_max"],
                    "staleness_mean": row["staleness_mean"],
                    "staleness_bound": {"bsp": 0, "ssp": s}.get(consistency)})  # None: ASP, unbounded
    return out


def summary_lines(summary, runs_per_protocol):
    """Return the printed summary: one neutral line per protocol (no verdicts), as a list of str."""
    n = runs_per_protocol
    lines = [f"per protocol (updates/s: median of {n} run{'s' * (n > 1)}, accuracy: mean; staleness in clocks):"]
    for t in summary:
        name = t["protocol"].upper().replace("SSP", "SSP s=")
        ratio = "" if t["throughput_vs_bsp"] is None else f" ({t['throughput_vs_bsp']:.2f}x BSP)"
        pts = "" if t["acc_points_vs_bsp"] is None else f" ({t['acc_points_vs_bsp']:+.2f} points vs BSP)"
        bound = "unbounded" if t["staleness_bound"] is None else f"bound {t['staleness_bound']}"
        lines.append(f"  {name:<8} {t['updates_per_s']:6.0f} updates/s{ratio} | test acc "
                     f"{t['final_test_acc']:.2%}{pts} | staleness max {t['staleness_max']} ({bound}), "
                     f"mean {t['staleness_mean']:.2f}")
    return lines


_TABLE_HEAD = ("protocol", "updates/s", "vs BSP", "samples/s", "time to 95 % (s)", "final test acc",
               "vs BSP (points)", "staleness max / mean", "wall (s)")


def markdown_table(rows):
    """Return the study table as Markdown (``tabulate``'s pipe format: first column left, numbers right)."""
    cells = []
    for r in rows:
        ttt = "never" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f}"
        ratio = "" if r["throughput_vs_bsp"] is None else f"{r['throughput_vs_bsp']:.2f}x"
        pts = "" if r["acc_points_vs_bsp"] is None else f"{r['acc_points_vs_bsp']:+.2f}"
        cells.append((r["protocol"].upper().replace("SSP", "SSP s="), f"{r['updates_per_s']:.0f}", ratio,
                      f"{r['samples_per_s']:.0f}", ttt, f"{r['final_test_acc']:.2%}", pts,
                      f"{r['staleness_max']} / {r['staleness_mean']:.2f}", f"{r['wall_s']:.2f}"))
    return tabulate(cells, _TABLE_HEAD, tablefmt="pipe", disable_numparse=True,
                    colalign=("left",) + ("right",) * (len(_TABLE_HEAD) - 1))


_PERSISTENT = ("Under a persistent straggler SSP's long-run throughput is bounded by the straggler by "
               "construction: a worker runs at most s clocks ahead of the slowest, so all advance at the "
               "straggler's clock rate; SSP gains over BSP only by absorbing transient delays (--jitter).")


def _parser():
    p = Parser(
        prog="python -m experiments.studies.staleness_sweep",
        description="Train the default model with a parameter server (one server, the other ranks "
                    "workers) under BSP, SSP(s) and ASP while one worker straggles; compare update "
                    "throughput, time to 95 % test accuracy, final accuracy and staleness. Run it under "
                    "MPI: mpiexec -n 5 python -m experiments.studies.staleness_sweep. A rerun replaces the "
                    "previous sweep's runs and results in --out.",
        epilog="Protocols: bsp = bulk synchronous parallel (one update per clock from all workers); "
               "asp = asynchronous (every push applied on arrival, staleness unbounded); sspS = stale "
               "synchronous parallel with staleness bound S clocks, S an integer >= 0 (a worker's clock "
               "counts the gradients it has pushed): a pull at clock c is served once the slowest live "
               "worker's first c - S clocks are folded in, so what a worker reads misses at most the last S "
               "clocks of the workers' updates; like BSP it applies one update per complete clock, so "
               "ssp0 is BSP, e.g. ssp2. Draw the results with: python -m plots.staleness "
               "OUT/staleness_sweep.json. The study of the SSP papers' claims (transient delays, a "
               "persistent straggler, 1-4 servers) is python -m experiments.studies.ps_study.")
    p.add_argument("--protocols", type=text(), default=",".join(PROTOCOLS), metavar="LIST",
                   help="comma-separated protocols: bsp, asp, or sspS with S the staleness bound in clocks "
                        "(ssp2: at most 2 clocks stale) (default: %(default)s)")
    p.add_argument("--epochs", type=integer(1, INT32_MAX), default=20, help="epochs per run (default: 20)")
    p.add_argument("--straggler", type=text(), default="2:4",
                   help="slow worker RANK:FACTOR (its step takes FACTOR x its compute time), '' for none "
                        "(default: %(default)s)")
    p.add_argument("--jitter", type=real(0, 1e15), default=0.0,
                   help="extra random delay per step, uniform in [0, JITTER] seconds (default: 0)")
    p.add_argument("--set", type=text(), action="append", default=[], metavar="KEY=VALUE",
                   help="change a training setting (repeatable), e.g. --set optimizer=sgd")
    harness.add_options(p, out="results/staleness", folder=True, repeats=1,
                        what="results directory; its previous sweep is removed first")
    return p


def main(argv=None):
    """Parse the command line, run the sweep and write the results (rank 0).

    Returns
    -------
    int
        0 on success, 2 after a bad argument or on a busy machine (one message from rank 0,
        :func:`experiments.harness.start`, before the previous sweep is removed), 1 after an error
        raised on every rank (one message, printed by rank 0); an error on some ranks only aborts the
        job so that nothing hangs.
    """
    comm = MPI.COMM_WORLD
    rank0 = comm.Get_rank() == 0
    parser = _parser()

    def check(args):
        protocols = list(dict.fromkeys(p.strip() for p in args.protocols.split(",") if p.strip()))
        if not protocols:
            raise ValueError("--protocols is empty")
        for p in protocols:
            parse_protocol(p)
        base = base_config(args.epochs, args.straggler, args.jitter, args.set)
        for p in protocols:  # the trainer's own job checks, before the previous sweep is removed
            consistency, s = parse_protocol(p)
            check_run(base.replace(consistency=consistency, staleness=s), comm)
        return protocols, base

    args, (protocols, base) = harness.parse(parser, argv, comm, check)  # --help and errors once
    echo = harness.echo(comm)
    watch = harness.start(args, comm, paths=[os.path.join(args.out, RESULTS)], prog=parser.prog)
    if watch is None:  # before anything is removed
        return 2

    def body():
        started = time.strftime("%Y-%m-%dT%H:%M:%S")
        removed = root_bytes(comm, lambda: str(len(clean_previous(args.out))).encode(), OSError).decode()
        echo(f"staleness sweep on {comm.Get_size()} ranks ({base.servers} server), straggler "
             f"{args.straggler or 'none'}, {args.epochs} epochs, protocols {', '.join(protocols)} x "
             f"{args.repeats} -> {args.out}" + (f" (removed {removed} entries of the previous sweep)"
                                                if removed != "0" else ""))
        runs = run_sweep(base, protocols, args.repeats, args.out, comm, echo)
        if rank0:
            _write(args, base, protocols, runs, started, comm, watch, argv)
        else:
            watch.summary()  # stops this rank's sampling: rank 0 alone writes

    return harness.run_or_report(body, comm)


def _write(args, base, protocols, runs, started, comm, watch, argv):
    """Rank 0: write ``staleness_sweep.json`` (stamped with ``watch`` and the command of ``argv``), print the
    summary."""
    rows = _table(runs, protocols)
    summary = _summary(rows)
    results = {"experiment": "staleness_sweep", "sweep": vars(args), "train_config": base.to_dict(),
               "run": run_info(comm), "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "runs": runs, "table": rows, "summary": summary}
    path = os.path.join(args.out, RESULTS)
    lines = [markdown_table(rows), *summary_lines(summary, args.repeats)]
    if args.straggler and any(parse_protocol(p)[0] == "ssp" for p in protocols):
        lines.append(textwrap.fill(_PERSISTENT, 100))
    harness.finish(results, watch, path, comm=comm, module="experiments.studies.staleness_sweep", argv=argv,
                   show=lambda _: "\n".join(lines + [f"draw with: python -m plots.staleness {path}"]))


if __name__ == "__main__":
    sys.exit(main())
