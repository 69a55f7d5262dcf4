"""The worker side of the parameter server: push gradient shards, pull parameter shards.

A worker at clock ``c`` pushes gradient ``c`` (each server gets its shard) and pulls the parameters
for clock ``c + 1``; each server answers the pull once its consistency model allows
(:mod:`ps.serving.shard_server`). Every wait polls with a deadline, so a vanished server shows up as
:class:`ps.wire.messages.PSTimeout` instead of a hang.

Every PUSH and PULL carries a request id (1, 2, ...) and every PUSH the version of the shard its
gradient was computed from (the version of the last reply from that server). With ``retries`` a
request that gets no answer within ``retry_s`` seconds is sent again with its id, up to ``retries``
times with the wait doubling each time (ps-lite's resend after a timeout): the pull and the push it
follows, which the server applies once. A reply to an earlier request (a late original after its
resend was answered) is received and dropped. Under ``cas`` a pull answered with REFUSED by some
servers returns ``"refused"``: the worker recomputes on the values it just received and pushes again
to those servers only (:attr:`Client.refused_shards`).

Replicated shards (``replicas`` > 1, :mod:`ps.replicas.chain_replication`): requests go to each shard's primary and
carry its epoch; when a primary does not answer within ``reply_timeout`` the worker takes the next
replica of the chain (:class:`ps.worker.failover.Chains`), resends what was not answered there (the new
primary applies a push once), and goes on; an EPOCH message from a newer primary moves it at once.
Replies from a replica that is no longer the primary are dropped, and so are the pending sends to it.
DONE is then always a handshake, so that the worker leaves only once the chain has its DONE. While a
worker waits longer than ``heartbeat_s``, it sends a HEARTBEAT to the servers (primaries) it is not
waiting on, so that a failover or a stopped server of one shard does not make the others drop it for
silence. A worker that itself did not run for a while (stopped, descheduled) does not count that time
against the servers it waits on.
"""
import time

import numpy as np

from commlab import tracing
from ps.worker.failover import Chains
from ps.wire.messages import (H_AUX, H_CLOCK, H_RID, H_TYPE, H_VERSION, H_WORKER, REJECT_REASONS, STALL_S, Backoff, Msg,
                         PSError, PSTimeout, dead, probe, receive, send, wait_all)
from ps.shards.key_ranges import shard_offsets

__all__ = ["Client"]


