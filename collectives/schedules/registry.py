"""The one algorithm registry: name -> schedule builder, description, collectives served, ``auto``.

Every list of algorithm names elsewhere (:data:`collectives.ALGORITHMS`,
:data:`collectives.schedules.registry.OP_ALGORITHMS`, the candidates of ``auto`` in :mod:`collectives.model.auto`, the
algorithms the cost model covers in :mod:`collectives.model.cost`) is derived from :data:`REGISTRY`, and
every name is checked by :func:`check_algorithm`, with one message. A built-in algorithm is one entry
here plus its schedule builder module; a researcher's own all-reduce is added at any time in a job by
:func:`register_algorithm` (from a script), by :func:`load_algorithm` (``FILE.py:FUNCTION`` or
``package.module:FUNCTION``, as ``--algorithm`` of the trainer takes it), or from an installed
package's entry point in the group :data:`ENTRY_POINTS`. Every rank must register the same
algorithms; the call fingerprint carries the algorithm's name, so ranks that disagree get an error.
"""
from collections.abc import Mapping
import contextlib
import contextvars
from dataclasses import dataclass
import importlib
import importlib.metadata
import importlib.util
import os
import sys

from collectives.schedules.recursive import rabenseifner_allreduce, recursive_doubling_allreduce
from collectives.schedules.ring import ring_allreduce
from collectives.schedules.torus import square_grid, torus_allreduce, torus_nd_allreduce
from collectives.schedules.tree import tree_allreduce

__all__ = ["OP_ALGORITHMS", "Algorithm", "REGISTRY", "COLLECTIVES", "names", "auto_candidates", "modelled", "check_algorithm",
           "describe", "build_allreduce_schedule", "register_algorithm", "unregister_algorithm", "load_algorithm",
           "import_builder", "verify_share",
           "AlgorithmTable",
           "ENTRY_POINTS", "BUILT_IN"]

#: ``(index, count)``: which of the verifier's sizes :func:`load_algorithm` checks in this context
#: (every ``count``-th from the ``index``-th on); set by :func:`verify_share`.
_SHARE = contextvars.ContextVar("commlab_verify_share", default=(0, 1))

#: The entry-point group an installed package names its algorithms in (``name = "pkg.module:builder"``).
ENTRY_POINTS = "commlab.algorithms"

#: The collectives commlab offers, in the order the docs list them.
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")


@dataclass(frozen=True)
class Algorithm:
    """One registry entry.

    Attributes
    ----------
    name : str
        The name callers pass as ``algorithm=``.
    description : str
        One line: the steps and the source (paper, section).
    serves : tuple of str
        The collectives (keys of :data:`COLLECTIVES`) it implements.
    allreduce_builder : callable or None
        ``(rank, size, count) -> Schedule`` for the all-reduce (``2d`` and ``torus`` take a grid too), or None
        for algorithms with no hand-made all-reduce schedule (``mpi``, ``auto``).
    auto : bool
        Whether ``algorithm="auto"`` may pick it for the all-reduce.
    modelled : bool
        Whether the alpha-beta-gamma model (:mod:`collectives.model.cost`) covers its all-reduce.
    verified : dict or None
        For a registered algorithm, what :func:`~collectives.schedules.verify.verify` checked in
        this process (``cases``, ``seconds``, ``sizes``: the P, a tuple).

    Examples
    --------
    >>> ring = REGISTRY["ring"]
    >>> ring.serves, ring.auto, ring.modelled
    (('allreduce', 'reduce_scatter', 'allgather'), True, True)
    """

    name: str
    description: str
    serves: tuple
    allreduce_builder: object = None
    auto: bool = False
    modelled: bool = False
    verified: object = None


