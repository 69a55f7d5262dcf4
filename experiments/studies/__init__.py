"""Studies: compression sweeps, parameter-server staleness and consistency, model
parallelism, serving under load and the scale simulator. Each writes a results file that
:mod:`plots` draws.

Imports: anything below :mod:`experiments`, and :mod:`experiments.outputs`.
"""
