"""Per-server load of the ctr model's rows: range against hash sharding, and the hot-row split.

Each step every worker pulls (and then pushes) the distinct rows of its ``B / W`` samples; a server's load
is the rows it serves per step, summed over the workers, and the bytes (the rows' values both ways plus
an ``int64`` id per piece). :func:`server_load` counts them from the training ids without running
anything: the same counts :class:`ps.embedding.sparse_push_pull.SparseServer` keeps when it runs (``served_pieces``).

With Zipf ids the hottest rows of every table are touched by every worker at every step. Range sharding
keeps a table's first ids, the hot ones, on one server, and the small tables, whose rows are all warm,
together; hash sharding spreads rows by chance. The remedy (``--ctr-hot K``) splits the ``K`` rows the
training ids touch most column-wise over all servers (:class:`ps.shards.rows.RowSharding`), so each server
serves ``1 / S`` of each of them.
"""
import numpy as np

from ps.shards.rows import RowSharding
from training.ctr.modes import global_batch
from training.ctr.run import hot_rows

__all__ = ["server_load", "hot_for_balance"]


def server_load(cfg, data, servers, workers, kind, hot=0, steps=20):
    """Return the per-server load of ``steps`` training steps of ``cfg`` on ``servers`` servers and ``workers`` workers.

    Parameters
    ----------
    cfg : training.settings.config.Config
        ``batch_size``, ``ctr_rows``, ``ctr_dim``, ``dtype``, ``seed``.
    data : training.ctr.data.CTRData
    servers, workers : int
    kind : {"hash", "range"}
    hot : int
        Rows split over every server (0: none).
    steps : int

    Returns
    -------
    dict
        ``rows_per_step`` and ``bytes_per_step`` (lists of ``servers`` floats), ``max_over_mean`` (rows).

    Examples
    --------
    >>> from training.settings.config import Config
    >>> from training.ctr.data import make_ctr_data
    >>> cfg = Config(model="ctr", ctr_rows=400, ctr_tables=2, ctr_train=512, ctr_test=64, batch_size=128)
    >>> load = server_load(cfg, make_ctr_data(cfg), 4, 2, "range", steps=2)
    >>> len(load["rows_per_step"]), load["max_over_mean"] >= 1.0
    (4, True)
    """
    sharding = RowSharding(cfg.ctr_rows, cfg.ctr_dim, servers, kind, hot_rows(data.train_ids, cfg.ctr_rows, hot))
    item = np.dtype(cfg.dtype).itemsize
    rows, b, cache = np.zeros(servers), cfg.batch_size // workers, {}
    for step in range(steps):
        batch = global_batch(cfg, step, cache)
        for w in range(workers):
            rows += sharding.load(np.unique(data.train_ids[batch[w * b:(w + 1) * b]]))
    rows /= steps
    pieces = rows * sharding.split
    nbytes = 2 * rows * cfg.ctr_dim * item + 8 * pieces  # values pulled and pushed, one id per piece pulled
    return {"rows_per_step": rows.tolist(), "bytes_per_step": nbytes.tolist(),
            "max_over_mean": float(rows.max() / rows.mean())}


def hot_for_balance(cfg, data, servers, workers, kind, target=1.2, steps=20):
    """Return the smallest hot-row count (doubling from 16) whose split brings max / mean rows to ``target`` or below.

    Returns
    -------
    (int, dict)
        The count (``ctr_rows`` when even that misses) and its :func:`server_load`.
    """
    hot = 0
    while True:
        load = server_load(cfg, data, servers, workers, kind, hot, steps)
        if load["max_over_mean"] <= target or hot >= cfg.ctr_rows:
            return hot, load
        hot = min(cfg.ctr_rows, max(16, 2 * hot))
