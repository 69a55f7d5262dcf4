"""Schedules: pure builders of per-rank communication schedules, and the algorithm registry.

A schedule is a list of rounds, each a set of sends, receives and reductions over regions of one
flat buffer (:mod:`.schedule`). ``ring``, ``tree``, ``recursive`` (recursive doubling, Rabenseifner)
and ``torus`` (2D) build them; :mod:`.registry` names every algorithm, the collectives it serves and
whether ``auto`` and the cost model cover it.

Imports: NumPy and :mod:`collectives.errors` only. No MPI: these modules run without mpi4py.
"""
