"""The harness every study and benchmark runs on: the options they share, the checks before a
measurement and the write after it, written once.

A study is a small unit: its own options, a run, its table (:class:`Study`, whose ``main`` runs the
steps below around them). Around the run, in this order:

1. :func:`add_options` gives its parser the options common to every study: ``--out`` (the results
   file or folder), ``--repeats`` where the study repeats its runs, and the load options
   ``--max-load``, ``--settle`` and ``--allow-noisy`` (:func:`commlab.provenance.add_options`);
2. :func:`start`, on every rank, before anything is measured or removed: the results files must be
   writable (rank 0 tries, every rank hears its verdict) and the machine quiet
   (:func:`commlab.provenance.guard`); it returns the running load watch, or None after rank 0
   printed one error line (the study then exits with status 2);
3. the study's run (rank 0 alone prints, through :func:`echo`);
4. :func:`finish`: rank 0 stamps the record with its provenance (the command, versions, P, host, the
   load before and during: :func:`commlab.provenance.stamp`), writes it as JSON, prints the study's
   table and the path; the other ranks stop their load watch and write nothing.

A study whose run may fail alike on every rank wraps it in :func:`run_or_report`: one error line and
status 1, or an abort when only some ranks failed.

A study that launches its jobs as commands of their own (the emulated-cluster studies, the elastic
and replica studies) runs them through :func:`run_commands` under one load watch.

Every study is listed by the index, ``python -m experiments --list``, and run by it as
``python -m experiments NAME [ARGS]`` (:mod:`experiments.__main__`).

Examples
--------
>>> from experiments import harness
>>> from training.settings.options import Parser
>>> p = Parser(prog="python -m experiments.studies.example")
>>> harness.add_options(p, out="results/example.json", repeats=3)
>>> args = p.parse_args(["--max-load", "1000"])
>>> args.out, args.repeats, args.allow_noisy
('results/example.json', 3, False)
>>> watch = harness.start(args)           # None, after one error line, on a busy machine
>>> record = harness.finish({"rows": []}, watch, None, P=1)
>>> record["provenance"]["noisy"]
False
"""
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import collectives.engine.policy
from commlab import provenance as prov
from commlab.file_formats import write_json
from commlab.job_control import all_failed
from commlab.provenance import command_line, unwritable
from training.settings.cli import parse_on_every_rank
from training.settings.options import INT32_MAX, Parser, integer, outpath, real, text

__all__ = ["Study", "add_options", "add_worker_options", "worker_methods", "parse", "start", "finish", "echo",
           "fresh_folder", "scratch_folder", "logged", "load_flags", "argv", "run_commands",
           "run_or_report"]


