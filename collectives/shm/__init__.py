"""Shared memory: the ``shm`` algorithm, the five collectives among the ranks of one node.

:mod:`.node` holds the node's MPI-3 shared windows (``MPI_Win_allocate_shared``), the flags through
which the ranks synchronise, and :func:`shared_empty`, an array in shared memory that an all-reduce
reduces in place without copying it in or out (:func:`free_shared` frees it); :mod:`.algorithms` runs the collectives on them
(blocking, non-blocking and persistent forms).

Imports: mpi4py, :mod:`collectives.engine`, :mod:`collectives.schedules`, :mod:`collectives.backend`,
:mod:`collectives.errors`. Never :mod:`collectives.library`, :mod:`collectives.model` or
:mod:`collectives.calls` (which calls it).
"""
from collectives.shm.node import free_shared, shared_empty

__all__ = ["shared_empty", "free_shared"]
