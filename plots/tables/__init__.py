"""Markdown tables (tabulate's pipe format) that the studies print and :mod:`plots.publish` publishes.

- :mod:`plots.tables.study_tables`: the benchmarks' tables (the trainer against PyTorch, the all-reduce's
  per-step breakdown) and the model-parallel study's (grids, pipeline bubble);
- :mod:`plots.tables.ps_tables`: the parameter-server study's ratios and tables;
- :mod:`plots.tables.cluster_tables`: the emulated-cluster studies' tables;
- :mod:`plots.tables.shm_tables`: the shared-memory algorithm's figures against their targets, and its
  per-call breakdown.

Text only: no matplotlib, so a study prints its table without loading a drawing library. Imports no
other part of :mod:`plots` (the figure commands and the publisher import it), and nothing of the project.
"""
