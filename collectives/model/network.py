"""A cost model of a three-level network whose links are shared: ranks in nodes, nodes in racks, racks
joined by uplinks, and hosts with fewer cores than ranks.

Every message of ``n`` bytes is priced by the level it crosses (R. Thakur, R. Rabenseifner and
W. Gropp, IJHPCA 19(1), 2005, section 3, with one ``alpha`` and ``beta`` per level, as in the
hierarchical models of BlueConnect, Cho et al., SysML 2019, section 3, and ASTRA-sim's multi-dimensional
topologies, Rashidi et al., ISPASS 2020):

- inside a node (shared memory): ``alpha_intra + n beta_intra o``;
- between two nodes of one rack: ``alpha_node + n max(beta_node s_node / d_node, cpu o)``;
- between racks: ``alpha_node + alpha_rack + n max(beta_node s_node / d_node, beta_rack s_rack / d_rack, cpu o)``;
- reducing ``n`` bytes: ``n gamma o``.

``s_node`` is the number of flows that share the busier of the two node links in that round: the
ranks of the sender's node sending off the node, or of the receiver's node receiving from off the
node, in the same round of their schedules (the larger); ``s_rack`` counts the flows through the
sender's rack's uplink out, or the receiver's rack's uplink in, the same way (the bandwidth bound of
Patarasuk and Yuan, JPDC 69(2), 2009, applied per link and round). ``d_node`` is ``duplex`` when
either of those node links also carries flows the other way in that round (a ring's every link) and 1
otherwise, ``d_rack`` the same for the uplinks: ``duplex`` is one direction's rate while the other
direction is busy, as a fraction of its one-way rate (the emulator's calibration measures it with an
exchange after the OSU Micro-Benchmarks' ``osu_bibw``, Panda et al., one message each way, per
direction; 1 is a full-duplex link). ``o = max(1, ranks_per_host /
cores)`` is the oversubscription of a host: with more ranks than cores every byte a rank copies,
reduces or hands to the network stack waits for a core, and ``cpu`` (seconds per byte) is the stack's
own cost of a byte sent between nodes, which bounds a flow's rate once the host is busy. ``cpu`` and
the per-level terms are measured: :mod:`experiments.cluster.levels` fits them on sweeps of small
emulated layouts.

The schedules replayed are the executor's own (:func:`collectives.schedules.registry.build_allreduce_schedule`),
so segmentation and the order of the rounds are modelled as executed.
"""
from collections import defaultdict
from dataclasses import dataclass, fields

from collectives.model.simulate import replay
from collectives.schedules.registry import build_allreduce_schedule
from collectives.schedules.torus import square_grid

__all__ = ["Network", "allreduce_time", "schedules_time", "default_grid"]


