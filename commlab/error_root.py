"""The root of commlab's errors: :class:`CommlabError`, for every error the project raises on purpose.

The collectives' errors (``collectives.errors``), the parameter server's (``ps.wire.messages.PSError``),
the file formats' (:class:`commlab.file_formats.CheckpointError`) and the run directories'
(``training.runtime.checkpoint.RunDirError``) all derive from it, so ``except CommlabError`` catches every
one of them; argument errors stay ``TypeError`` and ``ValueError``.
"""

__all__ = ["CommlabError"]


class CommlabError(Exception):
    """Root of every error commlab raises on purpose (argument errors stay ``TypeError``/``ValueError``).

    Examples
    --------
    >>> class ShardLost(CommlabError, RuntimeError):  # a layer's own error derives from the root
    ...     pass
    >>> try:
    ...     raise ShardLost("server 1")
    ... except CommlabError as exc:  # catches every commlab error, whichever layer raised it
    ...     print(type(exc).__name__, exc)
    ShardLost server 1
    >>> issubclass(ValueError, CommlabError)  # argument errors are not commlab errors
    False
    """