@dataclass(frozen=True)
class Study:
    """A study or benchmark as a unit: its own options, its run and its table; :meth:`main` is the harness
    around them (parse, check, :func:`start`, run, :func:`finish`).

    A module defines ``STUDY = Study(...)`` and ``main = STUDY.main``.

    Examples
    --------
    >>> import os, tempfile
    >>> def options(p):
    ...     p.add_argument("--n", type=integer(1, 9), default=3)
    >>> demo = Study("experiments.studies.example", "A demo.", options, run=lambda args, comm: {"n": args.n},
    ...              out="results/example.json", mpi=False, table=lambda r: f"n = {r['n']}")
    >>> out = os.path.join(tempfile.mkdtemp(), "r.json")
    >>> demo.main(["--n", "4", "--out", out, "--max-load", "1000"])  # doctest: +ELLIPSIS
    n = 4
    results: ...r.json
    0
    """

    module: str                  # the entry point, "experiments.bench.trace"
    description: str             # what --help says it does
    options: Callable            # options(parser): the study's own options
    run: Callable                # run(args, comm) -> the record on rank 0 (None elsewhere); may print; a
                                 # ValueError raised alike on every rank is one error line, status 2
    out: str                     # default of --out
    folder: bool = False         # --out names a folder (the record is results(args) inside it)
    what: str = None             # what --out holds, for its help (default: the results file or folder)
    repeats: int = None          # default of --repeats; None: the study has no --repeats
    check: Callable = None       # check(args, comm): a ValueError is the one error line, status 2
    results: Callable = None     # results(args) -> the JSON file (default: --out)
    table: Callable = None       # table(record) -> str, printed before the path
    ranks: Callable = None       # ranks(args, comm) -> P the provenance names (default: the job's size)
    status: Callable = None      # status(record) -> exit status on rank 0 (default 0)
    mpi: bool = True             # runs on the ranks of MPI.COMM_WORLD (False: one process, no MPI)
    launcher: str = "mpiexec -n P "  # what --help's usage line puts before python

    def main(self, argv=None):
        """Run the study: 0, 2 after one error line before anything runs, or :attr:`status`."""
        comm = None
        if self.mpi:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        rank = comm.Get_rank() if comm is not None else 0
        p = Parser(prog=f"{self.launcher if self.mpi else ''}python -m {self.module}", description=self.description)
        self.options(p)
        add_options(p, out=self.out, folder=self.folder, repeats=self.repeats, what=self.what)
        args, _ = parse(p, argv, comm, None if self.check is None else lambda a: self.check(a, comm))
        path = self.results(args) if self.results is not None else args.out
        watch = start(args, comm, paths=[path], prog=p.prog)
        if watch is None:
            return 2
        try:
            record = self.run(args, comm)
        except ValueError as e:
            watch.summary()
            if rank == 0:
                print(f"{p.prog}: error: {e}", file=sys.stderr, flush=True)
            return 2
        P = self.ranks(args, comm) if self.ranks is not None else None
        finish(record, watch, path, comm=comm, P=P, module=self.module, argv=argv, show=self.table)
        return self.status(record) if self.status is not None and rank == 0 else 0


def add_options(parser, *, out=None, folder=False, repeats=None, what=None):
    """Add the options every study shares to ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    out : str, optional
        Default of ``--out``; None adds no ``--out`` (the study has options of its own for its files).
    folder : bool
        ``--out`` names a folder (the study writes several files into it) rather than one file.
    repeats : int, optional
        Default of ``--repeats`` (runs per variant, interleaved); None adds no ``--repeats``.
    what : str, optional
        What ``--out`` holds, for its help (default: the results file or folder).
    """
    if out is not None:
        what = what or ("results folder" if folder else "results file")
        parser.add_argument("--out", type=outpath(folder=folder), default=out, help=f"{what} (default: %(default)s)")
    if repeats is not None:
        parser.add_argument("--repeats", type=integer(1, INT32_MAX), default=repeats,
                            help="runs per variant, interleaved (default: %(default)s)")
    prov.add_options(parser, real)


def add_worker_options(parser, dp_methods, ps_methods):
    """Add ``--workers W`` and ``--methods LIST`` of a study whose W workers run on W ranks (data-parallel) or
    on W + 1 (one parameter server); ``dp_methods`` and ``ps_methods`` are the default lists of each kind."""
    parser.add_argument("--workers", type=integer(1, INT32_MAX), required=True,
                        help="workers W: ranks (data-parallel) or ranks - 1 (PS)")
    parser.add_argument("--methods", type=text(), default=None, metavar="LIST",
                        help=f"comma-separated methods of one kind (default: {dp_methods} on W ranks, {ps_methods} "
                             "on W + 1)")


def worker_methods(args, size, dp_methods, ps_methods, is_ps):
    """Return ``(kind, methods)`` of :func:`add_worker_options`' options for a job of ``size`` ranks.

    ``kind`` is ``"dp"`` (``size`` = W) or ``"ps"`` (``size`` = W + 1); ``is_ps(method)`` says whether a
    method runs with the parameter server.

    Raises
    ------
    ValueError
        When ``size`` is neither W nor W + 1, or a method is not of the job's kind.

    >>> import argparse
    >>> worker_methods(argparse.Namespace(workers=2, methods=None), 3, "bsp", "asp", lambda m: m == "asp")
    ('ps', ['asp'])
    """
    W = args.workers
    kind = "dp" if size == W else "ps" if size == W + 1 else None
    if kind is None:
        raise ValueError(f"--workers {W} needs {W} ranks (data-parallel) or {W + 1} (parameter server), got {size}")
    methods = [m for m in (args.methods or (dp_methods if kind == "dp" else ps_methods)).split(",") if m]
    for m in methods:
        if is_ps(m) != (kind == "ps"):
            raise ValueError(f"method {m} is not a {'parameter-server' if kind == 'ps' else 'data-parallel'} "
                             f"method: launch it on {W + 1 if kind == 'dp' else W} ranks")
    return kind, methods


