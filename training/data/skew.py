"""A run's skewed data set-up from its configuration: the partition, each worker's sampler, the record.

Every rank draws the same partition from ``--seed`` (no communication) and keeps its own shard;
rank 0 logs each worker's size and label histogram and writes them to ``partition.json`` in the run
directory. :func:`check_skew` makes the same draw before anything is created, so a partition that
cannot be drawn fails on every rank with one message.
"""
import json
import os

import numpy

from commlab.logs import get_logger
from training.data.partition import draw_partition, label_histogram, parse_partition
from training.data.shard_sampler import ShardSampler, shared_subset

__all__ = ["uses_shards", "check_skew", "shard_sampler", "skew_record", "gradient_scale", "RECORD"]

RECORD = "partition.json"  #: file name of the partition's record in the run directory

_log = get_logger("training.data.skew")


def uses_shards(cfg):
    """Return True when ``cfg`` asks for per-worker shards (a skewed partition or a remedy).

    Examples
    --------
    >>> from training.settings.config import Config
    >>> uses_shards(Config()), uses_shards(Config(partition="classes:k=3")), uses_shards(Config(resample=True))
    (False, True, True)
    """
    return cfg.partition != "iid" or cfg.resample or cfg.shared_fraction > 0


def _draw(cfg, labels, n_classes, workers):
    return draw_partition(labels, workers, parse_partition(cfg.partition), cfg.seed, n_classes,
                          min_size=max(1, cfg.batch_size // workers))


def check_skew(cfg, labels, n_classes, workers):
    """Raise ``ValueError`` (naming the partition) when ``cfg``'s partition cannot be drawn for ``workers``.

    Examples
    --------
    >>> import numpy
    >>> from training.settings.config import Config
    >>> check_skew(Config(partition="classes:k=11", batch_size=4), numpy.arange(100) % 10, 10, 4)
    Traceback (most recent call last):
    ...
    ValueError: partition classes:k=11: k must be at most the number of classes (10)
    """
    if uses_shards(cfg):
        _draw(cfg, labels, n_classes, workers)


def skew_record(cfg, partition, labels, n_classes, shared):
    """Return the JSON-ready record of a partition: spec, seeds, redraws, sizes, label histograms, remedies.

    Examples
    --------
    >>> import numpy
    >>> from training.settings.config import Config
    >>> from training.data.partition import draw_partition
    >>> labels = numpy.arange(8) % 2
    >>> rec = skew_record(Config(partition="classes:k=1"), draw_partition(labels, 2, "classes:k=1", 0), labels, 2, [])
    >>> rec["sizes"], rec["label_histogram"]
    ([4, 4], [[0, 4], [4, 0]])
    """
    return {"partition": cfg.partition, "seed": cfg.seed, "seed_used": partition.seed,
            "redraws": partition.redraws, "workers": len(partition.shards), "sizes": partition.sizes,
            "label_histogram": label_histogram(labels, partition.shards, n_classes).tolist(),
            "resample": cfg.resample, "shared_fraction": cfg.shared_fraction, "shared_samples": int(len(shared))}


def shard_sampler(cfg, labels, n_classes, rank, workers, record_dir=None):
    """Return worker ``rank``'s :class:`training.data.shard_sampler.ShardSampler` of ``cfg``'s partition.

    Parameters
    ----------
    cfg : training.settings.config.Config
    labels : ndarray, shape (N,), int64
        Training labels.
    n_classes : int
    rank, workers : int
        Worker index and number of workers.
    record_dir : str, optional
        Where to write ``partition.json`` and whose rank logs the partition (rank 0's run directory).

    Returns
    -------
    training.data.shard_sampler.ShardSampler

    Raises
    ------
    ValueError
        When the partition cannot be drawn (:func:`training.data.partition.draw_partition`).

    Examples
    --------
    >>> import numpy
    >>> from training.settings.config import Config
    >>> cfg = Config(partition="classes:k=1", batch_size=20)
    >>> s = shard_sampler(cfg, numpy.arange(100) % 2, 2, rank=1, workers=2)
    >>> len(s), len(set((numpy.arange(100) % 2)[s.indices(0)]))  # 5 steps of 10 samples, one class
    (50, 1)
    """
    part = _draw(cfg, labels, n_classes, workers)
    shared = shared_subset(len(labels), cfg.shared_fraction, cfg.seed)
    if record_dir is not None:
        rec = skew_record(cfg, part, labels, n_classes, shared)
        if part.redraws:
            _log.warning("partition %s: seeds %d..%d left a worker with less than one batch of %d samples; "
                         "drawn with seed %d", cfg.partition, cfg.seed, part.seed - 1, cfg.batch_size // workers,
                         part.seed)
        _log.info("partition %s over %d workers (resample %s, shared subset %d samples):", cfg.partition, workers,
                  "on" if cfg.resample else "off", len(shared))
        for w, (size, hist) in enumerate(zip(rec["sizes"], rec["label_histogram"])):
            _log.info("  worker %d: %d samples, labels %s", w, size, hist)
        with open(os.path.join(record_dir, RECORD), "w", encoding="utf-8") as f:
            json.dump(rec, f, indent=1)
    return ShardSampler(part.shards[rank], labels, rank, workers, cfg.batch_size, cfg.seed, shared, cfg.resample)


def gradient_scale(cfg, labels, rank, workers):
    """Return worker ``rank``'s weight ``W n_w / sum_v n_v`` in the sample-weighted average of gradients.

    ``n_w`` is the number of samples worker ``w`` draws its batches from: its shard of ``cfg``'s
    partition (``labels``, the training labels, of classes ``0 .. labels.max()`` as
    :func:`training.runtime.build.make_sampler` takes them), with the shared subset when there is one. Every rank draws the same partition from
    the seed, so every rank knows every ``n_w`` without a message. A data-parallel step that scales
    each worker's mean gradient ``g_w`` by this weight before the plain average
    ((1/W) sum_w, the all-reduce with ``op="avg"``) takes sum_w n_w g_w / sum_v n_v: each ``g_w`` is
    unbiased for its shard's mean gradient, so the step is unbiased for the full-batch gradient
    (FedAvg's n_k / n weights, McMahan et al., AISTATS 2017, Algorithm 1, applied to gradients). An
    IID run's shards are equal: 1.0.

    Returns
    -------
    float

    Examples
    --------
    >>> from training.settings.config import Config
    >>> cfg = Config(partition="quantity:alpha=1", batch_size=8, seed=0)
    >>> labels = numpy.arange(400) % 4
    >>> w = [gradient_scale(cfg, labels, r, 4) for r in range(4)]
    >>> round(sum(w), 12), gradient_scale(Config(), labels, 0, 4)
    (4.0, 1.0)
    """
    if not uses_shards(cfg):
        return 1.0
    part = _draw(cfg, labels, int(labels.max()) + 1, workers)
    shared = shared_subset(len(labels), cfg.shared_fraction, cfg.seed)
    n = numpy.array([numpy.union1d(s, shared).size for s in part.shards], numpy.float64)
    return float(workers * n[rank] / n.sum())
