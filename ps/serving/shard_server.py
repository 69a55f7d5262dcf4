"""The server loop: serve pushes and pulls as they arrive under BSP, ASP or SSP.

One server owns one shard of the flat parameter vector (:mod:`ps.shards.key_ranges`) and its optimizer state
(:class:`ps.serving.server_optimizer.ServerOptimizer`, running the caller's optimizer). It probes for any message from
any worker, handles it, and re-examines the deferred pulls whenever a push is folded in or a worker
leaves (:mod:`ps.serving.consistency` decides which pull may go, and why BSP and SSP apply one update per
clock while ASP applies every push). Nothing assumes an arrival order: a pull that overtakes its
reader's own push waits for it where the model requires it (BSP, ASP), and the clock buckets of BSP
and SSP are keyed by clock and summed in worker order.

Versions: ``version`` counts the updates applied to the shard (one per ASP push, one per BSP/SSP clock);
PARAMS carry it, a PUSH its base. Under ``conflict="cas"`` a push more than ``conflict_lag`` versions
behind is refused and the worker's next pull answered at once with REFUSED and the current shard.
Resent requests count once (:mod:`ps.serving.request_log`); a malformed one gets a REJECT naming the reason
(:data:`ps.wire.messages.REJECT_REASONS`), is counted, and everyone else is still served.

Faults: a live worker with no pull waiting here, silent for ``ps_timeout`` seconds, is dropped: ASP and SSP carry
on without it (a worker waiting on another server sends heartbeats; the seconds in which this server itself
did not run, and a worker whose message waits unread here, are no silence); BSP enters the error state, answers every pull with ERROR, and ends once every worker has aborted
or been dropped. The loop ends when every worker is done, aborted or dropped (replicated:
:mod:`ps.replicas.chain_replication`).
"""
import time

import numpy as np

from commlab import tracing
from ps.checkpoints.shard_files import newest_generation, restore_server, save_server, server_checkpoint_path
from ps.serving.consistency import AGGREGATED, DONE, DROPPED, LIVE, ClockBuckets, ClockTable
from ps.serving.request_log import ReplyFaults, RequestLog
from ps.serving.server_optimizer import ServerOptimizer
from ps.shards.key_ranges import proportional, shard_offsets
from ps.wire.messages import (H_CLOCK, H_RID, H_SHARD, H_VERSION, STALL_S, Backoff, Msg, PSError, dead, done, probe,
                              receive, send, wait_all, waiting)

__all__ = ["Server", "EVENT_DROPPED", "EVENT_ABORTED", "EVENT_DIED", "COUNTERS"]

# codes of Server.events (EVENT_DIED: dropped because the MPI library reported the worker dead, under ULFM);
# seconds between silence checks
EVENT_DROPPED, EVENT_ABORTED, EVENT_DIED, _SILENCE_CHECK = 1, 2, 3, 0.01
#: The server's counters (in :class:`ps.job.reports.RunResult`): distinct and resent pushes, pulls answered from a
#: kept reply, ``cas`` refusals, REJECTs, and the injected dropped and late replies.
COUNTERS = ("pushes_received", "duplicate_pushes", "replayed_replies", "refused", "rejected", "dropped_replies",
            "late_replies")