def parse(parser, argv=None, comm=None, check=None):
    """Parse ``argv`` on every rank of ``comm`` (``--help`` and usage errors print once); return ``(args,
    check(args))``.

    A ``ValueError`` or ``ImportError`` that ``check`` raises (alike on every rank: the study's own checks of
    its settings, before anything runs) is the parser's one error line, and every rank exits with status 2.
    """
    rank = comm.Get_rank() if comm is not None else 0
    args = parse_on_every_rank(parser.parse_args, argv, rank)
    if check is None:
        return args, None
    try:
        return args, check(args)
    except (ValueError, ImportError) as e:
        if rank == 0:
            parser.error(str(e))
        raise SystemExit(2) from None


def start(args, comm=None, *, paths=(), prog=None):
    """Check, before any measurement, that the results files can be written and the machine is quiet.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed options of :func:`add_options` (``max_load``, ``settle``, ``allow_noisy``).
    comm : mpi4py.MPI.Comm, optional
        Every rank of the job: rank 0 checks, every rank returns its verdict (one error, no hang).
        None: this process alone.
    paths : sequence of str
        Results files the study will write (:func:`commlab.provenance.unwritable`).
    prog : str, optional
        The error line's prefix, ``PROG: error: ...`` as argparse words it (default ``error: ...``).

    Returns
    -------
    commlab.provenance.LoadWatch or None
        The running watch for :func:`finish`; None after rank 0 printed the one error line.
    """
    rank0 = comm is None or comm.Get_rank() == 0
    why = unwritable(*paths) if rank0 and paths else None
    if comm is not None:
        why = comm.bcast(why, root=0)
    if why is None:
        try:
            return prov.guard(args, comm)  # rank 0's verdict on every rank
        except ValueError as e:
            why = str(e)
    if rank0:
        print(f"{prog + ': ' if prog else ''}error: {why}", file=sys.stderr, flush=True)
    return None


def finish(record, watch, path, *, comm=None, P=None, module=None, argv=None, show=None):
    """Stamp ``record`` with its provenance, write it to ``path``, print its table; return the record.

    Rank 0 alone writes and prints; the other ranks stop their load watch and return ``record``
    unchanged.

    Parameters
    ----------
    record : dict
        The study's results.
    watch : commlab.provenance.LoadWatch
        From :func:`start`.
    path : str or None
        The JSON results file (folders made); None writes nothing (the study writes its own files).
    comm : mpi4py.MPI.Comm, optional
        The job (default: this process alone). ``P`` defaults to its size.
    P : int, optional
        Ranks the measurement ran on (the load each of them adds while it runs).
    module, argv : str, list of str, optional
        The entry point and the arguments its ``main`` parsed: the command the provenance names
        (:func:`commlab.provenance.command_line`; default: this process's command line).
    show : callable, optional
        ``show(record) -> str``: the study's table, printed before the path (and the word noisy when
        the machine was busy).
    """
    if comm is not None and comm.Get_rank() != 0:
        watch.summary()  # stops this rank's sampling: rank 0 alone writes
        return record
    P = P if P is not None else (comm.Get_size() if comm is not None else None)
    prov.stamp(record, watch, P=P, command=command_line(module, argv) if module else None)
    if path is not None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        write_json(path, json.loads(json.dumps(record, default=float)))  # NumPy scalars as numbers
    if show is not None:
        print(show(record), flush=True)
    if path is not None:
        print(f"results: {path}" + (" (noisy: never published)" if record["provenance"]["noisy"] else ""), flush=True)
    return record


def echo(comm=None):
    """Return a ``print`` that prints (flushed) on rank 0 of ``comm`` only (every call when ``comm`` is None)."""
    if comm is None or comm.Get_rank() == 0:
        return lambda *a: print(*a, flush=True)
    return lambda *a: None


