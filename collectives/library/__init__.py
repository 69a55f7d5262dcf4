"""Library: the ``mpi`` algorithm, MPI's own collectives posted with the call checks beside them.

:mod:`.call` posts one library collective with its fingerprint; :mod:`.mpi_allreduce` is the
all-reduce's library route (blocking and non-blocking); :mod:`.plans` keeps the cached all-reduce
plans of repeated calls; :mod:`.scatter_plan` the reduce-scatter's.

Imports: :mod:`collectives.engine` and below, and :mod:`collectives.model.auto` (its table state).
"""