_ALL = COLLECTIVES
REGISTRY = {a.name: a for a in (
    Algorithm("ring", "ring reduce-scatter then ring all-gather (Patarasuk & Yuan 2009)",
              ("allreduce", "reduce_scatter", "allgather"), ring_allreduce, auto=True, modelled=True),
    Algorithm("tree", "binomial-tree reduce to rank 0 then binomial-tree broadcast (Thakur et al. 2005)",
              ("allreduce", "broadcast", "reduce"), tree_allreduce, auto=True, modelled=True),
    Algorithm("recursive_doubling", "log2 P full-vector exchanges (Thakur et al. 2005, 4.5)",
              ("allreduce",), recursive_doubling_allreduce, auto=True, modelled=True),
    Algorithm("rabenseifner",
              "recursive-halving reduce-scatter then recursive-doubling all-gather (Rabenseifner 2004)",
              ("allreduce",), rabenseifner_allreduce, auto=True, modelled=True),
    Algorithm("2d", "row reduce-scatter, column all-reduce, row all-gather on a grid (Mikami et al. 2018)",
              ("allreduce",), torus_allreduce, auto=True, modelled=True),
    Algorithm("torus", "reduce-scatter along each dimension of grid=(a, b, c, ...) in turn, then all-gather back "
              "(Ying et al. 2018, 3.3; Cho et al. 2019)", ("allreduce",), torus_nd_allreduce, modelled=True),
    Algorithm("shm", "one node's ranks read each other's inputs in MPI-3 shared windows, each reducing its own slice "
              "and writing it into every rank's buffer, synchronised by flags (no messages; Katevenis et al. 2023)",
              _ALL),
    Algorithm("mpi", "the MPI library's own collective (the oracle and baseline)", _ALL, modelled=True),
    Algorithm("auto", "tuned (P, size) table from measured sweeps, else the alpha-beta-gamma model's fastest; "
              "the first hand-made algorithm for the other collectives", _ALL),
)}


#: The algorithms commlab ships (registration may not replace them).
BUILT_IN = tuple(REGISTRY)
_NAMES = {}  # collective -> names, cleared when an algorithm is registered
_LOADED = [False]  # whether the installed entry points have been looked at


def names(collective="allreduce"):
    """Return the algorithm names that serve ``collective``, in registry order (``auto`` last).

    Raises
    ------
    ValueError
        ``collective`` is not one of :data:`COLLECTIVES`.

    Examples
    --------
    >>> names("broadcast")
    ('tree', 'shm', 'mpi', 'auto')
    >>> names("scan")
    Traceback (most recent call last):
    ...
    ValueError: unknown collective 'scan': expected one of allreduce, reduce_scatter, allgather, broadcast, reduce
    """
    known = _NAMES.get(collective)
    if known is not None:
        return known
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}: expected one of {', '.join(COLLECTIVES)}")
    known = _NAMES[collective] = tuple(a.name for a in REGISTRY.values() if collective in a.serves)
    return known


#: Algorithms available to each collective besides all-reduce ("auto" picks the first).
OP_ALGORITHMS = {name: names(name) for name in ("reduce_scatter", "allgather", "broadcast", "reduce")}


def auto_candidates():
    """Return the all-reduce algorithms ``auto`` chooses among.

    Examples
    --------
    >>> auto_candidates()
    ('ring', 'tree', 'recursive_doubling', 'rabenseifner', '2d')
    """
    return tuple(a.name for a in REGISTRY.values() if a.auto)


def modelled():
    """Return the all-reduce algorithms the cost model covers.

    Examples
    --------
    >>> modelled()
    ('ring', 'tree', 'recursive_doubling', 'rabenseifner', '2d', 'torus', 'mpi')
    """
    return tuple(a.name for a in REGISTRY.values() if a.modelled)


def describe(collective="allreduce"):
    """Return ``{name: description}`` of the algorithms serving ``collective``.

    Examples
    --------
    >>> list(describe("reduce_scatter"))
    ['ring', 'shm', 'mpi', 'auto']
    >>> describe()["tree"]
    'binomial-tree reduce to rank 0 then binomial-tree broadcast (Thakur et al. 2005)'
    """
    return {n: REGISTRY[n].description for n in names(collective)}


def check_algorithm(algorithm, collective="allreduce"):
    """Raise ``ValueError`` unless ``algorithm`` serves ``collective``; the message lists those that do.

    Parameters
    ----------
    algorithm : object
        The caller's ``algorithm=`` argument.
    collective : str
        One of :data:`COLLECTIVES`.

    Raises
    ------
    ValueError
        ``algorithm`` does not serve ``collective``.

    Examples
    --------
    >>> check_algorithm("ring", "reduce_scatter")
    >>> check_algorithm("tree", "reduce_scatter")
    Traceback (most recent call last):
    ...
    ValueError: unknown reduce_scatter algorithm 'tree': expected one of ring, shm, mpi, auto
    """
    known = names(collective)
    if isinstance(algorithm, str) and algorithm not in known and not _LOADED[0]:
        _entry_points()
        known = names(collective)
    if not isinstance(algorithm, str) or algorithm not in known:
        what = "algorithm" if collective == "allreduce" else f"{collective} algorithm"
        raise ValueError(f"unknown {what} {algorithm!r}: expected one of {', '.join(known)}")


