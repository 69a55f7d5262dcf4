"""Schedules: pure builders of per-rank communication schedules, their verifier, and the algorithm registry.

A schedule is a list of rounds, each a set of sends, receives and reductions over regions of one
flat buffer (:mod:`.schedule`, which defines what a round means). ``ring``, ``tree``, ``recursive``
(recursive doubling, Rabenseifner) and ``torus`` (2D) build them; :mod:`.verify` checks an
algorithm symbolically for every P and count; :mod:`.registry` names every algorithm, the
collectives it serves and whether ``auto`` and the cost model cover it, and registers new ones.

The names a researcher writing an algorithm needs are gathered here::

    from collectives.schedules import Round, Schedule, chunk_bounds, verify, register_algorithm

Imports: NumPy and :mod:`collectives.errors` only. No MPI: these modules run without mpi4py.
"""
from collectives.schedules.schedule import Round, Schedule, chunk_bounds
from collectives.schedules.verify import check, verify
from collectives.schedules.registry import load_algorithm, register_algorithm

__all__ = ["Round", "Schedule", "chunk_bounds", "check", "verify", "register_algorithm", "load_algorithm"]
