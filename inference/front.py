"""The front rank: accepts requests, batches them, dispatches batches to replicas, collects answers.

All traffic with the replicas is nonblocking point-to-point (``Isend``/``Irecv``, tested in one
loop) on the serving communicator. Each replica always has one reply receive posted, and holds at
most ``inflight`` batches: a batch leaves the front only when a replica has room for it, so while
the replicas are busy requests wait in the batcher and merge into full batches. A replica with
work outstanding that sends nothing for ``replica_timeout`` seconds is removed: its in-flight
requests go back to the head of the batcher queue and are retried on another replica, exactly once;
a request whose second replica also fails, or that finds no replica left, is answered with an error.
Replies that arrive from a removed replica are counted and dropped, so no request is answered
twice. A replica whose process is gone is removed the same way: by its silence, or at once when
the MPI library fails a transfer with it (``MPI.Exception``, under Open MPI's ``--enable-recovery``
for instance); only that replica's messages are given up. Shutdown drains: every waiting and
in-flight request is answered first, then each replica gets STOP and answers FIN after its last
reply (messages between two ranks do not overtake each other, so nothing of a replica is still on
the wire after its FIN).
"""
import time

import numpy
from mpi4py import MPI

from inference.replicas.replica import BATCH, HEAD_REPLY, HEAD_WORK, STOP, TAG_REPLY, TAG_WORK
from inference.request import parse_features

__all__ = ["Front", "FrontOptions"]


class FrontOptions:
    """How the front batches, admits and records requests.

    Parameters
    ----------
    replica_timeout : float
        Seconds without any reply from a replica that has work outstanding before it is removed.
    inflight : int
        Batches a replica may hold at once (>= 1); the front keeps the rest, so they merge.
    max_queue : int
        Requests that may wait at the front (>= 1); more are refused ("queue full").
    objective : inference.policies.slo.LatencyObjective or None
        Latency objective: AIMD batch size and admission control.
    keep : bool
        Keep every request in :attr:`Front.requests` (the load test's records); False keeps only
        what unanswered requests need (a long-running HTTP server).
    metrics : inference.web.prometheus.ServingMetrics or None
    fail_after : int or None
        Raise on the front after this many batches (fault injection).
    poll_s : float
        Sleep of an idle loop iteration (seconds).
    """

    __slots__ = ("replica_timeout", "inflight", "max_queue", "objective", "keep", "metrics", "fail_after", "poll_s")

    def __init__(self, replica_timeout=2.0, inflight=1, max_queue=1 << 20, objective=None, keep=True, metrics=None,
                 fail_after=None, poll_s=1e-4):
        if not replica_timeout > 0:
            raise ValueError(f"replica_timeout must be > 0 seconds, got {replica_timeout!r}")
        if inflight < 1 or max_queue < 1:
            raise ValueError(f"inflight and max_queue must be >= 1, got {inflight!r}, {max_queue!r}")
        self.replica_timeout, self.inflight, self.max_queue = float(replica_timeout), int(inflight), int(max_queue)
        self.objective, self.keep, self.metrics, self.fail_after = objective, keep, metrics, fail_after
        self.poll_s = float(poll_s)


