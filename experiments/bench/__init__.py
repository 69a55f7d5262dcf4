"""Benchmarks: the collectives against MPI's own (:mod:`.collectives`), the plain MPI baseline
(:mod:`.mpi_baseline`), overlap, local reductions, the trainer against PyTorch, trace overhead, and
the tuning tables of ``auto`` (:mod:`.tune`). Each is run as ``mpiexec -n P python -m experiments NAME``
(or ``python -m experiments.bench.NAME``) and writes a results file through :mod:`experiments.harness`.

Imports: anything below :mod:`experiments`, :mod:`experiments.harness`.
"""
