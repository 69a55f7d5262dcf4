"""A rank of a training or serving job dies mid-run: ``python -m experiments.faults.crash KIND RANK AT [FLAGS...]``.

Runs ``training.train.main(FLAGS)`` (``inference.serve.main(FLAGS)`` for ``KIND = serve``) with one
change: rank RANK leaves the job
(:func:`experiments.faults.dead.vanish`: no ``MPI_Finalize``, no message to its peers, as a killed
process) at its AT-th (1-based) step. RANK may list several ranks, comma-separated (``1,2``): each
leaves at its own AT-th step.

* ``KIND = dp``: the AT-th data-parallel training step (``training.train.train_step``);
* ``KIND = ps``: the AT-th parameter-server protocol step: a worker at its AT-th push, a server at the
  AT-th message it handles (``ps.worker.client.Client.push``, ``ps.serving.shard_server.Server._handle``);
* ``KIND = setup``: the run's set-up (``training.runtime.checkpoint.make_run_dir`` as ``training.train`` calls
  it: the run directory that rank 0 makes and broadcasts), before any training step;
* ``KIND = serve``: a serving job's replica rank at the forward of its AT-th batch
  (``inference.replicas.predictor.Predictor.predict``), so that batch is in flight when it dies.

The line it prints before dying (:func:`~experiments.faults.dead.vanish`) carries the wall-clock
time, so that the caller can measure how long the survivors take to end the job. Launched under
``mpiexec -disable-auto-cleanup`` by :mod:`experiments.faults.suite` and the tests, so that MPICH does
not end the survivors itself (Open MPI's ``--enable-recovery`` the same): the trainer's watchdog
(``--timeout``, ``--ps-timeout``) must, or the serving front (``--replica-timeout``; only under Open
MPI's launcher does a serving job outlive a replica, see ``docs/guide/serving.md``).
"""
import sys

from mpi4py import MPI

import ps.worker.client
import ps.serving.shard_server
import training.train
from experiments.faults.dead import vanish

__all__ = ["inject", "main"]


def _exit_at(ranks, at, counter):
    counter[0] += 1
    if MPI.COMM_WORLD.rank in ranks and counter[0] == at:
        vanish(MPI.COMM_WORLD.rank)


def inject(kind, rank, at):
    """Make rank ``rank`` exit at its ``at``-th step of ``kind`` (``"dp"``, ``"ps"``, ``"setup"`` or ``"serve"``).

    Parameters
    ----------
    kind : str
    rank : int or sequence of int
        The rank, or the ranks, that exit (each at its own ``at``-th step).
    at : int

    Raises
    ------
    ValueError
        When ``kind`` is none of them, or ``at < 1``.
    """
    if kind not in ("dp", "ps", "setup", "serve") or at < 1:
        raise ValueError(f"fault_crash: KIND must be dp, ps, setup or serve and AT >= 1, got {kind!r} {at}")
    ranks = {int(rank)} if isinstance(rank, int) else {int(r) for r in rank}
    counter = [0]
    if kind == "serve":
        import inference.replicas.predictor  # here: a training job's crash does not load the serving stack

        targets = [(inference.replicas.predictor.Predictor, "predict")]
    else:
        targets = {"dp": [(training.train, "train_step")], "setup": [(training.train, "make_run_dir")],
                   "ps": [(ps.worker.client.Client, "push"), (ps.serving.shard_server.Server, "_handle")]}[kind]
    for owner, name in targets:
        real = getattr(owner, name)
        if not isinstance(owner, type):
            def wrapped(*args, _real=real, **kwargs):
                _exit_at(ranks, at, counter)
                return _real(*args, **kwargs)
        else:
            def wrapped(self, *args, _real=real, **kwargs):
                _exit_at(ranks, at, counter)
                return _real(self, *args, **kwargs)
        setattr(owner, name, wrapped)


def main(argv=None):
    """Inject the crash and run the trainer (or the server); return its exit status."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        kind, ranks, call = argv[0], [int(r) for r in argv[1].split(",")], int(argv[2])
    except (IndexError, ValueError):
        print("usage: mpiexec -n P python -m experiments.faults.crash KIND RANK[,RANK...] CALL [TRAINER OR SERVER "
              "FLAGS...] (run by experiments.faults.suite and the crash tests)", file=sys.stderr)
        return 2
    inject(kind, ranks, call)
    if kind == "serve":
        import inference.serve

        return inference.serve.main(argv[3:])
    return training.train.main(argv[3:])


if __name__ == "__main__":
    sys.exit(main())
