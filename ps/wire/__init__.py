"""The parameter server's messages between ranks: typed headers and payloads on buffer-based
point-to-point calls, their tags, the polling wait, and the errors of a run that cannot go on.

``messages`` (:class:`~ps.wire.messages.Msg`, ``send`` / ``probe`` / ``receive`` / ``wait_all``,
:class:`~ps.wire.messages.PSError`, :class:`~ps.wire.messages.PSTimeout`).

Imports: the floor below every layer (``commlab``), ``collectives.errors`` and mpi4py only; nothing else
of ``ps``.
"""
