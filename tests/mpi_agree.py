"""Rank-side body: ranks started with different trainer settings stop with one line naming them.

``mpiexec -n 1 python -m tests.mpi_agree RUN_DIR base : -n 1 ... RUN_DIR lr : -n 1 ... RUN_DIR seed`` (an
MPMD launch: each program its own command line) runs the jobs of :data:`JOBS` one after the other, each
with the flags its ROLE adds; :func:`training.train.main` must end with status 1 on every rank of every
job before any run directory exists. Each rank prints ``JOB rank R status C made M`` per job.

``mpiexec -n 3 python -m tests.mpi_agree RUN_DIR parse|serve``: the command line parses on ranks 0 and 1
only; serving with one replica started with another ``--max-batch``.
"""
import os
import sys

from mpi4py import MPI

from training.train import main

_GRID = ["--pipeline-parallel", "3", "--hidden", "16,16", "--data", "synthetic", "--samples", "120",
         "--features", "12", "--classes", "5", "--batch-size", "12"]
_CTR = ["--model", "ctr", "--ctr-rows", "300", "--ctr-tables", "3", "--ctr-train", "192", "--ctr-test", "96",
        "--batch-size", "48", "--hidden", "8", "--optimizer", "adagrad", "--ps-timeout", "30"]
#: job -> role -> the flags that role adds to ``--epochs 1 --no-progress``.
JOBS = {
    # data-parallel: rank 1 another --lr, rank 2 another --seed, --lr and a log level of its own
    # (a per-rank setting, not compared)
    "options": {"base": [], "lr": ["--lr", "0.01"], "seed": ["--seed", "3", "--lr", "0.01", "--log-level", "DEBUG"]},
    # a pipeline of three stages, the last two widths differing on rank 2 (its stages would be 16 -> 8 wide)
    "widths": {"base": _GRID, "lr": _GRID, "seed": [*_GRID, "--hidden", "16,8"]},
    # a pipeline whose stages were started with another learning rate and micro-batching
    "stage-options": {"base": _GRID, "lr": [*_GRID, "--lr", "0.01"], "seed": [*_GRID, "--micro-batches", "2"]},
    # rank 2 started without the pipeline: it takes the data-parallel driver, the others the grid's
    "driver": {"base": _GRID, "lr": _GRID, "seed": _GRID[2:]},
    # the ctr model: rank 1 another table count, rank 2 another mode and hot split (it would serve, the others train)
    "ctr": {"base": _CTR, "lr": [*_CTR, "--ctr-tables", "4"], "seed": [*_CTR, "--mode", "ps",
                                                                   "--ctr-hot", "10"]},
}


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


def _main(job, run_dir, extra):
    try:
        code = main(["--epochs", "1", "--no-progress", "--run-dir", run_dir, *extra])
    except SystemExit as exc:
        code = exc.code
    made = os.path.isdir(run_dir) and os.listdir(run_dir)
    # one write of the whole line: the launcher forwards each rank's output as it reads it, and a line
    # written in two pieces can be joined to another rank's line
    sys.stdout.write(f"{job} rank {MPI.COMM_WORLD.Get_rank()} status {code} made {bool(made)}\n")
    sys.stdout.flush()
    return code in (1, 2) and not made


if __name__ == "__main__":
    if sys.argv[2:] == ["serve"]:
        serve()
    if sys.argv[2:] == ["parse"]:  # the command line parses on ranks 0 and 1 only
        rank = MPI.COMM_WORLD.Get_rank()
        sys.exit(0 if _main("parse", sys.argv[1], ["--lr", "abc"] if rank == 2 else []) else 3)
    role = sys.argv[2]
    ok = [_main(job, os.path.join(sys.argv[1], job), flags[role]) for job, flags in JOBS.items()]
    sys.exit(0 if all(ok) else 3)
