"""Every message of a predicted step, priced by :mod:`collectives.model.network` on the executor's schedules.

- all-reduce: :func:`collectives.model.network.allreduce_time`'s replay, per-rank clocks
  (:func:`allreduce_clocks`); ring, ``2d`` and ``torus`` through its vectorized form
  (:func:`collectives.model.lockstep.lockstep_clocks`, equal to it), so P = 4,096 takes about a second;
- all-gather (compressors whose payloads do not sum): the ring all-gather's rounds;
- parameter-server push and pull, and pipeline activations: schedules built here, one round each,
  replayed with :func:`collectives.model.network.schedules_time`, so the flows that meet at a server's
  or a node's link share it.

A sub-communicator (a tensor or data-parallel group of a grid) is priced on :func:`group_network`: its
ranks' own layout, with each node link and uplink divided among the groups that use it at once.

On a :class:`HostNetwork` with ``round_s`` > 0 a rank's part in a collective of R rounds lasts at least
R ``round_s`` (:func:`floored`): the least time one round takes on its host, whatever the bytes (an
oversubscribed host runs each rank's round only when the rank gets a core; fitted by
:mod:`training.predict.floor`).
"""
from dataclasses import dataclass
from functools import lru_cache

import numpy

from collectives.model.lockstep import lockstep_clocks, ring_family
from collectives.model.network import Network, default_grid, schedules_time
from collectives.schedules.registry import build_allreduce_schedule
from collectives.schedules.ring import ring_allgather_rounds
from collectives.schedules.schedule import Round, Schedule, chunk_bounds

__all__ = ["HostNetwork", "floored", "allreduce_clocks", "allreduce_rounds", "allgather_clocks", "ps_clocks",
           "send_clocks", "group_network", "resolve_grid"]


@dataclass(frozen=True)
class HostNetwork(Network):
    """A :class:`Network` whose hosts add a least duration ``round_s`` (seconds) to every round."""

    round_s: float = 0.0


def floored(clocks, rounds, net):
    """Return ``max(clocks, rounds * round_s)`` per rank (``rounds``: an int or one per rank).

    Examples
    --------
    >>> net = HostNetwork(racks=1, nodes_per_rack=2, ranks_per_node=1, round_s=1e-3)
    >>> floored(numpy.array([0.5e-3, 5e-3]), 2, net).tolist()  # two rounds last at least 2 ms
    [0.002, 0.005]
    """
    r = getattr(net, "round_s", 0.0)
    return numpy.maximum(clocks, numpy.asarray(rounds) * r) if r else clocks


def resolve_grid(algorithm, grid, net):
    """Return the grid of ``2d`` / ``torus`` (``"topology"``: the network's levels), else None."""
    if algorithm not in ("2d", "torus"):
        return None
    if grid == "topology" or grid is None:
        return default_grid(algorithm, net)
    return tuple(grid)


@lru_cache(maxsize=4096)
def _allreduce(algorithm, count, net, grid, itemsize):
    if algorithm in ring_family and count >= net.size:
        return lockstep_clocks(algorithm, count * itemsize, net, grid, itemsize)
    scheds = [build_allreduce_schedule(algorithm, r, net.size, count, grid) for r in range(net.size)]
    return numpy.array(schedules_time(scheds, net, itemsize))


def allreduce_clocks(algorithm, nbytes, net, grid=None, itemsize=4):
    """Return each rank's seconds in an all-reduce of ``nbytes`` on ``net`` (zeros for P = 1 or no data).

    Parameters
    ----------
    algorithm : str
        An all-reduce with schedules (``ring``, ``tree``, ``recursive_doubling``, ``rabenseifner``,
        ``2d``, ``torus``).
    nbytes : int
        Bytes per rank.
    net : Network
    grid : tuple of int or "topology", optional
    itemsize : int
        Bytes per element (1 for a compressor's byte payloads).

    Returns
    -------
    ndarray, shape (P,)

    Examples
    --------
    >>> net = Network(racks=1, nodes_per_rack=2, ranks_per_node=1, alpha_node=1e-3, beta_node=0.0, gamma=0.0)
    >>> allreduce_clocks("ring", 64, net).tolist()  # two rounds of 1 ms
    [0.002, 0.002]
    """
    count = int(nbytes) // itemsize
    if net.size == 1 or count == 0:
        return numpy.zeros(net.size)
    clocks = _allreduce(algorithm, count, net, resolve_grid(algorithm, grid, net), itemsize)
    return floored(clocks, allreduce_rounds(algorithm, net.size, nbytes, grid, itemsize, net), net)


