"""Runnable jobs: ``mpiexec -n P python -m experiments.SUBPACKAGE.NAME``, each writing a results file.

:mod:`.bench` (benchmarks and ``auto``'s tables), :mod:`.cluster` (the emulated cluster and its
studies), :mod:`.faults` (the fault-and-mismatch suite), :mod:`.studies` (training, parameter-server,
serving and scale studies). Beside them: :mod:`.outputs` (one way a multi-rank study ends on an
error; results provenance, the quiet-machine guard and job control are :mod:`commlab`'s), the
collectives demo (:mod:`.demo`) and the JAX example (:mod:`.jax_example`).

Imports: every package below (:mod:`plots`, :mod:`inference`, :mod:`training`, :mod:`ps`,
:mod:`collectives`); nothing imports :mod:`experiments`.
"""
