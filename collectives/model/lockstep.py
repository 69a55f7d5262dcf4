"""The replay of :func:`collectives.model.network.allreduce_time` for ring, ``2d`` and ``torus``, vectorized
over the ranks, so that P = 4,096 takes about a second instead of hours.

The three algorithms are rings along the dimensions of a grid (:func:`collectives.schedules.torus.torus_nd_allreduce`;
``ring`` is the grid ``(P,)`` and ``2d`` the grid ``(rows, cols)``): every rank runs the same number of
rounds, each with one send to its right neighbour and one receive from its left one, and the rounds
of one phase keep their peers. With every chunk non-empty (``count >= P``) the event replay of
:func:`collectives.model.simulate.replay` reduces to the lockstep recurrence

``T[r] <- max(T[r] + c(r -> right), T[left] + c(left -> r)) + reduce(r)``

with ``c`` the three-level, shared-link price of :mod:`collectives.model.network` (the flows sharing a
node link or an uplink, and whether it carries flows both ways, are counted once per phase, since its
rounds keep their peers). The block sizes are the executor's own (``chunk_bounds``, the
``numpy.array_split`` rule), so the result equals the event replay; the tests check it against
:func:`collectives.model.network.allreduce_time`.
"""
import numpy

from collectives.model.network import default_grid
from collectives.schedules.torus import check_dims

__all__ = ["ring_family", "lockstep_clocks"]

#: Algorithms :func:`lockstep_clocks` replays.
ring_family = ("ring", "2d", "torus")


def _split(lo, hi, d):
    """Vectorized ``chunk_bounds``: (g,) ranges -> (g, d + 1) bounds of their ``numpy.array_split`` blocks."""
    n = hi - lo
    q, rem = n // d, n % d
    sizes = q[:, None] + (numpy.arange(d)[None, :] < rem[:, None])  # (g, d)
    return numpy.concatenate([lo[:, None], lo[:, None] + numpy.cumsum(sizes, axis=1)], axis=1)


def _phases(dims, count):
    """Yield ``(groups (g, d), bounds (g, d + 1), reduce)`` per ring phase, in the schedules' order."""
    P = int(numpy.prod(dims))
    ranks = numpy.arange(P).reshape(dims)
    lo, hi = numpy.zeros(P, numpy.int64), numpy.full(P, count, numpy.int64)
    done = []
    for j in reversed(range(len(dims))):
        if dims[j] == 1:
            continue
        groups = numpy.moveaxis(ranks, j, -1).reshape(-1, dims[j])  # (g, d) members in coordinate order
        bounds = _split(lo[groups[:, 0]], hi[groups[:, 0]], dims[j])
        yield groups, bounds, True
        done.append((groups, bounds))
        idx = numpy.arange(dims[j])[None, :].repeat(len(groups), 0)
        lo[groups], hi[groups] = bounds[numpy.arange(len(groups))[:, None], idx], \
            bounds[numpy.arange(len(groups))[:, None], idx + 1]
    for groups, bounds in reversed(done):
        yield groups, bounds, False


def _prices(net, src, dst, itemsize):
    """Per send ``src[i] -> dst[i]`` of one phase: (seconds per message, seconds per element)."""
    P, K = net.size, net.ranks_per_node
    node_s, node_d = src // K, dst // K
    rack_s, rack_d = src // (K * net.nodes_per_rack), dst // (K * net.nodes_per_rack)
    off_node, off_rack = node_s != node_d, rack_s != rack_d
    nodes, racks = P // K, net.racks
    out_n = numpy.bincount(node_s[off_node], minlength=nodes)
    in_n = numpy.bincount(node_d[off_node], minlength=nodes)
    out_r = numpy.bincount(rack_s[off_rack], minlength=racks)
    in_r = numpy.bincount(rack_d[off_rack], minlength=racks)
    s_node = numpy.maximum(numpy.maximum(out_n[node_s], in_n[node_d]), 1)
    s_rack = numpy.maximum(numpy.maximum(out_r[rack_s], in_r[rack_d]), 1)
    two_n, two_r = (out_n > 0) & (in_n > 0), (out_r > 0) & (in_r > 0)  # links carrying flows both ways
    d_node = numpy.where(two_n[node_s] | two_n[node_d], net.duplex, 1.0)
    d_rack = numpy.where(two_r[rack_s] | two_r[rack_d], net.duplex, 1.0)
    o = net.oversubscription
    per_node = numpy.maximum(net.beta_node * s_node / d_node, net.cpu * o)
    per_rack = numpy.maximum(per_node, net.beta_rack * s_rack / d_rack)
    alpha = numpy.where(~off_node, net.alpha_intra, numpy.where(off_rack, net.alpha_node + net.alpha_rack,
                                                                  net.alpha_node))
    per_byte = numpy.where(~off_node, net.beta_intra * o, numpy.where(off_rack, per_rack, per_node))
    return alpha, per_byte * itemsize