def allreduce_rounds(algorithm, P, nbytes, grid=None, itemsize=4, net=None):
    """Return the number of rounds of rank 0's all-reduce schedule (a round advances per test)."""
    if P == 1:
        return 0
    if net is not None:
        grid = resolve_grid(algorithm, grid, net)
    if algorithm == "ring":
        return 2 * (P - 1)
    if algorithm in ("2d", "torus") and int(nbytes) // itemsize >= P:
        return sum(2 * (d - 1) for d in grid)
    return len(build_allreduce_schedule(algorithm, 0, P, max(1, int(nbytes) // itemsize), grid).rounds)


@lru_cache(maxsize=256)
def allgather_clocks(nbytes, net):
    """Return each rank's seconds in a ring all-gather of ``nbytes`` per rank (``collectives.allgather``'s ring)."""
    P = net.size
    if P == 1 or nbytes == 0:
        return numpy.zeros(P)
    if P >= 64:  # the same rounds, vectorized: the all-gather half of a ring all-reduce of P blocks
        return floored(lockstep_clocks("ring", P * nbytes, net, itemsize=1, allgather_only=True), P - 1, net)
    bounds = [i * nbytes for i in range(P + 1)]
    scheds = [Schedule("allgather", r, P, P * nbytes,
                       ring_allgather_rounds(list(range(P)), r, bounds, "ring all-gather")) for r in range(P)]
    return floored(numpy.array(schedules_time(scheds, net, 1)), P - 1, net)


def _fields(net):
    return {k: getattr(net, k) for k in net.__dataclass_fields__}


def group_network(net, base, stride, size):
    """Return the :class:`Network` of the group ``base + i stride`` (i < size) of ``net``, links shared.

    The group keeps its ranks' levels (ranks per node, nodes per rack, racks, counted from its ranks);
    every node link is divided among the ``ranks_per_node / group's ranks per node`` groups of the grid
    that use it at the same time, every uplink likewise per rack.

    Examples
    --------
    >>> net = Network(racks=1, nodes_per_rack=4, ranks_per_node=2, beta_node=1.0)
    >>> g = group_network(net, 0, 2, 4)  # one rank per node: two such groups share each node link
    >>> (g.racks, g.nodes_per_rack, g.ranks_per_node, g.beta_node)
    (1, 4, 1, 2.0)
    """
    ranks = [base + i * stride for i in range(size)]
    K, N = net.ranks_per_node, net.nodes_per_rack
    nodes = sorted({r // K for r in ranks})
    racks = sorted({r // (K * N) for r in ranks})
    per_node = size // len(nodes)
    per_rack_nodes = len(nodes) // len(racks)
    c_node = max(1.0, K / per_node) if len(nodes) > 1 else 1.0
    c_rack = max(1.0, (K * N) / (per_node * per_rack_nodes)) if len(racks) > 1 else 1.0
    f = _fields(net)
    f.update(racks=len(racks), nodes_per_rack=per_rack_nodes, ranks_per_node=per_node,
             beta_node=net.beta_node * c_node, beta_rack=net.beta_rack * c_rack,
             ranks_per_host=net.ranks_per_host or K)
    return type(net)(**f)


def ps_clocks(net, servers, nbytes, itemsize=4):
    """Return per-rank seconds of one push and of one pull: ``(push (P,), pull (P,))``.

    Workers (ranks ``servers..P-1``) send each server its shard (``chunk_bounds`` of the gradient over
    the servers), one shard per round, worker w starting with server ``w mod S``; a server takes the W
    pushes in one round and adds each in (``reduce``). A pull is one round of requests (one element)
    and then one round per worker in which each server sends it its shard. One message per round and
    sender keeps :func:`collectives.model.network.schedules_time` from counting a rank's own messages
    both as sharing its link and as sent one after another; the flows that meet at one node's link in
    a round share it.
    """
    P, S = net.size, servers
    W = P - S
    count = int(nbytes) // itemsize
    b = chunk_bounds(count, S)
    workers = list(range(S, P))
    push, pull = [], []
    for r in range(P):
        if r < S:
            push.append(Schedule("push", r, P, count, [Round(recvs=[(w, b[r], b[r + 1], True) for w in workers])]))
            pull.append(Schedule("pull", r, P, count, [Round(recvs=[(w, 0, 1, False) for w in workers])]
                                 + [Round(sends=[(workers[(r + k) % W], b[r], b[r + 1])]) for k in range(W)]))
        else:
            w = r - S
            push.append(Schedule("push", r, P, count,
                                 [Round(sends=[((w + k) % S, b[(w + k) % S], b[(w + k) % S + 1])]) for k in range(S)]))
            pull.append(Schedule("pull", r, P, count, [Round(sends=[(s, 0, 1) for s in range(S)]),
                                                       Round(recvs=[(s, b[s], b[s + 1], False) for s in range(S)])]))
    push_rounds = numpy.array([1] * S + [S] * W)
    pull_rounds = numpy.array([1 + W] * S + [2] * W)
    return (floored(numpy.array(schedules_time(push, net, itemsize)), push_rounds, net),
            floored(numpy.array(schedules_time(pull, net, itemsize)), pull_rounds, net))


def send_clocks(net, pairs, nbytes):
    """Return per-rank seconds when every ``(src, dst)`` of ``pairs`` sends ``nbytes`` at once (one round)."""
    P = net.size
    out = {r: [] for r in range(P)}
    into = {r: [] for r in range(P)}
    for s, d in pairs:
        out[s].append((d, 0, int(nbytes)))
        into[d].append((s, 0, int(nbytes), False))
    scheds = [Schedule("send", r, P, int(nbytes), [Round(sends=out[r], recvs=into[r])]) for r in range(P)]
    busy = numpy.array([1 if out[r] or into[r] else 0 for r in range(P)])
    return floored(numpy.array(schedules_time(scheds, net, 1)), busy, net)