def build_allreduce_schedule(algorithm, rank, size, count, grid=None):
    """Return the all-reduce :class:`~collectives.schedules.schedule.Schedule` of a hand-made algorithm.

    Parameters
    ----------
    algorithm : str
        A registry name with an all-reduce builder: ``ring``, ``tree``, ``recursive_doubling``,
        ``rabenseifner``, ``2d``, ``torus``.
    rank, size, count : int
        This rank, P, and the number of elements.
    grid : tuple of int, optional
        For ``2d``: rows and columns; default the factorization of P closest to square. For
        ``torus``: the dimensions, any number of them (product P); default ``(P,)``, a flat ring.

    Returns
    -------
    Schedule

    Raises
    ------
    ValueError
        ``algorithm`` has no hand-made all-reduce schedule.

    Examples
    --------
    >>> build_allreduce_schedule("2d", 0, 6, 12)  # on the 2 x 3 grid
    Schedule('2d', rank=0, size=6, count=12, rounds=6, messages=6, elements_sent=20)
    >>> build_allreduce_schedule("mpi", 0, 4, 12)
    Traceback (most recent call last):
    ...
    ValueError: no all-reduce schedule for 'mpi': expected one of ring, tree, recursive_doubling, rabenseifner, 2d, torus
    >>> build_allreduce_schedule("torus", 0, 8, 16, (2, 2, 2)).rounds[0].phase
    'dim 2 reduce-scatter'
    """
    entry = REGISTRY.get(algorithm)
    if entry is None and isinstance(algorithm, str) and not _LOADED[0]:
        _entry_points()
        entry = REGISTRY.get(algorithm)
    if entry is None or entry.allreduce_builder is None:
        hand = [a.name for a in REGISTRY.values() if a.allreduce_builder is not None]
        raise ValueError(f"no all-reduce schedule for {algorithm!r}: expected one of {', '.join(hand)}")
    if algorithm == "2d":
        return torus_allreduce(rank, size, count, grid or square_grid(size))
    if algorithm == "torus":
        return torus_nd_allreduce(rank, size, count, tuple(grid) if grid else (size,))
    return entry.allreduce_builder(rank, size, count)


class AlgorithmTable(Mapping):
    """The live ``{name: description}`` of one collective's algorithms (``collectives.ALGORITHMS``).

    It follows the registry: an algorithm registered later in the job appears in it at once.

    Examples
    --------
    >>> table = AlgorithmTable("broadcast")
    >>> list(table), "tree" in table
    (['tree', 'shm', 'mpi', 'auto'], True)
    """

    __slots__ = ("collective",)

    def __init__(self, collective):
        names(collective)  # refuses an unknown collective
        self.collective = collective

    def __getitem__(self, name):
        if name not in names(self.collective):
            raise KeyError(name)
        return REGISTRY[name].description

    def __contains__(self, name):
        if name in names(self.collective):
            return True
        if isinstance(name, str) and not _LOADED[0]:  # an installed package's algorithm, asked for by name
            _entry_points()
            return name in names(self.collective)
        return False

    def __iter__(self):
        return iter(names(self.collective))

    def __len__(self):
        return len(names(self.collective))

    def __repr__(self):
        return repr(dict(self))


