"""Replicated shards: a chain of server ranks per shard, fenced epochs, and no acknowledged update lost.

Each shard lives on ``R`` consecutive server ranks (:func:`chains`), kept as a chain (van Renesse and
Schneider, "Chain Replication for Supporting High Throughput and Availability", OSDI 2004; key ranges
replicated on neighbouring servers, Li et al., OSDI 2014, sections 4.3-4.4). The workers talk to the
chain's first live replica, the primary. The primary applies a worker's PUSH, DONE and ABORT, and its
own drop of a silent worker, as an unreplicated server does (:class:`ps.serving.shard_server.Server`), and forwards
each down the chain (FORWARD, numbered by ``seq``); every backup applies it the same way and in the
same order, so each replica holds the same shard, optimizer state, clock table and request log (BSP
and SSP sum a clock's bucket in worker order; ASP replays the primary's order with its staleness).
The tail answers ACK, passed back up hop by hop. The primary holds every reply to a worker (PARAMS,
which acknowledges the pushes before it, STOP, ERROR, the DONE handshake) until the chain has
acknowledged every update it applied so far: an acknowledged push is on every live replica.

A replica whose successor leaves a forward unacknowledged for its timeout (three quarters of
``ps_timeout`` at the primary, less down the chain, so that the replica next to a dead one notices
first, and the primary's held replies go out before the workers give up on it) cuts it off: it
sends it FENCED (a replica cut off never becomes primary with updates missing), resends what was not
acknowledged to the next replica, or, being the tail now, acknowledges itself.

Failover (:mod:`ps.worker.failover`): a worker whose primary does not answer within ``ps_timeout +``
:data:`FAILOVER_MARGIN` seconds takes the next replica of the chain. The epoch is the position in the
chain of the replica taken; every request carries it. A replica receiving a request of its own
position's epoch takes over: it sends FENCED to the replicas before it and EPOCH to every worker (so
that the others turn to it at once), and serves; the workers resend their unacknowledged requests,
which it applies once (its request log came down the chain). Fencing: a replica refuses a FORWARD of
an older epoch and answers FENCED, upon which the old primary stops for good; it also looks for a
FENCED before applying any request; workers drop replies of an older epoch. So a slow old primary can
neither get an update acknowledged nor answer a worker after its replacement took over.
"""
import time

from mpi4py import MPI

from ps.serving.consistency import DONE, DROPPED, LIVE
from ps.wire.messages import (H_AUX, H_CLOCK, H_EPOCH, H_RID, H_SEQ, H_VERSION, H_WORKER, Msg, PSError, PSTimeout,
                         dead, done, header_tag, receive, send, waiting)
from ps.serving.shard_server import EVENT_ABORTED, EVENT_DIED, EVENT_DROPPED, Server

__all__ = ["ReplicatedServer", "chains", "FAILOVER_MARGIN", "REPLICA_COUNTERS"]

#: Seconds a worker waits beyond ``ps_timeout`` before it takes the next replica of a shard.
FAILOVER_MARGIN = 0.5
#: A replica's own counters: updates forwarded and applied from upstream, ACKs received, FORWARDs and
#: requests refused as fenced, successors cut off, takeovers, replies held until acknowledged, chain
#: messages whose payload never came (the sender died in between), and FORWARDs not applied because an
#: earlier one of their stream was lost (a gap in the sequence numbers).
REPLICA_COUNTERS = ("forwarded", "applied_forwards", "acks", "fenced", "refused_requests", "cut", "takeovers",
                    "held_replies", "lost_payloads", "skipped_forwards")
#: The primary cuts off a successor silent for this share of ``ps_timeout`` (less down the chain), so
#: that its held replies go out before a worker's failover timeout (``ps_timeout + FAILOVER_MARGIN``).
_SUCCESSOR_SHARE = 0.75
_PUSH, _DONE, _ABORT, _DROP = 1, 2, 3, 4  # kinds of a forwarded update (aux = kind + 16 x staleness)


