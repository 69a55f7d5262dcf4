"""commlab parameter server: sharded push/pull with BSP, ASP and SSP consistency on MPI.

Roles come from the communicator (the first ``S`` ranks serve, the others work). A job is one call
of :func:`run` with its :class:`PSOptions`; the servers run the optimizer its caller hands it
(``make_optimizer``), and rank 0 gets the :class:`RunResult`. Training the trainer's model with a
parameter server is the trainer's ``--mode ps`` (:mod:`training.ps_mode.worker`).

Subpackages, top to bottom (each imports only those below it; ``.importlinter`` holds the order):
``job`` (settings, the run with its roles and worker loop, the end-of-run report, a replicated
run's report), ``embedding`` (sparse pulls and pushes of embedding rows) and ``replicas`` (a
shard's chain of replicas, fencing), ``worker`` (a worker's push/pull, its view of the chains) and
``serving`` (the server loop, BSP/ASP/SSP rules, request log, a shard's step size),
``checkpoints`` (a server's shard file, its name and its checks, in commlab's checksummed ``.npz``
format), ``shards`` (the split of the flat vector, rows of embedding tables) and ``wire`` (messages,
errors).
"""
from ps.job.reports import RunResult
from ps.job.runner import run
from ps.job.settings import PSOptions
from ps.serving.consistency import CONSISTENCY
from ps.wire.messages import PSError, PSTimeout

__all__ = ["run", "RunResult", "PSOptions", "CONSISTENCY", "PSError", "PSTimeout"]
