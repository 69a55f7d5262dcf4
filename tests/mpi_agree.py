"""Rank-side body: ranks started with different trainer settings stop with one line naming them.

``mpiexec -n 3 python -m tests.mpi_agree RUN_DIR [parse|serve]``: rank 1 adds ``--lr 0.01``, rank 2 ``--seed 3 --lr
0.01`` and a log level of its own (a per-rank setting, not compared); :func:`training.train.main`
must end with status 1 on every rank before any run directory exists.
"""
import os
import sys

from mpi4py import MPI

from training.train import main

def serve():
    """Serving: rank 2 (a replica) started with another --max-batch; every rank ends with status 2 before
    the checkpoint is read (it does not exist) or a request is made."""
    from inference.serve import main as serve_main

    rank = MPI.COMM_WORLD.Get_rank()
    extra = ["--max-batch", "4"] if rank == 2 else []
    code = serve_main(["--checkpoint", os.path.join(sys.argv[1], "none"), "--replicas", "2", "--run-dir",
                       os.path.join(sys.argv[1], "serve"), *extra])
    print(f"rank {rank} status {code}", flush=True)
    sys.exit(0 if code == 2 else 3)


if __name__ == "__main__":
    if sys.argv[2:] == ["serve"]:
        serve()
    rank = MPI.COMM_WORLD.Get_rank()
    extra = {0: [], 1: ["--lr", "0.01"], 2: ["--seed", "3", "--lr", "0.01", "--log-level", "DEBUG"]}[rank]
    if sys.argv[2:] == ["parse"]:  # the command line parses on ranks 0 and 1 only
        extra = ["--lr", "abc"] if rank == 2 else []
    try:
        code = main(["--epochs", "1", "--no-progress", "--run-dir", sys.argv[1], *extra])
    except SystemExit as exc:
        code = exc.code
    made = os.path.isdir(sys.argv[1]) and os.listdir(sys.argv[1])
    print(f"rank {rank} status {code} made {bool(made)}", flush=True)
    sys.exit(0 if code in (1, 2) and not made else 3)
