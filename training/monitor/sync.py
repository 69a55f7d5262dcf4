"""Live metrics of a synchronous run (data-parallel, hybrid grid), gathered to rank 0 every N steps.

Each rank adds up its steps' figures (:data:`FIELDS`: step, compute, arrival, gradient-sync, wait
and compression seconds, bytes sent, skipped steps, and the monitor's own seconds); every
``--metrics-every`` steps one ``MPI_Igather`` of these sums (a few float64 per rank, on a
communicator of its own) brings them to rank 0 -- posted at one gather and completed at the next, by
when it has long arrived, so no rank waits for it. Rank 0 turns them into per-step means per rank and

* sets the Prometheus metrics (:class:`training.monitor.exporter.Exporter`, ``--metrics-port``),
* writes them as TensorBoard scalars (:class:`training.monitor.board.Board`, ``--tensorboard``),
* applies the straggler rule (:class:`training.monitor.detect.StragglerRule`) to the arrival times, per
  sample of each rank's share of the global batch (``commlab_batch_share``), scaled to the mean share:
  the time a rank would take with an equal share, so a straggler that ``--balance`` has given a
  smaller share is still named.

Each rank also sends a heartbeat as it reaches the step's first collective
(:class:`training.monitor.heartbeat.Heartbeat`), from which rank 0 names a stalled rank. A named
straggler or stall is a warning in the log (naming the rank and its figures), a metric
(``commlab_straggler``, ``commlab_stalled``), and a line of ``events.jsonl`` in the run directory.
"""
import json
import os
import threading
import time

import numpy

from collectives.engine.waiting import wait_within
from commlab.logs import get_logger
from training.monitor.board import Board
from training.monitor.detect import StragglerRule, median
from training.monitor.exporter import Exporter
from training.monitor.heartbeat import Heartbeat

__all__ = ["FIELDS", "SyncMonitor", "Events"]

_log = get_logger("training.monitor")

#: What each rank sums over an interval, in the gathered vector's order (after the last step's number):
#: steps, then seconds, bytes and counts summed over them.
FIELDS = ("steps", "step_s", "compute_s", "arrival_s", "sync_s", "wait_s", "compress_s", "bytes_sent",
          "skipped", "monitor_s", "samples")
_AT = {name: 1 + i for i, name in enumerate(FIELDS)}
#: Metric (without ``commlab_``) -> field whose per-step mean it is.
_MEANS = {"step_seconds": "step_s", "compute_seconds": "compute_s", "arrival_seconds": "arrival_s",
          "sync_seconds": "sync_s", "wait_seconds": "wait_s", "compression_seconds": "compress_s",
          "batch_share": "samples"}


class Events:
    """``events.jsonl`` of a run (rank 0): one JSON line per straggler or stall named; thread-safe.

    Parameters
    ----------
    run_dir : str or None
        The run directory; None keeps the events in memory only.
    """

    def __init__(self, run_dir):
        self.rows, self._lock, self._t0 = [], threading.Lock(), time.monotonic()
        self._file = open(os.path.join(run_dir, "events.jsonl"), "a", encoding="utf-8") if run_dir else None

    def add(self, event, **fields):
        """Record ``event`` ("straggler", "stall") with ``fields`` and the seconds since the start."""
        row = {"event": event, "wall_s": round(time.monotonic() - self._t0, 3), **fields}
        with self._lock:
            self.rows.append(row)
            if self._file is not None:
                self._file.write(json.dumps(row) + "\n")
                self._file.flush()

    def close(self):
        """Close the file."""
        if self._file is not None:
            self._file.close()


