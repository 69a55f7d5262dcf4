"""A rank killed by SIGKILL at a chosen step of a data-parallel job: ``python -m experiments.faults.kill RANKS STEP WHERE [FLAGS...]``.

Runs ``training.train.main(FLAGS)`` with one change: each rank of RANKS (comma-separated) sends
itself SIGKILL at its STEP-th (1-based) training step, as a failing node's process dies:

* ``WHERE = step``: as the step begins (the plain loop's and ``--elastic``'s
  :func:`training.dp.data_parallel.train_step`);
* ``WHERE = inside``: inside the step's gradient exchange, once it has posted the first round of a
  hand-made collective of more than 8 elements (the non-finite flag's all-reduce is left alone).

Before dying it prints ``rank R: killed at T (step S, WHERE)``, ``T`` the wall-clock time
(``time.time()``), from which :mod:`experiments.studies.elastic_recovery` measures the recovery; RANKS ``-``
kills no rank. Rank 0 prints ``first step done at T`` once its first step of this job has completed
(a restarted job's first step, for the same study). Every rank
that lives prints ``exit R STATUS`` when the trainer returns, which an elastic job that lost a rank
and took in no replacement does not: it ends inside the trainer, without ``MPI_Finalize``
(:func:`training.driver.elastic.leave`). Launch it under
``mpiexec --with-ft ulfm`` (Open MPI) for ``--elastic``.
"""
import os
import signal
import sys
import time

from mpi4py import MPI

import collectives.engine.executor
import training.driver.elastic
import training.train

__all__ = ["inject", "main"]


def inject(ranks, at, where):
    """Make each rank of ``ranks`` die by SIGKILL at its ``at``-th training step, as ``where`` says.

    Raises
    ------
    ValueError
        When ``where`` is neither ``step`` nor ``inside``, or ``at < 1``.
    """
    if where not in ("step", "inside") or at < 1:
        raise ValueError(f"kill: WHERE must be step or inside and STEP >= 1, got {where!r} {at}")
    me = MPI.COMM_WORLD.rank
    if MPI.Comm.Get_parent() != MPI.COMM_NULL:
        ranks = set()  # a replacement that --elastic-respawn started (it runs this command too): it lives
    count = [0]

    def die():
        print(f"rank {me}: killed at {time.time():.3f} (step {count[0]}, {where})", flush=True)
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    for owner in (training.train, training.driver.elastic):
        real = owner.train_step

        def step(*args, _real=real, **kwargs):
            count[0] += 1
            if me in ranks and count[0] == at and where == "step":
                die()
            out = _real(*args, **kwargs)
            if count[0] == 1 and me == 0:
                print(f"first step done at {time.time():.3f}", flush=True)
            return out
        owner.train_step = step
    if where == "inside":
        post = collectives.engine.executor.Run.post

        def post_then_die(self, index, _post=post):
            out = _post(self, index)
            if me in ranks and count[0] == at and self.work.size > 8:
                die()
            return out
        collectives.engine.executor.Run.post = post_then_die


def main(argv=None):
    """Inject the kill and run the trainer; return its exit status."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        ranks = set() if argv[0] == "-" else {int(r) for r in argv[0].split(",")}
        at, where = int(argv[1]), argv[2]
        inject(ranks, at, where)
    except (IndexError, ValueError) as e:
        print(f"usage: mpiexec -n P python -m experiments.faults.kill RANK[,RANK...] STEP step|inside [TRAINER FLAGS...] "
              f"({e})", file=sys.stderr)
        return 2
    rank = MPI.COMM_WORLD.rank  # the trainer may have finalized MPI when it returns (a job that took in replacements)
    status = training.train.main(argv[3:])
    print(f"exit {rank} {status}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
