"""Rank-side body of the live-monitoring tests: ``python -m tests.mpi_monitor DIR [CASE...]`` on 3 ranks.

Every case trains a small synthetic model through :func:`training.train.run` with monitoring on; rank 0
reads its own endpoint (``http://127.0.0.1:PORT/metrics``) every 0.3 s while the job runs and keeps
the last page. Cases:

clean       no rank slowed: nobody is named (straggler or stall); the page parses with
            prometheus_client's parser, holds every metric of a synchronous run with one series
            per rank; the bytes per step in the page and in the TensorBoard files (read back with
            TensorBoard's own reader) equal those of ``metrics.jsonl`` (oracle), and the TensorBoard
            compute time of rank 0 equals the mean of its steps' ``compute_s`` (rtol 1e-5, float32);
            the monitoring's own share of the step time is reported per rank, the exporter's updates
            as a part of rank 0's.
straggler   ``--straggler 2:6``: rank 2, and only it, is named, in the summary, ``events.jsonl``, the
            metric (its TensorBoard scalar at every gather) and rank 0's log warning.
stall       rank 1 sleeps 1.2 s before one step's collective: with ``--stall-seconds 0.4`` it is
            named stalled while the others wait, 0.4-1.2 s late; the job finishes.
stopped     ``SIGSTOP`` for 1.5 s: rank 1 inside step 6's all-reduce (after posting its first round:
            every rank waits in the call, at the same step), then rank 2 as step 14 begins, then rank
            0 as step 20 begins: each is named stalled (rank 1 as silent: its ticks stopped; rank 0
            by rank 1, its deputy, whose finding reaches ``events.jsonl`` at the end), and no rank
            that only waited.
port        rank 0's port is taken: every rank raises the same ValueError before the run directory
            exists.
ps          ``--mode ps`` (1 server, 2 workers, ASP) with ``--straggler 2:6 --balance``, and worker rank
            1's third step skipped (as for a non-finite loss): the page holds the servers' pushes per
            second, queue depth and staleness, the workers' sync time and rank 1's one skipped step;
            worker rank 2, and only it, is named, and balancing gave it the smaller batch.
ps_clean    the same run without ``--straggler`` nor ``--balance`` (same length, same thresholds):
            nobody is named, nothing in ``events.jsonl``.
ps_stall    worker rank 2 held back 3 s in one step, ``--stall-seconds 1``: it is named stalled (the
            log warning, ``commlab_stalled{rank="2"} 1`` in a page, ``events.jsonl``), and not a
            straggler; the job finishes.
ps_bsp_stall the same under BSP, where worker rank 1 waits for rank 2 and sends no report either:
            rank 2 alone is named.
grid        the pipeline grid (3 stages) runs with monitoring: nobody named, every rank's sync time at
            every gather (TensorBoard).
"""
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
from mpi4py import MPI

import collectives.engine.executor
from tests.mpicases import quiet, run_cases, shared_dir
from training.settings.config import Config
from commlab.file_formats import read_jsonl
import training.ps_mode.worker
import training.train

BASE = dict(data="synthetic", samples=2400, features=512, classes=10, hidden=(1024,), batch_size=96, epochs=2,
            progress=False, checkpoint_every=0, threads=1, timeout=60.0, metrics_every=4, straggler_intervals=3)
SYNC_METRICS = ("commlab_step", "commlab_step_seconds", "commlab_compute_seconds", "commlab_arrival_seconds",
                "commlab_sync_seconds", "commlab_wait_seconds", "commlab_compression_seconds",
                "commlab_sent_bytes", "commlab_skipped_steps", "commlab_straggler", "commlab_monitor_overhead_ratio")


def _free_port(comm):
    port = np.zeros(1, np.int64)
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    comm.Bcast(port, root=0)
    return int(port[0])


class _Scraper:
    """Rank 0: fetch ``http://127.0.0.1:PORT/metrics`` every 0.3 s; keep the pages."""

    def __init__(self, comm, port):
        self.pages, self.port, self.stop = [""], port, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True) if comm.rank == 0 else None
        if self.thread:
            self.thread.start()

    def _run(self):
        while not self.stop.wait(0.3):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                    page = r.read().decode()
                if "commlab_step_seconds{" in page or "commlab_ps_queue_depth{" in page:
                    self.pages.append(page)
            except OSError:
                pass

    def done(self):
        if self.thread:
            self.stop.set()
            self.thread.join()
        return self.pages


