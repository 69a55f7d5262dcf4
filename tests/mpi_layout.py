"""Rank-side body of the model-layout check tests: ``python -m tests.mpi_layout DIR CASE:FIRST:ALG...``.

Each ``CASE:FIRST:ALG`` runs in turn in one launch, reported as ``case_CASE:FIRST:ALG: ok`` (its files
in ``DIR/FIRST-ALG``); ``python -m tests.mpi_layout DIR FIRST ALG [CASE...]`` runs the cases (default
all) with one FIRST and ALG.

Ranks ``< FIRST`` train ``--hidden 8``, ranks ``>= FIRST`` ``--hidden 16`` (FIRST = P: every rank
alike), on a small synthetic set (12 features, 5 classes) for one epoch with all-reduce algorithm
ALG. The oracle for the layouts is the model each rank builds: 149 parameters with ``--hidden 8``,
293 with ``--hidden 16``. Cases (:func:`tests.mpicases.run_cases`; DIR is shared by the ranks):

mismatch  (FIRST < P) ``training.train.run`` raises ValueError on every rank, with the same message
          everywhere, naming rank FIRST's layout and rank 0's, before the run directory exists.
cli       (FIRST < P) ``training.train.main`` returns 1 on every rank; all the ranks' output
          together holds one ``error:`` line, rank 0's, naming rank FIRST, and no traceback.
match     (FIRST = P) every rank trains its epoch and the replicas end identical.
"""
import contextlib
import io
import os
import sys

from mpi4py import MPI

from training.settings.cli import parse_args
from training.train import main, run
from tests.mpicases import quiet, run_cases

SMALL = "parameter shapes [(12, 8), (8,), (8, 5), (5,)] (float32, 149 parameters)"
LARGE = "parameter shapes [(12, 16), (16,), (16, 5), (5,)] (float32, 293 parameters)"


def argv(run_dir, first, alg, comm):
    """Return this rank's command line: ``--hidden 8`` below rank ``first``, 16 from it on."""
    return ["--data", "synthetic", "--samples", "300", "--features", "12", "--classes", "5",
            "--hidden", "8" if comm.rank < first else "16", "--epochs", "1", "--batch-size", str(20 * comm.size),
            "--algorithm", alg, "--run-dir", run_dir, "--checkpoint-every", "0", "--no-progress"]


def case_mismatch(comm, base, first, alg):
    run_dir = os.path.join(base, "mismatch")
    try:
        quiet(run, parse_args(argv(run_dir, first, alg, comm)))
        said = "no error"
    except ValueError as e:
        said = f"ValueError: {e}"
    every = comm.allgather(said)
    assert all(s.startswith("ValueError: ") for s in every), f"not every rank raised: {every}"
    assert len(set(every)) == 1, f"the ranks' messages differ: {every}"
    assert f"rank {first} has 3 layers, {LARGE}" in said, said
    assert f"rank 0 has 3 layers, {SMALL}" in said, said
    assert not os.path.exists(run_dir), "the run directory was created before the check"


def case_cli(comm, base, first, alg):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = main(argv(os.path.join(base, "cli"), first, alg, comm))
    every = comm.allgather(out.getvalue())
    assert status == 1, f"rank {comm.rank}: main returned {status}"
    text = "".join(every)
    assert text.count("error:") == 1 and "Traceback" not in text, every
    assert "error:" in every[0], f"the error line does not come from rank 0: {every}"
    assert f"error: the model differs across ranks: rank {first} has 3 layers, {LARGE}" in every[0], every[0]


def case_match(comm, base, first, alg):
    summary = quiet(run, parse_args(argv(os.path.join(base, "match"), first, alg, comm)))
    assert summary["epochs"] == 1 and summary["replicas_identical"], summary


CASES = [case_mismatch, case_cli, case_match]


def _spec(text):
    """Return the case of ``CASE:FIRST:ALG``, reported as ``case_CASE:FIRST:ALG``, in a folder of its own."""
    name, first, alg = text.split(":")
    case = {c.__name__[5:]: c for c in CASES}[name]

    def one(comm, base):
        folder = os.path.join(base, f"{first}-{alg}")
        if comm.rank == 0:
            os.makedirs(folder, exist_ok=True)
        comm.Barrier()
        case(comm, folder, int(first), alg)

    one.__name__ = f"case_{text}"
    return one


if __name__ == "__main__":
    base, specs = sys.argv[1], sys.argv[2:]
    if specs and ":" not in specs[0]:  # DIR FIRST ALG [CASE...]
        first, alg, names = specs[0], specs[1], specs[2:] or [c.__name__[5:] for c in CASES]
        specs = [f"{name}:{first}:{alg}" for name in names]
    sys.exit(1 if run_cases(MPI.COMM_WORLD, [_spec(s) for s in specs], base) else 0)
