"""Runnable jobs, each writing a results file: ``python -m experiments --list`` lists them with one line
each, ``mpiexec -n P python -m experiments NAME`` runs one (:mod:`.__main__`, the index; the module's
own ``python -m experiments.SUBPACKAGE.NAME`` runs the same).

:mod:`.bench` (benchmarks and ``auto``'s tables), :mod:`.cluster` (the studies on the emulated
cluster), :mod:`.faults` (the fault-and-mismatch suite), :mod:`.studies` (training, parameter-server,
serving and scale studies). Every study and benchmark is built on one harness (:mod:`.harness`: the
options they share, the checks of the results files and of the load before a measurement, the
stamped write and printed table after it; results provenance, the quiet-machine guard and job
control underneath are :mod:`commlab`'s). Beside them: :mod:`.outputs` (one way a multi-rank study
ends on an error), the collectives demo (:mod:`.demo`) and the JAX example (:mod:`.jax_example`).

Imports: every package below (:mod:`plots`, :mod:`inference`, :mod:`training`, :mod:`ps`,
:mod:`collectives`); nothing imports :mod:`experiments`.
"""
