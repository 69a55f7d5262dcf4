"""Model: the alpha-beta-gamma cost model, the schedule simulator and ``auto``'s choice.

:mod:`.cost` prices a schedule per link; :mod:`.simulate` replays schedules for thousands of ranks;
:mod:`.auto` picks an all-reduce algorithm for (P, bytes) from a measured tuning table
(``tuning.json`` for MPICH, ``tuning-openmpi.json`` for Open MPI) or, without one, from the model.

Imports: :mod:`collectives.schedules`, :mod:`collectives.backend`, :mod:`collectives.errors`. No MPI
at import (the MPI library's name is asked only when a table is chosen).
"""
