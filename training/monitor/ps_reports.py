"""Live metrics of a parameter-server run: small non-blocking reports every few seconds to server 0.

Servers and workers share no step, so nothing here is collective once the run has started: every
``--metrics-interval`` seconds each worker sends server 0 (rank 0) its running totals
(:data:`WORKER_FIELDS`: clock, steps, samples, compute, injected delay, push-and-pull and pull-wait
seconds, bytes pushed, steps skipped) and each other server its own (:data:`SERVER_FIELDS`: pushes
folded, pulls waiting, staleness of the pulls served), each as one ``MPI_Isend`` of a few float64 on
a communicator of its own, sent only when the previous one has completed. Server 0 receives them
between two messages of its serving loop (:attr:`ps.serving.shard_server.Server.on_tick`), takes differences of
the totals and sets the metrics: per worker as in synchronous runs (``commlab_compute_seconds{rank}``,
...), per server ``commlab_ps_pushes_per_second``, ``commlab_ps_staleness_clocks`` and
``commlab_ps_queue_depth``.

Stragglers: the rule of :class:`training.monitor.detect.StragglerRule` over the workers' own time
per sample (compute and injected delay), one interval per report round: the figure ``--balance``
sizes the workers' batches by, so a worker that balancing has given a smaller batch (and a step
time near the others') is still named. Stalls: a live worker whose last report is older than
``--stall-seconds`` is named (the servers drop it after ``--ps-timeout``).
"""
import time

import numpy
from mpi4py import MPI

from commlab.logs import get_logger
from training.monitor.board import Board
from training.monitor.detect import StragglerRule, median
from training.monitor.exporter import Exporter
from training.monitor.sync import Events

__all__ = ["WORKER_FIELDS", "SERVER_FIELDS", "PSMonitor"]

_log = get_logger("training.monitor")
_WORKER_TAG, _SERVER_TAG = 0x3E71, 0x3E72

#: A worker's report: running totals since its start (seconds, bytes, counts).
WORKER_FIELDS = ("clock", "steps", "samples", "compute_s", "delay_s", "sync_s", "wait_s", "bytes_sent", "skipped",
                 "monitor_s")
#: A server's report: running totals, but ``queue`` (pulls waiting now).
SERVER_FIELDS = ("pushes", "queue", "staleness_sum", "served", "monitor_s")
_W = {name: i for i, name in enumerate(WORKER_FIELDS)}
_S = {name: i for i, name in enumerate(SERVER_FIELDS)}


