"""Algorithm selection for ``algorithm="auto"``.

The rule, in order:

1. a tuned decision table: JSON written by ``experiments/bench/tune.py`` from measured sweeps, the way
   MPICH's JSON tuning files map (P, message size) ranges to algorithms. It is read from
   ``COMMLAB_TUNING=path.json`` when set, else from the table shipped with the package for the
   running MPI library (:data:`SHIPPED`: ``collectives/model/tuning.json`` measured with MPICH,
   ``collectives/model/tuning-openmpi.json`` with Open MPI, on the reference machine), or installed with
   :func:`load_table`; ``COMMLAB_TUNING=none`` disables tables. Tables are keyed by MPI library: a
   table measured with one library (its ``sources``' ``mpi_library``) is refused under another, and
   a library without a shipped table gets the model alone;
2. for a P the table does not cover, the alpha-beta-gamma model (:mod:`collectives.model.cost`): the
   hand-made algorithm with the smallest predicted time, using the table's fitted ``model``
   parameters when it has them, else :data:`DEFAULT_PARAMS`.
"""
import json
import os

from collectives.schedules.registry import auto_candidates
from collectives.backend import mpi_library_key
from collectives.model.cost import predict

__all__ = ["DEFAULT_PARAMS", "CANDIDATES", "SHIPPED", "select_allreduce", "table_token", "load_table", "clear_table", "reset_table",
           "model_choice",
           "table_library"]

#: Model parameters used without a fitted table: alpha (s), beta and gamma (s/byte), typical of
#: shared-memory MPI on one node.
DEFAULT_PARAMS = {"alpha": 2e-6, "beta": 2.5e-10, "gamma": 2.5e-10}

#: Algorithms ``auto`` may choose (registry entries with ``auto=True``).
CANDIDATES = auto_candidates()

_HERE = os.path.dirname(os.path.abspath(__file__))

#: MPI library name (:func:`collectives.backend.mpi_library_key`) -> the tuning table shipped for it.
SHIPPED = {"MPICH": os.path.join(_HERE, "tuning.json"), "Open MPI": os.path.join(_HERE, "tuning-openmpi.json")}
_STATE = {"loaded": False, "rules": None, "params": None, "source": None, "cache": {}}


def table_library(table):
    """Return the MPI library name a table was measured with (from its ``sources``), or None."""
    names = {mpi_library_key(s["mpi_library"])[0] for s in table.get("sources") or ()
             if isinstance(s, dict) and isinstance(s.get("mpi_library"), str)}
    return names.pop() if len(names) == 1 else None


def _running_library():
    """Return the name of the MPI library this process runs (``"MPICH"``, ``"Open MPI"``, ...).

    None without mpi4py: no shipped table applies, and ``auto`` takes the model's choice.
    """
    try:
        return mpi_library_key()[0]
    except ImportError:
        return None


def load_table(path, check_library=True):
    """Install a tuned decision table for ``auto``.

    Parameters
    ----------
    path : str
        JSON file ``{"allreduce": [{"size": P, "max_bytes": B or null, "algorithm": name}, ...],
        "model": {"alpha": s, "beta": s/B, "gamma": s/B} (optional), "sources": [{"mpi_library":
        ...}, ...] (optional)}``; for a given P the first rule whose ``max_bytes`` is at least the
        message size wins (null = no upper limit).
    check_library : bool
        Refuse a table whose ``sources`` were measured with another MPI library than the running one.

    Raises
    ------
    ValueError
        The file is not such a table, names an algorithm ``auto`` cannot run, or (``check_library``)
        was measured with another MPI library.
    """
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a commlab tuning table (not JSON text: {exc})") from None
    rules = table.get("allreduce") if isinstance(table, dict) else None
    if not isinstance(rules, list) or not all(isinstance(r, dict) and {"size", "max_bytes", "algorithm"} <= set(r)
                                              for r in rules):
        raise ValueError(f"{path}: not a commlab tuning table (expected an 'allreduce' list of "
                         "{size, max_bytes, algorithm} rules)")
    for i, r in enumerate(rules):
        if not _is_int(r["size"]) or r["size"] < 1:
            raise ValueError(f"{path}: rule {i}: size must be a positive integer (ranks), not {r['size']!r}")
        if r["max_bytes"] is not None and not (_is_number(r["max_bytes"]) and r["max_bytes"] >= 0):
            raise ValueError(f"{path}: rule {i}: max_bytes must be a number of bytes or null, not {r['max_bytes']!r}")
        if not isinstance(r["algorithm"], str):
            raise ValueError(f"{path}: rule {i}: algorithm must be a name, not {r['algorithm']!r}")
    bad = sorted({r["algorithm"] for r in rules} - set(CANDIDATES) - {"mpi"})
    if bad:
        raise ValueError(f"{path}: rules name {', '.join(bad)}; auto chooses among {', '.join(CANDIDATES)} "
                         "(and mpi, where a measured table says the library's own call is fastest)")
    params = table.get("model")
    if params is not None and not (isinstance(params, dict) and {"alpha", "beta", "gamma"} <= set(params)):
        raise ValueError(f"{path}: 'model' must hold alpha, beta and gamma")
    for name in ("alpha", "beta", "gamma") if params is not None else ():
        if not (_is_number(params[name]) and params[name] >= 0):
            raise ValueError(f"{path}: model {name} must be a non-negative number (seconds or s/byte), "
                             f"not {params[name]!r}")
    measured, running = table_library(table), _running_library()
    if check_library and measured is not None and measured != running:
        raise ValueError(f"{path}: measured with {measured}, but this process runs {running}: its choices do not "
                         f"carry over; measure a table with {running} (experiments.bench.tune) or use COMMLAB_TUNING=none")
    _STATE.update(loaded=True, rules=rules, params=params, source=path, cache={})


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v != float("inf")


