"""Algorithm selection for ``algorithm="auto"``.

The rule, in order:

1. a tuned decision table, when one is installed (``COMMLAB_TUNING=path.json`` or
   :func:`load_table`): JSON written by ``experiments/tune.py``, the way MPICH's JSON tuning files
   map (P, message size) ranges to algorithms;
2. otherwise a size/P rule in the spirit of MPICH's defaults (Thakur et al. 2005, section 4.5):
   messages up to :data:`SMALL_BYTES` go to recursive doubling (fewest rounds), larger ones to the
   ring (bandwidth-optimal).
"""
import json
import os

__all__ = ["SMALL_BYTES", "select_allreduce", "load_table", "clear_table"]

#: Largest all-reduce message (bytes) that the default rule sends to recursive doubling.
SMALL_BYTES = 16 * 1024

_TABLE = {"loaded": False, "rules": None}


def load_table(path):
    """Install a tuned decision table for ``auto``.

    Parameters
    ----------
    path : str
        JSON file ``{"allreduce": [{"size": P, "max_bytes": B or null, "algorithm": name}, ...]}``;
        for a given P the first rule whose ``max_bytes`` is at least the message size wins (null =
        no upper limit). Communicator sizes missing from the table fall back to the default rule.

    Raises
    ------
    ValueError
        The file is not such a table.
    """
    with open(path, encoding="utf-8") as f:
        table = json.load(f)
    rules = table.get("allreduce") if isinstance(table, dict) else None
    if not isinstance(rules, list) or not all(isinstance(r, dict) and {"size", "max_bytes", "algorithm"} <= set(r)
                                              for r in rules):
        raise ValueError(f"{path}: not a commlab tuning table (expected an 'allreduce' list of "
                         "{size, max_bytes, algorithm} rules)")
    _TABLE["rules"], _TABLE["loaded"] = rules, True


def clear_table():
    """Forget any installed decision table (``auto`` falls back to the default rule)."""
    _TABLE["rules"], _TABLE["loaded"] = None, True


def select_allreduce(size, nbytes):
    """Return the all-reduce algorithm ``auto`` resolves to for P = ``size`` and ``nbytes`` bytes."""
    if not _TABLE["loaded"]:
        _TABLE["loaded"] = True
        path = os.environ.get("COMMLAB_TUNING")
        if path:
            load_table(path)
    if _TABLE["rules"]:
        for rule in _TABLE["rules"]:
            if rule["size"] == size and (rule["max_bytes"] is None or nbytes <= rule["max_bytes"]):
                return rule["algorithm"]
    if size == 1:
        return "ring"
    return "recursive_doubling" if nbytes <= SMALL_BYTES else "ring"
