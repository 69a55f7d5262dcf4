"""The alpha-beta-gamma cost model, its least-squares fit, and a schedule simulator for large P.

Model (R. Thakur, R. Rabenseifner and W. Gropp, "Optimization of collective communication operations
in MPICH", IJHPCA 19(1), 2005, section 3): sending a message of ``n`` bytes costs
``alpha + n beta``; combining ``n`` bytes costs ``n gamma``. Each all-reduce algorithm's time is
``a alpha + b beta + c gamma`` with coefficients from :func:`coefficients`.

The simulator (:func:`simulate`) instead replays the algorithms' own schedules with one clock per
rank on a two-level topology (:class:`Topology`: intra-node and inter-node alpha and beta, ranks
per node), so contention-free effects such as a ring crossing node boundaries show up. Ring-based
algorithms (``ring``, ``2d``) run as vectorized lockstep rounds (their round tables are checked
against the per-rank schedules in the tests); the others go through the event replay of
:mod:`collectives.model.simulate`. P = 4096 takes seconds.
"""
import math
from dataclasses import dataclass

import numpy

from collectives.schedules.registry import build_allreduce_schedule, modelled
from collectives.schedules.schedule import chunk_bounds
from collectives.model.simulate import replay
from collectives.schedules.torus import square_grid

__all__ = ["coefficients", "predict", "fit", "Topology", "simulate", "ring_tables", "MODELLED"]

#: Algorithms the model and simulator cover (``mpi`` is modelled as MPICH's choice: the faster of
#: recursive doubling and Rabenseifner).
MODELLED = modelled()


def coefficients(algorithm, P, nbytes, grid=None):
    """Return ``(a, b, c)``: the all-reduce time is ``a alpha + b beta + c gamma``.

    Parameters
    ----------
    algorithm : str
        One of :data:`MODELLED`.
    P : int
        Number of ranks, >= 1.
    nbytes : float
        Message size in bytes.
    grid : tuple of int, optional
        For ``2d`` (rows, cols; default the factorization of P closest to square) and ``torus``
        (its dimensions; default ``(P,)``).

    Returns
    -------
    tuple of float
        Message count (alpha), bytes on the critical path (beta), bytes reduced (gamma).

    Raises
    ------
    ValueError
        ``algorithm`` is not modelled.

    Examples
    --------
    >>> coefficients("ring", 4, 1024)  # 2 (P-1) messages, 2 (P-1)/P n and (P-1)/P n bytes
    (6.0, 1536.0, 768.0)
    >>> coefficients("tree", 1, 1024)  # one rank: nothing to do
    (0.0, 0.0, 0.0)
    >>> coefficients("torus", 8, 1024, (2, 2, 2))  # three dimensions of 2: 6 messages, 1792 bytes
    (6.0, 1792.0, 896.0)
    """
    if P <= 1 or nbytes <= 0:
        return 0.0, 0.0, 0.0
    n = float(nbytes)
    lg = math.ceil(math.log2(P))
    p2 = 1 << (P.bit_length() - 1)
    l2 = p2.bit_length() - 1
    fold = (2.0, 2 * n, n) if p2 != P else (0.0, 0.0, 0.0)  # non-power-of-two pre and post steps
    if algorithm == "ring":
        return 2.0 * (P - 1), 2 * (P - 1) / P * n, (P - 1) / P * n
    if algorithm == "tree":
        return 2.0 * lg, 2 * lg * n, lg * n
    if algorithm == "recursive_doubling":
        return l2 + fold[0], l2 * n + fold[1], l2 * n + fold[2]
    if algorithm == "rabenseifner":
        return 2.0 * l2 + fold[0], 2 * (p2 - 1) / p2 * n + fold[1], (p2 - 1) / p2 * n + fold[2]
    if algorithm == "2d":
        R, C = grid or square_grid(P)
        m = n / C
        return (2.0 * (C - 1) + 2.0 * (R - 1), 2 * (C - 1) / C * n + 2 * (R - 1) / R * m,
                (C - 1) / C * n + (R - 1) / R * m)
    if algorithm == "torus":
        dims = tuple(grid) if grid else (P,)
        alpha = beta = gamma = 0.0
        for d in reversed(dims):  # the block entering each dimension, last dimension first
            alpha, beta, gamma = alpha + 2.0 * (d - 1), beta + 2 * (d - 1) / d * n, gamma + (d - 1) / d * n
            n /= d
        return alpha, beta, gamma
    if algorithm == "mpi":
        return min(coefficients("recursive_doubling", P, n), coefficients("rabenseifner", P, n),
                   key=lambda abc: abc[0] * 1e-6 + abc[1] * 1e-10 + abc[2] * 1e-10)
    raise ValueError(f"unknown algorithm {algorithm!r} for the cost model: expected one of {', '.join(MODELLED)}")


