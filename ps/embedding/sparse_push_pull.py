"""Sparse pulls and pushes: a worker asks for the rows its batch touches and pushes only their gradients.

The protocol, versions, request ids, retries and consistency models are the dense parameter server's
(:mod:`ps.serving.shard_server`, :mod:`ps.worker.client`); what changes is the payload. A PULL carries the
slots it wants (``int64``, one list per server, from :meth:`ps.shards.rows.RowSharding.route`) and its
PARAMS reply the pieces of those slots in that order; the PUSH of the same clock carries the gradient of the
same pieces, in the same order, so it needs no ids of its own: the server keeps the slots of each worker's pull by clock. BSP and
SSP add the clock's sparse pushes in worker order (:class:`ps.shards.rows.SparseRows` in
:class:`ps.serving.consistency.ClockBuckets`) and apply one sparse update per clock; ASP applies each push.

The update rule is the caller's, as for dense shards: an optimizer over the shard's table (shape
``(slots, width)``) with ``sparse_step(ids, rows)``, ``lr``, ``steps``, ``state_dict()`` and
``load_state_dict()`` (the trainer's ``training.ctr.sparse_optim``). Only the rows a clock touches are
read and written, so SGD and Adagrad give the same table as their dense forms; momentum and Adam keep
their state per row and move it only when the row is touched (lazy), which differs from the dense form.

Not supported here: replicated shards, ``cas`` conflicts and snapshots (the caller refuses them).
"""
import numpy as np

from commlab import tracing
from ps.worker.client import Client
from ps.wire.messages import H_CLOCK, H_RID, Msg
from ps.shards.rows import SparseRows
from ps.serving.shard_server import Server
from ps.serving.server_optimizer import ServerOptimizer

__all__ = ["SparseServer", "SparseClient"]


class _SparseUpdate(ServerOptimizer):
    """:class:`ps.serving.server_optimizer.ServerOptimizer` whose gradient is a :class:`ps.shards.rows.SparseRows`."""

    __slots__ = ()

    def step(self, grad, lr):
        self.optimizer.lr = lr
        self.optimizer.sparse_step(grad.ids, grad.rows)


class SparseServer(Server):
    """A parameter server holding pieces of embedding rows (:mod:`ps.shards.rows`), served and updated sparsely.

    Parameters
    ----------
    comm, index, worker_ranks, opts
        As :class:`ps.serving.shard_server.Server`.
    table : ndarray, shape (slots, width), float32 or float64
        This server's pieces (:meth:`ps.shards.rows.RowSharding.shard`), updated in place.
    total : int
        Elements in all servers' tables together (recorded in the checkpoint).
    make_optimizer : callable
        ``make_optimizer(table) -> optimizer`` with ``sparse_step(ids, rows)`` (see the module docstring).
    layout : ndarray, optional
        The rows' layout over the servers (:meth:`ps.shards.rows.RowSharding.fingerprint`): written into the
        checkpoint, and a checkpoint of another layout is refused naming the setting that differs.

    Attributes
    ----------
    served_pieces, served_bytes : int
        Pieces and payload bytes sent in PARAMS replies (the server's load).
    """

    def __init__(self, comm, index, worker_ranks, table, total, opts, make_optimizer, *, layout=None):
        if opts.replicas > 1 or opts.conflict == "cas" or opts.snapshot_every:
            raise ValueError("sparse shards support neither replicas, cas conflicts nor snapshots")
        self.rows_table, self.width = table, int(table.shape[1])
        self.layout = None if layout is None else np.asarray(layout, np.int64)  # checkpointed, checked on resume
        super().__init__(comm, index, worker_ranks, table.reshape(-1), total, opts,
                         lambda params, grads: make_optimizer(table))
        self.opt.__class__ = _SparseUpdate  # same state (the optimizer built above, resumed), sparse steps
        self.pull_ids = {}            # (worker, request id) -> slots of a pull not yet answered
        self.clock_ids = {}           # (worker, clock) -> slots of its pull, for the push of that clock
        self.served_pieces = self.served_bytes = 0

    def _dispatch(self, source, mtype, header, data):
        w = self.rank_to_worker.get(source)
        if mtype == Msg.PULL and w is not None:
            ids = np.zeros(0, np.int64) if data is None else data
            if ids.dtype != np.int64 or (ids.size and (ids.min() < 0 or ids.max() >= self.rows_table.shape[0])):
                self._reject(w, int(header[H_RID]), 6)
                return
            self.pull_ids[(w, int(header[H_RID]))] = ids
            if int(header[H_CLOCK]) >= 0:
                self.clock_ids[(w, int(header[H_CLOCK]))] = ids
            data = None
        super()._dispatch(source, mtype, header, data)

    def _payload(self, w, rid):
        ids = self.pull_ids.pop((w, rid), np.zeros(0, np.int64))
        rows = self.rows_table[ids].reshape(-1)
        self.served_pieces += int(ids.size)
        self.served_bytes += int(rows.nbytes)
        return rows

    def _accept_push(self, w, header, data):
        rid, clock = int(header[H_RID]), int(header[H_CLOCK])
        done = self._logged(w, rid, data)
        if done is not None:
            return done
        ids = self.clock_ids.get((w, clock))
        n = 0 if data is None else data.shape[0]
        if ids is None or n != ids.size * self.width:
            return self._reject(w, rid, 1)
        if data is not None and data.dtype != self.params.dtype:
            return self._reject(w, rid, 2)
        return self._accept_addressed(w, rid, header, data)

    def _push(self, w, clock, grad, stale):
        ids = self.clock_ids.pop((w, clock))
        rows = np.zeros((0, self.width), self.params.dtype) if grad is None else grad.reshape(-1, self.width)
        sparse = SparseRows(ids, rows.copy())
        if self.buckets is not None:  # BSP, SSP: one update per clock on the mean gradient
            if self.staleness_lr and stale > 1:
                sparse /= stale
            self.buckets.add(w, clock, sparse)
            return
        tau = (self.pushes - self.read_version[w]) / self.n_workers
        with tracing.span("update", "ps", {"worker": int(w), "clock": int(clock)}):
            self.opt.step(sparse, self.opt.rate(self.pushes, self._horizon(), tau, self.n_workers))
        self.version += 1
        self.table.fold(w, clock)
        self._after_fold(1)


