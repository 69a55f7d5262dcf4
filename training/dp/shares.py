"""Batch shares of data-parallel training: any global batch over any number of ranks, and ``--balance``.

Each step's global batch (:meth:`training.data.sampling.DistributedSampler.global_batches`, the same
samples for every P) is dealt to the ranks in *shares* (:func:`training.data.sampling.deal`), and each
rank's gradient, the mean over its ``b_r`` samples, is weighted by ``P b_r / B`` before the
all-reduce's average (``train_step``'s ``scale``), so the average is the mean gradient over the global
batch, ``sum_r b_r g_r / B``, whatever the shares: the update equals, to float rounding, the one
of a single process on the same batch. Equal shares give the weight 1.0 exactly.

Without ``--balance`` the shares are the equal split of B (64 over 3: 22, 21, 21). With
``--balance`` (LB-BSP: Chen et al., "Semi-dynamic load balancing: efficient distributed learning in
non-dedicated environments", SoCC 2020, section 4) every ``--balance-every`` K steps each rank's
measured seconds per sample (its forward and backward, and the delay ``--straggler`` injects, up to
the step's first collective: :func:`window_estimate`, the median over its steps since the shares last
changed, at most the last :data:`HISTORY`, or over the last K steps alone when their median is
more than :data:`CHANGE` times faster or slower than that) are all-gathered, and B is split anew
in proportion to the ranks' speeds (samples per second), by the largest-remainder rule of
:func:`ps.shards.key_ranges.proportional`: at least one sample each, at most the rank's memory bound
(:func:`share_cap`). The new split is taken only when it shortens the predicted step,
``max_r b_r t_r`` (``t_r`` seconds per sample), by at least ``--balance-gain`` (a fraction): ranks
whose measured speeds differ by less than that, by noise, keep their shares, and such a run is
bitwise the run without ``--balance`` (ranks that really differ in speed, even without
``--straggler``, get shares that differ). While the shares hold, each gather's figure is
the median of more steps, so noise that a K-step median lets through (on a 2-core host, +-10 % at K
= 2) does not move the shares back and forth; a new share starts a new window (a step's fixed part
makes the seconds per sample depend on the share). A rank whose speed changes by a factor of more
than :data:`CHANGE` is followed at the first gather whose K steps are at least half at the new
speed: the next one, K steps on, when the change comes at a gather; at most 2K - 1 steps after it.

The shares are part of a checkpoint (``balance/shares``), so ``--resume`` continues with them.
"""
import numpy

import collectives
from ps.shards.key_ranges import proportional
from training.data.sampling import deal

__all__ = ["BatchShares", "HISTORY", "CHANGE", "window_estimate", "share_cap", "memory_cap", "bytes_per_sample",
           "steps_per_epoch", "rank_batches"]

#: Most steps a rank's window of seconds per sample holds (:meth:`BatchShares.update`).
HISTORY = 64
#: Factor between the last K steps' median and the window's (either way: slower or faster) above which
#: the window restarts from those K steps: the rank's speed changed (a straggler moved, another job
#: took its core, or left it), not noise.
CHANGE = 1.25

#: Algorithm of the speeds' all-gather (an all-reduce of a P-vector holding one rank's entry each): a
#: hand-made one, so that a timeout names the silent peer.
_GATHER_ALGORITHM = "recursive_doubling"


def bytes_per_sample(n_features, hidden, n_classes, itemsize):
    """Return the bytes one sample of a rank's batch holds during an MLP's step (an estimate).

    The batch's rows (``n_features``), and per layer of width ``w`` its pre-activation, its output,
    the gradient flowing back and the activation's mask or derivative (4 ``w``; the output layer's
    logits, probabilities and their gradient, 3 ``n_classes``).

    Examples
    --------
    >>> bytes_per_sample(64, (128,), 10, 4)   # (64 + 4 x 128 + 3 x 10) x 4 bytes
    2424
    """
    return int(itemsize) * (int(n_features) + 4 * sum(int(h) for h in hidden) + 3 * int(n_classes))


