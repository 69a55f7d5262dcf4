"""Clock bookkeeping of one server: which clocks are folded in, who is live, which pull may go.

A worker's *clock* counts the gradients it has pushed: it pulls at clock ``c``, computes gradient
``c`` and pushes it, and then pulls at ``c + 1``. The server keeps, for every worker, the number of
its pushes folded into the shard (``folded[w]``).

Update rules. BSP and SSP fold a clock's pushes together: once every live worker has pushed
gradient ``c``, the server applies *one* optimizer step on their mean (:class:`ClockBuckets`, summed
in worker order), as bulk synchronous training does, so ``folded`` advances for all of them at
once. SSP therefore differs from BSP only in which pulls it serves, and SSP with ``s = 0`` is BSP
exactly (same reads, same updates, same bits). ASP applies every push on arrival, as its own step
of ``1 / W`` of the learning rate.

Why SSP aggregates per clock: in Ho et al.'s SSP (below, section 2) and Cui et al.'s LazyTable
(H. Cui et al., "Exploiting Bounded Staleness to Speed Up Big Data Analytics", USENIX ATC 2014)
the servers *add* the workers' updates, so folding a clock push by push or all at once gives the
same table. Here the server runs a stateful optimizer (momentum, Adam), whose step is not additive:
one step per push would take ``W`` optimizer steps per clock where BSP takes one (momentum and Adam
moments advancing ``W`` times as fast), and SSP(0) would not be BSP. Aggregating per clock keeps
SSP's guarantee (a reader at clock ``c`` sees every update of clocks ``<= c - s - 1``) and BSP's
update rule; what it gives up is SSP's read-my-writes: a worker's own gradients of the clocks that
are not yet complete are not in what it reads (with ``s = 0`` there are none).

A pull by worker ``w`` at clock ``c`` is served when

* BSP: every live worker's clock ``c - 1`` has been aggregated into one update
  (``min folded >= c``); the bulk synchronous model (Valiant, CACM 1990);
* SSP(s): the slowest live worker has ``min folded >= c - s``; stale synchronous parallel, Ho et
  al., "More Effective Distributed ML via a Stale Synchronous Parallel Parameter Server", NIPS
  2013, section 2 (the staleness bound);
* ASP: ``folded[w] >= c`` only (no bound, but a worker always sees its own updates; Hogwild-style
  asynchrony as in ps-lite's eventual consistency, Li et al., OSDI 2014, section 4.2).

The staleness of a served pull is ``c - min folded`` over the live workers and the reader: how many
clocks of the slowest live worker are missing from what the reader receives. BSP never exceeds 0
and SSP(s) never exceeds ``s`` by construction. Workers that finished or were dropped no longer hold
anyone back.
"""
import numpy as np

__all__ = ["LIVE", "DONE", "DROPPED", "CONSISTENCY", "ClockTable", "ClockBuckets", "AGGREGATED"]

LIVE, DONE, DROPPED = 0, 1, 2
CONSISTENCY = ("bsp", "asp", "ssp")
AGGREGATED = ("bsp", "ssp")  #: models that apply one update per clock (:class:`ClockBuckets`)


