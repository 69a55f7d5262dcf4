"""Reading a results file for a ``plots`` command: one usage line on a missing or malformed file."""
import json

__all__ = ["read_results"]


def read_results(parser, path):
    """Return the JSON object in ``path``, or end through ``parser.error`` naming the file and the cause.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The command's parser (its ``error`` prints the usage line and exits with status 2).
    path : str
        The results file.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        parser.error(f"{path}: {exc.strerror or exc}")
    except ValueError as exc:
        parser.error(f"{path}: not a JSON results file ({exc})")
    if not isinstance(data, dict):
        parser.error(f"{path}: not a results file (a JSON object)")
    return data
