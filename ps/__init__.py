"""commlab parameter server: sharded push/pull with BSP, ASP and SSP consistency on MPI.

Roles come from the communicator (the first ``S`` ranks serve, the others work); see
:func:`ps.runtime.run` for the generic job, which runs the optimizer its caller hands it. Training
the trainer's model with a parameter server is the trainer's ``--mode ps``
(:mod:`training.ps_mode`).
"""
from ps.client import Client
from ps.consistency import CONSISTENCY
from ps.options import PSOptions
from ps.protocol import PSError, PSTimeout
from ps.runtime import RunResult, run
from ps.server import Server
from ps.sharding import join_shards, shard_offsets, shard_sizes, shard_slice, split_shards
from ps.state import ServerOptimizer

__all__ = ["Client", "CONSISTENCY", "PSOptions", "PSError", "PSTimeout", "RunResult", "run", "Server",
           "join_shards", "shard_offsets", "shard_sizes", "shard_slice", "split_shards",
           "ServerOptimizer"]
