"""Checking, before any measurement starts, that an experiment's results files can be written."""
import os

__all__ = ["unwritable"]


def unwritable(*paths):
    """Return why one of ``paths`` cannot be written (folders made if missing), or None.

    Each file is really opened for writing (a new one is removed again, an existing one is left as it
    is): permission bits say little to root or on a read-only file system.

    Parameters
    ----------
    *paths : str
        Results files an experiment will write.
    """
    for path in paths:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        except OSError as exc:
            return f"cannot make the folder of {path!r}: {exc.strerror or exc}"
        if os.path.isdir(path):
            return f"{path!r} is a folder, give a file path"
        try:
            if os.path.exists(path):
                open(path, "a", encoding="utf-8").close()  # leaves the contents as they are
            else:
                open(path, "x", encoding="utf-8").close()
                os.remove(path)
        except OSError as exc:
            return f"{path!r} is not writable: {exc.strerror or exc}"
    return None
