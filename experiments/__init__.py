"""Runnable jobs: ``mpiexec -n P python -m experiments.SUBPACKAGE.NAME``, each writing a results file.

:mod:`.bench` (benchmarks and ``auto``'s tables), :mod:`.cluster` (the emulated cluster and its
studies), :mod:`.faults` (the fault-and-mismatch suite), :mod:`.studies` (training, parameter-server,
serving and scale studies). Beside them: job control the others use (:mod:`.outputs`: results files
with the run's configuration, host and load; :mod:`.job_stop`: ending a launch with all its ranks),
the collectives demo (:mod:`.demo`) and the JAX example (:mod:`.jax_example`).

Imports: every package below (:mod:`plots`, :mod:`inference`, :mod:`training`, :mod:`ps`,
:mod:`collectives`); nothing imports :mod:`experiments`.
"""