class ClockTable:
    """Folded clocks, liveness and the pull rule of one server.

    Parameters
    ----------
    n_workers : int
        Number of workers ``W >= 1``.
    consistency : {"bsp", "asp", "ssp"}
        Consistency model.
    staleness : int
        SSP bound ``s >= 0`` in clocks (ignored by BSP and ASP).

    Raises
    ------
    ValueError
        When an argument is out of range (the message names it).

    Examples
    --------
    Worker 0 has pushed clocks 0 and 1, worker 1 nothing yet; SSP with ``s = 1``:

    >>> t = ClockTable(2, "ssp", staleness=1)
    >>> t.fold(0, 0); t.fold(0, 1)
    >>> t.servable(0, 1), t.servable(0, 2)  # worker 1 is one clock behind, not two
    (True, False)
    >>> t.staleness_of(0, 1)
    1
    """

    __slots__ = ("n_workers", "consistency", "staleness", "folded", "status")

    def __init__(self, n_workers, consistency, staleness=0):
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        if consistency not in CONSISTENCY:
            raise ValueError(f"consistency must be one of {CONSISTENCY}, got {consistency!r}")
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        self.n_workers = int(n_workers)
        self.consistency = consistency
        self.staleness = int(staleness)
        self.folded = np.zeros(self.n_workers, dtype=np.int64)  # pushes folded in, per worker
        self.status = np.full(self.n_workers, LIVE, dtype=np.int64)  # LIVE / DONE / DROPPED

    def live(self):
        """Return the indices of the live workers (ndarray of int64)."""
        return np.flatnonzero(self.status == LIVE)

    def min_clock(self, reader=None):
        """Return the smallest folded clock over the live workers and ``reader`` (None if none)."""
        mask = self.status == LIVE
        if reader is not None:
            mask = mask.copy()
            mask[reader] = True
        if not mask.any():
            return None
        return int(self.folded[mask].min())

    def servable(self, worker, clock):
        """Return True when a pull by ``worker`` at ``clock`` may be served now.

        Parameters
        ----------
        worker : int
            Reader's worker index.
        clock : int
            Reader's clock (number of gradients it has pushed).
        """
        if self.consistency == "bsp":
            return self.min_clock(worker) >= clock
        if self.consistency == "ssp":  # own pushes are folded with their clock: no read-my-writes
            return self.min_clock(worker) >= clock - self.staleness
        return self.folded[worker] >= clock  # ASP: a worker always sees its own updates

    def staleness_of(self, worker, clock):
        """Return the staleness of a pull served now: ``clock - min folded`` (clocks, int >= 0)."""
        return max(0, int(clock) - self.min_clock(worker))

    def fold(self, worker, clock):
        """Record that gradient ``clock`` of ``worker`` is now folded into the shard."""
        self.folded[worker] = max(self.folded[worker], int(clock) + 1)

    def state_dict(self):
        """Return the checkpointable state (arrays only)."""
        return {"folded": self.folded.copy(), "status": self.status.copy()}

    def load_state_dict(self, state):
        """Restore :meth:`state_dict` output; finished workers become live again on restart.

        Raises
        ------
        ValueError
            When the saved worker count differs from ``n_workers``.
        """
        folded = np.asarray(state["folded"], dtype=np.int64)
        if folded.shape != (self.n_workers,):
            raise ValueError(f"checkpoint has {folded.shape[0]} workers, this job has {self.n_workers}")
        self.folded[:] = folded
        self.status[:] = LIVE


class ClockBuckets:
    """Per-clock gradient buckets of BSP and SSP: one update per clock once every live worker has pushed.

    The sum runs over the workers in index order, so the update does not depend on the order in
    which the pushes arrived (bitwise reproducible). Under SSP several clocks' buckets are open at
    once (fast workers run up to ``s`` clocks ahead); they complete, and are applied, in clock order.

    Parameters
    ----------
    table : ClockTable
        The server's clock table (liveness decides when a bucket is complete).

    Examples
    --------
    >>> buckets = ClockBuckets(ClockTable(2, "bsp"))
    >>> buckets.add(1, 0, np.array([4.0]))
    >>> buckets.pop_ready() is None  # worker 0 has not pushed clock 0 yet
    True
    >>> buckets.add(0, 0, np.array([2.0]))
    >>> buckets.pop_ready()  # (clock, mean gradient, workers)
    (0, array([3.]), [0, 1])
    """

    __slots__ = ("table", "buckets")

    def __init__(self, table):
        self.table = table
        self.buckets = {}  # clock -> {worker: gradient shard}

    def add(self, worker, clock, grad):
        """Store worker ``worker``'s gradient for ``clock`` (kept by reference and never changed)."""
        self.buckets.setdefault(int(clock), {})[int(worker)] = grad

    def pop_ready(self):
        """Return ``(clock, mean gradient, workers)`` of the oldest complete bucket, or ``None``.

        A bucket is complete when every live worker has pushed into it; the mean divides the sum by
        the number of contributions. The sum is a new array: the gradients added are left as they
        came (a replica forwards the very gradient it applies, and a resent push is compared with it).
        """
        if not self.buckets:
            return None
        clock = min(self.buckets)
        bucket = self.buckets[clock]
        if not set(self.table.live().tolist()) <= set(bucket):
            return None
        del self.buckets[clock]
        workers = sorted(bucket)
        total = bucket[workers[0]].copy()
        for w in workers[1:]:
            total += bucket[w]
        total /= len(workers)
        return clock, total, workers
