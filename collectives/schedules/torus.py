"""Torus all-reduce schedules: 2D (hierarchical) on a ``rows x cols`` grid, and N-dimensional.

``torus`` (:func:`torus_nd_allreduce`) generalizes ``2d`` to a grid ``(a, b, c, ...)`` of any number
of dimensions (product P, rank coordinates in row-major order, the last dimension varying fastest):
ring reduce-scatter along the last dimension, then along each earlier one on the block owned so far,
then ring all-gather back in reverse order. With the dimensions set to the levels of a network
(racks, nodes per rack, ranks per node) only the last level's block crosses the outer links: the
hierarchical all-reduce of BlueConnect (M. Cho, U. Finkler, D. Kung and H. Hunter, "BlueConnect:
Decomposing all-reduce for deep learning on heterogeneous network hierarchy", SysML 2019) and the
2D/3D torus all-reduce of TPU pods (C. Ying et al., "Image classification at supercomputer scale",
arXiv:1811.06992, 2018, section 3.3).

The 2D schedule on ``rows x cols``:

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

__all__ = ["torus_allreduce", "torus_nd_allreduce", "check_grid", "check_dims", "square_grid"]


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


def check_dims(grid, size):
    """Return ``grid`` as a tuple of positive ints whose product is ``size`` (the ``torus`` grid).

    Raises
    ------
    ValueError
        ``grid`` is not a non-empty sequence of positive integers, or their product is not ``size``.

    Examples
    --------
    >>> check_dims([2, 2, 2], 8)
    (2, 2, 2)
    >>> check_dims((2, 0, 4), 8)
    Traceback (most recent call last):
    ...
    ValueError: grid=(2, 0, 4) must be one or more positive integers, one per dimension
    >>> check_dims((2, 3), 8)
    Traceback (most recent call last):
    ...
    ValueError: grid=(2, 3) has 6 ranks but the communicator has 8
    """
    if (not isinstance(grid, (tuple, list)) or not grid
            or not all(isinstance(g, (int, numpy.integer)) and not isinstance(g, bool) and g >= 1 for g in grid)):
        raise ValueError(f"grid={tuple(grid) if isinstance(grid, list) else grid!r} must be one or more positive "
                         "integers, one per dimension")
    dims = tuple(int(g) for g in grid)
    if int(numpy.prod(dims)) != size:
        raise ValueError(f"grid={dims!r} has {int(numpy.prod(dims))} ranks but the communicator has {size}")
    return dims


def torus_nd_allreduce(rank, size, count, dims):
    """Build the N-dimensional torus all-reduce schedule on ``dims = (a, b, c, ...)``.

    Cost (n bytes; dimensions processed last first, ``n_j`` the block entering dimension ``j``:
    ``n`` for the last, divided by each dimension already done): ``sum 2 (d_j - 1)`` alpha,
    ``sum 2 (d_j - 1) / d_j n_j`` beta, ``sum (d_j - 1) / d_j n_j`` gamma. Sources: Ying et al. 2018,
    section 3.3; Cho et al. 2019 (see the module docstring).

    Parameters
    ----------
    rank, size, count : int
        This rank, P and the element count.
    dims : tuple of int
        The grid, product ``size`` (see :func:`check_dims`).

    Examples
    --------
    >>> s = torus_nd_allreduce(0, 8, 16, (2, 2, 2))
    >>> [rd.phase for rd in s.rounds]
    ['dim 2 reduce-scatter', 'dim 1 reduce-scatter', 'dim 0 reduce-scatter', 'dim 0 all-gather', 'dim 1 all-gather', 'dim 2 all-gather']
    >>> [rd.sends[0][0] for rd in s.rounds]  # rank 0's peers: 1 (dim 2), 2 (dim 1), 4 (dim 0)
    [1, 2, 4, 4, 2, 1]
    """
    coords = numpy.unravel_index(rank, dims)
    strides = [int(numpy.prod(dims[j + 1:])) for j in range(len(dims))]
    lo, hi, rounds, steps = 0, count, [], []
    for j in reversed(range(len(dims))):
        if dims[j] == 1:
            continue
        base = rank - int(coords[j]) * strides[j]
        group = [base + k * strides[j] for k in range(dims[j])]
        bounds = [lo + x for x in chunk_bounds(hi - lo, dims[j])]
        rounds += ring_reduce_scatter_rounds(group, int(coords[j]), bounds, f"dim {j} reduce-scatter")
        steps.append((j, group, bounds))
        lo, hi = bounds[int(coords[j])], bounds[int(coords[j]) + 1]
    for j, group, bounds in reversed(steps):
        rounds += ring_allgather_rounds(group, int(coords[j]), bounds, f"dim {j} all-gather")
    return Schedule("torus", rank, size, count, rounds)