def register_algorithm(name, builder, *, description=None, collectives=("allreduce",), verify=True,
                       sizes=range(1, 65), replace=False):
    """Add an all-reduce algorithm of one's own; it then works wherever a built-in one does.

    The builder is checked first by :func:`~collectives.schedules.verify.verify` (every P in
    ``sizes``, counts 0, below P and not divisible by P) and refused with the first violation. Once
    registered, ``name`` is accepted by :func:`collectives.allreduce` and its non-blocking and
    persistent forms, the trainer's ``--algorithm``, the benchmark, the DDP hook, the simulator and
    cost model (:func:`collectives.model.cost.simulate`), the job predictor and the emulated cluster.
    Call it on every rank (the call fingerprint names the algorithm, so ranks that disagree get an
    error, never a value), at any time in a job.

    Parameters
    ----------
    name : str
        The name callers pass as ``algorithm=``: letters, digits, ``_`` and ``-``, not a built-in's.
    builder : callable
        ``builder(rank, size, count) -> Schedule``: rank's all-reduce schedule (see
        :mod:`collectives.schedules.schedule` for what a round means).
    description : str, optional
        One line: the steps and the source; default the builder's docstring's first line.
    collectives : tuple of str
        The collectives it serves; ``("allreduce",)`` (the others run built-in algorithms only).
    verify : bool
        Run the verifier first (default). False only for a builder verified elsewhere.
    sizes : iterable of int
        The P the verifier checks (default 1 to 64).
    replace : bool
        Replace an algorithm registered earlier under ``name`` (registering the same builder again
        is always allowed and changes nothing).

    Returns
    -------
    Algorithm
        The registry entry.

    Raises
    ------
    ScheduleViolation
        The verifier refused the builder (the message names rank, round, region and what is wrong).
    ValueError
        ``name`` is a built-in's, is taken by another builder, or is not a plain name; ``collectives``
        names something other than ``allreduce``.
    TypeError
        ``builder`` is not callable.

    Examples
    --------
    >>> from collectives.schedules.ring import ring_allreduce
    >>> def my_ring(rank, size, count):
    ...     "The ring, under another name."
    ...     return ring_allreduce(rank, size, count)
    >>> register_algorithm("my_ring", my_ring, sizes=range(1, 9)).description
    'The ring, under another name.'
    >>> "my_ring" in names("allreduce")
    True
    >>> unregister_algorithm("my_ring")
    >>> register_algorithm("ring", my_ring)
    Traceback (most recent call last):
    ...
    ValueError: 'ring' is a built-in algorithm; choose another name
    """
    from collectives.schedules.verify import verify as run_verify  # the verifier imports this module's neighbours

    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "_-" for c in name):
        raise ValueError(f"algorithm name must be letters, digits, '_' or '-', got {name!r}")
    if name in BUILT_IN:
        raise ValueError(f"{name!r} is a built-in algorithm; choose another name")
    if not callable(builder):
        raise TypeError(f"builder must be callable (rank, size, count) -> Schedule, got {type(builder).__name__}")
    collectives = tuple(collectives)
    if collectives != ("allreduce",):
        raise ValueError(f"collectives={collectives!r}: a registered algorithm serves ('allreduce',); the other "
                         "collectives run built-in algorithms")
    old = REGISTRY.get(name)
    if old is not None and old.allreduce_builder is builder:
        return old
    if old is not None and not replace:
        raise ValueError(f"algorithm {name!r} is already registered with another builder (replace=True to replace it)")
    if description is None:
        doc = (getattr(builder, "__doc__", None) or "").strip()
        description = doc.splitlines()[0] if doc else f"registered algorithm {getattr(builder, '__name__', name)}"
    checked = None
    if verify:
        sizes = tuple(sizes)
        checked = dict(run_verify(builder, "allreduce", sizes=sizes), sizes=sizes)
    entry = Algorithm(name, description, collectives, builder, auto=False, modelled=True, verified=checked)
    items = [(n, a) for n, a in REGISTRY.items() if n != name]
    at = next(i for i, (n, _) in enumerate(items) if n == "mpi")
    items.insert(at, (name, entry))
    REGISTRY.clear()
    REGISTRY.update(items)
    _NAMES.clear()
    return entry


def unregister_algorithm(name):
    """Remove an algorithm :func:`register_algorithm` added (built-in ones stay).

    Raises
    ------
    ValueError
        ``name`` is built in or not registered.

    Examples
    --------
    >>> unregister_algorithm("tree")
    Traceback (most recent call last):
    ...
    ValueError: 'tree' is a built-in algorithm
    """
    if name in BUILT_IN:
        raise ValueError(f"{name!r} is a built-in algorithm")
    if name not in REGISTRY:
        raise ValueError(f"no registered algorithm {name!r}")
    del REGISTRY[name]
    _NAMES.clear()


def _entry_points():
    """Register the algorithms of installed packages (group :data:`ENTRY_POINTS`), once per process."""
    _LOADED[0] = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINTS):
        if ep.name not in REGISTRY:
            register_algorithm(ep.name, ep.load())


