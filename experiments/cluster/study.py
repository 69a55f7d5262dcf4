"""One command for a whole emulated-cluster study: its runs one after another under one load watch, gathered
into one results file with provenance (:mod:`commlab.provenance`).

A study gives its runs as shell lines that start with ``python`` or ``mpiexec`` (run with this interpreter
and the ``mpiexec`` beside it) and a function that gathers their outputs into a record. :func:`run_study`
checks that the machine is quiet before the first run (``--max-load``, ``--settle``, ``--allow-noisy``),
samples the load average while they run and stamps the record: noisy when a sample rose above the
threshold plus the study's largest job (its ranks and one unit more for the emulator's launch proxies and
the kernel's work on the shaped links), or when a results file of one of its runs says it was noisy. A run
that checks the load itself is given the study's threshold plus that job's size (:func:`load_flags`): the
previous run's ranks are still in the 1-minute average when it starts.

Examples
--------
>>> import argparse
>>> from experiments.cluster import study
>>> parser = argparse.ArgumentParser()
>>> study.add_options(parser, "results/cluster/x", "results/cluster/x.json")
>>> args = parser.parse_args(["--max-load", "0.5"])
>>> study.load_flags(args, 5)
' --max-load 5.5'
>>> study.argv("python -m training.emulator.emulate -- python -m training.train")[4] == study.argv("python")[0]
True
"""
import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

from commlab import provenance
from training.settings.options import Parser, outpath, real, text

__all__ = ["add_options", "subcommands", "load_flags", "argv", "run_commands", "run_study", "write_record"]


def add_options(parser, out, study):
    """Add ``--out DIR`` (the runs), ``--study FILE`` (the gathered record) and the load options."""
    parser.add_argument("--out", type=outpath(), default=out, help=f"the runs' directory (default {out})")
    parser.add_argument("--study", type=text(), default=study, help=f"the gathered results file (default {study})")
    provenance.add_options(parser, real)


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


def load_flags(args, P):
    """Return the load options for a run that checks the load itself, as a string to append to its command."""
    limit = args.max_load if args.max_load is not None else provenance.default_max_load()
    return f" --max-load {limit + P:g}" + (" --allow-noisy" if args.allow_noisy else "")


def argv(cmd):
    """Return the argument list of the shell line ``cmd``, ``python`` and ``mpiexec`` resolved to this
    interpreter and the launcher beside it (else the one on ``PATH``)."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = here if os.path.exists(here) else (shutil.which("mpiexec") or "mpiexec")
    return [{"python": sys.executable, "mpiexec": mpiexec}.get(a, a) for a in shlex.split(cmd)]


def run_commands(cmds, label, pause=3.0, wait=300.0):
    """Run the shell lines ``cmds`` one after another; return the lines that failed.

    Before each, ``pause`` seconds for the previous job's ranks to leave the cores, then, for a run that
    checks the load itself (``--max-load L``), up to ``wait`` seconds more until the 1-minute load average
    is half a unit below ``L``: the previous run's ranks and the emulator's work decay out of the average
    only gradually, and a run started too early would refuse to measure."""
    failed = []
    for cmd in cmds:
        time.sleep(pause)
        words = cmd.split()
        if "--max-load" in words and "--allow-noisy" not in words:
            ceiling, until = float(words[words.index("--max-load") + 1]) - 0.5, time.monotonic() + wait
            while os.getloadavg()[0] > ceiling and time.monotonic() < until:
                time.sleep(2.0)
        print(f"[{label}] {cmd}", flush=True)
        if subprocess.run(argv(cmd)).returncode != 0:
            failed.append(cmd)
    return failed


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
        Seconds before each run (:func:`run_commands`).
    show : callable, optional
        ``show(record) -> str``: the record's table, printed when every run succeeded.

    Returns
    -------
    int
        0; 1 when a run failed (the record is written and names it) or the runs cannot be gathered; 2 on
        a busy machine without ``--allow-noisy``.
    """
    try:
        watch = provenance.guard(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    failed = run_commands(cmds, label, pause)
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
