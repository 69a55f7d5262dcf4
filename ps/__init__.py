"""commlab parameter server: sharded push/pull with BSP, ASP and SSP consistency on MPI.

Roles come from the communicator (the first ``S`` ranks serve, the others work); see
:func:`ps.runtime.run` for the generic job and :func:`ps.driver.run_ps` for training with the
trainer's model and data.
"""
from ps.client import Client
from ps.consistency import CONSISTENCY, BspBuckets, ClockTable
from ps.driver import BatchStream, ps_options, run_ps
from ps.options import PSOptions, parse_rank_spec
from ps.protocol import Msg, PSError, PSTimeout
from ps.runtime import STAT_FIELDS, RunResult, roles, run
from ps.server import Server, checkpoint_path
from ps.sharding import join_shards, shard_offsets, shard_sizes, shard_slice, split_shards
from ps.state import ServerOptimizer

__all__ = ["Client", "CONSISTENCY", "BspBuckets", "ClockTable", "BatchStream", "ps_options", "run_ps", "PSOptions", "parse_rank_spec", "Msg",
           "PSError", "PSTimeout", "STAT_FIELDS", "RunResult", "roles", "run", "Server",
           "checkpoint_path", "join_shards", "shard_offsets", "shard_sizes", "shard_slice",
           "split_shards", "ServerOptimizer"]