def predict(algorithm, P, nbytes, params, grid=None):
    """Return the modelled all-reduce time in seconds.

    Parameters
    ----------
    algorithm, P, nbytes, grid
        As for :func:`coefficients`.
    params : dict
        ``alpha`` (s), ``beta`` (s/byte), ``gamma`` (s/byte).

    Returns
    -------
    float

    Examples
    --------
    >>> params = {"alpha": 1e-6, "beta": 1e-9, "gamma": 0.0}
    >>> round(predict("ring", 4, 10**6, params), 9)  # 6 alpha + 1.5e6 beta
    0.001506
    >>> predict("recursive_doubling", 4, 10**6, params) > predict("ring", 4, 10**6, params)
    True
    """
    a, b, c = coefficients(algorithm, P, nbytes, grid)
    return a * params["alpha"] + b * params["beta"] + c * params["gamma"]


def fit(rows, min_bytes=0):
    """Fit alpha, beta and gamma to measured all-reduce times by least squares on relative error.

    Each row contributes ``a alpha + b beta + c gamma = t`` scaled by ``1 / t``, so small and large
    messages weigh alike. Negative estimates are set to 0 and the rest refitted (non-negative least
    squares by elimination).

    Parameters
    ----------
    rows : iterable of dict
        Keys ``algorithm`` (one of :data:`MODELLED`), ``P``, ``bytes``, ``time_s``; optional ``op``
        (rows whose op is not "allreduce" are skipped).
    min_bytes : int
        Ignore rows with fewer bytes.

    Returns
    -------
    dict
        ``alpha``, ``beta``, ``gamma`` (seconds, seconds/byte), and ``rows`` used.

    Raises
    ------
    ValueError
        Fewer than three usable rows.

    Examples
    --------
    Times made by the model itself give its parameters back:

    >>> import math
    >>> true = {"alpha": 2e-6, "beta": 1e-9, "gamma": 5e-10}
    >>> rows = [{"algorithm": a, "P": 4, "bytes": n, "time_s": predict(a, 4, n, true)}
    ...         for a in ("ring", "recursive_doubling") for n in (1e3, 1e6)]
    >>> got = fit(rows)
    >>> got["rows"], all(math.isclose(got[k], true[k], rel_tol=1e-6) for k in true)
    (4, True)
    """
    A, t = [], []
    for r in rows:
        if r.get("collective", "allreduce") != "allreduce" or r["algorithm"] not in MODELLED or r["P"] < 2:
            continue
        if r["bytes"] < min_bytes or not r["time_s"] > 0:
            continue
        A.append(coefficients(r["algorithm"], int(r["P"]), float(r["bytes"])))
        t.append(float(r["time_s"]))
    if len(A) < 3:
        raise ValueError(f"need at least 3 all-reduce rows with P >= 2 to fit alpha, beta, gamma; got {len(A)}")
    A, t = numpy.array(A), numpy.array(t)
    Aw, ones = A / t[:, None], numpy.ones(len(t))
    active = [0, 1, 2]
    while True:
        sol = numpy.zeros(3)
        sol[active] = numpy.linalg.lstsq(Aw[:, active], ones, rcond=None)[0]
        if (sol >= 0).all() or len(active) == 1:
            break
        active.remove(int(numpy.argmin(numpy.where(numpy.isin(range(3), active), sol, numpy.inf))))
    sol = numpy.maximum(sol, 0.0)
    return {"alpha": float(sol[0]), "beta": float(sol[1]), "gamma": float(sol[2]), "rows": len(t)}


