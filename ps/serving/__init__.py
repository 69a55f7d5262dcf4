"""One parameter server: its serving loop (``shard_server``), the clock bookkeeping of the BSP, ASP
and SSP rules (``consistency``), its record of the workers' requests (``request_log``) and the
step size of its shard's updates (``server_optimizer``).

Imports: :mod:`ps.wire`, :mod:`ps.shards`, :mod:`ps.checkpoints` (and ``collectives``); never the
worker side, replication or the job.
"""
