"""Each worker's batches from its own shard of a skewed partition, and the two remedies for skew.

:class:`ShardSampler` has the interface of :class:`training.data.sampling.DistributedSampler`
(``indices``, ``num_samples``, ``num_batches``, ``batches``), so the data-parallel and
parameter-server drivers use it unchanged. With unequal shards an epoch is ``ceil(N / B)`` steps
(N training samples, global batch B): every worker takes its B / W samples per step from its own shard
(the equal split of B when W does not divide it),
wrapping around it (a new seeded permutation each time round), so a small shard is seen several
times per epoch and a large one partly.

Remedies (both optional):

* class-balanced resampling: each local batch holds every class of the worker's data
  ``b // m`` or ``b // m + 1`` times (m classes present; which classes get the extra sample is
  drawn), each class's samples taken in a permuted order, wrapping around;
* a globally shared IID subset (Zhao et al., "Federated Learning with Non-IID Data", 2018,
  section 4): ``shared_fraction`` of the training set, drawn with the seed alone, is held by every
  worker in addition to its shard and sampled with it.
"""
import numpy

from ps.shards.key_ranges import proportional

__all__ = ["ShardSampler", "shared_subset"]

_STREAM = 0x5A3B1E  # second word of the sampler's seeds


def shared_subset(n, fraction, seed):
    """Return the sorted int64 indices of the shared IID subset: ``round(fraction * n)`` of ``range(n)``.

    Examples
    --------
    >>> shared_subset(100, 0.05, seed=0).size
    5
    """
    if not 0 <= fraction < 1:
        raise ValueError(f"shared_fraction must be in [0, 1), got {fraction!r}")
    rng = numpy.random.default_rng([seed, _STREAM, 1])
    return numpy.sort(rng.permutation(n)[:int(round(fraction * n))]).astype(numpy.int64)


class ShardSampler:
    """Per-epoch batches of one worker from its shard (plus the shared subset), optionally class-balanced.

    Parameters
    ----------
    shard : ndarray, int64
        The worker's sample indices (from :func:`training.data.partition.draw_partition`), non-empty.
    labels : ndarray, shape (N,), int
        Labels of the whole training set.
    rank, size : int
        Worker index and number of workers W.
    batch : int
        Global batch B (samples), >= W; the local batch is this worker's share of it, B / W when W
        divides B, else ``ps.shards.key_ranges.proportional``'s equal split (64 over 3: 22, 21, 21).
    seed : int
    shared : ndarray, int64, optional
        Indices every worker also holds (:func:`shared_subset`).
    balance : bool
        Class-balanced batches.

    Examples
    --------
    >>> labels = numpy.array([0] * 8 + [1] * 2)
    >>> s = ShardSampler(numpy.arange(10), labels, rank=0, size=1, batch=4, seed=0, balance=True)
    >>> len(s), s.num_batches(4)           # ceil(10 / 4) steps of 4 samples
    (12, 3)
    >>> [numpy.bincount(labels[b], minlength=2).tolist() for b in s.batches(0, 4)]
    [[2, 2], [2, 2], [2, 2]]
    """

    def __init__(self, shard, labels, rank, size, batch, seed=0, shared=None, balance=False):
        shard = numpy.asarray(shard, numpy.int64)
        if shard.size < 1:
            raise ValueError(f"worker {rank} holds no sample")
        if batch < size:
            raise ValueError(f"the global batch ({batch}) is smaller than the number of workers ({size}): "
                             "every worker needs at least one sample of each batch")
        if shared is not None and len(shared):
            shard = numpy.union1d(shard, numpy.asarray(shared, numpy.int64))
        self.shard, self.rank, self.size, self.seed, self.balance = shard, int(rank), int(size), int(seed), bool(balance)
        labels = numpy.asarray(labels)
        self.local_batch = int(proportional(numpy.ones(size), batch)[rank])
        self.steps = -(-labels.size // batch)  # an epoch: N / B steps, rounded up
        self.num_samples = self.steps * self.local_batch
        mine = labels[shard]
        self.classes = numpy.unique(mine)
        self.by_class = [shard[mine == c] for c in self.classes]

    def _rng(self, epoch):
        return numpy.random.default_rng([self.seed, _STREAM, epoch, self.rank])

    def indices(self, epoch):
        """Return this worker's ``num_samples`` int64 indices of ``epoch``, in batch order."""
        rng = self._rng(epoch)
        if not self.balance:
            return _wrapped(self.shard, self.num_samples, rng)
        b, m = self.local_batch, self.classes.size
        picks = []  # the class (position in self.classes) of every sample, batch by batch
        for _ in range(self.steps):
            extra = rng.permutation(m)[:b % m]
            counts = numpy.full(m, b // m) + numpy.isin(numpy.arange(m), extra)
            picks.append(rng.permutation(numpy.repeat(numpy.arange(m), counts)))
        picks = numpy.concatenate(picks)
        out = numpy.empty(picks.size, numpy.int64)
        for j, members in enumerate(self.by_class):
            where = numpy.flatnonzero(picks == j)
            out[where] = _wrapped(members, where.size, rng)
        return out

    def num_batches(self, batch):
        """Return the number of local batches of ``batch`` samples per epoch."""
        return -(-self.num_samples // batch)

    def batches(self, epoch, batch):
        """Yield this worker's index arrays of ``batch`` samples for ``epoch``."""
        idx = self.indices(epoch)
        for lo in range(0, idx.size, batch):
            yield idx[lo:lo + batch]

    def __len__(self):
        return self.num_samples


def _wrapped(members, count, rng):
    """Return ``count`` indices from permutations of ``members`` laid end to end."""
    if count == 0:
        return numpy.empty(0, numpy.int64)
    rounds = -(-count // members.size)
    return numpy.concatenate([rng.permutation(members) for _ in range(rounds)])[:count]
