"""Rank-side body of the model-layout check tests: ``python -m tests.mpi_layout DIR MODE FIRST ALG``.

Ranks ``< FIRST`` train ``--hidden 8``, ranks ``>= FIRST`` ``--hidden 16`` (FIRST = P: every rank
alike), on a small synthetic set for one epoch with all-reduce algorithm ALG.

MODE ``cli``: every rank runs ``training.train.main`` and exits with its status.
MODE ``each``: every rank calls ``training.train.run`` and writes ``DIR/rank-R.txt`` holding
``ValueError: MESSAGE`` for the error it raised (exit 1), or ``ok`` (exit 0), so a test sees what
every rank raised (files, since the ranks' stdout lines interleave).
"""
import os
import sys

from mpi4py import MPI

from training.cli import parse_args
from training.train import main, run


def argv(run_dir, first, alg):
    rank, size = MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size
    hidden = "8" if rank < first else "16"
    return ["--data", "synthetic", "--samples", "300", "--features", "12", "--classes", "5",
            "--hidden", hidden, "--epochs", "1", "--batch-size", str(20 * size), "--algorithm", alg,
            "--run-dir", run_dir, "--checkpoint-every", "0", "--no-progress"]


def each(args, out_dir):
    path = os.path.join(out_dir, f"rank-{MPI.COMM_WORLD.rank}.txt")
    try:
        run(parse_args(args))
    except ValueError as e:
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"ValueError: {e}")
        return 1
    with open(path, "w", encoding="utf-8") as f:
        f.write("ok")
    return 0


if __name__ == "__main__":
    base, mode, first, alg = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    args = argv(os.path.join(base, mode), first, alg)
    sys.exit(main(args) if mode == "cli" else each(args, base))