def chains(server_ranks, replicas):
    """Return the chain of every shard: shard ``g`` on server ranks ``g R .. g R + R - 1``, primary first.

    Parameters
    ----------
    server_ranks : sequence of int
        The ``S`` server ranks; ``replicas`` divides ``S``.
    replicas : int
        ``R``, ranks per shard.

    Returns
    -------
    list of list of int
        ``S / R`` chains of ``R`` ranks.

    Examples
    --------
    >>> chains([0, 1, 2, 3], 2)
    [[0, 1], [2, 3]]
    """
    return [list(server_ranks[g * replicas:(g + 1) * replicas]) for g in range(len(server_ranks) // replicas)]


class ReplicatedServer(Server):
    """One replica of a shard: the primary while it heads its chain, else a backup that applies forwards.

    Parameters
    ----------
    comm, worker_ranks, shard, total, opts, make_optimizer
        As :class:`ps.serving.shard_server.Server` (``opts.replicas`` > 1; the vector has ``opts.shards`` shards).
    chain : sequence of int
        The ranks holding this shard, primary first; this rank is one of them.
    index : int
        The shard's index ``0 <= index < opts.shards``.

    Attributes
    ----------
    head, deposed : bool
        This replica is the primary / was fenced off (it serves no more).
    took_over, last_reply : float
        Seconds since the start when this replica took over (-1: never) and when it last sent a worker
        a reply (-1: never).
    first_update : float
        ``time.time()`` of the first update this replica applied after taking over (-1: none).
    acked_version, took_over_version : int
        The newest shard version a reply of this replica acknowledged, and the version it held when it
        took over (-1: none): an old primary's ``acked_version`` never exceeds its successor's
        ``took_over_version`` (fencing).
    acked_folded : ndarray, shape (W,), int64
        Per worker, the clocks folded in when this replica last acknowledged that worker (released a
        reply): every one of them was on every live replica then.
    """

    def __init__(self, comm, index, chain, worker_ranks, shard, total, opts, make_optimizer):
        super().__init__(comm, index, worker_ranks, shard, total, opts, make_optimizer)
        self.chain = [int(r) for r in chain]
        self.pos = self.chain.index(comm.Get_rank())
        self.live = self.chain[self.pos + 1:]       # successors not cut off, in chain order
        self.head, self.deposed = self.pos == 0, False
        self.upstream = self.chain[self.pos - 1] if self.pos else None
        self.seq = self.acked = 0                   # last update applied here / acknowledged below
        self.unacked = []                           # (seq, sent at, fields, data) forwarded, not acknowledged
        self.replies_held = []                      # (seq needed, folded clocks, reply) until acknowledged
        self.counters = dict.fromkeys(REPLICA_COUNTERS, 0)
        self.took_over = self.last_reply = self.first_update = -1.0
        self.acked_version = self.took_over_version = -1     # see the Attributes
        self.acked_folded = self.table.folded.copy()
        span = max(1, len(self.chain) - 1)
        self.successor_timeout = _SUCCESSOR_SHARE * opts.ps_timeout * (len(self.chain) - 1 - self.pos) / span
        self._peer_sends, self._header, self._looked = [], None, time.monotonic()
        self._broken = set()                        # chain peers whose FORWARD payload never came

    @property
    def held(self):
        """True while replies wait for the chain's ACK or forwards for the successor's (the loop goes on)."""
        return bool(self.replies_held or self.unacked)

    # ------------------------------------------------------------------------------------------
    def serve(self, start_time=None):
        """Serve as :meth:`ps.serving.shard_server.Server.serve`; then give the last chain messages a moment to leave.

        Raises
        ------
        PSError
            Under BSP when a worker was lost.
        """
        try:
            super().serve(start_time)
        except PSError:
            if not self.deposed:  # a fenced-off replica's own verdicts (drops) never counted
                raise
        finally:
            deadline = time.monotonic() + min(0.2, self.opts.ps_timeout)
            while self._peer_sends and time.monotonic() < deadline:  # a dead peer's never complete: no wait
                self._peer_sends = [s for s in self._peer_sends if not done(self.comm, s[0])]
                time.sleep(1e-3)

    def checkpoint(self):
        """Write the shard's checkpoint unless fenced off: every replica writes each generation (the same shard),
        so a backup that takes over has written the one its primary died writing."""
        if not self.deposed:
            super().checkpoint()

    # ------------------------------------------------------------------------------------------
    def _handle(self, source, mtype):
        if mtype == Msg.FORWARD and source in self._broken:
            # the stream from this peer lost an update already, so none of its later FORWARDs can be
            # applied (the sequence has a gap): take the header, leave its payload to a receive that is
            # never waited for, and do not wait a --ps-timeout for each (a dead primary's last forwards)
            try:
                receive(self.comm, source, mtype, time.monotonic())
            except PSTimeout:
                pass
            self.counters["skipped_forwards"] += 1
            return
        try:
            super()._handle(source, mtype)
        except PSTimeout:
            if source not in self.chain:
                raise
            self.counters["lost_payloads"] += 1  # a replica died between a header and its payload: never
            #                                      acknowledged, so resent by the workers if it was theirs
            if mtype == Msg.FORWARD:
                self._broken.add(source)

    def _dispatch(self, source, mtype, header, data):
        if mtype in (Msg.FORWARD, Msg.ACK, Msg.FENCED):
            self._chain_message(source, mtype, header, data)
            return
        if mtype == Msg.HEARTBEAT:  # a worker waiting out another shard's failover is not silent
            if self.head and source in self.rank_to_worker:
                self._last_heard[self.rank_to_worker[source]] = time.monotonic()
            return
        if not self.deposed and int(header[H_EPOCH]) == self.pos and not self.head:
            self._take_over()
        if self.head:
            self._poll_fenced()  # a successor that took over meanwhile: apply nothing more
        if self.deposed or not self.head or int(header[H_EPOCH]) != self.pos:
            self.counters["refused_requests"] += 1  # a request of an older epoch, or to a replica fenced off
            return
        self._header = header
        w = self.rank_to_worker.get(source)
        if mtype in (Msg.DONE, Msg.ABORT) and w is not None:  # down the chain before its acknowledgement
            self._forward(w, 0, 0, 0, _DONE if mtype == Msg.DONE else _ABORT, None)
        super()._dispatch(source, mtype, header, data)

    def _push(self, w, clock, grad, stale):
        if self.head:  # BSP/SSP: the read's staleness; ASP: the pushes since the worker's read
            tau = stale if self.buckets is not None else self.pushes - int(self.read_version[w])
            self._forward(w, clock, int(self._header[H_RID]), int(self._header[H_VERSION]), _PUSH + 16 * tau,
                          grad.copy())
        super()._push(w, clock, grad, stale)

    def _after_fold(self, count):
        if self.took_over >= 0 and self.first_update < 0:
            self.first_update = time.time()  # wall clock: compared with the crash's time printed by its rank
        super()._after_fold(count)

    def _lost(self, w, code):
        if self.head and code in (EVENT_DROPPED, EVENT_DIED):
            self._forward(w, 0, 0, 0, _DROP, None)
        super()._lost(w, code)

    def _reply(self, w, mtype, clock, data=None, worker=None, rid=0, version=None):
        if self.deposed:
            return  # fenced off: it acknowledges nothing
        reply = (w, mtype, clock, data, worker, rid, self.version if version is None else version)
        if self.acked < self.seq:
            self.replies_held.append((self.seq, int(self.table.folded[w]), reply))
            self.counters["held_replies"] += 1
            return
        self._release(int(self.table.folded[w]), reply)

    def _release(self, folded, reply):
        w = reply[0]
        self.acked_folded[w] = max(int(self.acked_folded[w]), folded)
        self.last_reply, self.acked_clocks = self.elapsed(), folded  # the reply's aux: clocks on every replica
        self.acked_version = max(self.acked_version, int(reply[6]))
        super()._reply(*reply)

    def _check_silence(self, now):
        self._peer_sends = [s for s in self._peer_sends if not done(self.comm, s[0])]
        if now - self._looked > 0.5 * self.successor_timeout:  # this replica itself stalled: its clock of the
            self.unacked = [(seq, now, f, d) for seq, _, f, d in self.unacked]  # successor's silence restarts
        self._looked = now
        if self.unacked and self.live and (self.live[0] in dead(self.comm) or (
                now - self.unacked[0][1] > self.successor_timeout
                and not waiting(self.comm, self.live[0]))):  # dead (ULFM), or silent with nothing waiting
            self._cut(now)
        if self.head:
            self._poll_fenced()  # taken over while this replica was not looking: drop no one
        if not self.head or self.deposed:
            return  # a backup hears the workers through its primary: its drops come down the chain
        for _, _, reply in self.replies_held:
            self._last_heard[reply[0]] = now  # waiting for this replica's answer: not silent
        super()._check_silence(now)

    # ------------------------------------------------------------------------------------------
    def _chain_message(self, source, mtype, header, data):
        epoch = int(header[H_EPOCH])
        if mtype == Msg.FENCED:
            if epoch > self.epoch:
                self._depose()
        elif mtype == Msg.ACK:
            if self.live and source == self.live[0]:
                self.counters["acks"] += 1
                self._acked(int(header[H_SEQ]))
        elif epoch < self.epoch or self.head or self.deposed:  # an old primary's update: refused
            self.counters["fenced"] += 1
            self._peer(source, Msg.FENCED)
        elif int(header[H_SEQ]) > self.seq + 1:  # an update before it never came: applying this one and
            self.counters["skipped_forwards"] += 1  # acknowledging it would acknowledge the lost one too
            self._broken.add(source)
        else:
            self.epoch, self.upstream, seq = epoch, source, int(header[H_SEQ])
            if seq > self.seq:
                self._apply(header, data)  # leaves data as it came (ps.serving.consistency): the same bytes go down
                self.seq = seq
                fields = tuple(int(header[k]) for k in (H_WORKER, H_CLOCK, H_RID, H_VERSION, H_AUX))
                self._send_down(seq, fields, data)
            elif seq <= self.acked:  # a resend after a cut, applied and acknowledged below already (to the
                self._peer(source, Msg.ACK, seq=seq)  # replica cut off, maybe): say so again
            # else applied here and on its way down: the ACK from below goes up to this new upstream

    def _apply(self, header, data):
        """Apply a forwarded update exactly as the primary did."""
        self.counters["applied_forwards"] += 1
        w, clock, aux = int(header[H_WORKER]), int(header[H_CLOCK]), int(header[H_AUX])
        kind, tau = aux % 16, aux // 16
        if kind == _PUSH:
            self.log.remember(w, int(header[H_RID]), data)  # a resend after a failover counts once
            self.counts["pushes_received"] += 1
            if self.buckets is None:
                self.read_version[w] = self.pushes - tau  # ASP: the primary's staleness of this push
            self._push(w, clock, data, tau)
        elif self.table.status[w] == LIVE:
            self.table.status[w] = DROPPED if kind == _DROP else DONE
            if kind == _ABORT:
                self.aborted.add(w)
            if kind != _DONE:
                self._lost(w, EVENT_ABORTED if kind == _ABORT else EVENT_DROPPED)
        self._progress_clocks()

    def _forward(self, w, clock, rid, version, aux, data):
        """Primary: number an update it applies and send it down the chain."""
        self.seq += 1
        self.counters["forwarded"] += 1
        self._send_down(self.seq, (w, clock, rid, version, aux), data)

    def _send_down(self, seq, fields, data):
        if not self.live:  # the tail: acknowledged by the whole chain
            self._acked(seq)
            return
        self.unacked.append((seq, time.monotonic(), fields, data))
        self._forward_to(self.live[0], seq, fields, data)

    def _forward_to(self, dest, seq, fields, data):
        w, clock, rid, version, aux = fields
        self._peer(dest, Msg.FORWARD, w, clock, data, rid=rid, version=version, shard=self.index, seq=seq, aux=aux)

    def _acked(self, seq):
        self.acked = max(self.acked, seq)
        self.unacked = [u for u in self.unacked if u[0] > seq]
        if not self.head:
            if self.upstream is not None and not self.deposed:
                self._peer(self.upstream, Msg.ACK, seq=seq)
            return
        self._poll_fenced()  # replaced meanwhile: release nothing
        while self.replies_held and self.replies_held[0][0] <= self.acked:
            _, folded, reply = self.replies_held.pop(0)
            self._release(folded, reply)

    def _cut(self, now):
        """The successor left a forward unacknowledged too long: take it out of the chain."""
        dead = self.live.pop(0)
        self.counters["cut"] += 1
        self._peer(dead, Msg.FENCED, epoch=len(self.chain))  # if only slow, it never takes over
        if not self.live:
            self._acked(self.seq)
            return
        self.unacked = [(seq, now, fields, data) for seq, _, fields, data in self.unacked]
        for seq, _, fields, data in self.unacked:
            self._forward_to(self.live[0], seq, fields, data)

    def _take_over(self):
        """Become the primary at this replica's epoch: fence the replicas before it, tell the workers."""
        self.epoch, self.head, self.upstream = self.pos, True, None
        self.took_over, self.took_over_version = self.elapsed(), self.version
        self.counters["takeovers"] += 1
        for r in self.chain[:self.pos]:
            self._peer(r, Msg.FENCED)
        for w in self.table.live():
            self._peer(self.worker_ranks[w], Msg.EPOCH, int(w), version=self.version, shard=self.index)
        self._last_heard[:] = time.monotonic()  # the workers come over now: none is silent yet
        while self.replies_held and self.replies_held[0][0] <= self.acked:
            _, folded, reply = self.replies_held.pop(0)
            self._release(folded, reply)

    def _depose(self):
        """Fenced off: serve nothing more and leave the loop (the chain's other replicas carry on)."""
        self.deposed, self.head = True, False
        self.replies_held, self.pending, self.unacked, self._sends = [], {}, [], []  # nothing more to wait for
        self.table.status[self.table.status == LIVE] = DONE

    def _poll_fenced(self):
        status = MPI.Status()
        while waiting(self.comm, MPI.ANY_SOURCE, header_tag(Msg.FENCED), status):
            source = status.Get_source()
            header, data = receive(self.comm, source, Msg.FENCED, time.monotonic() + self.opts.ps_timeout)
            self._chain_message(source, Msg.FENCED, header, data)

    def _peer(self, dest, mtype, worker=0, clock=0, data=None, *, rid=0, version=0, shard=0, epoch=None, seq=0,
              aux=0):
        """Send a chain message or an EPOCH; ``epoch`` None is this replica's."""
        epoch = self.epoch if epoch is None else epoch
        self._peer_sends += [(req, buf, dest) for req, buf in
                             send(self.comm, dest, mtype, worker, clock, data, rid=rid, version=version, shard=shard,
                                  epoch=epoch, seq=seq, aux=aux)]