def load_algorithm(spec, *, sizes=range(1, 65)):
    """Return the registered name of ``spec``, importing and registering it first when needed.

    Parameters
    ----------
    spec : str
        A registered name (built-in, registered, or an installed package's entry point), or
        ``FILE.py:FUNCTION`` / ``package.module:FUNCTION``: the module is imported (once) and, unless
        importing it registered ``FUNCTION`` under that name, the function is registered as the
        all-reduce builder named ``FUNCTION`` (verified first, :func:`register_algorithm`).
    sizes : iterable of int
        The P the verifier checks a newly registered function for (default 1 to 64).

    Returns
    -------
    str
        The name to pass as ``algorithm=``.

    Raises
    ------
    ValueError
        The module or function cannot be found, or the name is unknown.
    ScheduleViolation
        The verifier refused the builder.

    Examples
    --------
    >>> load_algorithm("ring")
    'ring'
    >>> load_algorithm("collectives.schedules.ring:ring_allreduce_twice")
    Traceback (most recent call last):
    ...
    ValueError: collectives.schedules.ring has no function 'ring_allreduce_twice'
    """
    if not isinstance(spec, str):
        raise ValueError(f"algorithm must be a name or MODULE:FUNCTION, got {spec!r}")
    if ":" not in spec:
        check_algorithm(spec, "allreduce")
        return spec
    where, _, func = spec.rpartition(":")
    builder = import_builder(spec)
    if func in REGISTRY and REGISTRY[func].allreduce_builder is builder:
        return func
    index, count = _SHARE.get()
    register_algorithm(func, builder, sizes=tuple(sizes)[index::count])
    return func


@contextlib.contextmanager
def verify_share(index, count):
    """Within the block, :func:`load_algorithm` verifies a new builder for its share of the sizes only.

    The ranks of a job that load the same ``FILE.py:FUNCTION`` together and then agree on the
    outcome, so that a violation found by any one stops them all before a message is sent
    (:func:`training.settings.cli.parse_on_every_rank`, which the trainer, the benchmark and the
    studies parse under), split the verifier's work: rank ``index`` of ``count`` checks every
    ``count``-th P from the ``index``-th on (P = 1..64 over 4 ranks: each checks 16 of them), so
    the job's start costs a quarter of every rank verifying all 64. Outside the block, and with
    ``count`` 1, every size is checked.

    Parameters
    ----------
    index, count : int
        This process's share: ``0 <= index < count``.

    Raises
    ------
    ValueError
        ``index`` or ``count`` out of range.

    Examples
    --------
    >>> with verify_share(1, 4):
    ...     name = load_algorithm("collectives.schedules.ring:ring_allreduce")
    >>> REGISTRY[name].verified["sizes"][:3], len(REGISTRY[name].verified["sizes"])  # P = 2, 6, ..., 62
    ((2, 6, 10), 16)
    >>> unregister_algorithm(name)
    """
    if not (isinstance(index, int) and isinstance(count, int) and 0 <= index < count):
        raise ValueError(f"verify_share needs 0 <= index < count, got index={index!r} count={count!r}")
    token = _SHARE.set((index, count))
    try:
        yield
    finally:
        _SHARE.reset(token)


def import_builder(spec):
    """Return the function ``spec`` names: ``FILE.py:FUNCTION`` or ``package.module:FUNCTION`` (imported once).

    Raises
    ------
    ValueError
        No such file, module or function.

    Examples
    --------
    >>> import_builder("collectives.schedules.ring:ring_allreduce").__name__
    'ring_allreduce'
    """
    where, _, func = spec.rpartition(":")
    if where.endswith(".py"):
        path = os.path.abspath(where)
        if not os.path.isfile(path):
            raise ValueError(f"algorithm {spec!r}: no file {where}")
        modname = "commlab_algorithm_" + "".join(c if c.isalnum() else "_" for c in path)
        module = sys.modules.get(modname)
        if module is None:
            loader = importlib.util.spec_from_file_location(modname, path)
            module = importlib.util.module_from_spec(loader)
            sys.modules[modname] = module
            try:
                loader.loader.exec_module(module)
            except BaseException:
                del sys.modules[modname]
                raise
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise ValueError(f"algorithm {spec!r}: cannot import {where}: {exc}") from None
    builder = getattr(module, func, None)
    if not callable(builder):
        raise ValueError(f"{where} has no function {func!r}")
    return builder
