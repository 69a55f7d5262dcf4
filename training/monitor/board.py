"""TensorBoard scalars of a running job, written by the rank that gathers them, with tensorboardX.

``--tensorboard DIR`` writes the figures the exporter serves (:data:`training.monitor.exporter.METRICS`)
as TensorBoard scalars: one tag per metric and rank (``sync_seconds/rank1``), one point per gather
(its step: the training step, or a parameter server's pushes). ``tensorboard --logdir DIR`` shows
them while the job runs. tensorboardX writes the event files without a deep-learning framework
(the ``monitor`` extra).
"""
import os
import sys

__all__ = ["Board", "check_logdir"]


def check_logdir(path):
    """Raise ``ValueError`` unless ``path`` is a directory, or can be made one, that this process may write.

    Raises
    ------
    ValueError
        Naming ``--tensorboard`` and the reason.

    Examples
    --------
    >>> import tempfile
    >>> check_logdir(os.path.join(tempfile.mkdtemp(), "tb"))  # created later, by the writer
    """
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"--tensorboard {path}: exists and is not a directory")
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.access(parent, os.W_OK):
        raise ValueError(f"--tensorboard {path}: cannot write into {parent}")


class Board:
    """Scalars of every rank into TensorBoard event files under ``logdir``.

    Parameters
    ----------
    logdir : str
        Directory of the event files (made when missing).
    flush_s : float
        Seconds between two flushes to disk (tensorboardX's ``flush_secs``).

    Raises
    ------
    ImportError
        Without tensorboardX (the ``monitor`` extra).

    Examples
    --------
    >>> import tempfile
    >>> board = Board(tempfile.mkdtemp())
    >>> board.add(10, {"sync_seconds": {0: 0.01, 1: 0.02}})
    >>> board.close()
    """

    def __init__(self, logdir, flush_s=2.0):
        hide = "torch" not in sys.modules  # tensorboardX imports PyTorch where installed, for its tensors only:
        if hide:                           # seconds of start-up for nothing, the scalars here are floats
            sys.modules["torch"] = None
        try:
            from tensorboardX import SummaryWriter
        except ImportError as e:
            raise ImportError(f"--tensorboard needs tensorboardX ({e}); install the monitor extra: "
                              "pip install -e '.[monitor]'") from None
        finally:
            if hide:
                del sys.modules["torch"]
        self.writer = SummaryWriter(logdir, flush_secs=max(1, int(round(flush_s))))

    def add(self, step, scalars):
        """Add ``scalars`` ({metric: {rank or server: value}}) at ``step`` (int)."""
        for name, values in scalars.items():
            for key, v in values.items():
                self.writer.add_scalar(f"{name}/{key}", float(v), int(step))

    def close(self):
        """Flush and close the event file."""
        self.writer.close()
