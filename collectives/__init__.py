"""commlab collectives: hand-made all-reduce, reduce-scatter, all-gather, broadcast and reduce on MPI.

Every hand-made algorithm is a per-rank schedule (:mod:`collectives.schedules`) run by one executor
(:mod:`collectives.engine`) over point-to-point messages on a duplicated communicator;
``algorithm="mpi"`` calls the MPI library's own collective (:mod:`collectives.library`), the oracle
and baseline. The rules every collective shares (chunking, float16 accumulation, integer ``avg``)
are in :mod:`collectives.calls`.

This package is the public face: the collectives, their non-blocking and persistent forms,
:class:`Request`, the persistent plan :class:`AllreducePlan`, :data:`ALGORITHMS`, :func:`register_algorithm`
(a researcher's own all-reduce, verified first) and the errors.
Everything else is imported from its subpackage by the code that needs it.

Importing ``collectives`` starts nothing: the names below are loaded on first use (PEP 562), and
MPI starts when a collective's module is first loaded. The pure parts (``collectives.schedules``,
``collectives.model``, the compressors of ``collectives.compression``, ``collectives.errors``) import
and run without mpi4py.

Subpackages, bottom to top (each may import only those below it)::

    errors, backend           the error classes, dtypes/ops rules
    schedules                 pure schedule builders and the algorithm registry (no MPI)
    arguments                 every argument check, raised on every rank before any message
    engine | model            side by side, neither imports the other: the executor, requests,
                              deadlines, fingerprints, contexts, buffers, trace | the cost model,
                              simulator, ``auto`` and its tables (no MPI)
    library | shm             the ``mpi`` path: MPI's own collectives and their cached plans | the ``shm``
                              algorithm: one node's ranks through MPI-3 shared windows, shared buffers
    calls                     the public collectives: argument checks, then library or schedule
    compression               compressors (pure) and compressed all-reduce / hook (MPI)
    interop                   PyTorch adapters (DDP hook, distributed optimizer)
"""
import importlib

_PUBLIC = {
    "allreduce": "collectives.calls.allreduce",
    "iallreduce": "collectives.calls.allreduce",
    "ALGORITHMS": "collectives.calls.allreduce",
    "reduce_scatter": "collectives.calls.reduce_scatter",
    "broadcast": "collectives.calls.rooted",
    "reduce": "collectives.calls.rooted",
    "allgather": "collectives.calls.allgather",
    "allreduce_init": "collectives.calls.persistent",
    "AllreducePlan": "collectives.calls.persistent",
    "Request": "collectives.engine.request",
    "register_algorithm": "collectives.schedules.registry",
    "CommlabError": "commlab.error_root",
    "Timeout": "collectives.errors",
    "CollectiveError": "collectives.errors",
    "CollectiveMismatch": "collectives.errors",
    "CollectiveTimeout": "collectives.errors",
    "ProcessFailed": "collectives.errors",
}

__all__ = list(_PUBLIC)


def __getattr__(name):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'collectives' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted(__all__)
