"""2D (torus / hierarchical) all-reduce schedule on a ``rows x cols`` grid of ranks.

Rank ``r`` sits at row ``r // cols``, column ``r % cols``. Steps:

1. ring reduce-scatter along the row (``cols`` ranks): the rank in column ``c`` owns block ``c``;
2. ring all-reduce of that block along the column (``rows`` ranks);
3. ring all-gather along the row.

With rows = nodes and columns = the ranks of one node (``Split_type(COMM_TYPE_SHARED)``), steps 1 and 3
stay inside a node and only ``1/cols`` of the vector crosses the network per rank: the hierarchical
all-reduce. Sources: H. Mikami et al., "Massively distributed SGD: ImageNet/ResNet-50 training in a
flash", arXiv:1811.05233, 2018, section 3.2 (2D-torus all-reduce); P. Sanders, J. Speck and
J. L. Träff, "Two-tree algorithms for full bandwidth broadcast, reduction and scan", Parallel
Computing 35(12), 2009, for the hierarchical decomposition.
"""
import numpy

from collectives.schedules.ring import ring_allgather_rounds, ring_reduce_scatter_rounds
from collectives.schedules.schedule import Schedule, chunk_bounds

__all__ = ["torus_allreduce", "check_grid", "square_grid"]


def check_grid(grid, size):
    """Return ``grid`` as a (rows, cols) tuple of ints after checking it.

    Raises
    ------
    ValueError
        ``grid`` is not two positive integers, or ``rows * cols != size``.

    Examples
    --------
    >>> check_grid([2, 3], 6)
    (2, 3)
    >>> check_grid((2, 3), 4)
    Traceback (most recent call last):
    ...
    ValueError: grid=(2, 3) has 6 ranks but the communicator has 4
    """
    if (not isinstance(grid, (tuple, list)) or len(grid) != 2
            or not all(isinstance(g, (int, numpy.integer)) and not isinstance(g, bool) and g >= 1 for g in grid)):
        raise ValueError(f"grid={grid!r} must be two positive integers (rows, cols)")
    rows, cols = grid
    if rows * cols != size:
        raise ValueError(f"grid={tuple(grid)!r} has {rows * cols} ranks but the communicator has {size}")
    return int(rows), int(cols)


def square_grid(size):
    """Return the (rows, cols) factorization of ``size`` closest to square, with rows <= cols.

    Examples
    --------
    >>> square_grid(12), square_grid(16), square_grid(7)
    ((3, 4), (4, 4), (1, 7))
    """
    rows = max(d for d in range(1, int(size ** 0.5) + 1) if size % d == 0)
    return rows, size // rows


def torus_allreduce(rank, size, count, grid):
    """Build the 2D all-reduce schedule on ``grid = (rows, cols)``.

    Cost (n bytes, R rows, C cols): ``2(C-1) + 2(R-1)`` alpha, ``2 (C-1)/C n + 2 (R-1)/(R C) n``
    beta, ``((C-1)/C + (R-1)/(R C)) n`` gamma. Source: Mikami et al. 2018, section 3.2.

    Parameters
    ----------
    rank, size, count : int
        This rank, P and the element count.
    grid : (int, int)
        Rows and columns, ``rows * cols == size`` (see :func:`check_grid`).

    Examples
    --------
    >>> s = torus_allreduce(0, 4, 8, (2, 2))
    >>> [rd.phase for rd in s.rounds]
    ['row reduce-scatter', 'column reduce-scatter', 'column all-gather', 'row all-gather']
    >>> [rd.sends[0][0] for rd in s.rounds]  # rank 0's row peer is 1, its column peer 2
    [1, 2, 2, 1]
    """
    rows, cols = grid
    row, col = divmod(rank, cols)
    row_group = [row * cols + c for c in range(cols)]
    col_group = [r * cols + col for r in range(rows)]
    b = chunk_bounds(count, cols)
    sub = [b[col] + x for x in chunk_bounds(b[col + 1] - b[col], rows)]
    rounds = ring_reduce_scatter_rounds(row_group, col, b, "row reduce-scatter")
    rounds += ring_reduce_scatter_rounds(col_group, row, sub, "column reduce-scatter")
    rounds += ring_allgather_rounds(col_group, row, sub, "column all-gather")
    rounds += ring_allgather_rounds(row_group, col, b, "row all-gather")
    return Schedule("2d", rank, size, count, rounds)
