"""Calls: the public collectives. Each checks every argument once, then runs one route.

The rules every collective shares:

* **Chunking**: a flat vector of ``n`` elements is split over P ranks as ``numpy.array_split`` does:
  the first ``n % P`` chunks get ``n // P + 1`` elements, the rest ``n // P``.
* **float16** (and bfloat16) is accumulated in float32: the collective runs on a float32 copy and the
  result is rounded once at the end.
* **avg** is ``sum / P``; on integer dtypes the floor of the mean. Integer sums wrap on overflow.
* **NaN** propagates through ``min`` and ``max``.
* Errors in arguments are raised on every rank before any message is sent.

:mod:`.allreduce` (``allreduce``, ``iallreduce``), :mod:`.signatures` (the repeated all-reduce's
one look-up of its cached plan), :mod:`.persistent` (``allreduce_init``), :mod:`.reduce_scatter`,
:mod:`.allgather`, :mod:`.rooted` (``broadcast``, ``reduce``). Their argument checks are
:mod:`collectives.arguments`.

Imports: :mod:`collectives.library`, :mod:`collectives.shm`, :mod:`collectives.engine`,
:mod:`collectives.model`, :mod:`collectives.arguments` and below.
"""
