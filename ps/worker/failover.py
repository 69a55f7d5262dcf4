"""A worker's view of the replicated shards: which replica is each shard's primary, at which epoch.

The replicas of a shard form a chain (:func:`ps.replicas.chain_replication.chains`). A worker starts with the first
replica of every chain as the shard's primary, at epoch 0. When the primary does not answer within the
worker's reply timeout, :meth:`Chains.fail_over` takes the next replica: the epoch becomes that
replica's position in the chain, so every worker that fails over to the same replica agrees on the
epoch without a message; the replicas before it count as gone (their late replies are dropped, and
sends to them are never waited for). An EPOCH message from a replica further down the chain
(:meth:`Chains.newer`) moves the worker there at once, without waiting out its own timeout. When a
chain has no replica left, the run cannot continue and every worker says so (Li et al., OSDI 2014,
section 4.3; van Renesse and Schneider, OSDI 2004).
"""
import time

from ps.wire.messages import PSError

__all__ = ["Chains"]


class Chains:
    """The shards' chains, each one's current primary and epoch, and the failovers made.

    Parameters
    ----------
    server_ranks : sequence of int, or sequence of sequence of int
        The server ranks, one per shard, or every shard's chain (primary first;
        :func:`ps.replicas.chain_replication.chains`). One rank per shard: nothing fails over.

    Attributes
    ----------
    heads : list of int
        The current primary of every shard (the rank requests go to).
    epochs : list of int
        The epoch of every shard: the position of its primary in its chain.
    gone : set of int
        Replicas given up (timed out, or before a newer primary).
    failovers : list of (float, int, int, int)
        ``(time.monotonic(), shard, old rank, new rank)`` of every change of primary.

    Examples
    --------
    >>> from ps.replicas.chain_replication import chains
    >>> c = Chains(chains([0, 1, 2, 3], 2))
    >>> c.heads, c.shard_of[3]
    ([0, 2], 1)
    >>> c.fail_over(2, worker=0, timeout=1.0)
    (1, 3)
    >>> c.heads, c.epochs, sorted(c.gone)
    ([0, 3], [0, 1], [2])
    >>> c.fail_over(3, worker=0, timeout=1.0)
    Traceback (most recent call last):
    ...
    ps.wire.messages.PSError: worker 0: every replica of shard 1 (server ranks [2, 3]) stopped answering (1 s each); the run cannot continue
    """

    def __init__(self, server_ranks):
        self.chains = [[int(r) for r in c] if hasattr(c, "__len__") else [int(c)] for c in server_ranks]
        self.heads = [c[0] for c in self.chains]
        self.epochs = [0] * len(self.chains)
        self.shard_of = {r: g for g, c in enumerate(self.chains) for r in c}
        self.gone, self.failovers = set(), []

    def fail_over(self, rank, *, worker, timeout):
        """Give up on primary ``rank``; return ``(shard, new primary)``.

        Raises
        ------
        PSError
            When ``rank`` was the last replica of its shard.
        """
        s = self.shard_of[rank]
        k = self.chains[s].index(rank) + 1
        if k >= len(self.chains[s]):
            self.gone.add(rank)
            raise PSError(f"worker {worker}: every replica of shard {s} (server ranks {self.chains[s]}) stopped "
                          f"answering ({timeout:g} s each); the run cannot continue")
        return s, self._take(s, k)

    def newer(self, rank):
        """Return the shard whose primary ``rank`` announces it is from a newer epoch, else None."""
        s = self.shard_of.get(rank)
        if s is None or self.chains[s].index(rank) <= self.epochs[s]:
            return None
        self._take(s, self.chains[s].index(rank))
        return s

    def stale(self, rank):
        """True for a replica that is not its shard's primary (its messages are dropped)."""
        return rank in self.shard_of and rank not in self.heads

    def _take(self, s, k):
        old, new = self.heads[s], self.chains[s][k]
        self.gone.update(self.chains[s][:k])
        self.heads[s], self.epochs[s] = new, k
        self.failovers.append((time.monotonic(), s, old, new))
        return new
