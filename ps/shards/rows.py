"""Rows of embedding tables on the parameter servers: which server holds which row, and sparse gradients.

A table of ``n`` rows of ``dim`` elements is stored as *pieces*: each row is cut into ``split`` pieces of
``dim / split`` consecutive columns (``split = 1``: a piece is a row). Piece ``j`` of row ``r`` has the key
``r * split + j``. :class:`RowSharding` assigns every piece a server and a slot on that server:

* ``"range"``: row ``r`` goes to server ``r * S // n`` (ps-lite's key ranges; Li et al., OSDI 2014,
  section 3.3): the ids of a table that are next to each other, hot or cold, land together;
* ``"hash"``: row ``r`` goes to server ``hash(r) mod S`` (Knuth's multiplicative hash), so hot rows spread
  by chance, not by design;
* ``hot`` rows (either way): the rows named are split column-wise over every server, piece ``j`` on server
  ``(home + j) mod S`` with ``split = S``, so each server serves ``1 / S`` of every hot row. The update of an
  element depends on that element alone under SGD and Adagrad, so the split changes the load, not the
  trajectory (the hot-key remedy of docs/guide/ctr.md; ps-lite splits hot keys the same way).

:class:`SparseRows` is a gradient on a few pieces: it adds to another (union of the keys) and divides in
place, so the clock buckets of BSP and SSP (:class:`ps.serving.consistency.ClockBuckets`) sum the workers' sparse
pushes in worker order exactly as they sum dense ones.
"""
import zlib

import numpy as np

__all__ = ["RowSharding", "SparseRows", "SHARDINGS", "layout_difference"]

SHARDINGS = ("hash", "range")
_KNUTH = np.uint64(2654435761)  # multiplicative hash constant (Knuth, TAOCP vol. 3, section 6.4)


class RowSharding:
    """Which server holds each piece of each row, and its slot there.

    Parameters
    ----------
    n_rows : int
        Rows of all tables together (global row ids ``0 .. n_rows - 1``).
    dim : int
        Elements per row.
    servers : int
        Number of servers ``S``.
    kind : {"hash", "range"}
        Where a row that is not hot goes.
    hot : array_like of int, optional
        Rows split column-wise over all servers (needs ``dim % S == 0``).

    Attributes
    ----------
    split : int
        Pieces per row (``S`` with hot rows, else 1); ``width = dim // split`` elements per piece.
    server_of, slot_of : ndarray, shape (n_rows * split,), int64
        Server and slot of every piece key.
    sizes : ndarray, shape (S,), int64
        Pieces each server holds.

    Raises
    ------
    ValueError
        When an argument is out of range, a hot row is not a row, or ``dim`` does not split into ``S``.

    Examples
    --------
    >>> sh = RowSharding(8, 4, 2, "range")
    >>> sh.server_of.tolist(), sh.sizes.tolist()
    ([0, 0, 0, 0, 1, 1, 1, 1], [4, 4])
    >>> sh = RowSharding(8, 4, 2, "range", hot=[0])  # row 0 in halves, one on each server
    >>> sh.split, sh.server_of[:4].tolist(), sh.sizes.tolist()
    (2, [0, 1, 0, 0], [7, 9])
    """

    def __init__(self, n_rows, dim, servers, kind="hash", hot=()):
        if kind not in SHARDINGS:
            raise ValueError(f"kind must be one of {SHARDINGS}, got {kind!r}")
        if n_rows < 1 or dim < 1 or servers < 1:
            raise ValueError(f"n_rows, dim and servers must be >= 1, got {n_rows}, {dim}, {servers}")
        hot = np.unique(np.asarray(hot, dtype=np.int64))
        if hot.size and (hot[0] < 0 or hot[-1] >= n_rows):
            raise ValueError(f"hot rows must be in [0, {n_rows}), got {hot[0]} .. {hot[-1]}")
        self.split = servers if hot.size and servers > 1 else 1
        if dim % self.split:
            raise ValueError(f"splitting hot rows over {servers} servers needs dim ({dim}) divisible by {servers}")
        self.n_rows, self.dim, self.servers, self.kind = int(n_rows), int(dim), int(servers), kind
        self.width, self.hot = self.dim // self.split, hot
        rows = np.arange(self.n_rows, dtype=np.int64)
        if kind == "range":
            home = rows * self.servers // self.n_rows
        else:
            home = ((rows.astype(np.uint64) * _KNUTH) % np.uint64(1 << 32) % np.uint64(self.servers)).astype(np.int64)
        server = np.repeat(home, self.split).reshape(self.n_rows, self.split)
        if self.split > 1:
            server[hot] = (home[hot, None] + np.arange(self.split)) % self.servers
        self.server_of = server.reshape(-1)
        order = np.argsort(self.server_of, kind="stable")  # per server: pieces in key order
        self.sizes = np.bincount(self.server_of, minlength=self.servers).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        self.slot_of = np.empty_like(self.server_of)
        self.slot_of[order] = np.arange(order.size) - np.repeat(starts, self.sizes)

    def keys(self, rows):
        """Return the piece keys of ``rows`` (ndarray, shape (len(rows) * split,), int64), row by row."""
        rows = np.asarray(rows, dtype=np.int64)
        return (rows[:, None] * self.split + np.arange(self.split)).reshape(-1)

    def route(self, rows):
        """Return how a request for ``rows`` goes out: the piece order, per-server counts and slots.

        Parameters
        ----------
        rows : ndarray, shape (n,), int64
            Distinct rows in ``[0, n_rows)``.

        Returns
        -------
        order : ndarray, shape (n * split,), int64
            Pieces (in :meth:`keys` order) sorted by server: the wire order.
        counts : ndarray, shape (S,), int64
            Pieces each server is asked for.
        slots : ndarray, shape (n * split,), int64
            Slot of each piece on its server, in wire order.
        """
        keys = self.keys(rows)
        servers = self.server_of[keys]
        order = np.argsort(servers, kind="stable")
        return order, np.bincount(servers, minlength=self.servers).astype(np.int64), self.slot_of[keys[order]]

    def shard(self, table, server):
        """Return server ``server``'s pieces of a whole table ``table`` (shape (n_rows, dim)), shape (sizes[s], width)."""
        pieces = np.asarray(table).reshape(self.n_rows * self.split, self.width)
        return np.ascontiguousarray(pieces[np.flatnonzero(self.server_of == server)])

    def assemble(self, shards, out=None):
        """Return the whole table (n_rows, dim) from every server's pieces (the inverse of :meth:`shard`)."""
        out = np.empty((self.n_rows, self.dim), shards[0].dtype) if out is None else out
        pieces = out.reshape(self.n_rows * self.split, self.width)
        for s, part in enumerate(shards):
            pieces[np.flatnonzero(self.server_of == s)] = part
        return out

    def fingerprint(self):
        """Return what identifies this layout in a server's checkpoint: ``[kind (0 hash, 1 range), hot rows,
        split, n_rows, dim, CRC-32 of server_of]`` (ndarray, shape (6,), int64).

        Examples
        --------
        >>> RowSharding(8, 4, 2, "range", hot=[0]).fingerprint()[:5].tolist()
        [1, 1, 2, 8, 4]
        """
        crc = zlib.crc32(np.ascontiguousarray(self.server_of, np.int64).tobytes())
        return np.array([SHARDINGS.index(self.kind), self.hot.size, self.split, self.n_rows, self.dim, crc], np.int64)

    def load(self, rows):
        """Return the pieces each server serves for a request of ``rows``, in rows (pieces / split), shape (S,)."""
        return np.bincount(self.server_of[self.keys(rows)], minlength=self.servers) / self.split


