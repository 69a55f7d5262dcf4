"""The worker side of the parameter server: a worker's push and pull (``client``) and its view of
replicated shards' chains, which replica is each shard's primary at which epoch (``failover``).

Imports: :mod:`ps.wire` and :mod:`ps.shards` (and ``collectives``); never a server.
"""
