"""Reading the predictor's input files: one error line naming the file, whatever keeps it from being read."""
import json

__all__ = ["read_json"]


def read_json(path):
    """Return the JSON document in ``path``; anything that keeps it from being read is one
    :class:`ValueError` line naming the path (not a file, not UTF-8, not JSON, nested too deep).

    Examples
    --------
    >>> read_json("/")
    Traceback (most recent call last):
    ...
    ValueError: /: cannot read it (Is a directory)
    """
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror or e})") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, too many digits
        raise ValueError(f"{path}: not JSON ({str(e)[:200]})") from None