class Server:
    """One parameter server: owns a shard, applies pushes, serves pulls under a consistency model.

    Parameters
    ----------
    comm : MPI.Comm
        The run's duplicated communicator; servers are ranks ``0 .. S - 1``.
    index : int
        This server's index ``0 <= index < S`` (equal to its rank).
    worker_ranks : sequence of int
        Ranks of the workers, in worker-index order.
    shard : ndarray, shape (n_r,), float32 or float64
        Initial parameters of this shard (owned and updated in place).
    total : int
        The flat parameter vector's length; the shard is this server's part of it under
        :func:`ps.shards.key_ranges.shard_offsets` (its first element is ``shard_offsets(total, opts.servers)[index]``).
    opts : ps.job.settings.PSOptions
        Run settings (consistency, budget, learning rate, timeouts, checkpoints).
    make_optimizer : callable
        ``make_optimizer(params, grads) -> optimizer`` over the shard's flat buffers
        (:class:`ps.serving.server_optimizer.ServerOptimizer`).
    on_push : callable, optional
        ``on_push(pushes_applied)`` after every folded push (progress display).
    on_tick : callable, optional
        ``on_tick(server)`` between two messages, every 0.01 s at most (a live monitor); it must return
        at once.

    Raises
    ------
    commlab.file_formats.CheckpointError
        When the checkpoint to resume from is of another run, another server or makes no sense
        (:func:`ps.checkpoints.shard_files.check_server_checkpoint`).
    ValueError
        When a checkpoint to resume from does not match this shard.
    """
    epoch, held, acked_clocks = 0, (), 0  # replicated shards (ps.replicas): reply epoch and aux, held replies

    def __init__(self, comm, index, worker_ranks, shard, total, opts, make_optimizer, *, on_push=None, on_tick=None):
        self.comm, self.index, self.opts = comm, int(index), opts
        self.worker_ranks = list(worker_ranks)
        self.rank_to_worker = {r: w for w, r in enumerate(self.worker_ranks)}
        self.n_workers = len(self.worker_ranks)
        self.params, self.total = shard, int(total)
        self.offset = int(shard_offsets(self.total, opts.shards)[self.index])
        self.table = ClockTable(self.n_workers, opts.consistency, opts.staleness)
        self.buckets = ClockBuckets(self.table) if opts.consistency in AGGREGATED else None
        self.staleness_lr = opts.staleness_lr or opts.conflict == "scale"
        self.opt = ServerOptimizer(shard, make_optimizer, lr=opts.lr, lr_at=opts.lr_at, staleness_lr=self.staleness_lr)
        self.on_push, self.on_tick = on_push, on_tick      # on_tick(self): every _SILENCE_CHECK s (a monitor)
        self.pushes = 0                                    # pushes folded into the shard
        self.pending = {}                                  # worker -> (clock, request id) of its deferred pull
        self.read_version = np.zeros(self.n_workers, np.int64)  # self.pushes at each worker's last read
        self.staleness_histogram = {}                      # staleness (clocks) -> served pulls used
        self.read_staleness = {}                           # worker -> staleness of its last read, until it pushes
        self.snapshots = []                                # (pushes, seconds since start, shard copy)
        self.events = []                                   # (seconds since start, worker, code)
        self.aborted = set()                               # workers that left with ABORT
        self.error_worker = -1                             # BSP: the worker whose loss stops the run
        self.speeds = np.zeros(self.n_workers)             # seconds per sample reported (server 0)
        self.speed_waiting = {}                            # worker -> clock of its SPEED awaiting BATCH
        self._sends = []
        self.version = 0                                   # optimizer updates applied to the shard
        self.counts = dict.fromkeys(COUNTERS, 0)           # the server's records (COUNTERS)
        self.rejected = {}                                 # REJECT reason code -> count
        self.log = RequestLog(self.n_workers)              # push ids and kept replies (exactly once)
        self.refused = {}                                  # worker -> clock of its refused push
        self.faults = ReplyFaults(opts.drop_replies, opts.late_replies, opts.late_s,
                                  self.index * 104_729 + opts.seed)  # injected into first replies
        self.resumed_pushes, self.resumed_seconds = 0, 0.0   # where a resumed run starts from
        self._t0 = time.monotonic()
        self._last_heard = np.full(self.n_workers, self._t0)
        if opts.resume_dir:  # the newest generation every shard holds (ps.checkpoints.shard_files)
            paths = newest_generation(opts.resume_dir, opts.shards)
            self._resume(paths[self.index] if paths else server_checkpoint_path(opts.resume_dir, self.index))

    def serve(self, start_time=None):
        """Run the loop until every worker is done, aborted or dropped.

        Parameters
        ----------
        start_time : float, optional
            ``time.monotonic()`` of the common start (after the start barrier).

        Raises
        ------
        PSError
            Under BSP when a worker was lost (after every other worker has been told).
        """
        self._t0 = (time.monotonic() if start_time is None else start_time) - self.resumed_seconds
        self._last_heard[:] = time.monotonic()
        backoff, next_check, checked = Backoff(), 0.0, time.monotonic()
        while (self.table.status == LIVE).any() or self.held:
            msg = probe(self.comm)
            if msg is not None:
                self._handle(*msg)
                backoff.reset()
            now = time.monotonic()
            if self.faults.held:
                self._send_late(now)
            if now >= next_check:  # also while busy: a dead worker must not wait for a lull
                if now - checked > STALL_S:  # this server did not run meanwhile: the workers' silence clocks skip it
                    self._last_heard = np.minimum(self._last_heard + (now - checked), now)
                checked = now
                self._sends = [s for s in self._sends if not done(self.comm, s[0])]
                self._check_silence(now)
                next_check = now + _SILENCE_CHECK
                if self.on_tick is not None:
                    self.on_tick(self)
            if msg is None:
                backoff.sleep()
        # a dropped worker may be dead: its replies would never complete, so only the others are awaited
        live = [(req, buf) for req, buf, w in self._sends if self.table.status[w] != DROPPED]
        wait_all(live, time.monotonic() + self.opts.ps_timeout, "replies to the workers")
        self._sends = []
        if self.error_worker >= 0:
            raise PSError(self.error_message())
        if self.opts.checkpoint_dir:
            self.checkpoint()

    def elapsed(self):
        """Return the seconds of training so far, resumed runs included."""
        return time.monotonic() - self._t0

    def error_message(self):
        """Return the text of the BSP error (which worker was lost and why)."""
        rank = self.worker_ranks[self.error_worker]
        if rank in dead(self.comm):
            return f"BSP cannot continue: worker rank {rank} died (the MPI library reported it); every rank stops"
        return (f"BSP cannot continue: worker rank {rank} stopped answering (silent for more than "
                f"--ps-timeout {self.opts.ps_timeout:g} s, or aborted); every rank stops")

    def _handle(self, source, mtype):
        self._dispatch(source, mtype, *receive(self.comm, source, mtype, time.monotonic() + self.opts.ps_timeout))

    def _dispatch(self, source, mtype, header, data):
        w = self.rank_to_worker.get(source)
        if w is None:
            raise PSError(f"server {self.index} got {mtype.name} from rank {source}, which is not a worker")
        self._last_heard[w] = time.monotonic()
        if mtype == Msg.HEARTBEAT:  # a worker waiting on another server (stopped, failing over) is not silent
            return
        clock, rid = int(header[H_CLOCK]), int(header[H_RID])
        status = self.table.status[w]
        if mtype == Msg.PUSH:
            if self._accept_push(w, header, data) and status == LIVE and self.error_worker < 0:
                if self.opts.conflict == "cas" and self.version - int(header[H_VERSION]) > self.opts.conflict_lag:
                    self.refused[w] = clock  # optimistic concurrency: too stale, recompute on the new values
                    self.counts["refused"] += 1
                else:
                    # a read counts once the gradient computed from it arrives: a worker whose pull another
                    # server answered with STOP never uses this server's PARAMS, and neither side counts it
                    stale = self.read_staleness.pop(w, None)
                    if stale is not None:
                        self.staleness_histogram[stale] = self.staleness_histogram.get(stale, 0) + 1
                    self._push(w, clock, data, stale or 0)
        elif mtype == Msg.PULL:
            pending = self.pending.get(w)
            if self.log.kept(w, rid) is not None:  # a resent pull: the reply it was given, again
                self.counts["replayed_replies"] += 1
                self._reply(w, *self.log.kept(w, rid))
            elif pending is not None and pending[1] == rid:
                pass  # resent while it still waits here: it is answered once
            elif clock < 0:  # join: the current shard and the resume clock, or STOP when spent
                if self.pushes >= self.opts.budget:
                    self._answer(w, rid, Msg.STOP, int(self.table.folded[w]))
                else:
                    self._answer(w, rid, Msg.PARAMS, int(self.table.folded[w]), self._payload(w, rid))
            elif status == DROPPED:
                self._answer(w, rid, Msg.DROPPED, clock)
            elif w in self.refused:
                del self.refused[w]
                self._answer(w, rid, Msg.REFUSED, clock, self.params.copy())
            else:
                self.pending[w] = (clock, rid)
        elif mtype in (Msg.DONE, Msg.ABORT):
            if status == LIVE:
                self.table.status[w] = DONE
                self.pending.pop(w, None)
                if mtype == Msg.ABORT:
                    self.aborted.add(w)
                    self._lost(w, EVENT_ABORTED)
            if mtype == Msg.DONE and (self.opts.retries or self.opts.replicas > 1):  # nothing left in flight
                self._send_late(float("inf"), only=w)
                self._reply(w, Msg.DONE, clock)
        elif mtype == Msg.SPEED:
            self.speeds[w] = float(data[0])
            self.speed_waiting[w] = clock
        else:
            raise PSError(f"server {self.index} got unexpected {mtype.name} from rank {source}")
        self._progress_clocks()
        self._serve_pending()

    def _logged(self, w, rid, data):
        """None for a new push; False for a resend (skipped); REJECT's answer for an id reused with other data."""
        seen = self.log.push(w, rid, data)
        if seen == "reused":
            return self._reject(w, rid, 5)
        if seen == "repeat":
            self.counts["duplicate_pushes"] += 1
            return False
        return None

    def _accept_push(self, w, header, data):
        """Return True for a push to apply; answer a malformed one with REJECT, skip a resent one."""
        rid = int(header[H_RID])
        done = self._logged(w, rid, data)
        if done is not None:
            return done
        if data is None or data.shape != self.params.shape:
            return self._reject(w, rid, 1)
        if data.dtype != self.params.dtype:
            return self._reject(w, rid, 2)
        return self._accept_addressed(w, rid, header, data)

    def _accept_addressed(self, w, rid, header, data):  # dense and sparse pushes: shard, version, remember
        if int(header[H_SHARD]) != self.index or int(header[H_VERSION]) > self.version:  # another shard's; unseen version
            return self._reject(w, rid, 3 if int(header[H_SHARD]) != self.index else 4)
        self.log.remember(w, rid, data)
        self.counts["pushes_received"] += 1
        return True

    def _reject(self, w, rid, code):
        self.counts["rejected"] += 1
        self.rejected[code] = self.rejected.get(code, 0) + 1
        self._reply(w, Msg.REJECT, code, rid=rid)
        return False

    def _push(self, w, clock, grad, stale):
        if grad is None or grad.shape != self.params.shape:
            raise PSError(f"push from worker {w} has {0 if grad is None else grad.shape[0]} elements, "
                          f"shard has {self.params.shape[0]}")
        if self.buckets is not None:  # BSP, SSP: one update per clock on the mean gradient
            if self.staleness_lr and stale > 1:  # Zhang et al. 2016, per gradient: lr / tau (a new array:
                grad = grad / stale                 # a received gradient is never changed, ps.replicas.chain_replication)
            self.buckets.add(w, clock, grad)
            return
        tau = (self.pushes - self.read_version[w]) / self.n_workers  # gradient staleness (clocks)
        lr = self.opt.rate(self.pushes, self._horizon(), tau, self.n_workers)
        with tracing.span("update", "ps", {"worker": int(w), "clock": int(clock)}):
            self.opt.step(grad, lr)
        self.version += 1
        self.table.fold(w, clock)
        self._after_fold(1)

    def _horizon(self):
        return self.opts.horizon or self.opts.budget  # pushes over which the schedule runs (the budget unless set)

    def _progress_clocks(self):
        """Apply every complete clock bucket (BSP, SSP), oldest first: one optimizer step each.

        Once the budget is spent nothing more is applied: under SSP, fast workers' pushes of later
        clocks are then left over, and the workers that finish would otherwise make those buckets
        complete with fewer contributions.
        """
        while self.buckets is not None and self.error_worker < 0 and self.pushes < self.opts.budget:
            ready = self.buckets.pop_ready()
            if ready is None:
                return
            clock, mean, workers = ready
            with tracing.span("update", "ps", {"clock": int(clock), "workers": len(workers)}):
                self.opt.step(mean, self.opt.rate(self.pushes, self._horizon()))
            self.version += 1
            for w in workers:
                self.table.fold(w, clock)
            self._after_fold(len(workers))

    def _after_fold(self, count):
        before, self.pushes = self.pushes, self.pushes + count
        every = self.opts.snapshot_every
        if every and before // every != self.pushes // every:
            self.snapshots.append((self.pushes, time.monotonic() - self._t0, self.params.copy()))
        every = self.opts.checkpoint_every_pushes
        if every and self.opts.checkpoint_dir and before // every != self.pushes // every:
            self.checkpoint()
        if self.on_push is not None:
            self.on_push(self.pushes)

    def _serve_pending(self):
        for w in list(self.pending):
            clock, rid = self.pending[w]
            if self.error_worker >= 0:
                self._answer(w, rid, Msg.ERROR, clock, worker=self.error_worker)
            elif self.pushes >= self.opts.budget:
                self._answer(w, rid, Msg.STOP, clock)
            elif w in self.refused:  # its push was refused after the pull arrived
                del self.refused[w]
                self._answer(w, rid, Msg.REFUSED, clock, self.params.copy())
            elif self.table.servable(w, clock):
                stale = self.table.staleness_of(w, clock)
                self.read_staleness[w] = stale
                self.read_version[w] = self.pushes
                self._answer(w, rid, Msg.PARAMS, stale, self._payload(w, rid))
            else:
                continue
            del self.pending[w]
        if self.speed_waiting:
            self._answer_speeds()

    def _answer_speeds(self):
        live = self.table.live()
        lockstep = self.opts.consistency == "bsp" or (self.opts.consistency == "ssp" and self.opts.staleness == 0)
        if lockstep and not set(live.tolist()) <= set(self.speed_waiting):
            return  # BSP, SSP(0): every live worker reports at the same clock; answer them together
        known = self.speeds > 0
        mean = self.speeds[known].mean() if known.any() else 1.0
        rate = 1.0 / np.where(known, self.speeds, mean)      # samples per second
        rate[self.table.status != LIVE] = 0.0
        nominal = proportional(np.ones(self.n_workers), self.opts.global_batch or self.opts.worker_batch * self.n_workers)
        total = int(nominal[rate > 0].sum())  # the live workers' part of the global batch
        cap = max(self.opts.max_batch, -(-total // max(1, int((rate > 0).sum())))) if self.opts.max_batch else None
        batches = proportional(rate, total, cap)  # within each worker's memory bound while the live ones fit it
        for w, clock in self.speed_waiting.items():
            self._reply(w, Msg.BATCH, clock, batches.astype(self.params.dtype))
        self.speed_waiting.clear()

    def _check_silence(self, now):
        late = self.faults.waiting()
        for w in self.table.live():
            if w in self.pending or w in self.speed_waiting or w in late:
                continue  # waiting on this server (for a reply it holds back, too): not silent
            rank = self.worker_ranks[w]
            if rank in dead(self.comm) or (now - self._last_heard[w] > self.opts.ps_timeout
                                           and not waiting(self.comm, rank)):
                self.table.status[w] = DROPPED  # dead (ULFM), or silent with nothing of it waiting unread here
                self._lost(w, EVENT_DIED if rank in dead(self.comm) else EVENT_DROPPED)
        self._progress_clocks()
        self._serve_pending()

    def _lost(self, w, code):
        self.events.append((time.monotonic() - self._t0, w, code))
        if self.opts.consistency == "bsp" and self.error_worker < 0:
            self.error_worker = w

    def _reply(self, w, mtype, clock, data=None, worker=None, rid=0, version=None):
        self._sends += [(req, buf, w) for req, buf in send(
            self.comm, self.worker_ranks[w], mtype, w if worker is None else worker, clock, data, rid=rid,
            version=self.version if version is None else version, shard=self.index, epoch=self.epoch,
            aux=self.acked_clocks)]

    def _payload(self, w, rid):  # what a PARAMS reply carries (ps.embedding's SparseServer: the rows asked for)
        return self.params.copy()

    def _answer(self, w, rid, mtype, clock, data=None, worker=None):
        """Reply to pull ``rid`` of worker ``w``, keep the reply for a resend, and inject the set faults."""
        reply = (mtype, clock, data, worker, rid, self.version)
        self.log.keep(w, rid, reply)
        fault = self.faults.draw(w, rid) if rid and mtype != Msg.STOP else None
        if fault == "drop":
            self.counts["dropped_replies"] += 1
        elif fault == "late":
            self.counts["late_replies"] += 1
            self.faults.hold(w, reply)
        else:
            self._reply(w, *reply)

    def _send_late(self, now, only=None):
        """Send the late replies that are due (to a live worker; every one of ``only`` when it leaves)."""
        for w, reply in self.faults.due(now, only):
            if only is not None or self.table.status[w] == LIVE:
                self._reply(w, *reply)

    def checkpoint(self):
        """Write this server's shard, optimizer state, clocks and origin to its checkpoint file (atomic)."""
        save_server(self)

    def _resume(self, path):
        restore_server(self, path)  # ps.checkpoints.shard_files: refuses another run's, another server's, nonsense
