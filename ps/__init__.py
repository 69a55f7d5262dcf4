"""commlab parameter server: sharded push/pull with BSP, ASP and SSP consistency on MPI.

Roles come from the communicator (the first ``S`` ranks serve, the others work). A job is one call
of :func:`run` with its :class:`PSOptions`; the servers run the optimizer its caller hands it
(``make_optimizer``), and rank 0 gets the :class:`RunResult`. Training the trainer's model with a
parameter server is the trainer's ``--mode ps`` (:mod:`training.ps_mode.worker`).

Modules: ``options`` (settings), ``runtime`` (the job: roles, worker loop, reports), ``server``
(the server loop), ``client`` (a worker's push/pull), ``consistency`` (BSP/ASP/SSP rules),
``protocol`` (messages), ``sharding`` (the split of the flat vector), ``state`` (a shard's
optimizer and step size), ``store`` (atomic, checksummed ``.npz`` checkpoints), ``replication``
(a shard's chain of replicas, fencing), ``failover`` (a worker's view of the chains),
``survivors`` (a replicated run's report, gathered on a worker).
"""
from ps.consistency import CONSISTENCY
from ps.options import PSOptions
from ps.protocol import PSError, PSTimeout
from ps.runtime import RunResult, run

__all__ = ["run", "RunResult", "PSOptions", "CONSISTENCY", "PSError", "PSTimeout"]
