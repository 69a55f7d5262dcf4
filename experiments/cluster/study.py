"""One command for a whole emulated-cluster study: its runs one after another under one load watch, gathered
into one results file with provenance (:mod:`commlab.provenance`).

A study gives its runs as shell lines that start with ``python`` or ``mpiexec`` (run with this interpreter
and the ``mpiexec`` beside it) and a function that gathers their outputs into a record. :func:`run_study`
checks that the machine is quiet before the first run (``--max-load``, ``--settle``, ``--allow-noisy``),
samples the load average while they run and stamps the record: noisy when a sample rose above the
threshold plus the study's largest job (its ranks and one unit more for the emulator's launch proxies and
the kernel's work on the shaped links), or when a results file of one of its runs says it was noisy. A run
that checks the load itself is given the study's threshold plus that job's size
(:func:`experiments.harness.load_flags`): the previous run's ranks are still in the 1-minute average when
it starts. The runs are launched by :func:`experiments.harness.run_commands`.

Examples
--------
>>> import argparse
>>> from experiments.cluster import study
>>> parser = argparse.ArgumentParser()
>>> study.add_options(parser, "results/cluster/x", "results/cluster/x.json")
>>> parser.parse_args(["--max-load", "0.5"]).study
'results/cluster/x.json'
"""
import json
import os
import sys

from commlab import provenance
from experiments import harness
from training.settings.options import Parser, outpath, text

__all__ = ["add_options", "subcommands", "run_study", "write_record"]


def add_options(parser, out, study):
    """Add ``--out DIR`` (the runs), ``--study FILE`` (the gathered record) and the load options."""
    parser.add_argument("--out", type=outpath(), default=out, help=f"the runs' directory (default {out})")
    parser.add_argument("--study", type=text(), default=study, help=f"the gathered results file (default {study})")
    harness.add_options(parser)


def subcommands(prog, description, epilog, out, study):
    """Return ``(parser, {"run": ..., "commands": ..., "report": ...})``: a study's three subcommands, ``run``
    with :func:`add_options`, ``commands`` with ``--out``, ``report`` with ``--study`` (their own
    arguments are the caller's to add)."""
    p = Parser(prog=prog, description=description, epilog=epilog)
    sub = p.add_subparsers(dest="what", required=True)
    parsers = {name: sub.add_parser(name) for name in ("run", "commands", "report")}
    add_options(parsers["run"], out, study)
    parsers["commands"].add_argument("--out", type=outpath(folder=True), default=out, help="the runs' directory")
    parsers["report"].add_argument("--study", type=text(), default=study, help="the results file")
    return p, parsers


def write_record(record, path, show=None):
    """Write ``record`` to ``path`` (JSON), printing ``show(record)`` (its table) first when given."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    if show is not None:
        print(show(record))


def run_study(args, cmds, gather, P, label, pause=3.0, show=None):
    """Run a study as one command and write its record to ``args.study``; return the exit status.

    Parameters
    ----------
    args : argparse.Namespace
        From :func:`add_options`.
    cmds : list of str
        The runs, in order.
    gather : callable
        ``gather() -> dict``: the record from the runs' outputs; its ``sources`` (``{name: {"provenance":
        ...}}``) name the runs' own results files.
    P : int
        The largest job's ranks plus one (the load each sample may add over the threshold).
    label : str
        Printed before each run.
    pause : float
        Seconds before each run (:func:`experiments.harness.run_commands`).
    show : callable, optional
        ``show(record) -> str``: the record's table, printed when every run succeeded.

    Returns
    -------
    int
        0; 1 when a run failed (the record is written and names it) or the runs cannot be gathered; 2 on
        a busy machine without ``--allow-noisy``.
    """
    watch = harness.start(args, paths=[args.study])
    if watch is None:
        return 2
    failed = harness.run_commands(cmds, label, pause)
    try:
        record = gather()
    except (OSError, ValueError, KeyError) as e:
        watch.summary()
        print(f"error: the runs cannot be gathered ({type(e).__name__}: {e}); failed runs: {failed or 'none'}",
              file=sys.stderr)
        return 1
    record["failed"] = failed
    provenance.stamp(record, watch, P=P)
    noisy = sorted(name for name, src in record.get("sources", {}).items()
                   if provenance.is_noisy(src if isinstance(src, dict) else {}))
    if noisy:
        record["provenance"]["noisy"] = True
        record["provenance"]["noisy_runs"] = noisy
    write_record(record, args.study, None if failed else show)
    verdict = "noisy" if record["provenance"]["noisy"] else "quiet"
    print(f"wrote {args.study} ({verdict}); failed runs: {failed or 'none'}")
    return 1 if failed else 0
