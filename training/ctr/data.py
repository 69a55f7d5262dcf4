"""Synthetic click data with a planted truth, and what a ctr configuration needs in memory.

``F`` categorical features, each with its own table; table sizes grow geometrically (a thousandfold from
the first to the last, as real features range from a few categories to millions) and add up to
``ctr_rows``. Every sample draws ``ctr_bag`` ids per feature from a Zipf law bounded to the table
(``P(k) ~ (k + 1) ** -1.1``, so a few rows are hot). Its label is drawn from a hidden logistic model over
hidden embeddings: ``p = sigmoid(b + sum_f mean_bag(h[id]) . u_f)``. Ranking by the true ``p`` is the best
any model can do, so :func:`make_ctr_data` reports that AUC (``best_auc``) beside the data.

Every array comes from ``numpy.random.default_rng`` seeded by ``seed`` alone, in a fixed order, so every
rank of every rank count holds the same data.
"""
import os
from collections import namedtuple

import numpy as np

__all__ = ["CTRData", "make_ctr_data", "table_sizes", "check_ctr_config", "memory_need", "check_memory",
           "available_bytes", "check_ids", "ZIPF_EXPONENT"]

ZIPF_EXPONENT = 1.1   # exponent of the bounded Zipf law of the ids
_HIDDEN = 4           # width of the hidden embeddings of the planted truth
_SCALE = 1.2          # spread of the true logit (sets the best AUC near 0.8)


class CTRData(namedtuple("CTRData", "train_ids train_y test_ids test_y offsets test_p")):
    """The data of a ctr run: ``train_ids``/``test_ids``: int32 (n, F, bag) global row ids; ``*_y``: float
    labels (0/1); ``offsets``: (F + 1,) first row of each table; ``test_p``: float64 (n_test,) true click
    probabilities of the test samples.

    ``best_auc`` and ``best_logloss`` score ``test_p`` on the test labels (scikit-learn's ``roc_auc_score``
    and ``log_loss``) when read: only the rank that reports them imports scikit-learn's metrics, seconds
    of every rank's start on a loaded machine.
    """

    __slots__ = ()

    @property
    def best_auc(self):
        """AUC of the true probabilities on the test set (NaN when the test labels hold one class)."""
        from sklearn.metrics import roc_auc_score

        return float(roc_auc_score(self.test_y, self.test_p)) if len(np.unique(self.test_y)) == 2 else float("nan")

    @property
    def best_logloss(self):
        """Log loss of the true probabilities on the test set."""
        from sklearn.metrics import log_loss

        return float(log_loss(self.test_y, self.test_p, labels=[0, 1]))


def table_sizes(rows, tables):
    """Return the rows of each table: geometric sizes (x1000 first to last), at least 2 each, summing to ``rows``.

    Examples
    --------
    >>> table_sizes(1000, 3).tolist()
    [2, 30, 968]
    """
    w = 1000.0 ** (np.arange(tables) / max(1, tables - 1))
    sizes = np.maximum(2, np.floor(w / w.sum() * rows).astype(np.int64))
    sizes[-1] += rows - sizes.sum()
    return sizes


def _zipf(rng, n, size):
    cdf = np.cumsum(np.arange(1, n + 1, dtype=np.float64) ** -ZIPF_EXPONENT)
    return np.minimum(np.searchsorted(cdf / cdf[-1], rng.random(size)), n - 1).astype(np.int32)


def _draw(rng, n, sizes, offsets, bag, hidden, u, bias):
    ids = np.empty((n, len(sizes), bag), np.int32)
    logit = np.full(n, bias)
    for f, size in enumerate(sizes):
        ids[:, f] = _zipf(rng, int(size), (n, bag)) + offsets[f]
        logit += hidden[ids[:, f]].mean(axis=1) @ u[f]
    p = 1.0 / (1.0 + np.exp(-logit))
    return ids, (rng.random(n) < p).astype(np.float32), p


def make_ctr_data(cfg):
    """Generate the training and test sets of ``cfg`` (``ctr_rows``, ``ctr_tables``, ``ctr_bag``, ``ctr_train``,
    ``ctr_test``, ``seed``).

    Returns
    -------
    CTRData

    Raises
    ------
    ValueError
        When an id falls outside ``[0, ctr_rows)`` (a bad table layout), on every rank alike.

    Examples
    --------
    >>> from training.settings.config import Config
    >>> d = make_ctr_data(Config(model="ctr", ctr_rows=100, ctr_tables=2, ctr_train=50, ctr_test=40))
    >>> d.train_ids.shape, int(d.offsets[-1]), 0.5 < d.best_auc < 1.0
    ((50, 2, 2), 100, True)
    """
    sizes = table_sizes(cfg.ctr_rows, cfg.ctr_tables)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    truth, train_rng, test_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(3))
    hidden = truth.normal(size=(cfg.ctr_rows, _HIDDEN))
    u = truth.normal(size=(cfg.ctr_tables, _HIDDEN)) * _SCALE / np.sqrt(cfg.ctr_tables * _HIDDEN) * 2
    bias = -1.0
    train_ids, train_y, _ = _draw(train_rng, cfg.ctr_train, sizes, offsets, cfg.ctr_bag, hidden, u, bias)
    test_ids, test_y, p = _draw(test_rng, cfg.ctr_test, sizes, offsets, cfg.ctr_bag, hidden, u, bias)
    check_ids(train_ids, cfg.ctr_rows)
    return CTRData(train_ids, train_y, test_ids, test_y, offsets, p)


