"""Binomial-tree reduce, broadcast and all-reduce schedules.

Source: R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of collective communication operations
in MPICH", IJHPCA 19(1), 2005, sections 4.1 (binomial broadcast) and 4.4 (binomial reduce).

Ranks are numbered relative to the root (``v = (rank - root) mod P``). In the reduce, at step
``k`` (mask ``m = 2**k``) a rank with bit ``m`` set sends its partial result to ``v - m`` and leaves;
the others receive from ``v + m`` (when it exists) and combine. The broadcast runs the same tree
backwards.
"""
from collectives.schedules.schedule import Round, Schedule

__all__ = ["binomial_reduce_rounds", "binomial_broadcast_rounds", "tree_allreduce", "tree_reduce",
           "tree_broadcast"]


def binomial_reduce_rounds(rank, size, root, lo, hi, phase="reduce"):
    """Return the rounds of a binomial-tree reduce of region ``[lo, hi)`` to ``root``.

    Parameters
    ----------
    rank, size : int
        This rank and P.
    root : int
        Rank that ends with the reduced region.
    lo, hi : int
        Element range of the work buffer being reduced.
    phase : str
        Label for the rounds.

    Examples
    --------
    Rank 0 of four receives and combines from 1, then from 2 (which combined 3's part):

    >>> [rd.recvs for rd in binomial_reduce_rounds(0, 4, 0, 0, 8)]
    [((1, 0, 8, True),), ((2, 0, 8, True),)]
    >>> [rd.sends for rd in binomial_reduce_rounds(3, 4, 0, 0, 8)]
    [((2, 0, 8),)]
    """
    v = (rank - root) % size
    rounds, mask = [], 1
    while mask < size:
        if v & mask:
            rounds.append(Round([((v - mask + root) % size, lo, hi)], [], phase))
            break
        if v + mask < size:
            rounds.append(Round([], [((v + mask + root) % size, lo, hi, True)], phase))
        mask <<= 1
    return rounds


def binomial_broadcast_rounds(rank, size, root, lo, hi, phase="broadcast"):
    """Return the rounds of a binomial-tree broadcast of region ``[lo, hi)`` from ``root``.

    A rank first receives from its parent, then sends to all its children in one round (largest
    subtree first).

    Examples
    --------
    >>> [(rd.sends, rd.recvs) for rd in binomial_broadcast_rounds(0, 4, 0, 0, 8)]
    [(((2, 0, 8), (1, 0, 8)), ())]
    """
    v = (rank - root) % size
    rounds, mask = [], 1
    while mask < size:
        if v & mask:
            rounds.append(Round([], [((v - mask + root) % size, lo, hi, False)], phase))
            break
        mask <<= 1
    mask >>= 1
    sends = []
    while mask > 0:
        if v + mask < size:
            sends.append(((v + mask + root) % size, lo, hi))
        mask >>= 1
    rounds.append(Round(sends, [], phase))
    return rounds


def tree_allreduce(rank, size, count):
    """Build the binomial-tree all-reduce schedule: reduce to rank 0, then broadcast from it.

    Cost (n bytes): ``2 ceil(log2 P) (alpha + n beta) + ceil(log2 P) n gamma``; latency-friendly for
    small messages, bandwidth-poor for large ones. Source: Thakur et al. 2005, sections 4.1 and 4.4.

    Examples
    --------
    >>> tree_allreduce(0, 4, 8)  # the root: two receives, then one round of two sends
    Schedule('tree', rank=0, size=4, count=8, rounds=3, messages=2, elements_sent=16)
    """
    rounds = binomial_reduce_rounds(rank, size, 0, 0, count) + binomial_broadcast_rounds(rank, size, 0, 0, count)
    return Schedule("tree", rank, size, count, rounds)


def tree_reduce(rank, size, count, root):
    """Build the binomial-tree reduce schedule to ``root``.

    Cost: ``ceil(log2 P) (alpha + n beta + n gamma)``. Source: Thakur et al. 2005, section 4.4.

    Examples
    --------
    >>> tree_reduce(2, 4, 8, root=2)
    Schedule('tree', rank=2, size=4, count=8, rounds=2, messages=0, elements_sent=0)
    """
    return Schedule("tree", rank, size, count, binomial_reduce_rounds(rank, size, root, 0, count))


def tree_broadcast(rank, size, count, root):
    """Build the binomial-tree broadcast schedule from ``root``.

    Cost: ``ceil(log2 P) (alpha + n beta)``. Source: Thakur et al. 2005, section 4.1.

    Examples
    --------
    >>> tree_broadcast(0, 5, 8, root=0)
    Schedule('tree', rank=0, size=5, count=8, rounds=1, messages=3, elements_sent=24)
    """
    return Schedule("tree", rank, size, count, binomial_broadcast_rounds(rank, size, root, 0, count))
