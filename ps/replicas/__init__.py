"""Replicated shards (``chain_replication``): each shard on a chain of server ranks, fenced epochs,
updates forwarded down the chain and acknowledged once every live replica applied them.

Imports: :mod:`ps.serving` (a replica is a server), :mod:`ps.wire`; never the worker side or the job.
"""