class Client:
    """Push/pull endpoint of one worker.

    Parameters
    ----------
    comm : MPI.Comm
        The run's duplicated communicator.
    worker : int
        This worker's index ``0 .. W - 1``.
    server_ranks : sequence of int, or sequence of sequence of int
        Ranks of the servers in shard order, or (replicated shards) every shard's chain, primary first
        (:func:`ps.replicas.chain_replication.chains`).
    worker_ranks : sequence of int
        Ranks of the workers (in worker-index order).
    n_params : int
        Length of the flat parameter vector (elements).
    dtype : numpy.dtype
        Parameter dtype on the wire (float32 or float64).
    reply_timeout : float
        Longest wait for a server's answer (seconds).
    retries : int
        Resends of an unanswered request (0: none; the wait is then ``reply_timeout``).
    retry_s : float
        First wait before a resend (seconds), doubling with each; the last try waits until
        ``reply_timeout`` has passed since the request was first sent.
    heartbeat_s : float, optional
        Seconds between the heartbeats a waiting worker sends the servers it is not waiting on (default
        ``reply_timeout / 3``); below the servers' silence timeout.

    Attributes
    ----------
    versions : ndarray, shape (S,), int64
        The version of each shard in the last reply from its server.
    resends, stale_replies : int
        Requests sent again, and replies to earlier requests (or repeats, or from a replica that is no
        longer the primary) received and dropped.
    chains : ps.worker.failover.Chains
        Each shard's primary and epoch, and the failovers made.
    acked_clocks : ndarray, shape (shards,), int64
        Replicated shards: the most clocks of this worker a primary said were on every live replica
        of its shard when it answered (the acknowledged pushes; the reply's ``aux``).

    Raises
    ------
    ValueError
        When ``worker`` is out of range or ``reply_timeout`` is not positive.

    Examples
    --------
    Worker 0 of two, with servers at ranks 1 and 2 each holding half of 10 float32 parameters
    (:func:`ps.shards.key_ranges.shard_offsets`); :func:`ps.job.runner.run` makes one per worker and drives
    :meth:`join`, :meth:`push`, :meth:`pull` and :meth:`finish` (the user guide's ``ps_example.py``
    runs a whole job). Building one sends nothing:

    >>> import numpy as np
    >>> from mpi4py import MPI
    >>> client = Client(MPI.COMM_WORLD, 0, [1, 2], [3, 4], 10, np.float32, reply_timeout=5.0)
    >>> client.offsets.tolist(), client.server_ranks, client.versions.tolist()
    ([0, 5, 10], [1, 2], [0, 0])
    >>> Client(MPI.COMM_WORLD, 2, [1, 2], [3, 4], 10, np.float32, reply_timeout=5.0)
    Traceback (most recent call last):
    ...
    ValueError: worker must be in [0, 2), got 2
    """

    def __init__(self, comm, worker, server_ranks, worker_ranks, n_params, dtype, reply_timeout, *, retries=0,
                 retry_s=1.0, heartbeat_s=None):
        if not 0 <= worker < len(worker_ranks):
            raise ValueError(f"worker must be in [0, {len(worker_ranks)}), got {worker}")
        if not reply_timeout > 0:
            raise ValueError(f"reply_timeout must be > 0 seconds, got {reply_timeout}")
        self.comm, self.worker = comm, int(worker)
        self.chains = Chains(server_ranks)
        self.replicas = max(len(c) for c in self.chains.chains)
        self.server_ranks, self.worker_ranks = self.chains.heads, list(worker_ranks)  # the current primaries
        self.dtype, self.reply_timeout = np.dtype(dtype), float(reply_timeout)
        self.heartbeat_s = self.reply_timeout / 3 if heartbeat_s is None else float(heartbeat_s)
        self.offsets = shard_offsets(int(n_params), len(self.server_ranks))
        self.wait_seconds = 0.0      # time spent waiting for pull answers (seconds)
        self.last_staleness = []     # staleness reported by each server for the last pull (clocks)
        self.retries, self.retry_s = int(retries), float(retry_s)
        self.versions = np.zeros(len(self.server_ranks), np.int64)
        self.refused_shards = []     # shards whose server refused the last push (cas)
        self.resends = self.stale_replies = 0
        self.acked_clocks = np.zeros(len(self.server_ranks), np.int64)  # per shard: clocks acknowledged
        self._rid = 0
        self._outbox = {r: [] for r in self.chains.shard_of}  # rank -> unanswered requests (to resend)
        self._pushes = []            # (request, buffer, rank) of sends not yet complete

    def join(self):
        """Fetch the current parameters and the clock to start (or resume) from.

        Returns
        -------
        params : ndarray, shape (n_params,)
            Host copy of the parameters.
        clock : int
            Smallest resume clock reported by the servers (0 on a fresh start).
        stopped : bool
            True when a server reports the budget already spent (a finished run resumed).
        """
        params = np.empty(int(self.offsets[-1]), dtype=self.dtype)
        replies = self._request(Msg.PULL, -1, params, self.server_ranks)
        stopped = any(h[H_TYPE] == Msg.STOP for h, _ in replies.values())
        return params, min(int(h[H_CLOCK]) for h, _ in replies.values()), stopped

    def push(self, clock, grad, shards=None):
        """Send gradient ``clock`` to the servers, each its shard (non-blocking).

        Parameters
        ----------
        clock : int
            The worker's clock of this gradient.
        grad : ndarray, shape (n_params,)
            Host gradient, already weighted; it must stay unchanged until the next :meth:`pull`.
        shards : list of int, optional
            Only these shards (a ``cas`` recomputation); default all.

        Raises
        ------
        TypeError
            When ``grad`` has another dtype than the parameters.
        ValueError
            When ``grad`` is not a 1-D array of ``n_params`` elements.
        """
        if grad.dtype != self.dtype:
            raise TypeError(f"grad must have dtype {self.dtype}, got {grad.dtype}")
        if grad.shape != (int(self.offsets[-1]),):
            raise ValueError(f"grad must have shape ({int(self.offsets[-1])},), got {grad.shape}")
        grad = np.ascontiguousarray(grad)
        self._rid += 1
        with tracing.span("push", "ps", {"clock": int(clock)}):
            for s in (range(len(self.server_ranks)) if shards is None else shards):
                rank, part = self.server_ranks[s], grad[self.offsets[s]:self.offsets[s + 1]]
                request = (Msg.PUSH, int(clock), part, self._rid, int(self.versions[s]), s)
                self._outbox[rank].append(request)
                self._pushes += self._send(rank, request)

    def pull(self, clock, out, shards=None):
        """Pull the parameters for ``clock`` into ``out``.

        Parameters
        ----------
        clock : int
            The reader's clock (gradients it has pushed so far).
        out : ndarray, shape (n_params,)
            Host buffer receiving the parameters.
        shards : list of int, optional
            Only these shards (after a ``cas`` recomputation); default all.

        Returns
        -------
        str
            ``"params"`` (``out`` is filled), ``"refused"`` (``out`` is filled; the servers of
            :attr:`refused_shards` refused the last push: recompute and push to them again),
            ``"stop"`` (budget spent) or ``"dropped"`` (this worker was dropped for silence).

        Raises
        ------
        PSError
            When a server reports the BSP error state; ABORT has been sent to every server.
        PSTimeout
            When a server does not answer within ``reply_timeout`` (after ``retries`` resends).
        """
        ranks = self.server_ranks if shards is None else [self.server_ranks[s] for s in shards]
        with tracing.span("pull", "ps", {"clock": int(clock)}):  # the wait for the servers' answers included
            replies = self._request(Msg.PULL, clock, out, ranks)
            wait_all(self._live(self._pushes), time.monotonic() + self.reply_timeout, "push sends")
        self._pushes = []
        kinds = {Msg(int(h[H_TYPE])) for h, _ in replies.values()}
        if Msg.ERROR in kinds:
            lost = next(int(h[H_WORKER]) for h, _ in replies.values() if h[H_TYPE] == Msg.ERROR)
            self.finish(Msg.ABORT)
            raise PSError(f"BSP cannot continue: worker rank {self.worker_ranks[lost]} stopped answering "
                          f"(dropped after --ps-timeout or aborted); every rank stops")
        self.last_staleness = [int(h[H_CLOCK]) for h, _ in replies.values() if h[H_TYPE] == Msg.PARAMS]
        self.refused_shards = sorted(self.server_ranks.index(r) for r, (h, _) in replies.items()
                                     if h[H_TYPE] == Msg.REFUSED)
        if Msg.DROPPED in kinds:
            return "dropped"
        if Msg.STOP in kinds:
            return "stop"
        return "refused" if self.refused_shards else "params"

    def report_speed(self, clock, seconds_per_sample):
        """Report this worker's measured speed to server 0 and receive every worker's new batch.

        Parameters
        ----------
        clock : int
            Current clock.
        seconds_per_sample : float
            Measured step time per sample, delays included (seconds).

        Returns
        -------
        ndarray, shape (W,), int64
            Batch (samples) of every worker; this worker's is ``batches[worker]``.
        """
        data = np.array([seconds_per_sample], dtype=self.dtype)
        req = send(self.comm, self.server_ranks[0], Msg.SPEED, self.worker, clock, data)
        header, batches = self._await({self.server_ranks[0]}, None, want=(Msg.BATCH,))[self.server_ranks[0]]
        wait_all(req, time.monotonic() + self.reply_timeout, "speed report")
        if header[H_TYPE] != Msg.BATCH:
            raise PSError(f"expected BATCH from server 0, got {Msg(int(header[H_TYPE])).name}")
        return np.rint(batches).astype(np.int64)

    def finish(self, mtype=Msg.DONE):
        """Tell every server that this worker leaves (DONE, or ABORT after an error).

        With retries, DONE is a handshake: each server first sends what it still held for this worker
        (late replies), then acknowledges, so that nothing sent to this worker is left in flight.
        """
        reqs = []
        for s, rank in enumerate(self.server_ranks):
            request = (mtype, 0, None, 0, 0, s)
            self._outbox[rank] = [request] if self.replicas > 1 else []  # resent to a new primary
            reqs += self._send(rank, request)
        if mtype == Msg.DONE and (self.retries or self.replicas > 1):
            self._await(set(self.server_ranks), None, 0, acks=True)
        wait_all(self._live(reqs + self._pushes), time.monotonic() + self.reply_timeout, f"{mtype.name} sends")
        self._pushes = []

    # ------------------------------------------------------------------------------------------
    def _send(self, rank, request):
        mtype, clock, data, rid, version, shard = request
        return [(r, b, rank) for r, b in send(self.comm, rank, mtype, self.worker, clock, data, rid=rid,
                                              version=version, shard=shard, epoch=self.chains.epochs[shard])]

    def _live(self, sends):
        """The ``(request, buffer)`` pairs of ``sends`` to replicas not given up (a dead one's never complete)."""
        return [(r, b) for r, b, rank in sends if rank not in self.chains.gone]

    def _fail_over(self, rank, sources, replies):
        """Give up on primary ``rank``: take the next replica of its shard, or stop when none is left."""
        try:
            self.chains.fail_over(rank, worker=self.worker, timeout=self.reply_timeout)
        except PSError:
            self.finish(Msg.ABORT)  # the other shards' primaries learn it at once
            raise
        self._moved(sources, replies)

    def _moved(self, sources, replies):
        """After a change of primary: resend the old primary's unanswered requests to the new one."""
        _, _, old, new = self.chains.failovers[-1]
        self._outbox[new], self._outbox[old] = self._outbox[old], []
        for request in self._outbox[new]:
            self._pushes += self._send(new, request)
        if old in sources:
            sources.discard(old)
            sources.add(new)
        if old in replies:  # answered before the takeover: the answer stands
            replies[new] = replies.pop(old)

    def _request(self, mtype, clock, out, ranks):
        self._rid += 1
        reqs = []
        for rank in ranks:
            s = self.server_ranks.index(rank)
            request = (mtype, int(clock), self._pull_payload(s), self._rid, 0, s)
            self._outbox[rank].append(request)
            reqs += self._send(rank, request)
        t0 = time.monotonic()
        replies = self._await(set(ranks), out, self._rid)
        self.wait_seconds += time.monotonic() - t0
        wait_all(self._live(reqs), time.monotonic() + self.reply_timeout, f"{mtype.name} sends")
        return replies

    def _pull_payload(self, shard):
        return None  # what a PULL to ``shard`` carries (ps.embedding.sparse_push_pull.SparseClient: the row ids)

    def _await(self, sources, out, rid=None, acks=False, want=None):
        """Receive one reply to request ``rid`` (None: any) from each rank in ``sources``.

        PARAMS and REFUSED payloads land in ``out``; replies to earlier requests are dropped, and so
        is any reply whose type is not in ``want`` (when given: the speed report waits for BATCH, and
        a late PARAMS arriving meanwhile is stale). An unanswered rank gets its outstanding requests
        again after ``retry_s`` (doubling), up to ``retries`` times; ``acks``: wait for the DONE
        acknowledgements of :meth:`finish`.
        """
        replies, backoff = {}, Backoff()
        start = time.monotonic()
        deadline, tries, wait = start + self.reply_timeout, 0, self.retry_s
        resend_at = start + wait if self.retries and not acks else float("inf")
        ping_at = start + self.heartbeat_s
        looked = start
        while len(replies) < len(sources):
            now = time.monotonic()
            if now - looked > STALL_S:  # this worker did not run (or handled a reply) meanwhile: no server's
                deadline, resend_at = deadline + (now - looked), resend_at + (now - looked)  # silence, skipped
            looked = now
            msg = probe(self.comm)
            if msg is None:
                now = time.monotonic()
                if now > ping_at:  # tell the primaries not waited on that this worker lives (heartbeat)
                    for s, rank in enumerate(self.server_ranks):
                        if rank not in sources or rank in replies:
                            self._pushes += self._send(rank, (Msg.HEARTBEAT, 0, None, 0, 0, s))
                    ping_at = now + self.heartbeat_s
                if now > resend_at:
                    tries, wait = tries + 1, 2 * wait
                    for rank in sorted(sources - set(replies)):
                        for request in self._outbox[rank]:
                            self.resends += 1
                            self._pushes += self._send(rank, request)
                    resend_at = now + wait if tries < self.retries else float("inf")
                gone = [r for r in sorted(sources - set(replies)) if r in dead(self.comm)]  # ULFM said so
                if gone and self.replicas > 1:  # fail over at once: the next replica of each dead primary
                    for rank in gone:
                        self._fail_over(rank, sources, replies)
                    deadline = now + self.reply_timeout
                elif gone:
                    raise PSTimeout(f"worker {self.worker}: server rank(s) {gone} died (the MPI library reported "
                                    "it)")
                elif now > deadline and self.replicas > 1:  # fail over: the next replica of each silent primary
                    for rank in sorted(sources - set(replies)):
                        self._fail_over(rank, sources, replies)
                    deadline = now + self.reply_timeout
                elif now > deadline:
                    missing = sorted(sources - set(replies))
                    raise PSTimeout(f"worker {self.worker}: no answer from server rank(s) {missing} "
                                    f"within {self.reply_timeout:g} s" + (f" ({tries} resends)" if tries else ""))
                backoff.sleep()
                continue
            source, mtype = msg
            try:
                header, data = receive(self.comm, source, mtype, deadline)
            except PSTimeout:  # the header came, its payload never will: the sender died in between
                if self.replicas == 1 or source not in self.chains.shard_of:
                    raise
                if not self.chains.stale(source):
                    self._fail_over(source, sources, replies)
                    deadline = time.monotonic() + self.reply_timeout
                continue
            if mtype == Msg.EPOCH:  # a replica took over its shard: turn to it now
                if self.chains.newer(source) is not None:
                    self._moved(sources, replies)
                    deadline = time.monotonic() + self.reply_timeout  # the new primary's full allowance
                continue
            if self.chains.stale(source):
                self.stale_replies += 1  # from a replica given up: fenced
                continue
            if source in self.chains.shard_of and header[H_AUX]:  # clocks this primary acknowledged
                s = self.chains.shard_of[source]
                self.acked_clocks[s] = max(int(self.acked_clocks[s]), int(header[H_AUX]))
            if source not in sources:
                if source in self.server_ranks and int(header[H_RID]) and int(header[H_RID]) != rid:
                    self.stale_replies += 1  # a late reply to an earlier request, from a server not asked now
                    continue
                raise PSError(f"worker {self.worker}: unexpected {mtype.name} from rank {source}")
            if (acks and mtype != Msg.DONE or (rid is not None and int(header[H_RID]) != rid and mtype != Msg.REJECT)
                    or (want is not None and mtype not in want and mtype != Msg.REJECT) or source in replies):
                self.stale_replies += 1  # a reply to an earlier request, or its repeat: already answered
                continue
            if mtype == Msg.REJECT:
                reason = REJECT_REASONS.get(int(header[H_CLOCK]), f"code {int(header[H_CLOCK])}")
                raise PSError(f"worker {self.worker}: server rank {source} rejected request "
                              f"{int(header[H_RID])}: {reason}")
            if mtype in (Msg.PARAMS, Msg.REFUSED):
                s = self.server_ranks.index(source)
                out[self.offsets[s]:self.offsets[s + 1]] = data if data is not None else 0
                self.versions[s] = int(header[H_VERSION])
            if rid is not None:
                self._outbox[source] = []  # answered: the push before this pull arrived too
            replies[source] = (header, data)
            backoff.reset()
        return replies