class SyncMonitor:
    """The monitor of one synchronous run: call :meth:`arrive` and :meth:`step` each step, :meth:`close` at the end.

    Collective over ``comm`` at construction, every ``cfg.metrics_every`` steps and at :meth:`close`.

    Parameters
    ----------
    cfg : training.settings.config.Config
        ``metrics_port``, ``metrics_host``, ``tensorboard``, ``metrics_every``, ``straggler_factor``,
        ``straggler_intervals``, ``stall_seconds`` and ``timeout`` apply.
    comm : mpi4py.MPI.Comm
        The run's ranks (duplicated here).
    run_dir : str
        Where rank 0 writes ``events.jsonl``.

    Raises
    ------
    OSError
        On rank 0, when the metrics endpoint cannot bind.
    """

    def __init__(self, cfg, comm, run_dir):
        self.comm = comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.every, self.timeout, self.cfg = cfg.metrics_every, cfg.timeout, cfg
        self.sums = numpy.zeros(1 + len(FIELDS))
        self._sent, self._req = numpy.zeros_like(self.sums), None  # the interval in flight to rank 0
        self._table = numpy.empty((self.size, self.sums.size)) if self.rank == 0 else None
        self.step_no, self.pending = 0, 0.0  # heartbeats sent; own seconds not yet in the sums
        self.own = numpy.zeros(self.size)    # rank 0: monitor seconds per rank, whole run
        self.busy = numpy.zeros(self.size)   # rank 0: step seconds per rank, whole run
        self.export_s = 0.0                  # rank 0: seconds of its own spent setting the exporter's metrics
        self.exporter = self.board = self.events = None
        if self.rank == 0:
            self.events = Events(run_dir)
            self.exporter = Exporter(cfg.metrics_port, cfg.metrics_host) if cfg.metrics_port else None
            self.board = Board(cfg.tensorboard) if cfg.tensorboard else None
        self.rule = StragglerRule(self.size, cfg.straggler_factor, cfg.straggler_intervals)
        self.deputy = []  # rank 1: rank 0 named stalled (Heartbeat's deputy), sent to rank 0 at close
        self.heart = Heartbeat(self.comm, cfg.stall_seconds, self._stalled, self._cleared)

    def arrive(self):
        """Send this rank's heartbeat: it has reached the step's first collective."""
        t = time.perf_counter()
        self.step_no += 1
        self.heart.beat(self.step_no)
        self.pending += time.perf_counter() - t

    def step(self, step, r):
        """Add one step's figures ``r`` (a step record: ``compute_s``, ``comm_s``, ...); gather every N steps.

        Parameters
        ----------
        step : int
            The run's step count after this step.
        r : dict
            ``step_s`` (or ``compute_s`` + ``comm_s``), ``compute_s``, ``arrival_s``, ``sync_s`` (or
            ``comm_s``), ``wait_s``, ``compress_s`` + ``decompress_s``, ``bytes_sent``, ``skipped``,
            ``samples`` (the rank's share of the global batch: ``commlab_batch_share``); missing ones count 0.
        """
        t = time.perf_counter()
        s, get = self.sums, r.get
        s[0] = step
        s[_AT["steps"]] += 1
        s[_AT["step_s"]] += get("step_s", get("compute_s", 0.0) + get("comm_s", 0.0))
        s[_AT["compute_s"]] += get("compute_s", 0.0)
        s[_AT["arrival_s"]] += get("arrival_s", get("compute_s", 0.0))
        s[_AT["sync_s"]] += get("sync_s", get("comm_s", 0.0))
        s[_AT["wait_s"]] += get("wait_s", 0.0)
        s[_AT["compress_s"]] += get("compress_s", 0.0) + get("decompress_s", 0.0)
        s[_AT["bytes_sent"]] += get("bytes_sent", 0)
        s[_AT["skipped"]] += get("skipped", 0)
        s[_AT["samples"]] += get("samples", 0)
        if s[_AT["steps"]] >= self.every:
            self._gather()
        self.pending += time.perf_counter() - t

    def _gather(self):
        """Post this interval's ``MPI_Igather``; complete (and publish) the previous one, long done by now."""
        self.sums[_AT["monitor_s"]] += self.pending
        self.pending = 0.0
        self._complete()
        self._sent[...] = self.sums
        self.sums[1:] = 0.0
        self._req = self.comm.Igather(self._sent, self._table, root=0)

    def _complete(self):
        if self._req is None:
            return
        wait_within(self._req, self.timeout, "monitor", "gather")
        self._req = None
        if self.rank == 0:
            self._publish(self._table)

    def _publish(self, table):
        """Rank 0: per-step means per rank -> metrics, TensorBoard, straggler rule."""
        steps = numpy.maximum(table[:, _AT["steps"]], 1)
        means = {name: table[:, _AT[field]] / steps for name, field in _MEANS.items()}
        self.own += table[:, _AT["monitor_s"]]
        self.busy += table[:, _AT["step_s"]]
        ratio = self.own / numpy.maximum(self.busy, 1e-12)
        ruled, share = dict(means), means["batch_share"]
        if (share > 0).all():  # the rule on seconds per sample (at the mean share): --balance's smaller share
            ruled["arrival_seconds"] = means["arrival_seconds"] / share * share.mean()  # would hide a straggler
        for r in self.rule.update(ruled["arrival_seconds"]):
            self._straggler(r, int(table[r, 0]), ruled)
        if self.exporter is not None:
            t, ex = time.perf_counter(), self.exporter
            for name, values in means.items():
                ex.set("commlab_" + name, dict(enumerate(values)))
            ex.set("commlab_step", dict(enumerate(table[:, 0])))
            ex.set("commlab_monitor_overhead_ratio", dict(enumerate(ratio)))
            ex.set("commlab_report_age_seconds", dict.fromkeys(range(self.size), 0.0))
            ex.set("commlab_straggler", dict(enumerate(self.rule.slow.astype(float))))
            ex.inc("commlab_sent_bytes", dict(enumerate(table[:, _AT["bytes_sent"]])))
            ex.inc("commlab_skipped_steps", dict(enumerate(table[:, _AT["skipped"]])))
            ex.inc("commlab_straggler_events", dict.fromkeys(range(self.size), 0))
            self.export_s += time.perf_counter() - t
        if self.board is not None:
            scalars = {name: {f"rank{r}": v for r, v in enumerate(values)} for name, values in means.items()}
            scalars["sent_bytes_per_step"] = {f"rank{r}": v for r, v in
                                              enumerate(table[:, _AT["bytes_sent"]] / steps)}
            scalars["straggler"] = {f"rank{r}": float(v) for r, v in enumerate(self.rule.slow)}
            self.board.add(int(table[0, 0]), scalars)

    def _straggler(self, r, step, means):
        arrival, mid = means["arrival_seconds"], median(means["arrival_seconds"])
        wait = means["wait_seconds"]
        others = median(numpy.delete(wait, r)) if self.size > 1 else 0.0
        _log.warning("straggler: rank %d takes %.4f s per step to reach the step's collective, %.1f x the median "
                     "%.4f s, for %d intervals of %d steps (--straggler-factor %g, --straggler-intervals %d); its "
                     "peers wait for it %.4f s per step, it waits %.4f s", r, arrival[r],
                     arrival[r] / max(mid, 1e-12), mid, self.rule.intervals, self.every,
                     self.rule.factor, self.rule.intervals, others, wait[r])
        self.events.add("straggler", rank=r, step=step, arrival_s=float(arrival[r]), median_s=mid,
                        peers_wait_s=others, wait_s=float(wait[r]))
        if self.exporter is not None:
            self.exporter.inc("commlab_straggler_events", {r: 1})

    def _stalled(self, r, step, late, stopped=False):
        """Rank 0's watchdog: rank ``r`` has not reached step ``step``'s collective for ``late`` seconds,
        or (``stopped``) its process has not run for ``late`` seconds, its last heartbeat at ``step``.

        On rank 1, the deputy: rank 0's process has not run for ``late`` seconds (``step``: rank 1's
        own last heartbeat). Rank 1 warns at once; the event reaches ``events.jsonl`` and the
        summary's ``stalls`` at :meth:`close`, through rank 0, once it runs again.
        """
        if self.rank:
            _log.warning("stall: rank 0 has not run for %.1f s (stopped or hung; named by rank 1 at its step %d, "
                         "the others wait on it) (--stall-seconds %g; the collective ends the job after --timeout "
                         "%g s)", late, step, self.cfg.stall_seconds, self.timeout)
            self.deputy.append({"rank": r, "step": step, "late_s": round(late, 3), "stopped": True, "named_by": 1})
            return
        if stopped:
            _log.warning("stall: rank %d has not run for %.1f s (stopped or hung; its last heartbeat at step %d, "
                         "the others wait on it) (--stall-seconds %g; the collective ends the job after --timeout "
                         "%g s)", r, late, step, self.cfg.stall_seconds, self.timeout)
        else:
            _log.warning("stall: rank %d has not reached the collective of step %d, %.1f s after the first rank "
                         "did (--stall-seconds %g; the collective ends the job after --timeout %g s)", r, step, late,
                         self.cfg.stall_seconds, self.timeout)
        self.events.add("stall", rank=r, step=step, late_s=round(late, 3), stopped=stopped)
        if self.exporter is not None:
            self.exporter.set("commlab_stalled", {r: 1.0})

    def _cleared(self, r):
        if self.exporter is not None:
            self.exporter.set("commlab_stalled", {r: 0.0})

    def close(self):
        """Gather what is left, stop the heartbeats and the endpoint (collective); return rank 0's findings.

        Returns
        -------
        dict
            Rank 0: ``monitor_overhead`` (the largest rank's monitoring seconds over its step
            seconds, whole run), ``monitor_overhead_ranks`` (each rank's), ``export_overhead``
            (rank 0's seconds setting the exporter's metrics over its step seconds: a part of its
            monitoring seconds; 0 without ``--metrics-port``), ``stragglers`` and ``stalls`` (the
            ranks named); else ``{}``.
        """
        export_s = self.export_s  # the updates the own time holds: not those of the gathers completed here
        if self.sums[_AT["steps"]]:  # the same on every rank: each took the same steps
            self._gather()
        self._complete()
        self.heart.close(self.timeout)
        named = self.comm.gather(self.deputy if self.rank == 1 else None, root=0)  # the deputy's findings
        self.comm.Free()
        if self.rank != 0:
            return {}
        for row in (named[1] if self.size > 1 else None) or ():
            self.events.add("stall", **row)
        for part in (self.exporter, self.board, self.events):
            if part is not None:
                part.close()
        ratio = self.own / numpy.maximum(self.busy, 1e-12)
        rows = self.events.rows
        busy = self.busy.any()
        return {"monitor_overhead": float(ratio.max()) if busy else 0.0,
                "monitor_overhead_ranks": [float(v) for v in ratio] if busy else [0.0] * self.size,
                "export_overhead": float(export_s / self.busy[0]) if self.busy[0] > 0 else 0.0,
                "stragglers": sorted({e["rank"] for e in rows if e["event"] == "straggler"}),
                "stalls": sorted({e["rank"] for e in rows if e["event"] == "stall"})}