def check_ids(ids, rows):
    """Raise ``ValueError`` naming the first id outside ``[0, rows)`` (negative or too large).

    Examples
    --------
    >>> check_ids(np.array([[0, 5]]), 5)
    Traceback (most recent call last):
    ...
    ValueError: row id 5 is out of range: the tables hold rows 0 .. 4
    """
    ids = np.asarray(ids)
    if ids.size and ids.min() < 0:
        raise ValueError(f"row id {int(ids.min())} is negative: the tables hold rows 0 .. {rows - 1}")
    if ids.size and ids.max() >= rows:
        raise ValueError(f"row id {int(ids.max())} is out of range: the tables hold rows 0 .. {rows - 1}")


def memory_need(cfg, size):
    """Return the bytes one rank needs at most for ``cfg`` on a job of ``size`` ranks (int).

    Data (ids as int32, labels), the hidden truth, the initial table, and the table, its gradient and the
    optimizer state where a rank holds them: every rank in ``dp``, a server's share in ``ps``/``hybrid``.
    """
    item = np.dtype(cfg.dtype).itemsize
    data = (cfg.ctr_train + cfg.ctr_test) * (cfg.ctr_tables * cfg.ctr_bag * 4 + 12)
    table = cfg.ctr_rows * cfg.ctr_dim * item
    state = {"sgd": 1 if cfg.momentum else 0, "adagrad": 1, "adam": 2}[cfg.optimizer]
    held = (2 + state) * table if cfg.mode == "dp" else (2 + state) * table // max(1, min(cfg.servers, size - 1))
    return int(data + cfg.ctr_rows * _HIDDEN * 8 + table + held)


def _available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def available_bytes():
    """Return the bytes this node has free now (``MemAvailable`` of ``/proc/meminfo``, else the free pages)."""
    return _available()


def check_memory(cfg, size, local_ranks, available=None):
    """Refuse ``cfg`` when ``local_ranks`` ranks of a ``size``-rank job would not fit the memory, with the figure.

    ``available``: the node's free bytes (default :func:`available_bytes`; a job passes the smallest its
    nodes report, so that every rank decides alike).

    Raises
    ------
    ValueError
        Naming the bytes needed per rank and the bytes available (``--memory-gb``, else MemAvailable).
    """
    need = memory_need(cfg, size)
    free = available_bytes() if available is None else available
    budget = cfg.memory_gb * 2 ** 30 if cfg.memory_gb else free / max(1, local_ranks)
    if need > budget:
        raise ValueError(f"--model ctr with --ctr-rows {cfg.ctr_rows} needs {need / 2 ** 30:.2f} GiB per rank "
                         f"(tables, gradients, optimizer state and data, --mode {cfg.mode}), more than the "
                         f"{budget / 2 ** 30:.2f} GiB available per rank; lower --ctr-rows or --ctr-train, "
                         "or use --mode hybrid with more --servers")


def check_ctr_config(cfg):
    """Check the fields of a ``--model ctr`` configuration (called by ``Config.validate``).

    Raises
    ------
    ValueError
        Naming the offending field.
    """
    for name in ("ctr_rows", "ctr_tables", "ctr_dim", "ctr_bag", "ctr_train", "ctr_test"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)!r}")
    if cfg.ctr_rows < 2 * cfg.ctr_tables:
        raise ValueError(f"ctr_rows ({cfg.ctr_rows}) must be at least 2 per table ({cfg.ctr_tables} tables)")
    if cfg.ctr_hot < 0 or cfg.ctr_hot > cfg.ctr_rows or cfg.memory_gb < 0:
        raise ValueError(f"ctr_hot must be in [0, ctr_rows] and memory_gb >= 0, got {cfg.ctr_hot}, {cfg.memory_gb}")
    if cfg.tensor_parallel * cfg.pipeline_parallel * cfg.micro_batches > 1 or cfg.local_steps > 1 or cfg.weighted_average:
        raise ValueError("--model ctr runs --mode dp, ps or hybrid, not model parallelism, local SGD or --weighted-average")
    if cfg.ps_replicas > 1 or cfg.ps_conflict == "cas" or cfg.weight_decay or cfg.device != "cpu":
        raise ValueError("--model ctr supports neither --ps-replicas, --ps-conflict cas, --weight-decay "
                         "(a sparse update would skip the rows not touched) nor --device gpu")
    if cfg.monitor or cfg.metrics_port or cfg.tensorboard:
        raise ValueError("--model ctr runs are not watched by live monitoring: drop --monitor, --metrics-port and "
                         "--tensorboard (docs/guide/monitoring.md lists the runs it watches)")
    if cfg.mode != "dp" and cfg.optimizer == "adam":
        raise ValueError("--model ctr with --mode ps or hybrid needs --optimizer sgd or adagrad (sparse updates "
                         "on the servers)")