def clear_table():
    """Forget any decision table: ``auto`` then uses the model with :data:`DEFAULT_PARAMS`."""
    _STATE.update(loaded=True, rules=None, params=None, source=None, cache={})


def reset_table():
    """Forget any table loaded or cleared: the next choice loads the one the environment names again
    (``COMMLAB_TUNING``, else the table shipped for the running MPI library)."""
    _STATE.update(loaded=False, rules=None, params=None, source=None, cache={})


def _ensure_loaded():
    if _STATE["loaded"]:
        return
    path = os.environ.get("COMMLAB_TUNING")
    if path == "none":
        _STATE["loaded"] = True
        return
    if path:
        if not os.path.isfile(path):
            raise ValueError(f"COMMLAB_TUNING={path}: file not found (a table from experiments/bench/tune.py, "
                             "or 'none' for the model alone)")
        try:
            load_table(path)
        except OSError as exc:
            raise ValueError(f"COMMLAB_TUNING={path}: cannot read the table: {exc}") from exc
    elif os.path.exists(SHIPPED.get(_running_library(), "")):
        load_table(SHIPPED[_running_library()])
    _STATE["loaded"] = True


def table_token():
    """Return an object that is replaced whenever ``auto``'s decision table changes (its choice cache).

    A cached call signature resolved by ``auto`` stays valid while this object is the same one.
    """
    _ensure_loaded()
    return _STATE["cache"]


def model_choice(size, nbytes, params=None):
    """Return the candidate with the smallest modelled all-reduce time for P = ``size``.

    Examples
    --------
    With :data:`DEFAULT_PARAMS`, latency rules small messages and bandwidth large ones:

    >>> model_choice(8, 64), model_choice(8, 64 << 20)
    ('recursive_doubling', 'rabenseifner')
    >>> model_choice(8, 64, {"alpha": 0.0, "beta": 1e-9, "gamma": 1e-9})
    'ring'
    """
    params = params or DEFAULT_PARAMS
    return min(CANDIDATES, key=lambda a: (predict(a, size, nbytes, params), CANDIDATES.index(a)))


def select_allreduce(size, nbytes):
    """Return the all-reduce algorithm ``auto`` resolves to for P = ``size`` and ``nbytes`` bytes.

    Examples
    --------
    >>> select_allreduce(1, 4096)  # one rank: the ring's schedule is empty
    'ring'
    >>> select_allreduce(4, 4096) in CANDIDATES + ("mpi",)  # from the table in force, else the model
    True
    """
    _ensure_loaded()
    key = (size, nbytes)
    choice = _STATE["cache"].get(key)
    if choice is not None:
        return choice
    if size == 1:
        choice = "ring"
    for rule in _STATE["rules"] or ():
        if choice is None and rule["size"] == size and (rule["max_bytes"] is None or nbytes <= rule["max_bytes"]):
            choice = rule["algorithm"]
    if choice is None:
        choice = model_choice(size, nbytes, _STATE["params"])
    if len(_STATE["cache"]) > 65536:
        _STATE["cache"].clear()
    _STATE["cache"][key] = choice
    return choice
