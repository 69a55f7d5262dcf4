"""Load balancing across replicas: round-robin, least-outstanding-requests, power of two choices.

- ``round-robin``: replicas in turn, blind to their load;
- ``least-outstanding``: the replica with the fewest requests sent and not yet answered (ties: the
  lowest index), the "least connections" rule of load balancers such as NGINX and Envoy;
- ``power-of-two``: two distinct replicas drawn at random, the less loaded of them (Mitzenmacher,
  "The Power of Two Choices in Randomized Load Balancing", IEEE TPDS 12(10), 2001): nearly the
  balance of least-outstanding while looking at only two queues.

Removed replicas (failed) are never chosen again.
"""
import numpy

__all__ = ["POLICIES", "Balancer"]

#: Balancing policy names.
POLICIES = ("round-robin", "least-outstanding", "power-of-two")


class Balancer:
    """Choose a replica for each batch and track requests outstanding per replica.

    Parameters
    ----------
    policy : str
        One of :data:`POLICIES`.
    n_replicas : int
        Number of replicas, >= 1.
    seed : int
        Seed of the power-of-two draws.

    Attributes
    ----------
    outstanding : ndarray, shape (n_replicas,), int64
        Requests sent to each replica and not yet answered.
    alive : ndarray, shape (n_replicas,), bool

    Raises
    ------
    ValueError
        Unknown ``policy`` or ``n_replicas < 1``.
    """

    __slots__ = ("policy", "outstanding", "alive", "_next", "_rng")

    def __init__(self, policy, n_replicas, seed=0):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if n_replicas < 1:
            raise ValueError(f"n_replicas must be >= 1, got {n_replicas!r}")
        self.policy = policy
        self.outstanding = numpy.zeros(n_replicas, numpy.int64)
        self.alive = numpy.ones(n_replicas, bool)
        self._next, self._rng = 0, numpy.random.default_rng(seed)

    def any_alive(self):
        """Return whether any replica is left."""
        return bool(self.alive.any())

    def choose(self, room=None):
        """Return the index of the replica for the next batch, or None when it must wait.

        Parameters
        ----------
        room : ndarray, shape (n_replicas,), bool, optional
            Replicas that can take a batch now (default: all). Round-robin keeps its turn: when the
            replica whose turn it is has no room, it returns None (the batch waits for it); the other
            policies choose among the replicas with room, None when there is none.

        Raises
        ------
        RuntimeError
            When every replica has been removed.
        """
        live = numpy.flatnonzero(self.alive)
        if live.size == 0:
            raise RuntimeError("no replica left")
        if self.policy == "round-robin":
            n = self.alive.size
            while not self.alive[self._next % n]:
                self._next += 1
            pick = self._next % n
            if room is not None and not room[pick]:
                return None
            self._next += 1
            return int(pick)
        if room is not None:
            live = live[room[live]]
            if live.size == 0:
                return None
        if self.policy == "least-outstanding" or live.size == 1:
            return int(live[numpy.argmin(self.outstanding[live])])
        a, b = self._rng.choice(live, 2, replace=False)
        return int(a if self.outstanding[a] <= self.outstanding[b] else b)

    def sent(self, replica, n):
        """Record ``n`` requests sent to ``replica``."""
        self.outstanding[replica] += n

    def done(self, replica, n):
        """Record ``n`` requests of ``replica`` answered (or taken back)."""
        self.outstanding[replica] -= n

    def remove(self, replica):
        """Stop choosing ``replica`` (it failed)."""
        self.alive[replica] = False