class SparseRows:
    """A gradient on a few pieces of a server's shard: ``rows[i]`` belongs to slot ``ids[i]``.

    Parameters
    ----------
    ids : ndarray, shape (n,), int64
        Distinct slots, ascending.
    rows : ndarray, shape (n, width), float32 or float64
        The gradient of each slot (owned: added to in place).

    Examples
    --------
    >>> a = SparseRows(np.array([1, 3]), np.array([[1.0], [2.0]]))
    >>> a += SparseRows(np.array([0, 3]), np.array([[4.0], [8.0]]))
    >>> a /= 2
    >>> a.ids.tolist(), a.rows.ravel().tolist()
    ([0, 1, 3], [2.0, 0.5, 5.0])
    """

    __slots__ = ("ids", "rows")

    def __init__(self, ids, rows):
        self.ids, self.rows = ids, rows

    def copy(self):
        """Return a copy that owns its ids and rows (a bucket's sum starts from one)."""
        return SparseRows(self.ids.copy(), self.rows.copy())

    def __iadd__(self, other):
        ids = np.union1d(self.ids, other.ids)
        if ids.size != self.ids.size:  # new slots: widen, keeping the order of the additions
            rows = np.zeros((ids.size, self.rows.shape[1]), self.rows.dtype)
            rows[np.searchsorted(ids, self.ids)] += self.rows
            self.ids, self.rows = ids, rows
        self.rows[np.searchsorted(self.ids, other.ids)] += other.rows
        return self

    def __itruediv__(self, k):
        self.rows /= k
        return self


def layout_difference(saved, mine):
    """Return what differs between two :meth:`RowSharding.fingerprint` results, naming the setting ('' if equal).

    Examples
    --------
    >>> a, b = RowSharding(8, 4, 2, "hash").fingerprint(), RowSharding(8, 4, 2, "range").fingerprint()
    >>> print(layout_difference(a, b))
    rows sharded by hash, this job by range (the trainer's --ctr-sharding)
    >>> layout_difference(a, a)
    ''
    """
    saved, mine = np.asarray(saved, np.int64).reshape(-1), np.asarray(mine, np.int64).reshape(-1)
    if saved.shape != (6,) or mine.shape != (6,):
        return "a row layout of another form"
    if saved[0] != mine[0]:
        return (f"rows sharded by {SHARDINGS[int(saved[0]) % 2]}, this job by {SHARDINGS[int(mine[0]) % 2]} "
                "(the trainer's --ctr-sharding)")
    if saved[1] != mine[1] or saved[2] != mine[2]:
        return f"{saved[1]} hot rows split over the servers, this job {mine[1]} (the trainer's --ctr-hot)"
    if saved[3] != mine[3] or saved[4] != mine[4]:
        return (f"{saved[3]} rows of {saved[4]} values, this job {mine[3]} of {mine[4]} (the trainer's --ctr-rows, "
                "--ctr-dim, --hidden)")
    if saved[5] != mine[5]:
        return ("other rows on each server (other hot rows: the trainer's --ctr-hot over other training ids, "
                "--ctr-train or --seed)")
    return ""