class Front:
    """Batching, balancing, admission and failure handling on the front rank.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        Serving communicator; this rank is the front.
    leaders : list of int
        Rank of each replica's leader in ``comm``.
    n_features, n_classes : int
    batcher : inference.policies.batching.DynamicBatcher
    balancer : inference.policies.balance.Balancer
    options : FrontOptions

    Attributes
    ----------
    requests : list of inference.request.Request
        Every request submitted, in order (only with ``options.keep``).
    batches : list of (int, int, float)
        (replica, batch size, dispatch time) of every batch sent (only with ``options.keep``).
    outcomes : dict of str -> int
        Requests answered per status (``ok``, ``rejected``, ``refused``, ``failed``).
    batch_sizes : ndarray, shape (max_batch + 1,), int64
        Batches sent per size.
    replica_batches, replica_sent : ndarray, shape (R,), int64
        Batches and requests sent to each replica.
    removed : dict of int -> float
        Removed replicas and when (seconds, front clock).
    lost : dict of int -> str
        Replicas with which the MPI library failed a transfer, and its error (they get no more messages).
    late_replies : int
        Replies dropped because their replica had been removed.
    answers, duplicates : int
        Answers given (one per request when all is well) and answers refused because the request
        had already been answered (must stay 0).
    """

    def __init__(self, comm, leaders, n_features, n_classes, batcher, balancer, options=None):
        self.comm, self.leaders = comm, list(leaders)
        self.F, self.C = int(n_features), int(n_classes)
        self.batcher, self.balancer = batcher, balancer
        self.options = opt = options or FrontOptions()
        self.replica_timeout, self.poll_s = opt.replica_timeout, opt.poll_s
        self.requests, self.batches, self.removed, self.lost, self.late_replies = [], [], {}, {}, 0
        self.answers = self.duplicates = 0
        self.outcomes = dict.fromkeys(("ok", "rejected", "refused", "failed"), 0)
        R = len(self.leaders)
        self.batch_sizes = numpy.zeros(batcher.max_batch + 1, numpy.int64)
        self.replica_batches, self.replica_sent = numpy.zeros(R, numpy.int64), numpy.zeros(R, numpy.int64)
        if opt.objective is not None:
            batcher.size = opt.objective.size
        self._bufs = [numpy.empty(HEAD_REPLY + batcher.max_batch * self.C) for _ in range(R)]
        self._recvs = [comm.Irecv(self._bufs[r], source=self.leaders[r], tag=TAG_REPLY) for r in range(R)]
        self._fin = [False] * R
        self._inflight = {}  # batch id -> (replica, [requests], dispatch time)
        self._held = numpy.zeros(R, numpy.int64)  # batches each replica holds
        self._sends = []  # (request, buffer, replica) until complete
        self._last = numpy.zeros(R)  # last sign of life while busy (seconds)
        self._next_id = 0

    # ----------------------------------------------------------------------------------- input
    def submit(self, req, now):
        """Accept ``req`` (queue it), or answer it at once: 'rejected' when its payload is bad, 'refused'
        when the queue is full or it cannot meet the latency objective. The payload is not kept."""
        if self.options.keep:
            self.requests.append(req)
        try:
            req.x = parse_features(req.payload, self.F)
        except ValueError as e:
            req.payload = None
            self._finish(req, now, "rejected", str(e))
            return
        req.payload = None  # the parsed row is all it needs from now on
        why = None
        if len(self.batcher) >= self.options.max_queue:
            why = f"queue full: {len(self.batcher)} requests wait (--max-queue {self.options.max_queue})"
        elif self.options.objective is not None:
            why = self.options.objective.admit(now, len(self.batcher), self._slots(), self._busy_left(now))
        if why:
            self._finish(req, now, "refused", why)
        else:
            self.batcher.add(req, now)

    def _slots(self):
        return int(self.balancer.alive.sum()) * self.options.inflight

    def _busy_left(self, now):
        """Seconds until the first replica has room (0 when one has room now), from the service estimate."""
        room = self._room()
        if room.any() or not self._inflight:
            return 0.0
        est = self.options.objective.service_s
        return max(0.0, min(t for _, _, t in self._inflight.values()) + est - now)

    def _room(self):
        return self.balancer.alive & (self._held < self.options.inflight)

    def pending(self):
        """Return how many requests wait in the batcher or are in flight."""
        return len(self.batcher) + sum(len(b[1]) for b in self._inflight.values())

    def in_flight(self):
        """Return how many requests are at replicas, not yet answered."""
        return sum(len(b[1]) for b in self._inflight.values())

    # ------------------------------------------------------------------------------- the loop
    def step(self, now, force=False):
        """Collect replies, detect failed replicas and dispatch due batches; return True if any work was done."""
        busy = self._collect(now)
        self._sends = [s for s in self._sends if not self._sent(s, now)]
        for r in numpy.flatnonzero(self.balancer.alive):
            if self.balancer.outstanding[r] > 0 and now - self._last[r] > self.replica_timeout:
                self._remove(int(r), now)
                busy = True
        while True:
            if not self.balancer.any_alive():  # nothing can serve: what waits fails now
                for req in self.batcher.drain():
                    self._finish(req, now, "failed", "no replica left")
                break
            if not self.batcher.due(now, force):
                break
            r = self.balancer.choose(self._room())
            if r is None:  # every replica (or the one whose turn it is) is full: requests merge here
                break
            batch = self._admit_batch(self.batcher.take(now, force), now)
            while len(batch) < self.batcher.size and len(self.batcher):  # refill what the objective refused
                batch += self._admit_batch(self.batcher.take(now, True, self.batcher.size - len(batch)), now)
            if batch:
                self._dispatch(r, batch, now)
            busy = True
        if self.options.metrics is not None:
            self.options.metrics.gauges(len(self.batcher), self.in_flight(), int(self.balancer.alive.sum()),
                                        self.batcher.size)
        return busy

    def _admit_batch(self, batch, now):
        """Refuse the requests of ``batch`` that can no longer meet the latency objective; return the rest."""
        obj = self.options.objective
        if obj is None:
            return batch
        keep = []
        for req in batch:
            why = obj.expired(now, req.arrival)
            if why:
                self._finish(req, now, "refused", why)
            else:
                keep.append(req)
        return keep

    def next_event(self):
        """Return when the oldest waiting request's batch wait ends (seconds), or None."""
        return self.batcher.deadline()

    def _dispatch(self, r, batch, now):
        fail = self.options.fail_after
        if fail is not None and self._next_id >= fail:
            raise RuntimeError(f"front fault injected after {fail} batches (--fail-front)")
        if self.balancer.outstanding[r] == 0:
            self._last[r] = now
        bid, n = self._next_id, len(batch)
        self._next_id += 1
        msg = numpy.empty(HEAD_WORK + n * self.F)
        msg[:HEAD_WORK] = (BATCH, bid, n)
        msg[HEAD_WORK:].reshape(n, self.F)[...] = [req.x for req in batch]
        try:
            send = self.comm.Isend(msg, dest=self.leaders[r], tag=TAG_WORK)
        except MPI.Exception as e:  # the replica is gone: the batch goes back to the head of the queue
            self._lose(r, now, e)
            for req in reversed(batch):
                self.batcher.add(req, now, front=True)
            return
        for req in batch:
            if req.attempts == 0:
                req.batch_wait = now - req.arrival
            req.attempts += 1
            req.dispatched = now
        self._sends.append((send, msg, r))
        self._inflight[bid] = (r, batch, now)
        self._held[r] += 1
        self.balancer.sent(r, n)
        if self.options.keep:
            self.batches.append((r, n, now))
        self.batch_sizes[n] += 1
        self.replica_batches[r] += 1
        self.replica_sent[r] += n
        if self.options.metrics is not None:
            self.options.metrics.batch(n)

    def _collect(self, now):
        got, status = False, MPI.Status()
        for r in range(len(self._recvs)):
            try:
                got = self._collect_from(r, now, status) or got
            except MPI.Exception as e:
                self._lose(r, now, e)
                got = True
        return got

    def _sent(self, send, now):
        """Test one (request, buffer, replica) send; True once complete, or given up with its replica."""
        try:
            return send[2] in self.lost or send[0].Test()
        except MPI.Exception as e:
            self._lose(send[2], now, e)
            return True

    def _lose(self, r, now, exc):
        """The MPI library failed a transfer with replica ``r``: remove it, and send it nothing more."""
        self.lost.setdefault(r, MPI.Get_error_string(exc.Get_error_class()).strip())
        self._recvs[r] = None  # not cancelled: the library failed it
        if self.balancer.alive[r]:
            self._remove(r, now)

    def _collect_from(self, r, now, status):
        """Take every reply of replica ``r`` that has arrived; return True if any did."""
        got, req = False, self._recvs[r]
        while req is not None and req.Test(status):
            got = True
            buf = self._bufs[r]
            bid = int(buf[0])
            if bid < 0:  # FIN: the replica has stopped
                self._fin[r], self._recvs[r] = True, None
                break
            entry = self._inflight.get(bid)
            if entry is None or entry[0] != r or not self.balancer.alive[r]:
                self.late_replies += 1
            else:
                del self._inflight[bid]
                self._held[r] -= 1
                if self.options.objective is not None:
                    self.options.objective.observe(now - entry[2])
                    self.batcher.size = self.options.objective.size
                self._answer(r, entry[1], buf, now)
            req = self._recvs[r] = self.comm.Irecv(buf, source=self.leaders[r], tag=TAG_REPLY)
        return got

    def _answer(self, r, batch, buf, now):
        n = len(batch)
        self.balancer.done(r, n)
        self._last[r] = now
        compute, comm_s, busy = buf[2], buf[3], buf[4]
        logits = buf[HEAD_REPLY:HEAD_REPLY + n * self.C].reshape(n, self.C)
        finite = numpy.isfinite(logits).all(axis=1)
        for i, req in enumerate(batch):
            req.replica, req.batch_size = r, n
            req.compute_s, req.comm_s, req.busy_s = compute, comm_s, busy
            if finite[i]:
                req.logits = logits[i].copy()
                self._finish(req, now, "ok", "")
            else:  # an answer must be numbers (RFC 8259 has no NaN or Infinity)
                self._finish(req, now, "rejected", "the model's logits overflow float64 for these features")

    def _remove(self, r, now):
        self.balancer.remove(r)
        self.removed[r] = now
        back = [bid for bid, (rr, _, _) in self._inflight.items() if rr == r]
        self._held[r] = 0
        for bid in back:
            _, batch, _ = self._inflight.pop(bid)
            self.balancer.done(r, len(batch))
            for req in reversed(batch):  # head of the queue, in their original order
                if req.attempts >= 2:
                    self._finish(req, now, "failed", "two replicas failed to answer")
                else:
                    self.batcher.add(req, now, front=True)

    def _finish(self, req, now, status, error):
        if req.status != "pending":
            self.duplicates += 1
            return
        self.answers += 1
        self.outcomes[status] += 1
        req.status, req.error, req.answered = status, error, now
        if not self.options.keep:
            req.x = None  # the row is not needed once answered
        if self.options.metrics is not None:
            self.options.metrics.request(status, now - req.arrival)
        if req.done is not None:
            req.done(req)

    # ------------------------------------------------------------------------------ shutdown
    def shutdown(self, fin_timeout=10.0):
        """Answer everything waiting or in flight, then stop every replica and wait for its FIN.

        Parameters
        ----------
        fin_timeout : float
            Seconds to wait for the FIN of all replicas after STOP; a removed replica, silent for
            ``replica_timeout`` already, gets ``max(replica_timeout, 2)`` seconds at most. A replica
            whose FIN never comes is reported, its receive cancelled, and its sends not waited for
            (its process may be gone); a lost replica (:attr:`lost`) gets no STOP.

        Returns
        -------
        list of int
            Replicas whose FIN never came.
        """
        while self.pending():
            if not self.step(time.perf_counter(), force=True):
                time.sleep(self.poll_s)
        stop = numpy.zeros(HEAD_WORK)
        stop[0] = STOP
        start = time.perf_counter()
        for r, dest in enumerate(self.leaders):
            if r not in self.lost:
                try:
                    self._sends.append((self.comm.Isend(stop, dest=dest, tag=TAG_WORK), stop, r))
                except MPI.Exception as e:
                    self._lose(r, start, e)
        wait = [fin_timeout if self.balancer.alive[r] else min(fin_timeout, max(self.replica_timeout, 2.0))
                for r in range(len(self.leaders))]
        while any(not self._fin[r] and r not in self.lost and time.perf_counter() - start < wait[r]
                  for r in range(len(self.leaders))):
            if not self._collect(time.perf_counter()):
                time.sleep(self.poll_s)
        missing = [r for r, f in enumerate(self._fin) if not f]
        for r in missing:
            if self._recvs[r] is not None:
                try:
                    self._recvs[r].Cancel()
                    self._recvs[r].Wait()
                except MPI.Exception as e:
                    self.lost.setdefault(r, MPI.Get_error_string(e.Get_error_class()).strip())
                self._recvs[r] = None
        sends = [s for s in self._sends if s[2] not in missing]  # a replica that sent FIN received them all
        while sends and time.perf_counter() - start < fin_timeout:
            sends = [s for s in sends if not self._sent(s, time.perf_counter())]
            time.sleep(self.poll_s)
        return missing
