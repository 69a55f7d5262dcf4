"""Ring reduce-scatter, all-gather and all-reduce schedules.

Source: P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", J. Parallel Distrib. Comput. 69(2), 2009, section 3; also R. Thakur, R. Rabenseifner
and W. Gropp, "Optimization of collective communication operations in MPICH", IJHPCA 19(1), 2005,
section 4 (ring all-gather).

The builders work on a *group* of ranks (a list of communicator ranks; the ring runs in list order)
and a region of the work buffer split into blocks, so the 2D algorithm can reuse them on rows and
columns of a grid.
"""
from collectives.schedules.schedule import Round, Schedule, chunk_bounds

__all__ = ["ring_reduce_scatter_rounds", "ring_allgather_rounds", "ring_allreduce", "ring_reduce_scatter",
           "ring_allgather"]


def ring_reduce_scatter_rounds(group, me, bounds, phase="reduce-scatter"):
    """Return the rounds of a ring reduce-scatter after which group member ``i`` holds block ``i``.

    In round ``s = 0 .. n-2`` member ``i`` sends block ``(i - s - 1) mod n`` to member ``i + 1`` and
    receives block ``(i - s - 2) mod n`` from member ``i - 1``, combining it into its own copy.

    Parameters
    ----------
    group : list of int
        Communicator ranks in ring order (``n = len(group)``).
    me : int
        This rank's index in ``group``.
    bounds : list of int, length n + 1
        Block boundaries in the work buffer; block ``j`` is ``[bounds[j], bounds[j + 1])``.
    phase : str
        Label for the rounds.

    Examples
    --------
    Member 0 of a three-rank ring over blocks ``[0, 2), [2, 4), [4, 6)``:

    >>> for rd in ring_reduce_scatter_rounds([0, 1, 2], 0, [0, 2, 4, 6]):
    ...     print(rd.sends, rd.recvs)
    ((1, 4, 6),) ((2, 2, 4, True),)
    ((1, 2, 4),) ((2, 0, 2, True),)
    """
    n = len(group)
    right, left = group[(me + 1) % n], group[(me - 1) % n]
    rounds = []
    for s in range(n - 1):
        sb, rb = (me - s - 1) % n, (me - s - 2) % n
        rounds.append(Round([(right, bounds[sb], bounds[sb + 1])],
                            [(left, bounds[rb], bounds[rb + 1], True)], phase))
    return rounds


def ring_allgather_rounds(group, me, bounds, phase="all-gather"):
    """Return the rounds of a ring all-gather where member ``i`` starts with block ``i``.

    In round ``s = 0 .. n-2`` member ``i`` sends block ``(i - s) mod n`` to member ``i + 1`` and
    receives block ``(i - s - 1) mod n`` from member ``i - 1`` directly into place.

    Parameters
    ----------
    group, me, bounds, phase
        As for :func:`ring_reduce_scatter_rounds`.

    Examples
    --------
    >>> for rd in ring_allgather_rounds([0, 1, 2], 0, [0, 2, 4, 6]):
    ...     print(rd.sends, rd.recvs)
    ((1, 0, 2),) ((2, 4, 6, False),)
    ((1, 4, 6),) ((2, 2, 4, False),)
    """
    n = len(group)
    right, left = group[(me + 1) % n], group[(me - 1) % n]
    rounds = []
    for s in range(n - 1):
        sb, rb = (me - s) % n, (me - s - 1) % n
        rounds.append(Round([(right, bounds[sb], bounds[sb + 1])],
                            [(left, bounds[rb], bounds[rb + 1], False)], phase))
    return rounds


def ring_allreduce(rank, size, count):
    """Build the ring all-reduce schedule: ring reduce-scatter, then ring all-gather.

    Steps: split the vector into P chunks (``numpy.array_split`` sizes); P - 1 reduce-scatter rounds
    leave rank r with the reduced chunk r; P - 1 all-gather rounds circulate the reduced chunks.

    Cost (alpha-beta-gamma, n bytes): ``2(P-1) alpha + 2 (P-1)/P n beta + (P-1)/P n gamma``;
    bandwidth-optimal. Source: Patarasuk and Yuan 2009, section 3.

    Parameters
    ----------
    rank, size : int
        This rank and the number of ranks P.
    count : int
        Elements in the vector.

    Returns
    -------
    Schedule

    Examples
    --------
    >>> s = ring_allreduce(1, 4, 10)
    >>> s  # 2 (P - 1) rounds, each sending one chunk of 10 elements split 3, 3, 2, 2
    Schedule('ring', rank=1, size=4, count=10, rounds=6, messages=6, elements_sent=15)
    >>> [rd.phase for rd in s.rounds[2:4]]
    ['reduce-scatter', 'all-gather']
    """
    group, bounds = list(range(size)), chunk_bounds(count, size)
    rounds = ring_reduce_scatter_rounds(group, rank, bounds) + ring_allgather_rounds(group, rank, bounds)
    return Schedule("ring", rank, size, count, rounds)


def ring_reduce_scatter(rank, size, count, bounds=None):
    """Build the ring reduce-scatter schedule: rank r ends with the reduced chunk r.

    Cost: ``(P-1) alpha + (P-1)/P n beta + (P-1)/P n gamma``. Source: Patarasuk and Yuan 2009.

    Parameters
    ----------
    rank, size, count : int
        This rank, the number of ranks P and the elements of the vector.
    bounds : sequence of int, length P + 1, optional
        Chunk boundaries (reduce-scatter-v: chunk r is ``[bounds[r], bounds[r + 1])``, empty ones
        allowed); default ``chunk_bounds(count, size)``.

    Examples
    --------
    >>> ring_reduce_scatter(0, 4, 10)
    Schedule('ring', rank=0, size=4, count=10, rounds=3, messages=3, elements_sent=7)
    >>> ring_reduce_scatter(0, 3, 6, bounds=(0, 0, 6, 6))  # every element to rank 1
    Schedule('ring', rank=0, size=3, count=6, rounds=2, messages=1, elements_sent=6)
    """
    bounds = chunk_bounds(count, size) if bounds is None else tuple(int(b) for b in bounds)
    return Schedule("ring", rank, size, count, ring_reduce_scatter_rounds(list(range(size)), rank, bounds))


def ring_allgather(rank, size, bounds):
    """Build the ring all-gather(-v) schedule for blocks with the given boundaries.

    Parameters
    ----------
    rank, size : int
        This rank and P.
    bounds : list of int, length P + 1
        Block boundaries of the concatenated result; rank r contributes block r (sizes may differ).

    Cost: ``(P-1) alpha + (P-1)/P n beta``. Source: Thakur, Rabenseifner and Gropp 2005, section 4.

    Examples
    --------
    Blocks of 1, 3 and 2 elements (all-gather-v):

    >>> ring_allgather(0, 3, [0, 1, 4, 6])
    Schedule('ring', rank=0, size=3, count=6, rounds=2, messages=2, elements_sent=3)
    """
    return Schedule("ring", rank, size, bounds[-1], ring_allgather_rounds(list(range(size)), rank, bounds))
