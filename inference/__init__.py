"""commlab inference: batched prediction serving of trained checkpoints on MPI.

A front rank batches requests dynamically (under an optional latency objective) and balances them over model replicas, each one rank or
a tensor-parallel group (:mod:`inference.replicas.tensor`); see :mod:`inference.serve` for the command
(not imported here, so that ``python -m inference.serve`` runs it fresh) and :mod:`inference.web.endpoint`
for its HTTP server, the Open Inference Protocol.

The rooms, top down (each imports only those below it, as the ``inference`` contract in
``.importlinter`` checks):

- :mod:`inference.serve`: the command; builds the job from the others;
- :mod:`inference.web` (the HTTP server, its bodies, connection bounds and Prometheus metrics) and
  :mod:`inference.front` (the front rank's loop: batches out to replicas, answers back);
- :mod:`inference.serve_config` (the serving configuration), :mod:`inference.loadgen` (the load
  generators), :mod:`inference.metrics` (per-request records, the run's summary),
  :mod:`inference.replicas` (the model as a prediction function, tensor-parallel replicas, the
  replica loop and its wire format) and :mod:`inference.request` (one request and its checks);
- :mod:`inference.policies`: what the front decides (dynamic batching, load balancing, the latency
  objective), pure Python and NumPy.

Below ``inference``: ``training`` (checkpoints, layers, options), ``collectives`` and ``commlab``.
"""
from .policies.balance import POLICIES, Balancer
from .policies.batching import DynamicBatcher
from .serve_config import ServeConfig
from .web.prometheus import ServingMetrics
from .front import Front, FrontOptions
from .loadgen import ClosedLoop, OpenLoop, make_payloads
from .replicas.predictor import ModelSpec, Predictor, dense_forward, load_spec
from .web.open_inference import ProtocolError, parse_infer
from .request import Request, parse_features
from .policies.slo import LatencyObjective
from .replicas.tensor import TensorParallelForward, emulate_forward, rank_order_allreduce, row_parallel_widths, shard_layers

__all__ = ["POLICIES", "Balancer", "DynamicBatcher", "ServeConfig", "Front", "FrontOptions", "LatencyObjective",
           "ServingMetrics", "ProtocolError", "parse_infer", "ClosedLoop", "OpenLoop",
           "make_payloads", "ModelSpec", "Predictor", "dense_forward", "load_spec", "Request",
           "parse_features", "TensorParallelForward", "emulate_forward", "rank_order_allreduce", "row_parallel_widths",
           "shard_layers"]