def lockstep_clocks(algorithm, nbytes, net, grid=None, itemsize=4, allgather_only=False):
    """Return every rank's finish time of a ring-family all-reduce on ``net`` (the event replay's clocks).

    Parameters
    ----------
    algorithm : {"ring", "2d", "torus"}
    nbytes : int
        Message size in bytes (``nbytes // itemsize`` elements, at least P of them).
    net : collectives.model.network.Network
    grid : tuple of int, optional
        As for :func:`collectives.model.network.allreduce_time` (default its ``default_grid``).
    itemsize : int
        Bytes per element.
    allgather_only : bool
        Replay only the all-gather phases: with ``ring``, the ring all-gather of ``nbytes / P`` per rank.

    Returns
    -------
    ndarray, shape (P,), float64
        Seconds.

    Raises
    ------
    ValueError
        Another algorithm, a grid that does not fit P, or fewer elements than ranks (empty chunks
        drop rounds, and the event replay is needed then).

    Examples
    --------
    >>> from collectives.model.network import Network, allreduce_time
    >>> net = Network(racks=2, nodes_per_rack=2, ranks_per_node=2)
    >>> fast = lockstep_clocks("torus", 1 << 20, net).max()
    >>> bool(abs(fast - allreduce_time("torus", 1 << 20, net)) < 1e-12)
    True
    """
    if algorithm not in ring_family:
        raise ValueError(f"lockstep replay covers {ring_family}, not {algorithm!r}")
    P, count = net.size, int(nbytes) // itemsize
    if count < P:
        raise ValueError(f"lockstep replay needs at least P={P} elements, got {count}")
    if algorithm == "ring":
        dims = (P,)
    else:
        dims = check_dims(tuple(grid if grid is not None else default_grid(algorithm, net)), P)
        if algorithm == "2d" and len(dims) != 2:
            raise ValueError(f"2d takes a grid of two dimensions, got {dims}")
    T = numpy.zeros(P)
    red_per_elem = itemsize * net.gamma * net.oversubscription
    for groups, bounds, reduce in _phases(dims, count):
        if reduce and allgather_only:
            continue
        g, d = groups.shape
        right = numpy.roll(groups, -1, axis=1)
        alpha, per_elem = _prices(net, groups.ravel(), right.ravel(), itemsize)
        A, C = numpy.zeros(P), numpy.zeros(P)
        A[groups.ravel()], C[groups.ravel()] = alpha, per_elem
        left = numpy.roll(groups, 1, axis=1)
        sizes = numpy.diff(bounds, axis=1)  # (g, d)
        twice = numpy.concatenate([sizes, sizes], axis=1)
        shift = 1 if reduce else 0
        r, lf = groups.ravel(), left.ravel()
        for s in range(d - 1):
            k, j = (-s - shift) % d, (-s - shift - 1) % d
            sn = twice[:, k:k + d].ravel()  # member i sends block (i - s - shift) mod d
            rn = twice[:, j:j + d].ravel()  # and receives block (i - s - shift - 1) mod d
            done = numpy.maximum(T[r] + A[r] + sn * C[r], T[lf] + A[lf] + rn * C[lf])
            if reduce:
                done += rn * red_per_elem
            T[r] = done
    return T
