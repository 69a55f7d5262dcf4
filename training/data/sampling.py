"""Distributed sampling: each rank's share of every epoch, and of the evaluation set.

:class:`DistributedSampler` has the semantics of PyTorch's ``torch.utils.data.DistributedSampler``
(one shared permutation per epoch, padding by wrapping around); :func:`eval_shard` gives each rank a
contiguous slice so that every sample is evaluated exactly once.

Global batches of any size over any number of ranks: :meth:`DistributedSampler.global_batches` cuts
one epoch's permutation into consecutive global batches of ``B`` samples (the same for every P),
and :func:`deal` hands each rank its share of one, in any sizes that sum to it (equal, or in
proportion to the ranks' speeds: :mod:`training.dp.shares`). Every sample is used once per epoch,
whatever the shares.
"""
import numpy

__all__ = ["DistributedSampler", "eval_shard", "deal"]


class DistributedSampler:
    """Split one epoch's sample order across P ranks, as PyTorch's ``DistributedSampler``.

    All ranks draw the same permutation of ``range(n)`` from ``seed + epoch`` (or keep the order
    when ``shuffle`` is off). Without ``drop_last`` the order is padded by wrapping around to a
    multiple of P; with ``drop_last`` the tail is cut to a multiple of P. Rank r takes positions
    r, r + P, r + 2P, ... so every rank gets the same number of samples. With shuffling off,
    n = 10 and P = 4 give ``[0 4 8] [1 5 9] [2 6 0] [3 7 1]``; with ``drop_last``
    ``[0 4] [1 5] [2 6] [3 7]``.

    Parameters
    ----------
    n : int
        Data set size (samples), >= 0.
    rank, size : int
        This rank and the number of ranks P.
    shuffle : bool
    seed : int
    drop_last : bool

    Examples
    --------
    >>> s = DistributedSampler(10, rank=2, size=4, shuffle=False)
    >>> s.indices(0).tolist(), len(s)  # padded by wrapping around
    ([2, 6, 0], 3)
    >>> [b.tolist() for b in s.batches(0, batch=2)]
    [[2, 6], [0]]
    >>> DistributedSampler(10, rank=2, size=4, shuffle=False, drop_last=True).indices(0).tolist()
    [2, 6]
    """

    def __init__(self, n, rank, size, shuffle=True, seed=0, drop_last=False):
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"rank must be in [0, size), got rank={rank}, size={size}")
        self.n, self.rank, self.size = int(n), int(rank), int(size)
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.total = (n // size) * size if drop_last else -(-n // size) * size
        self.num_samples = self.total // size  # samples per rank per epoch

    def indices(self, epoch):
        """Return this rank's sample indices for ``epoch``, int64 array of ``num_samples``."""
        if self.shuffle:
            order = numpy.random.default_rng(self.seed + epoch).permutation(self.n)
        else:
            order = numpy.arange(self.n)
        if self.n:
            order = numpy.resize(order, self.total)  # wraps around as often as needed
        return order[self.rank:self.total:self.size].astype(numpy.int64)

    def num_batches(self, batch):
        """Return the number of local batches of ``batch`` samples per epoch (last one partial)."""
        return -(-self.num_samples // batch)

    def batches(self, epoch, batch):
        """Yield this rank's index arrays of ``batch`` samples for ``epoch`` (the last may be short).

        Every rank yields the same number of batches of the same sizes, so local means averaged
        over ranks are exactly the global batch mean.
        """
        idx = self.indices(epoch)
        for lo in range(0, len(idx), batch):
            yield idx[lo:lo + batch]

    def epoch_order(self, epoch, batch):
        """Return one epoch's order of sample indices as global batches of ``batch`` samples take it.

        The epoch's permutation of ``range(n)`` (the one :meth:`indices` deals round-robin), cut into
        global batches of ``batch`` samples, the last one holding the rest. So that every rank gets
        at least one sample of every batch, a last batch of fewer than P samples is padded by
        wrapping around to P samples, or dropped with ``drop_last`` (which also cuts the epoch to a
        multiple of P, as :meth:`indices` does). The order does not depend on the shares.

        Parameters
        ----------
        epoch : int
        batch : int
            Global batch B (samples), >= P.

        Returns
        -------
        ndarray, shape (T,), int64
            ``n`` indices, plus the padding (at most P - 1) or less what ``drop_last`` cuts.

        Raises
        ------
        ValueError
            When ``batch`` is smaller than the number of ranks.

        Examples
        --------
        >>> DistributedSampler(10, rank=0, size=3, shuffle=False).epoch_order(0, 4).tolist()  # 4, 4, 2 -> 3
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0]
        """
        if batch < self.size:
            raise ValueError(f"the global batch ({batch}) is smaller than the number of ranks ({self.size}): "
                             "every rank needs at least one sample of each batch")
        if self.shuffle:
            order = numpy.random.default_rng(self.seed + epoch).permutation(self.n)
        else:
            order = numpy.arange(self.n)
        total = (self.n // self.size) * self.size if self.drop_last else self.n
        tail = total % batch
        if 0 < tail < self.size:
            total += -tail if self.drop_last else self.size - tail
        if self.n == 0:
            return order.astype(numpy.int64)
        return numpy.resize(order, total).astype(numpy.int64)

    def num_global_batches(self, batch):
        """Return the global batches of ``batch`` samples per epoch (:meth:`epoch_order`, the last partial).

        Examples
        --------
        >>> DistributedSampler(10, rank=0, size=3).num_global_batches(4)
        3
        """
        return -(-len(self.epoch_order(0, batch)) // batch) if self.n else 0

    def global_batches(self, epoch, batch):
        """Yield the epoch's global batches of ``batch`` samples (index arrays; the last may be shorter).

        Examples
        --------
        >>> [b.tolist() for b in DistributedSampler(10, rank=0, size=3, shuffle=False).global_batches(0, 4)]
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0]]
        """
        order = self.epoch_order(epoch, batch)
        for lo in range(0, len(order), batch):
            yield order[lo:lo + batch]

    def __len__(self):
        return self.num_samples


def deal(batch, shares):
    """Return each rank's samples of one global batch, ``shares[r]`` of them for rank ``r``.

    The batch's samples are dealt round-robin, like cards, to the ranks that still need one:
    position 0 to rank 0, 1 to rank 1, ..., and once a rank holds its share it is skipped. With
    equal shares of a batch that P divides, rank ``r`` gets positions ``r, r + P, r + 2P, ...``: the
    samples :meth:`DistributedSampler.batches` gives it, so equal shares reproduce it exactly.

    Parameters
    ----------
    batch : ndarray, shape (m,), int64
        One global batch (:meth:`DistributedSampler.global_batches`).
    shares : sequence of int, length P
        Samples per rank, each >= 0, summing to m.

    Returns
    -------
    list of ndarray, int64
        Rank ``r``'s indices, ``shares[r]`` of them, in batch order.

    Raises
    ------
    ValueError
        When the shares do not sum to the batch's size or one is negative.

    Examples
    --------
    >>> [p.tolist() for p in deal(numpy.arange(8), [2, 2, 2, 2])]
    [[0, 4], [1, 5], [2, 6], [3, 7]]
    >>> [p.tolist() for p in deal(numpy.arange(7), [2, 4, 1])]
    [[0, 3], [1, 4, 5, 6], [2]]
    """
    shares = numpy.asarray(shares, numpy.int64)
    if shares.ndim != 1 or (shares < 0).any() or int(shares.sum()) != len(batch):
        raise ValueError(f"shares {shares.tolist()} must be >= 0 and sum to the batch's {len(batch)} samples")
    rank = numpy.repeat(numpy.arange(shares.size), shares)               # (m,): the owner of each card...
    turn = numpy.concatenate([numpy.arange(k) for k in shares]) if shares.size else rank
    owner = rank[numpy.lexsort((rank, turn))]                            # ...in dealing order: turn, then rank
    return [batch[owner == r] for r in range(shares.size)]


def eval_shard(n, rank, size):
    """Return this rank's contiguous slice of ``range(n)``: each sample on exactly one rank.

    Shard sizes are ``numpy.array_split`` sizes (the first ``n % size`` ranks get one more).

    Examples
    --------
    >>> [eval_shard(10, r, 4) for r in range(4)]
    [slice(0, 3, None), slice(3, 6, None), slice(6, 8, None), slice(8, 10, None)]
    """
    base, extra = divmod(int(n), int(size))
    lo = rank * base + min(rank, extra)
    return slice(lo, lo + base + (rank < extra))