@dataclass
class Topology:
    """A two-level machine: nodes of ``ranks_per_node`` ranks (rank r on node ``r // ranks_per_node``).

    Examples
    --------
    >>> topo = Topology(ranks_per_node=2, alpha_intra=1.0, alpha_inter=3.0)
    >>> topo.link(0, [1, 2], 0).tolist()  # rank 1 shares rank 0's node, rank 2 does not
    [1.0, 3.0]
    >>> Topology(ranks_per_node=0)
    Traceback (most recent call last):
    ...
    ValueError: ranks_per_node=0 must be >= 1
    """

    ranks_per_node: int = 8  # ranks on one node
    alpha_intra: float = 1e-6  # seconds per message inside a node
    beta_intra: float = 1 / 20e9  # seconds per byte inside a node (20 GB/s)
    alpha_inter: float = 5e-6  # seconds per message between nodes
    beta_inter: float = 1 / 12.5e9  # seconds per byte between nodes (100 Gb/s)
    gamma: float = 1 / 10e9  # seconds per byte reduced (10 GB/s)

    def __post_init__(self):
        if self.ranks_per_node < 1:
            raise ValueError(f"ranks_per_node={self.ranks_per_node} must be >= 1")
        for name in ("alpha_intra", "beta_intra", "alpha_inter", "beta_inter", "gamma"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")

    def link(self, src, dst, nbytes):
        """Return the seconds a message of ``nbytes`` takes from ``src`` to ``dst`` (arrays allowed)."""
        same = numpy.asarray(src) // self.ranks_per_node == numpy.asarray(dst) // self.ranks_per_node
        return numpy.where(same, self.alpha_intra + nbytes * self.beta_intra,
                           self.alpha_inter + nbytes * self.beta_inter)


def _ring_phase(groups, bounds, reduce, shift):
    """Yield lockstep rounds ``(send_peer, send_n, recv_peer, recv_n, reduce)`` of a ring phase.

    ``groups`` (g, n) holds communicator ranks; ``bounds`` (g, n + 1) their block boundaries. With
    ``shift = 1`` (reduce-scatter) member i sends block (i - s - 1) mod n, else block (i - s) mod n.
    """
    g, n = groups.shape
    sizes = numpy.diff(bounds, axis=1)  # (g, n) block sizes
    right, left = numpy.roll(groups, -1, axis=1), numpy.roll(groups, 1, axis=1)
    twice = numpy.concatenate([sizes, sizes], axis=1)
    for s in range(n - 1):
        # member i sends block (i - s - shift) mod n and receives block (i - s - shift - 1) mod n
        k, j = (-s - shift) % n, (-s - shift - 1) % n
        yield groups, right, twice[:, k:k + n], left, twice[:, j:j + n], reduce


def ring_tables(algorithm, P, count, grid=None):
    """Yield the lockstep rounds of ``ring`` or ``2d`` all-reduce for every rank at once.

    Each item is ``(ranks, send_peer, send_n, recv_peer, recv_n, reduce)`` with arrays of equal shape:
    in that round ``ranks[i]`` sends ``send_n[i]`` elements to ``send_peer[i]`` and receives
    ``recv_n[i]`` from ``recv_peer[i]``. These are the rounds of :func:`collectives.schedules.ring.ring_allreduce`
    and :func:`collectives.schedules.torus.torus_allreduce`, generated without building P schedules.

    Examples
    --------
    >>> rounds = list(ring_tables("ring", 4, 10))
    >>> len(rounds)  # 2 (P - 1)
    6
    >>> ranks, send_peer, send_n, recv_peer, recv_n, reduce = rounds[0]
    >>> send_peer.tolist(), send_n.tolist(), reduce
    ([[1, 2, 3, 0]], [[2, 3, 3, 2]], True)
    """
    if algorithm == "ring":
        groups = numpy.arange(P)[None, :]
        b = numpy.array(chunk_bounds(count, P))[None, :]
        yield from _ring_phase(groups, b, True, 1)
        yield from _ring_phase(groups, b, False, 0)
        return
    R, C = grid or square_grid(P)
    rows = numpy.arange(P).reshape(R, C)
    b = numpy.array(chunk_bounds(count, C))
    row_b = numpy.repeat(b[None, :], R, axis=0)
    col_b = numpy.array([[b[c] + x for x in chunk_bounds(int(b[c + 1] - b[c]), R)] for c in range(C)])
    yield from _ring_phase(rows, row_b, True, 1)
    yield from _ring_phase(rows.T.copy(), col_b, True, 1)
    yield from _ring_phase(rows.T.copy(), col_b, False, 0)
    yield from _ring_phase(rows, row_b, False, 0)


def simulate(algorithm, P, nbytes, topo=None, itemsize=4, grid=None):
    """Replay an all-reduce's schedules on ``topo`` and return the slowest rank's finish time (s).

    A round on rank r posts its send at its clock ``T[r]``, receives a message that left its sender
    at ``T[src]`` and arrives ``link(src, r)`` later, then spends ``n gamma`` reducing it:
    ``T[r] = max(T[r] + link(r, dst), T[src] + link(src, r)) + reduce``.

    Parameters
    ----------
    algorithm : str
        ``ring``, ``tree``, ``recursive_doubling``, ``rabenseifner`` or ``2d``.
    P : int
        Number of ranks.
    nbytes : int
        Message size in bytes (``nbytes // itemsize`` elements).
    topo : Topology, optional
        Default ``Topology()``.
    itemsize : int
        Bytes per element.
    grid : (int, int), optional
        For ``2d``; default (nodes, ranks_per_node) when P fills whole nodes, else the squarest grid.

    Returns
    -------
    float

    Examples
    --------
    On one node the ring's replay takes the time the model predicts:

    >>> import math
    >>> topo = Topology(ranks_per_node=8)
    >>> params = {"alpha": topo.alpha_intra, "beta": topo.beta_intra, "gamma": topo.gamma}
    >>> math.isclose(simulate("ring", 4, 1 << 20, topo), predict("ring", 4, 1 << 20, params))
    True
    >>> simulate("ring", 16, 1 << 20, topo) > simulate("2d", 16, 1 << 20, topo)  # two nodes
    True
    """
    topo = topo or Topology()
    count = int(nbytes) // itemsize
    if algorithm == "2d" and grid is None:
        rpn = topo.ranks_per_node
        grid = (P // rpn, rpn) if P % rpn == 0 and P > rpn else square_grid(P)
    if algorithm in ("ring", "2d"):
        T = numpy.zeros(P)
        links = {}
        for ranks, sp, sn, rp, rn, red in ring_tables(algorithm, P, count, grid):
            key = (id(ranks), red)  # peers are fixed within a phase: cache its per-link alpha and beta
            if key not in links:
                r, s_, p_ = ranks.ravel(), sp.ravel(), rp.ravel()
                links[key] = (r, p_, topo.link(r, s_, 0.0), topo.link(r, s_, 1.0) - topo.link(r, s_, 0.0),
                              topo.link(p_, r, 0.0), topo.link(p_, r, 1.0) - topo.link(p_, r, 0.0), ranks)
            r, p_, a_s, b_s, a_r, b_r, _ = links[key]
            sbytes, rbytes = sn.ravel() * itemsize, rn.ravel() * itemsize
            # zero-element messages are never sent (see Round), so they cost nothing and wait for nothing
            send_done = T[r] + numpy.where(sbytes > 0, a_s + sbytes * b_s, 0.0)
            arrive = numpy.where(rbytes > 0, T[p_] + a_r + rbytes * b_r, -numpy.inf)
            done = numpy.maximum(send_done, arrive)
            if red:
                done += rbytes * topo.gamma
            T[r] = done
        return float(T.max())
    scheds = [build_allreduce_schedule(algorithm, r, P, count, grid) for r in range(P)]

    rpn = topo.ranks_per_node
    intra, inter = (topo.alpha_intra, topo.beta_intra * itemsize), (topo.alpha_inter, topo.beta_inter * itemsize)

    def cost(src, dst, n):
        a, b = intra if src // rpn == dst // rpn else inter
        return a + n * b, a + n * b

    out = replay(scheds, cost=cost, reduce_cost=lambda n: n * itemsize * topo.gamma)
    return max(out["clock"])
