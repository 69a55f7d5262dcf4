"""Engine: what runs a schedule on MPI point-to-point messages.

:mod:`.executor` (the round loop), :mod:`.request` (non-blocking collectives), :mod:`.waiting`
(deadlines), :mod:`.fingerprint` (the call checks that make mismatched ranks raise), :mod:`.context`
(the duplicated communicator, caches and each call's record of what it sent: ``CallRecord``,
``last_stats``, ``total_stats``, ``free_context``), :mod:`.buffers` (input adoption, accumulation
copies, output), :mod:`.schedule_allreduce` (the all-reduce's schedule route), :mod:`.policy`
(``abort_on_failure``) and :mod:`.trace` (Chrome-trace spans).

Imports: mpi4py, :mod:`collectives.arguments`, :mod:`collectives.schedules`, :mod:`collectives.backend`,
:mod:`collectives.errors`.
Never :mod:`collectives.model`, :mod:`collectives.library` or :mod:`collectives.calls`.
"""
