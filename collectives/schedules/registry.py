"""The one algorithm registry: name -> schedule builder, description, collectives served, ``auto``.

Every list of algorithm names elsewhere (:data:`collectives.ALGORITHMS`,
:data:`collectives.schedules.registry.OP_ALGORITHMS`, the candidates of ``auto`` in :mod:`collectives.model.auto`, the
algorithms the cost model covers in :mod:`collectives.model.cost`) is derived from :data:`REGISTRY`, and
every name is checked by :func:`check_algorithm`, with one message. Adding an algorithm is one entry
here plus its schedule builder module.
"""
from dataclasses import dataclass

from collectives.schedules.recursive import rabenseifner_allreduce, recursive_doubling_allreduce
from collectives.schedules.ring import ring_allreduce
from collectives.schedules.torus import square_grid, torus_allreduce, torus_nd_allreduce
from collectives.schedules.tree import tree_allreduce

__all__ = ["OP_ALGORITHMS", "Algorithm", "REGISTRY", "COLLECTIVES", "names", "auto_candidates", "modelled", "check_algorithm",
           "describe", "build_allreduce_schedule"]

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
    Algorithm("mpi", "the MPI library's own collective (the oracle and baseline)", _ALL, modelled=True),
    Algorithm("auto", "tuned (P, size) table from measured sweeps, else the alpha-beta-gamma model's fastest; "
              "the first hand-made algorithm for the other collectives", _ALL),
)}


def names(collective="allreduce"):
    """Return the algorithm names that serve ``collective``, in registry order (``auto`` last).

    Raises
    ------
    ValueError
        ``collective`` is not one of :data:`COLLECTIVES`.

    Examples
    --------
    >>> names("broadcast")
    ('tree', 'mpi', 'auto')
    >>> names("scan")
    Traceback (most recent call last):
    ...
    ValueError: unknown collective 'scan': expected one of allreduce, reduce_scatter, allgather, broadcast, reduce
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}: expected one of {', '.join(COLLECTIVES)}")
    return tuple(a.name for a in REGISTRY.values() if collective in a.serves)


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
    ['ring', 'mpi', 'auto']
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
    ValueError: unknown reduce_scatter algorithm 'tree': expected one of ring, mpi, auto
    """
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
    if entry is None or entry.allreduce_builder is None:
        hand = [a.name for a in REGISTRY.values() if a.allreduce_builder is not None]
        raise ValueError(f"no all-reduce schedule for {algorithm!r}: expected one of {', '.join(hand)}")
    if algorithm == "2d":
        return torus_allreduce(rank, size, count, grid or square_grid(size))
    if algorithm == "torus":
        return torus_nd_allreduce(rank, size, count, tuple(grid) if grid else (size,))
    return entry.allreduce_builder(rank, size, count)
