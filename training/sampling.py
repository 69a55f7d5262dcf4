"""Distributed sampling: each rank's share of every epoch, and of the evaluation set.

:class:`DistributedSampler` has the semantics of PyTorch's ``torch.utils.data.DistributedSampler``
(one shared permutation per epoch, padding by wrapping around); :func:`eval_shard` gives each rank a
contiguous slice so that every sample is evaluated exactly once.
"""
import numpy

__all__ = ["DistributedSampler", "eval_shard"]


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

    def __len__(self):
        return self.num_samples


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
