"""commlab inference: batched prediction serving of trained checkpoints on MPI.

A front rank batches requests dynamically (under an optional latency objective) and balances them over model replicas, each one rank or
a tensor-parallel group (:mod:`inference.tensor`); see :mod:`inference.serve` for the command
(not imported here, so that ``python -m inference.serve`` runs it fresh) and :mod:`inference.endpoint`
for its HTTP server, the Open Inference Protocol.
"""
from .balance import POLICIES, Balancer
from .batching import DynamicBatcher
from .config import ServeConfig
from .exporter import ServingMetrics
from .front import Front, FrontOptions
from .loadgen import ClosedLoop, OpenLoop, make_payloads
from .model import ModelSpec, Predictor, dense_forward, load_spec
from .protocol import ProtocolError, parse_infer
from .request import Request, parse_features
from .slo import LatencyObjective
from .tensor import TensorParallelForward, emulate_forward, rank_order_allreduce, row_parallel_widths, shard_layers

__all__ = ["POLICIES", "Balancer", "DynamicBatcher", "ServeConfig", "Front", "FrontOptions", "LatencyObjective",
           "ServingMetrics", "ProtocolError", "parse_infer", "ClosedLoop", "OpenLoop",
           "make_payloads", "ModelSpec", "Predictor", "dense_forward", "load_spec", "Request",
           "parse_features", "TensorParallelForward", "emulate_forward", "rank_order_allreduce", "row_parallel_widths",
           "shard_layers"]