class SparseClient(Client):
    """The worker's end of sparse pulls and pushes.

    Parameters
    ----------
    comm, worker, server_ranks, worker_ranks, dtype, reply_timeout, retries, retry_s
        As :class:`ps.worker.client.Client` (one server rank per shard).
    sharding : ps.shards.rows.RowSharding
        Where every row's pieces live.

    Attributes
    ----------
    sent_bytes, received_bytes : int
        Payload bytes of this worker's pulls and pushes, and of the replies.
    """

    def __init__(self, comm, worker, server_ranks, worker_ranks, sharding, dtype, reply_timeout, *, retries=0,
                 retry_s=1.0):
        super().__init__(comm, worker, server_ranks, worker_ranks, 0, dtype, reply_timeout, retries=retries,
                         retry_s=retry_s)
        self.sharding = sharding
        self._slots = [np.zeros(0, np.int64)] * len(self.server_ranks)
        self._order = None
        self.sent_bytes = self.received_bytes = 0

    def _pull_payload(self, shard):
        return self._slots[shard]

    def pull_rows(self, clock, rows):
        """Pull ``rows`` (distinct global row ids) for ``clock``.

        Parameters
        ----------
        clock : int
        rows : ndarray, shape (n,), int64
            Distinct rows in ``[0, sharding.n_rows)``.

        Returns
        -------
        status : str
            As :meth:`ps.worker.client.Client.pull`.
        values : ndarray, shape (n, dim)
            The rows (meaningful when ``status == "params"``).

        Raises
        ------
        ValueError
            When a row id is negative, out of range or repeated (before any message is sent).
        """
        rows = np.asarray(rows)
        sh = self.sharding
        if rows.dtype.kind not in "iu" or rows.ndim != 1:
            raise ValueError(f"rows must be a 1-D integer array, got {rows.dtype} of shape {rows.shape}")
        if rows.size and (rows.min() < 0 or rows.max() >= sh.n_rows):
            raise ValueError(f"row ids must be in [0, {sh.n_rows}), got {rows.min()} .. {rows.max()}")
        if np.unique(rows).size != rows.size:
            raise ValueError("row ids of one pull must be distinct (np.unique them first)")
        order, counts, slots = sh.route(rows.astype(np.int64))
        bounds = np.concatenate([[0], np.cumsum(counts)])
        self._slots = [slots[bounds[s]:bounds[s + 1]] for s in range(len(self.server_ranks))]
        self.offsets = bounds * sh.width
        self._order = order
        wire = np.empty(int(self.offsets[-1]), self.dtype)
        status = self.pull(clock, wire)
        self.sent_bytes += int(slots.nbytes)
        self.received_bytes += int(wire.nbytes)
        values = np.empty((rows.size * sh.split, sh.width), self.dtype)
        values[order] = wire.reshape(-1, sh.width)
        return status, values.reshape(rows.size, sh.dim)

    def push_rows(self, clock, grads):
        """Push the gradient ``grads`` (shape (n, dim)) of the rows of the last :meth:`pull_rows`, same order."""
        if self._order is None or grads.shape != (self._order.size // self.sharding.split, self.sharding.dim):
            raise ValueError(f"grads must have the shape of the last pull's rows, got {grads.shape}")
        wire = np.ascontiguousarray(grads.reshape(-1, self.sharding.width)[self._order], dtype=self.dtype)
        self._push_wire = wire.reshape(-1)  # kept until the next pull completes the sends
        self.push(clock, self._push_wire)
        self.sent_bytes += int(wire.nbytes)

    def join_rows(self):
        """Join the run: return ``(clock, stopped)`` (the resume clock; True when the budget is spent)."""
        self._slots = [np.zeros(0, np.int64)] * len(self.server_ranks)
        self.offsets = np.zeros(len(self.server_ranks) + 1, np.int64)
        _, clock, stopped = self.join()
        return clock, stopped