class PSMonitor:
    """The monitor of one parameter-server run (collective at construction only).

    Parameters
    ----------
    cfg : training.settings.config.Config
        ``metrics_port``, ``metrics_host``, ``tensorboard``, ``metrics_interval``,
        ``straggler_factor``, ``straggler_intervals`` and ``stall_seconds`` apply.
    comm : mpi4py.MPI.Comm
        Servers (ranks ``0 .. S - 1``) and workers (duplicated here).
    run_dir : str
        Where rank 0 writes ``events.jsonl``.

    Raises
    ------
    OSError
        On rank 0, when the metrics endpoint cannot bind.
    """

    def __init__(self, cfg, comm, run_dir):
        self.comm = comm.Dup()
        self.rank, self.S = self.comm.Get_rank(), cfg.servers
        self.W, self.cfg = self.comm.Get_size() - cfg.servers, cfg
        self.interval, self.next = cfg.metrics_interval, time.monotonic() + cfg.metrics_interval
        self.own, self.sync, self.sent = 0.0, 0.0, 0.0
        self.skipped = 0  # a worker's steps skipped for a non-finite loss or gradient (its gradient code counts)
        self._out, self._req = None, None
        self.exporter = self.board = self.events = None
        if self.rank == 0:
            self.events = Events(run_dir)
            self.exporter = Exporter(cfg.metrics_port, cfg.metrics_host) if cfg.metrics_port else None
            self.board = Board(cfg.tensorboard) if cfg.tensorboard else None
            self.rule = StragglerRule(self.W, cfg.straggler_factor, cfg.straggler_intervals)
            self.workers = numpy.zeros((self.W, len(WORKER_FIELDS)))   # last report of each worker
            self.shown = numpy.zeros((self.W, len(WORKER_FIELDS)))     # the report last published
            self.heard = numpy.full(self.W, time.monotonic())          # when each worker last reported
            self.servers = numpy.zeros((self.S, len(SERVER_FIELDS)))
            self.served = numpy.zeros((self.S, len(SERVER_FIELDS)))
            self.stalled, self.t_shown = set(), time.monotonic()
            self._buf = numpy.zeros(max(len(WORKER_FIELDS), len(SERVER_FIELDS)))

    def _send(self, vec, tag):
        if self._req is not None and not self._req.Test():
            return  # the last report is still on its way: skip this one, never wait
        self._out = vec
        self._req = self.comm.Isend(self._out, dest=0, tag=tag)

    def worker_tick(self, clock, stats, sync_s, wait_s, nbytes):
        """A worker after each step: add the step, report every interval (non-blocking).

        Parameters
        ----------
        clock : int
            The worker's clock after the step.
        stats : dict
            The worker's running totals (``pushes``, ``samples``, ``compute_s``, ``delay_s``).
        sync_s : float
            This step's push and pull seconds.
        wait_s : float
            Seconds waited for pull answers so far (running total).
        nbytes : int
            Bytes this step pushed.
        """
        t = time.perf_counter()
        self.sync += sync_s
        self.sent += nbytes
        if time.monotonic() >= self.next:
            self.next = time.monotonic() + self.interval
            self._send(numpy.array([clock, stats["pushes"], stats["samples"], stats["compute_s"], stats["delay_s"],
                                    self.sync, wait_s, self.sent, self.skipped, self.own], numpy.float64), _WORKER_TAG)
        self.own += time.perf_counter() - t

    def server_tick(self, server):
        """A server between two messages (:attr:`ps.serving.shard_server.Server.on_tick`): report, or on rank 0 collect."""
        if time.monotonic() < self.next:
            return
        t = time.perf_counter()
        self.next = time.monotonic() + self.interval
        hist = server.staleness_histogram
        vec = numpy.array([server.pushes, len(server.pending), sum(k * v for k, v in hist.items()),
                           sum(hist.values()), self.own], numpy.float64)
        if self.rank != 0:
            self._send(vec, _SERVER_TAG)
        else:
            self.servers[0] = vec
            self._drain()
            self._publish(server)
        self.own += time.perf_counter() - t

    def _drain(self):
        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
            src, tag = status.Get_source(), status.Get_tag()
            n = len(WORKER_FIELDS) if tag == _WORKER_TAG else len(SERVER_FIELDS)
            self.comm.Recv(self._buf[:n], source=src, tag=tag)
            if tag == _WORKER_TAG:
                self.workers[src - self.S] = self._buf[:n]
                self.heard[src - self.S] = time.monotonic()
            else:
                self.servers[src] = self._buf[:n]

    def _publish(self, server):
        now = time.monotonic()
        d = self.workers - self.shown
        steps = d[:, _W["steps"]]
        fresh = steps > 0
        per = numpy.maximum(steps, 1)
        own = (d[:, _W["compute_s"]] + d[:, _W["delay_s"]]) / per
        means = {"compute_seconds": own, "arrival_seconds": own, "sync_seconds": d[:, _W["sync_s"]] / per,
                 "wait_seconds": d[:, _W["wait_s"]] / per,
                 "step_seconds": own + d[:, _W["sync_s"]] / per}
        if fresh.sum() >= 2:  # the rule on seconds per sample: per step, balanced batches would hide a straggler
            per_sample = (d[:, _W["compute_s"]] + d[:, _W["delay_s"]]) / numpy.maximum(d[:, _W["samples"]], 1)
            for w in self.rule.update(per_sample, live=fresh):
                self._straggler(w, own, per_sample)
        table = server.table
        live = table.status == 0  # ps.serving.consistency.LIVE
        silent = live & (now - self.heard > self.cfg.stall_seconds)
        # a worker whose pull this server holds back (BSP and SSP wait for the slowest worker's push) is
        # waiting on another worker, not stalled: only the one it waits on is named
        silent[[w for w in server.pending if w < self.W]] = False
        for w in numpy.flatnonzero(silent).tolist():
            if self.cfg.stall_seconds > 0 and w not in self.stalled:
                self.stalled.add(w)
                self._stall(w, now - self.heard[w])
        self.stalled -= set(numpy.flatnonzero(now - self.heard <= self.cfg.stall_seconds).tolist())
        ds = self.servers - self.served
        dt = max(now - self.t_shown, 1e-9)
        ranks = [self.S + w for w in range(self.W)]
        if self.exporter is not None:
            ex = self.exporter
            for name, values in means.items():
                ex.set("commlab_" + name, {ranks[w]: values[w] for w in numpy.flatnonzero(fresh)})
            ex.set("commlab_step", {ranks[w]: self.workers[w, _W["clock"]] for w in range(self.W)})
            ex.set("commlab_report_age_seconds", {ranks[w]: now - self.heard[w] for w in range(self.W)})
            ex.set("commlab_monitor_overhead_ratio",
                   {ranks[w]: self.workers[w, _W["monitor_s"]] / max(self._busy(w), 1e-12) for w in range(self.W)})
            ex.set("commlab_straggler", {ranks[w]: float(self.rule.slow[w]) for w in range(self.W)})
            ex.set("commlab_stalled", {ranks[w]: float(w in self.stalled) for w in range(self.W)})
            ex.inc("commlab_sent_bytes", {ranks[w]: d[w, _W["bytes_sent"]] for w in range(self.W)})
            ex.inc("commlab_skipped_steps", {ranks[w]: d[w, _W["skipped"]] for w in range(self.W)})
            ex.inc("commlab_straggler_events", dict.fromkeys(ranks, 0))
            ex.set("commlab_ps_pushes_per_second", {s: ds[s, _S["pushes"]] / dt for s in range(self.S)})
            ex.set("commlab_ps_staleness_clocks", {s: ds[s, _S["staleness_sum"]] / ds[s, _S["served"]]
                                                   for s in range(self.S) if ds[s, _S["served"]] > 0})
            ex.set("commlab_ps_queue_depth", {s: self.servers[s, _S["queue"]] for s in range(self.S)})
            ex.inc("commlab_ps_pushes", {s: ds[s, _S["pushes"]] for s in range(self.S)})
        if self.board is not None:
            scalars = {n: {f"rank{ranks[w]}": v[w] for w in numpy.flatnonzero(fresh)} for n, v in means.items()}
            scalars["ps_pushes_per_second"] = {f"server{s}": ds[s, _S["pushes"]] / dt for s in range(self.S)}
            scalars["ps_queue_depth"] = {f"server{s}": self.servers[s, _S["queue"]] for s in range(self.S)}
            self.board.add(int(self.servers[0, _S["pushes"]]), scalars)
        self.shown[fresh] = self.workers[fresh]
        self.served, self.t_shown = self.servers.copy(), now

    def _busy(self, w):
        row = self.workers[w]
        return row[_W["compute_s"]] + row[_W["delay_s"]] + row[_W["sync_s"]]

    def _straggler(self, w, own, per_sample):
        mid = median(per_sample)
        _log.warning("straggler: worker rank %d takes %.3g s per sample (compute and delay; %.4f s per step), %.1f x "
                     "the workers' median %.3g s, for %d report intervals of %g s (--straggler-factor %g)", self.S + w,
                     per_sample[w], own[w], per_sample[w] / max(mid, 1e-12), mid, self.rule.intervals, self.interval,
                     self.rule.factor)
        self.events.add("straggler", rank=self.S + w, clock=int(self.workers[w, _W["clock"]]),
                        sample_s=float(per_sample[w]), median_s=mid, step_s=float(own[w]))
        if self.exporter is not None:
            self.exporter.inc("commlab_straggler_events", {self.S + w: 1})

    def _stall(self, w, silent):
        _log.warning("stall: worker rank %d has sent no report for %.1f s (--stall-seconds %g; the servers drop "
                     "it after --ps-timeout %g s)", self.S + w, silent, self.cfg.stall_seconds, self.cfg.ps_timeout)
        self.events.add("stall", rank=self.S + w, clock=int(self.workers[w, _W["clock"]]), late_s=round(silent, 3))

    def close(self):
        """Stop the endpoint and free the communicator; return rank 0's findings (else ``{}``).

        Returns
        -------
        dict
            Rank 0: ``monitor_overhead`` (the largest worker's monitoring seconds over its busy
            seconds, from its last report), ``stragglers`` and ``stalls`` (the ranks named).
        """
        findings = {}
        if self.rank == 0:
            self._drain()
            for part in (self.exporter, self.board, self.events):
                if part is not None:
                    part.close()
            ratios = [self.workers[w, _W["monitor_s"]] / self._busy(w) for w in range(self.W) if self._busy(w) > 0]
            rows = self.events.rows
            findings = {"monitor_overhead": float(max(ratios, default=0.0)),
                        "stragglers": sorted({e["rank"] for e in rows if e["event"] == "straggler"}),
                        "stalls": sorted({e["rank"] for e in rows if e["event"] == "stall"})}
        self.comm.Free()
        return findings