def share_cap(memory_gb, fixed_bytes, per_sample):
    """Return the most samples a rank's share may hold within ``memory_gb`` GiB (None: no bound).

    Parameters
    ----------
    memory_gb : float
        ``--memory-gb``: GiB a rank may use (0: no bound).
    fixed_bytes : int
        Bytes the rank holds whatever its share: the data set, the parameters, their gradient and
        the optimizer's state.
    per_sample : int
        Bytes per sample of the share (:func:`bytes_per_sample`).

    Returns
    -------
    int or None

    Raises
    ------
    ValueError
        When the bound leaves less than one sample.

    Examples
    --------
    >>> share_cap(0, 10 ** 6, 2424) is None
    True
    >>> share_cap(0.001, 0, 2424)      # 0.001 GiB / 2424 bytes
    442
    """
    if not memory_gb:
        return None
    cap = int((memory_gb * 2 ** 30 - fixed_bytes) // per_sample)
    if cap < 1:
        raise ValueError(f"--memory-gb {memory_gb:g}: a rank needs {fixed_bytes / 2 ** 30:.3f} GiB for the data, "
                         f"parameters, gradient and optimizer state plus {per_sample} bytes per sample of its "
                         "batch; that leaves it no sample (raise --memory-gb)")
    return cap


def memory_cap(cfg, ds, model, state_bytes=0):
    """Return the largest batch share ``--memory-gb`` allows a rank of ``cfg``'s run (None: no bound).

    :func:`share_cap` of the rank's fixed bytes (the data set in the model's dtype, the parameters,
    their gradient and ``state_bytes`` of optimizer state) and :func:`bytes_per_sample` of the MLP.

    Parameters
    ----------
    cfg : training.settings.config.Config
    ds : training.data.datasets.Dataset
    model : training.model.nn.Sequential
    state_bytes : int
        Bytes of optimizer state the rank holds (0 for a parameter-server worker).

    Raises
    ------
    ValueError
        When the bound leaves less than one sample.

    Examples
    --------
    >>> from training.runtime.build import build_model
    >>> from training.settings.config import Config
    >>> from training.data.datasets import load_dataset
    >>> cfg = Config(hidden=(16,), memory_gb=0.01)   # 10 MiB less the data and model, over 632 bytes a sample
    >>> ds = load_dataset(cfg)
    >>> memory_cap(cfg, ds, build_model(cfg, ds.n_features, ds.n_classes))
    16246
    """
    item = model.params.dtype.itemsize
    fixed = model.params.nbytes + model.grads.nbytes + (ds.x_train.size + ds.x_test.size) * item + int(state_bytes)
    return share_cap(cfg.memory_gb, fixed, bytes_per_sample(ds.n_features, cfg.hidden, ds.n_classes, item))


def window_estimate(window, fresh):
    """Return a rank's seconds per sample from its window, and the window to keep.

    The median of ``window`` (its steps since the shares last changed), unless the median of the last
    ``fresh`` of them (the steps since the last gather) is more than :data:`CHANGE` times larger or
    smaller: the rank's speed changed, and the window restarts from those steps.

    Parameters
    ----------
    window : list of float
        Seconds per sample of each step, oldest first.
    fresh : int
        How many of them came after the last gather (0 to ``len(window)``).

    Returns
    -------
    (float, list of float)
        The figure (0.0 for an empty window) and the window to keep.

    Examples
    --------
    >>> window_estimate([1.0, 1.1, 0.9, 1.05], 2)    # the last two steps are noise: the median of all four
    (1.025, [1.0, 1.1, 0.9, 1.05])
    >>> window_estimate([1.0, 1.1, 2.0, 2.1], 2)     # twice as slow since the last gather: those steps alone
    (2.05, [2.0, 2.1])
    >>> window_estimate([1.0] * 6 + [0.77] * 2, 2)    # 1.3x faster: followed as a slowdown would be
    (0.77, [0.77, 0.77])
    """
    if not window:
        return 0.0, window
    whole = float(numpy.median(window))
    recent = float(numpy.median(window[-fresh:])) if fresh else whole
    if recent > CHANGE * whole or recent * CHANGE < whole:
        return recent, window[-fresh:]
    return whole, window


def steps_per_epoch(sampler, batch):
    """Return the steps of one epoch of global batch ``batch`` with ``sampler`` (any rank's: all agree).

    :class:`training.data.sampling.DistributedSampler`: its global batches; a skewed partition's
    :class:`training.data.shard_sampler.ShardSampler`: its own steps.

    Examples
    --------
    >>> from training.data.sampling import DistributedSampler
    >>> steps_per_epoch(DistributedSampler(1438, 0, 3), 64)   # 22 batches of 64, one of 30
    23
    """
    if hasattr(sampler, "global_batches"):
        return sampler.num_global_batches(batch)
    return sampler.num_batches(sampler.local_batch)


def rank_batches(sampler, epoch, shares, rank):
    """Yield this rank's ``(indices, weight)`` for each step of ``epoch``.

    With a :class:`training.data.sampling.DistributedSampler`, step ``k`` takes global batch ``k``
    (:meth:`~training.data.sampling.DistributedSampler.global_batches`), splits it by the shares current
    when the step starts (:meth:`BatchShares.split`; read lazily, so a re-split between two steps
    applies to the next) and deals it (:func:`training.data.sampling.deal`). A skewed partition's
    :class:`~training.data.shard_sampler.ShardSampler` draws the rank's equal share from its own shard.
    ``weight`` is :meth:`BatchShares.scale`: ``P b_r / B`` (1.0 for equal shares).

    Examples
    --------
    >>> from training.data.sampling import DistributedSampler
    >>> s = BatchShares(3, 4)
    >>> [(b.tolist(), w) for b, w in rank_batches(DistributedSampler(10, 0, 3, shuffle=False), 0, s, 0)]
    [([0, 3], 1.5), ([4, 7], 1.5), ([8], 1.0)]
    """
    if not hasattr(sampler, "global_batches"):
        weight = shares.scale(shares.shares, rank)
        for idx in sampler.batches(epoch, sampler.local_batch):
            yield idx, weight
        return
    for batch in sampler.global_batches(epoch, shares.batch):
        split = shares.split(len(batch))
        yield deal(batch, split)[rank], shares.scale(split, rank)


class BatchShares:
    """The samples each rank takes of every global batch, re-split by measured speed under ``--balance``.

    Collective in :meth:`update` (every rank calls it at the same steps).

    Parameters
    ----------
    size : int
        P, the ranks.
    batch : int
        Global batch B (samples), >= P.
    every : int
        K >= 1: steps between two gathers of the speeds (``--balance-every``).
    cap : int, optional
        Largest share of one rank (:func:`share_cap`; None: no bound).
    gain : float
        Smallest fraction of the predicted step time a new split must save to be taken (``--balance-gain``).
    balance : bool
        Re-split by speed (``--balance``); False: the equal split, always.

    Attributes
    ----------
    shares : ndarray, shape (P,), int64
        Current samples per rank of a full global batch (sum B).
    moves : int
        Times the shares changed.
    last : dict
        The last gather's ``seconds_per_sample`` (per rank), ``ideal_s`` (B over the summed speeds)
        and ``predicted_s`` (the step the shares then taken predict), seconds; empty before the first.

    Raises
    ------
    ValueError
        When B < P, K < 1, ``gain`` is outside [0, 1), or B does not fit P ranks of ``cap`` samples.

    Examples
    --------
    >>> s = BatchShares(3, 64)
    >>> s.shares.tolist(), s.split(10).tolist(), s.scale(s.shares, 1)   # 64 over 3; a last batch of 10
    ([22, 21, 21], [4, 3, 3], 0.984375)
    >>> s = BatchShares(2, 100, balance=True)
    >>> s.decide(numpy.array([1e-3, 2e-3])).tolist()     # rank 1 twice as slow: 67/33 (step 67 ms, was 100 ms)
    [67, 33]
    >>> s.decide(numpy.array([1.00e-3, 1.04e-3])).tolist()   # 51/49 would save 2 %: below the 5 % gain, kept
    [50, 50]
    """

    __slots__ = ("size", "batch", "every", "cap", "gain", "balance", "shares", "moves", "last", "_window", "_fresh")

    def __init__(self, size, batch, *, every=10, cap=None, gain=0.05, balance=False):
        if not (isinstance(every, int) and every >= 1):
            raise ValueError(f"balance_every must be an integer >= 1 (steps), got {every!r}")
        if not 0 <= gain < 1:
            raise ValueError(f"balance_gain must be in [0, 1), got {gain!r}")
        if batch < size:
            raise ValueError(f"the global batch ({batch}) is smaller than the number of ranks ({size}): every rank "
                             "needs at least one sample of each batch (raise --batch-size or use fewer ranks)")
        self.size, self.batch, self.every, self.cap = int(size), int(batch), every, cap
        self.gain, self.balance = float(gain), bool(balance)
        self.shares = proportional(numpy.ones(self.size), self.batch, cap)  # ValueError when B > P x cap
        self.moves, self.last = 0, {}
        self._window = []  # this rank's seconds per sample of each step since the shares last changed
        self._fresh = 0  # how many of them came after the last gather

    def split(self, m):
        """Return the shares of a global batch of ``m`` samples (the current ones for a full batch).

        A shorter batch (an epoch's last) is split in proportion to the current shares, by the same
        rule.
        """
        if m == self.batch:
            return self.shares
        return proportional(self.shares.astype(numpy.float64), m, self.cap)

    def scale(self, shares, rank):
        """Return rank ``rank``'s gradient weight ``P b_r / sum b``: the all-reduce's average is then the batch mean."""
        return self.size * int(shares[rank]) / int(shares.sum())

    def observe(self, seconds, samples):
        """Add one step of this rank: ``seconds`` to reach the step's collective with ``samples`` samples."""
        if self.balance and samples > 0:
            self._window = self._window[-(HISTORY - 1):] + [float(seconds) / int(samples)]
            self._fresh += 1

    def due(self, step):
        """Return True when the speeds are gathered after the run's step ``step`` (1-based)."""
        return self.balance and step % self.every == 0

    def update(self, comm, timeout=None):
        """Gather every rank's seconds per sample since the last call and re-split (collective).

        A rank's figure is :func:`window_estimate` of its window: a median, so a step the host
        descheduled the rank for counts as one step, not as its seconds.

        Returns
        -------
        bool
            True when the shares changed (the same on every rank: each holds the same gathered figures).

        Raises
        ------
        collectives.CollectiveTimeout
            When a peer does not answer within ``timeout`` seconds.
        """
        per = numpy.zeros(self.size)
        per[comm.Get_rank()], self._window = window_estimate(self._window, self._fresh)
        collectives.allreduce(per, comm=comm, op="sum", algorithm=_GATHER_ALGORITHM, out=per, timeout=timeout)
        # one entry per rank, the others 0: every rank sums the same
        new = self.decide(per)
        changed = not numpy.array_equal(new, self.shares)
        self.shares = new
        self.moves += int(changed)
        if changed:  # a new share has seconds per sample of its own (the step's fixed part)
            self._window = []
        self._fresh = 0
        return changed

    def decide(self, per_sample):
        """Return the shares to take given each rank's measured ``per_sample`` seconds per sample (pure).

        The split in proportion to the speeds ``1 / per_sample`` (:func:`ps.shards.key_ranges.proportional`,
        within ``cap``), when it shortens the predicted step ``max_r b_r t_r`` by at least ``gain``;
        else the current shares. A rank that measured nothing (0) counts at the others' mean.
        """
        per = numpy.asarray(per_sample, numpy.float64)
        known = per > 0
        if not known.any():
            return self.shares
        per = numpy.where(known, per, per[known].mean())
        new = proportional(1.0 / per, self.batch, self.cap)
        now, then = float((self.shares * per).max()), float((new * per).max())
        keep = not then <= (1.0 - self.gain) * now
        self.last = {"seconds_per_sample": per.tolist(), "ideal_s": self.batch / float((1.0 / per).sum()),
                     "predicted_s": now if keep else then}
        return self.shares if keep else new

    def state_dict(self):
        """Return the shares as checkpoint entries (``balance/shares``, ``balance/moves``)."""
        return {"balance/shares": self.shares.copy(), "balance/moves": numpy.array(self.moves, numpy.int64)}

    def load_state_dict(self, d):
        """Restore the shares of :meth:`state_dict`; return False when they do not fit this job.

        A checkpoint without shares, or with shares of another job (another P or global batch, or a
        share above this run's memory bound), leaves the equal split (False).

        Raises
        ------
        ValueError
            When the saved shares are not whole numbers >= 1 (a tampered file).
        """
        if "balance/shares" not in d:
            return False
        v = numpy.asarray(d["balance/shares"])
        if v.ndim != 1 or v.dtype.kind not in "iu" or (v.size and v.min() < 1):
            raise ValueError(f"entry balance/shares = {v.tolist()!r} is not a list of sample counts >= 1")
        if v.shape != (self.size,) or int(v.sum()) != self.batch or (self.cap is not None and v.max() > self.cap):
            return False
        self.shares = v.astype(numpy.int64)
        self.moves = int(numpy.asarray(d.get("balance/moves", 0)))
        return True
