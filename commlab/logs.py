"""Log messages with the rank in front: library modules log, programs set the output up once.

Library code (``collectives``, ``ps``, ``training``, ``inference``) takes a named logger under ``commlab`` with
:func:`get_logger` and only logs; it never adds handlers and never touches the root logger, so an
application embedding commlab keeps control of its own logging. A program's entry point
(``training.train.main``) calls :func:`setup_logging` once: one handler on the ``commlab`` logger that
writes ``[rank R] LEVEL: message`` to stderr (whichever ``sys.stderr`` is current when the message is
written), at the level given by ``--log-level``, else by the ``COMMLAB_LOG_LEVEL`` environment
variable, else INFO. Without that call Python's last-resort handler prints warnings and errors
alone, without the rank.
"""
import logging
import os
import sys

__all__ = ["LOGGER", "ENV", "LEVELS", "get_logger", "log_level", "setup_logging"]

#: Name of the logger every commlab module logs under (``commlab.training.train``, ...).
LOGGER = "commlab"

#: Environment variable read for the level when no level is given.
ENV = "COMMLAB_LOG_LEVEL"

#: Level names accepted (any case), lowest first.
LEVELS = ("debug", "info", "warning", "error", "critical")


def get_logger(name=""):
    """Return the logger ``commlab.NAME`` (``commlab`` itself for ``""``) for a module to log through.

    Parameters
    ----------
    name : str
        Dotted name below ``commlab``, usually the module's ``__name__`` (``"training.train"``).

    Returns
    -------
    logging.Logger
    """
    return logging.getLogger(f"{LOGGER}.{name}" if name else LOGGER)


def log_level(level=None):
    """Return the logging level number of ``level``, else of ``$COMMLAB_LOG_LEVEL``, else INFO.

    Parameters
    ----------
    level : str, optional
        One of :data:`LEVELS` (any case); None or ``""`` reads the environment.

    Raises
    ------
    ValueError
        When the name (given or from the environment) is not one of :data:`LEVELS`; the message
        names where it came from.
    """
    where = "--log-level"
    if not level:
        level, where = os.environ.get(ENV, ""), ENV
    if not level:
        return logging.INFO
    if level.lower() not in LEVELS:
        raise ValueError(f"{where} must be one of {', '.join(LEVELS)}, got {level!r}")
    return getattr(logging, level.upper())


class _Stderr:
    """Writes to whatever ``sys.stderr`` is when a message is written (a test's capture, a redirect)."""

    def write(self, text):
        sys.stderr.write(text)

    def flush(self):
        sys.stderr.flush()


def setup_logging(rank, level=None, stream=None):
    """Send the ``commlab`` loggers' messages to stderr as ``[rank R] LEVEL: message`` (programs only).

    Replaces the handlers of the ``commlab`` logger with one (so calling it again, as a test calling
    ``main`` twice does, changes rank and level without doubling the lines) and stops its messages
    from reaching the root logger. The root logger is left alone.

    Parameters
    ----------
    rank : int
        This process's MPI rank, put in front of every message.
    level : str, optional
        Level name (:data:`LEVELS`); None or ``""``: ``$COMMLAB_LOG_LEVEL``, else INFO.
    stream : file, optional
        Where to write; default: the ``sys.stderr`` of the moment.

    Returns
    -------
    logging.Logger
        The ``commlab`` logger.

    Raises
    ------
    ValueError
        From :func:`log_level`, before anything is changed.
    """
    number = log_level(level)
    log = logging.getLogger(LOGGER)
    for h in list(log.handlers):
        log.removeHandler(h)
    handler = logging.StreamHandler(_Stderr() if stream is None else stream)
    handler.setFormatter(logging.Formatter(f"[rank {rank}] %(levelname)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(number)
    log.propagate = False
    return log