@dataclass(frozen=True)
class Network:
    """Racks of nodes of ranks, with each level's latency and inverse bandwidth.

    Rank ``r`` sits on node ``r // ranks_per_node`` and in rack ``node // nodes_per_rack``, the order in
    which MPI's launchers place ranks on ``-hosts node0:K,...``. Times in seconds, ``beta_*``, ``cpu``
    and ``gamma`` in seconds per byte.

    Examples
    --------
    >>> net = Network(racks=2, nodes_per_rack=2, ranks_per_node=2, alpha_node=1.0, alpha_rack=2.0)
    >>> net.size, net.level(0, 1), net.level(0, 2), net.level(0, 4)
    (8, 'intra', 'node', 'rack')
    >>> Network(racks=0)
    Traceback (most recent call last):
    ...
    ValueError: racks=0 must be >= 1
    """

    racks: int = 1
    nodes_per_rack: int = 2
    ranks_per_node: int = 1
    alpha_intra: float = 1e-6
    beta_intra: float = 1 / 5e9
    alpha_node: float = 30e-6
    beta_node: float = 8 / 1e9
    alpha_rack: float = 0.0
    beta_rack: float = 8 / 1e9
    gamma: float = 1 / 4e9
    cpu: float = 0.0
    duplex: float = 1.0  # one direction's rate while the other is busy / its one-way rate, in (0, 1]
    cores: int = 0  # cores of one host; 0: a core per rank
    ranks_per_host: int = 0  # ranks sharing one host's cores; 0: ranks_per_node

    def __post_init__(self):
        for name in ("racks", "nodes_per_rack", "ranks_per_node"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        for f in fields(self):
            if f.name not in ("racks", "nodes_per_rack", "ranks_per_node", "duplex") and getattr(self, f.name) < 0:
                raise ValueError(f"{f.name}={getattr(self, f.name)} must be >= 0")
        if not 0 < self.duplex <= 1:
            raise ValueError(f"duplex={self.duplex} must be in (0, 1]")

    @property
    def size(self):
        """Ranks in the whole network (P)."""
        return self.racks * self.nodes_per_rack * self.ranks_per_node

    @property
    def oversubscription(self):
        """``max(1, ranks_per_host / cores)``: how many ranks wait for each core (1 without ``cores``)."""
        if not self.cores:
            return 1.0
        return max(1.0, (self.ranks_per_host or self.ranks_per_node) / self.cores)

    def node(self, rank):
        """Node of ``rank``."""
        return rank // self.ranks_per_node

    def rack(self, rank):
        """Rack of ``rank``."""
        return rank // (self.ranks_per_node * self.nodes_per_rack)

    def level(self, src, dst):
        """``'intra'``, ``'node'`` or ``'rack'``: the highest level a message from ``src`` to ``dst`` crosses."""
        if self.node(src) == self.node(dst):
            return "intra"
        return "node" if self.rack(src) == self.rack(dst) else "rack"

    def levels(self):
        """The job's dimensions, outermost first, as ``grid="topology"`` takes them (levels of 1 left out)."""
        dims = tuple(d for d in (self.racks, self.nodes_per_rack, self.ranks_per_node) if d > 1)
        return dims or (self.size,)


def default_grid(algorithm, net):
    """Return the grid the executor uses for ``2d`` and ``torus`` on ``net`` (None for the others).

    ``2d``: (nodes, ranks per node) when there are several nodes of several ranks, else the squarest
    grid; ``torus``: the job's levels (``grid="topology"``).

    Examples
    --------
    >>> net = Network(racks=2, nodes_per_rack=2, ranks_per_node=2)
    >>> default_grid("2d", net), default_grid("torus", net), default_grid("ring", net)
    ((4, 2), (2, 2, 2), None)
    """
    P, K = net.size, net.ranks_per_node
    if algorithm == "2d":
        return (P // K, K) if 1 < P // K < P else square_grid(P)
    if algorithm == "torus":
        return net.levels()
    return None


def _share_factors(net, scheds):
    """Per rank, per send in posting order: (flows on the busier node link, flows on the busier uplink,
    the node links' duplex factor, the uplinks').

    A flow is a rank sending across the link in a round, counted on its own node's link out and on
    the receiver's node's link in (two ranks sending to one rank are two flows into its node); one
    rank's own messages of a round are sent one after another, so they count once. A duplex factor is
    ``net.duplex`` when the sender's link or the receiver's carries flows both ways in the round.
    """
    out_node, in_node = defaultdict(set), defaultdict(set)
    out_rack, in_rack = defaultdict(set), defaultdict(set)
    for r, s in enumerate(scheds):
        for k, rd in enumerate(s.rounds):
            for p, a, b in rd.sends:
                if b <= a or net.node(p) == net.node(r):
                    continue
                out_node[(net.node(r), k)].add(r)
                in_node[(net.node(p), k)].add(r)
                if net.rack(p) != net.rack(r):
                    out_rack[(net.rack(r), k)].add(r)
                    in_rack[(net.rack(p), k)].add(r)
    factors = []
    for r, s in enumerate(scheds):
        f = []
        for k, rd in enumerate(s.rounds):
            for p, _, _ in rd.sends:
                n, m, a, b = net.node(r), net.node(p), net.rack(r), net.rack(p)
                f.append((max(len(out_node[(n, k)]), len(in_node[(m, k)]), 1),
                          max(len(out_rack[(a, k)]), len(in_rack[(b, k)]), 1),
                          _duplex(net, out_node, in_node, n, m, k), _duplex(net, out_rack, in_rack, a, b, k)))
        factors.append(f)
    return factors


def _duplex(net, out, into, a, b, k):
    """``net.duplex`` when link ``a`` (out) or ``b`` (in) carries flows both ways in round ``k``, else 1."""
    two_way = (out.get((a, k)) and into.get((a, k))) or (out.get((b, k)) and into.get((b, k)))
    return net.duplex if two_way else 1.0


def allreduce_time(algorithm, nbytes, net, grid=None, itemsize=4, shared=True):
    """Replay an all-reduce's schedules on ``net`` and return the slowest rank's finish time.

    Parameters
    ----------
    algorithm : str
        A hand-made all-reduce with schedules: ``ring``, ``tree``, ``recursive_doubling``,
        ``rabenseifner``, ``2d`` or ``torus``.
    nbytes : int
        Message size in bytes (``nbytes // itemsize`` elements).
    net : Network
        The machine; P is ``net.size``.
    grid : tuple of int, optional
        For ``2d`` and ``torus``; default :func:`default_grid`.
    itemsize : int
        Bytes per element.
    shared : bool
        Divide each link among the flows crossing it in the same round (default); False gives every
        message a link of its own.

    Returns
    -------
    float
        Seconds.

    Raises
    ------
    ValueError
        ``algorithm`` has no schedule, or ``grid`` does not fit P.

    Examples
    --------
    Two racks of two nodes of two ranks at 1 Gbit/s with a 2:1 uplink. The ring crosses every node link
    and uplink with one flow of 2 (P - 1) / P of the vector, all links busy at once; the three-level
    torus moves the whole vector through the node links, then through the uplinks, one phase after
    the other, so at 64 MiB it is the slower of the two:

    >>> net = Network(racks=2, nodes_per_rack=2, ranks_per_node=2, beta_node=8 / 1e9, beta_rack=8 / 1e9)
    >>> ring, torus = allreduce_time("ring", 64 << 20, net), allreduce_time("torus", 64 << 20, net)
    >>> round(ring, 2), round(torus, 2), ring > torus
    (0.95, 1.1, False)
    """
    P, count = net.size, int(nbytes) // itemsize
    grid = grid if grid is not None else default_grid(algorithm, net)
    scheds = [build_allreduce_schedule(algorithm, r, P, count, grid) for r in range(P)]
    return max(schedules_time(scheds, net, itemsize, shared))


def schedules_time(scheds, net, itemsize=4, shared=True):
    """Replay any schedules (one per rank of ``net``) with the shared-link costs; return every rank's clock.

    The pricing of :func:`allreduce_time`, for schedules it does not build itself: an all-gather, a
    parameter server's push and pull, a pipeline's activations.

    Parameters
    ----------
    scheds : list of Schedule
        ``scheds[r]`` is rank r's, ``len(scheds) == net.size``.
    net : Network
    itemsize : int
        Bytes per element.
    shared : bool
        As for :func:`allreduce_time`.

    Returns
    -------
    list of float
        Each rank's finish time in seconds.

    Examples
    --------
    >>> from collectives.schedules.registry import build_allreduce_schedule
    >>> net = Network(racks=1, nodes_per_rack=2, ranks_per_node=1, alpha_node=1e-3, beta_node=0.0, gamma=0.0)
    >>> schedules_time([build_allreduce_schedule("ring", r, 2, 8) for r in range(2)], net)
    [0.002, 0.002]
    """
    P = net.size
    factors = _share_factors(net, scheds) if shared else None
    o = net.oversubscription
    calls = [0] * P

    def link(src, dst, n):
        share = factors[src][calls[src]] if shared else (1, 1, 1.0, 1.0)
        calls[src] += 1
        nb = n * itemsize
        level = net.level(src, dst)
        if level == "intra":
            t = net.alpha_intra + nb * net.beta_intra * o
        elif level == "node":
            t = net.alpha_node + nb * max(net.beta_node * share[0] / share[2], net.cpu * o)
        else:
            t = net.alpha_node + net.alpha_rack + nb * max(net.beta_node * share[0] / share[2],
                                                          net.beta_rack * share[1] / share[3], net.cpu * o)
        return t, t

    return replay(scheds, cost=link, reduce_cost=lambda n: n * itemsize * net.gamma * o)["clock"]
