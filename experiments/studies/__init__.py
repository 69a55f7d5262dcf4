"""Studies: compression sweeps, parameter-server staleness and consistency, model
parallelism, serving under load and the scale simulator. Each is run as ``mpiexec -n P python -m
experiments NAME`` and writes, through :mod:`experiments.harness`, a results file that :mod:`plots` draws.

Imports: anything below :mod:`experiments`, :mod:`experiments.harness`.
"""
