"""commlab inference: batched prediction serving of trained checkpoints on MPI.

A front rank batches requests dynamically and balances them over model replicas, each one rank or
a tensor-parallel group (:mod:`inference.tensor`); see :mod:`inference.serve` for the command
(not imported here, so that ``python -m inference.serve`` runs it fresh).
"""
from .balance import POLICIES, Balancer
from .batching import DynamicBatcher
from .config import ServeConfig
from .front import Front
from .loadgen import ClosedLoop, OpenLoop, make_payloads
from .model import ModelSpec, Predictor, dense_forward, load_spec
from .request import Request, parse_features
from .tensor import TensorParallelForward, emulate_forward, rank_order_allreduce, row_parallel_widths, shard_layers

__all__ = ["POLICIES", "Balancer", "DynamicBatcher", "ServeConfig", "Front", "ClosedLoop", "OpenLoop",
           "make_payloads", "ModelSpec", "Predictor", "dense_forward", "load_spec", "Request",
           "parse_features", "TensorParallelForward", "emulate_forward", "rank_order_allreduce", "row_parallel_widths",
           "shard_layers"]
