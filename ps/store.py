"""Where the parameter servers keep their checkpoint files.

Each server writes its shard as one file of commlab's checksummed ``.npz`` format
(:func:`commlab.file_formats.write_npz`, atomic, SHA-256 inside) named by :func:`server_checkpoint_path`;
what the file holds is :mod:`ps.checkpoints.shard_files`'s.
"""
import os

__all__ = ["server_checkpoint_path"]


def server_checkpoint_path(directory, server):
    """Return the checkpoint file of server ``server`` in ``directory``.

    Parameters
    ----------
    directory : str
        The servers' checkpoint directory (the trainer's is ``RUN_DIR/ps``).
    server : int or "*"
        The server's index ``0 <= server < S``, or ``"*"`` for the glob pattern of every server's file.

    Returns
    -------
    str

    Examples
    --------
    >>> server_checkpoint_path("runs/a/ps", 1)
    'runs/a/ps/ps_server1.npz'
    """
    return os.path.join(directory, f"ps_server{server}.npz")
