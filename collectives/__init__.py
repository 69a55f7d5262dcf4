"""commlab collectives: hand-made all-reduce, reduce-scatter, all-gather, broadcast and reduce on MPI.

Every hand-made algorithm is a per-rank :class:`~collectives.schedule.Schedule` run by one executor
over point-to-point messages on a duplicated communicator; ``algorithm="mpi"`` calls the MPI
library's own collective, the oracle and baseline. See :mod:`collectives.api` for the shared rules
(chunking, float16 accumulation, integer ``avg``).
"""
from .algorithms import REGISTRY, build_allreduce_schedule
from .api import ALGORITHMS, allreduce, iallreduce
from .backend import COPY_DTYPES, DTYPES, OPS, get_array_module
from .context import free_context, last_stats, total_stats
from .errors import CollectiveError, CollectiveMismatch, CollectiveTimeout
from .executor import execute
from .fingerprint import set_debug
from .gather import allgather
from .ops import OP_ALGORITHMS, broadcast, reduce, reduce_scatter
from .persistent import AllreducePlan, allreduce_init
from .policy import abort_on_failure
from .request import Request
from .schedule import Schedule, chunk_bounds

__all__ = [
    "ALGORITHMS", "OP_ALGORITHMS", "DTYPES", "COPY_DTYPES", "OPS", "allreduce", "iallreduce", "reduce_scatter", "allgather",
    "broadcast", "reduce", "CollectiveTimeout", "Request", "execute", "Schedule", "chunk_bounds",
    "build_allreduce_schedule", "get_array_module", "last_stats", "total_stats", "free_context", "REGISTRY",
    "CollectiveError", "CollectiveMismatch", "set_debug", "abort_on_failure", "allreduce_init", "AllreducePlan",
]