def fresh_folder(path, comm=None):
    """Make ``path`` an empty folder (rank 0 removes what a previous run left there); every rank returns after."""
    if comm is None or comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
    if comm is not None:
        comm.Barrier()


@contextlib.contextmanager
def scratch_folder(comm, prefix):
    """Yield a temporary folder that rank 0 makes and every rank of ``comm`` uses (its name broadcast);
    rank 0 removes it after every rank has left the ``with`` block."""
    tmp = comm.bcast(tempfile.mkdtemp(prefix=prefix) if comm.Get_rank() == 0 else None, root=0)
    try:
        yield tmp
    finally:
        comm.Barrier()
        if comm.Get_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)


def logged(call, log, comm=None):
    """Return ``call()``, what it prints (stdout and stderr) written to the file ``log`` on rank 0 of ``comm``
    and dropped on the other ranks: a study's training runs print their epoch tables, the study its own lines.

    >>> import os
    >>> logged(lambda: print("epoch 1") or 3, os.devnull)
    3
    """
    path = log if comm is None or comm.Get_rank() == 0 else os.devnull
    with open(path, "w", encoding="utf-8") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        return call()


def load_flags(args, P):
    """Return the load options for a launched job that checks the load itself, to append to its command.

    The job's threshold is the study's plus the job's own ``P`` ranks: the previous job's ranks are
    still in the 1-minute load average when it starts.

    >>> import argparse
    >>> load_flags(argparse.Namespace(max_load=0.5, allow_noisy=True), 5)
    ' --max-load 5.5 --allow-noisy'
    """
    limit = args.max_load if args.max_load is not None else prov.default_max_load()
    return f" --max-load {limit + P:g}" + (" --allow-noisy" if args.allow_noisy else "")


def argv(cmd):
    """Return the argument list of the shell line ``cmd``, ``python`` and ``mpiexec`` resolved to this
    interpreter and the launcher beside it (else the one on ``PATH``).

    >>> argv("python -m training.train")[0] == sys.executable
    True
    """
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = here if os.path.exists(here) else (shutil.which("mpiexec") or "mpiexec")
    return [{"python": sys.executable, "mpiexec": mpiexec}.get(a, a) for a in shlex.split(cmd)]


def run_commands(cmds, label, pause=3.0, wait=300.0):
    """Run the shell lines ``cmds`` one after another; return the lines that failed.

    Before each, ``pause`` seconds for the previous job's ranks to leave the cores, then, for a run that
    checks the load itself (``--max-load L``), up to ``wait`` seconds more until the 1-minute load average
    is half a unit below ``L``: the previous run's ranks and the emulator's work decay out of the average
    only gradually, and a run started too early would refuse to measure.

    Parameters
    ----------
    cmds : list of str
        Shell lines starting with ``python`` or ``mpiexec`` (:func:`argv`).
    label : str
        Printed before each line, ``[LABEL] CMD``.
    pause, wait : float
        Seconds.
    """
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


def run_or_report(body, comm):
    """Run ``body()`` on every rank of ``comm``; return 0, or 1 after one error line.

    An ``OSError``, ``ValueError`` or ``RuntimeError`` raised alike on every rank is printed once, by
    rank 0, as ``error: Type: message``; raised on some ranks only, each of those prints it with its
    rank and the job is aborted (:func:`collectives.engine.policy.abort`), so no rank waits for the others.
    Anything else prints its traceback on its rank, aborts a multi-rank job and is raised again.

    Parameters
    ----------
    body : callable
        The study's work, called with no argument.
    comm : mpi4py.MPI.Comm
    """
    try:
        body()
    except (OSError, ValueError, RuntimeError) as e:  # raised alike on every rank: one message
        everyone = all_failed(comm)
        if comm.Get_rank() == 0 or not everyone:
            where = "" if everyone else f"rank {comm.Get_rank()}: "
            print(f"error: {where}{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        if not everyone:
            collectives.engine.policy.abort(None, comm)
        return 1
    except Exception:  # noqa: BLE001 - anything else: report on this rank, abort the job (no hang)
        traceback.print_exc()
        if comm.Get_size() > 1:
            collectives.engine.policy.abort(None, comm)
        raise
    return 0