class _Warnings(logging.Handler):
    """The warnings the monitor logs (``commlab.training.monitor``) while installed."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []
        self.logger = logging.getLogger("commlab.training.monitor")

    def emit(self, record):
        self.lines.append(record.getMessage())

    def __enter__(self):
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)


def _families(page):
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(page)}


def _train(comm, root, name, **changes):
    port = _free_port(comm)
    cfg = Config(**{**BASE, "run_dir": root, "name": name, "metrics_port": port, **changes})
    scraper = _Scraper(comm, port)
    summary = quiet(training.train.run, cfg, comm)
    pages = scraper.done()
    return summary, pages, os.path.join(root, name)


def case_clean(comm, base):
    root = shared_dir(comm, base, "runs")
    board = os.path.join(root, "tb")
    summary, pages, run = _train(comm, root, "clean", tensorboard=board)
    assert summary.get("stragglers", []) == [] and summary.get("stalls", []) == [], summary
    if comm.rank:
        return
    assert read_jsonl(os.path.join(run, "events.jsonl")) == []
    fams = _families(pages[-1])
    for name in SYNC_METRICS:
        assert name in fams, (name, sorted(fams))
    for name in ("commlab_sync_seconds", "commlab_compute_seconds", "commlab_arrival_seconds"):
        ranks = sorted(s.labels["rank"] for s in fams[name].samples)
        assert ranks == ["0", "1", "2"], (name, ranks)
        assert all(s.value >= 0 for s in fams[name].samples), fams[name].samples
    steps = read_jsonl(os.path.join(run, "metrics.jsonl"))
    per_step = steps[0]["bytes_sent"]
    assert per_step > 0 and all(s["bytes_sent"] == per_step for s in steps)
    sent = {s.labels["rank"]: s.value for s in fams["commlab_sent_bytes"].samples if s.name.endswith("_total")}
    shown = {s.labels["rank"]: s.value for s in fams["commlab_step"].samples}
    # the counter is bytes/step x the steps gathered (a scrape between the two updates of a gather: one gather less)
    assert sent["0"] in (per_step * shown["0"], per_step * (shown["0"] - 4)), (sent, shown, per_step)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(board)
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for tag in ("sync_seconds/rank0", "sync_seconds/rank2", "compute_seconds/rank1", "sent_bytes_per_step/rank0"):
        assert tag in tags, (tag, tags)
    points = acc.Scalars("compute_seconds/rank0")
    assert [p.step for p in points] == list(range(4, len(steps) + 1, 4)) + ([len(steps)] if len(steps) % 4 else [])
    want = np.mean([s["compute_s"] for s in steps[:4]])
    assert abs(points[0].value - want) <= 1e-5 * want, (points[0].value, want)
    assert all(p.value == per_step for p in acc.Scalars("sent_bytes_per_step/rank0"))
    # the bound is the benchmark's (test_monitor.py checks the committed measurement); here: the parts add up
    own = summary["monitor_overhead_ranks"]
    assert len(own) == 3 and summary["monitor_overhead"] == max(own) > 0, summary
    assert 0 < summary["export_overhead"] <= own[0], summary  # the exporter's updates: a part of rank 0's own time


def case_straggler(comm, base):
    root = shared_dir(comm, base, "runs")
    board = os.path.join(root, "tb-straggler")
    with _Warnings() as warned:
        summary, pages, run = _train(comm, root, "straggler", straggler="2:6", tensorboard=board)
    if comm.rank:
        return
    assert summary["stragglers"] == [2] and summary["stalls"] == [], summary
    assert len(warned.lines) == 1 and warned.lines[0].startswith("straggler: rank 2 takes "), warned.lines
    assert "x the median" in warned.lines[0] and "its peers wait for it" in warned.lines[0], warned.lines
    events = read_jsonl(os.path.join(run, "events.jsonl"))
    assert events and {e["rank"] for e in events} == {2} and events[0]["event"] == "straggler", events
    assert events[0]["arrival_s"] > 2 * events[0]["median_s"], events
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(board)  # the metric's value at every gather (a scrape sees only some)
    acc.Reload()
    flags = {r: [p.value for p in acc.Scalars(f"straggler/rank{r}")] for r in range(3)}
    assert 1.0 in flags[2] and set(flags[0]) == set(flags[1]) == {0.0}, flags
    fams = _families(pages[-1])  # served: one series per rank
    assert sorted(s.labels["rank"] for s in fams["commlab_straggler"].samples) == ["0", "1", "2"], pages[-1]


def case_stall(comm, base):
    root = shared_dir(comm, base, "runs")
    real, calls = training.train.train_step, [0]

    def late_step(*args, **kw):
        calls[0] += 1
        if comm.rank == 1 and calls[0] == 6:
            time.sleep(1.2)  # before this step's first collective: the others wait for rank 1
        return real(*args, **kw)

    training.train.train_step = late_step
    try:
        summary, _, run = _train(comm, root, "stall", stall_seconds=0.4, epochs=1)
    finally:
        training.train.train_step = real
    if comm.rank:
        return
    assert summary["stalls"] == [1] and summary["stragglers"] == [], summary
    stalls = [e for e in read_jsonl(os.path.join(run, "events.jsonl")) if e["event"] == "stall"]
    assert len(stalls) == 1 and stalls[0]["rank"] == 1 and stalls[0]["step"] == 6, stalls
    assert 0.4 <= stalls[0]["late_s"] < 1.2, stalls


def _stop_for(seconds):
    """Have a helper process stop this rank (``SIGSTOP``) now and continue it ``seconds`` later."""
    pid = os.getpid()
    subprocess.Popen(["sh", "-c", f"kill -STOP {pid}; sleep {seconds}; kill -CONT {pid}"])
    time.sleep(0.5)  # stopped in here (the helper's start may take tens of ms on a loaded host)


def case_stopped(comm, base):
    root = shared_dir(comm, base, "runs")
    real_step, real_post, calls = training.train.train_step, collectives.engine.executor.Run.post, [0]
    inside, before, first = 6, 14, 20  # rank 1 stopped inside step 6's all-reduce; rank 2 as step 14 begins,
    # rank 0 as step 20 does

    def step(*args, **kw):
        calls[0] += 1
        if (comm.rank, calls[0]) in ((2, before), (0, first)):
            _stop_for(1.5)
        return real_step(*args, **kw)

    def post(run, index):
        out = real_post(run, index)
        if comm.rank == 1 and calls[0] == inside and index == 0 and run.work.size > 8:
            _stop_for(1.5)  # after posting the gradient's first round: every peer waits inside the call
        return out

    training.train.train_step, collectives.engine.executor.Run.post = step, post
    try:
        summary, _, run = _train(comm, root, "stopped", stall_seconds=0.4, epochs=1, algorithm="ring")
    finally:
        training.train.train_step, collectives.engine.executor.Run.post = real_step, real_post
    if comm.rank:
        return
    stalls = [e for e in read_jsonl(os.path.join(run, "events.jsonl")) if e["event"] == "stall"]
    deputy = [e for e in stalls if e.get("named_by") == 1]
    stalls = [e for e in stalls if e not in deputy]
    assert summary["stalls"] == [0, 1, 2], stalls
    assert [e["rank"] for e in stalls][:2] == [1, 2] and set(e["rank"] for e in stalls[2:]) <= {0}, stalls
    assert stalls[0]["stopped"] and stalls[0]["step"] == inside, stalls  # silent, its last heartbeat at step 6
    # rank 2, stopped as it begins step 14: named silent (last heartbeat 13) or behind at step 14, whichever
    # passes --stall-seconds first, and once
    assert (stalls[1]["stopped"], stalls[1]["step"]) in ((True, before - 1), (False, before)), stalls
    # rank 0, stopped as it begins step 20: named once by its deputy, rank 1, waiting at step 20's
    # collective; resumed, rank 0's own watchdog may also find itself behind at step 20
    assert [(e["rank"], e["stopped"], e["step"]) for e in deputy] == [(0, True, first)], deputy
    assert 0.4 <= deputy[0]["late_s"] < 1.5, deputy


def case_port(comm, base):
    root = shared_dir(comm, base, "runs")
    taken = socket.socket() if comm.rank == 0 else None
    port = np.zeros(1, np.int64)
    if taken is not None:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port[0] = taken.getsockname()[1]
    comm.Bcast(port, root=0)
    cfg = Config(**{**BASE, "run_dir": root, "name": "port", "metrics_port": int(port[0])})
    try:
        quiet(training.train.run, cfg, comm)
        message = "no error"
    except ValueError as e:
        message = str(e)
    finally:
        if taken is not None:
            taken.close()
    every = comm.allgather(message)
    assert len(set(every)) == 1 and "address already in use" in message, every
    assert f"--metrics-port {int(port[0])}" in message and not os.path.exists(os.path.join(root, "port")), message


#: The parameter-server runs: with 2 workers the median is their mean, so K = 1.5 names a worker 3 x slower
#: than the other, over 4 report rounds of 0.25 s in a row (a second of it: a busy machine's noise is shorter).
PS = dict(mode="ps", servers=1, consistency="asp", metrics_interval=0.25, straggler_factor=1.5, straggler_intervals=4,
          epochs=15)


def _patched(module, name, wrap):
    """Replace ``module.name`` by ``wrap(original)``; return the original (to put back)."""
    real = getattr(module, name)
    setattr(module, name, wrap(real))
    return real


def _samples(fams, name, label="rank"):
    return {s.labels[label]: s.value for s in fams[name].samples if not s.name.endswith("_created")}


def case_ps(comm, base):
    root = shared_dir(comm, base, "runs")
    calls = [0]

    def skip_third(real):
        def is_finite(*args):  # worker rank 1's third step: as if its loss were not finite
            calls[0] += 1
            return real(*args) and not (comm.rank == 1 and calls[0] == 3)
        return is_finite

    real = _patched(training.ps_mode.worker, "is_finite", skip_third)
    try:
        summary, pages, run = _train(comm, root, "ps", straggler="2:6", balance=True, **PS)
    finally:
        training.ps_mode.worker.is_finite = real
    if comm.rank:
        return
    assert summary["stragglers"] == [2] and summary["stalls"] == [], summary
    batches = [int(st["batch"]) for st in summary["worker_stats"]]  # workers 0, 1: ranks 1, 2
    assert batches[1] < batches[0], batches  # --balance shrank the named straggler's batch
    fams = _families(pages[-1])
    assert {s.labels["server"] for s in fams["commlab_ps_queue_depth"].samples} == {"0"}
    assert any(s.value > 0 for p in pages[1:] for s in _families(p)["commlab_ps_pushes_per_second"].samples), pages
    assert "commlab_ps_staleness_clocks" in fams and "commlab_ps_pushes" in fams
    assert {s.labels["rank"] for s in fams["commlab_sync_seconds"].samples} == {"1", "2"}
    skipped = _samples(fams, "commlab_skipped_steps")
    assert skipped == {"1": 1.0, "2": 0.0}, skipped
    events = read_jsonl(os.path.join(run, "events.jsonl"))
    assert {e["rank"] for e in events} == {2}, events


def case_ps_clean(comm, base):
    root = shared_dir(comm, base, "runs")
    summary, pages, run = _train(comm, root, "ps-clean", **PS)
    if comm.rank:
        return
    assert summary["stragglers"] == [] and summary["stalls"] == [], summary
    assert read_jsonl(os.path.join(run, "events.jsonl")) == []
    assert set(_samples(_families(pages[-1]), "commlab_straggler").values()) == {0.0}, pages[-1]


def case_ps_stall(comm, base):
    _ps_stall(comm, base, "asp")


def case_ps_bsp_stall(comm, base):
    _ps_stall(comm, base, "bsp")


def _ps_stall(comm, base, consistency):
    root = shared_dir(comm, base, "runs")
    calls = [0]

    def hold(real):
        def compute_gradient(*args, **kw):
            calls[0] += 1
            if comm.rank == 2 and calls[0] == 20:
                time.sleep(3.0)  # worker rank 2 sends no report for 3 s
            return real(*args, **kw)
        return compute_gradient

    real = _patched(training.ps_mode.worker, "compute_gradient", hold)
    try:
        with _Warnings() as warned:
            summary, pages, run = _train(comm, root, f"ps-stall-{consistency}",
                                         **{**PS, "consistency": consistency, "epochs": 3, "stall_seconds": 1.0})
    finally:
        training.ps_mode.worker.compute_gradient = real
    if comm.rank:
        return
    assert summary["stalls"] == [2] and summary["stragglers"] == [], summary
    assert len(warned.lines) == 1 and warned.lines[0].startswith("stall: worker rank 2 has sent no report for "), \
        warned.lines
    assert "(--stall-seconds 1;" in warned.lines[0], warned.lines
    flagged = [_samples(_families(p), "commlab_stalled").get("2") for p in pages[1:]]
    assert 1.0 in flagged, flagged  # named while silent
    stalls = read_jsonl(os.path.join(run, "events.jsonl"))
    assert [(e["event"], e["rank"]) for e in stalls] == [("stall", 2)] and stalls[0]["late_s"] >= 1.0, stalls


def case_grid(comm, base):
    root = shared_dir(comm, base, "runs")
    board = os.path.join(root, "tb-grid")
    summary, _, _ = _train(comm, root, "grid", pipeline_parallel=3, hidden=(48, 48), epochs=1, tensorboard=board)
    if comm.rank:
        return
    assert summary["stragglers"] == [] and summary["stalls"] == [], summary
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(board)
    acc.Reload()
    for r in range(3):
        points = acc.Scalars(f"sync_seconds/rank{r}")
        assert [p.step for p in points] == [4, 8, 12, 16, 20] and all(p.value >= 0 for p in points), points


CASES = [case_port, case_clean, case_straggler, case_stall, case_stopped, case_ps, case_ps_clean, case_ps_stall,
         case_ps_bsp_stall, case_grid]

if __name__ == "__main__":
    comm = MPI.COMM_WORLD
    chosen = [c for c in CASES if len(sys.argv) < 3 or c.__name__[5:] in sys.argv[2:]]
    sys.exit(1 if run_cases(comm, chosen, sys.argv[1]) else 0)
