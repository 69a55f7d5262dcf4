"""Serve a trained checkpoint across MPI ranks and load-test it (launch with mpiexec -n 1 + R * T).

``mpiexec -n P python -m inference.serve --checkpoint RUN --replicas R [--tensor-parallel T]
--balance POLICY --requests N --rate RPS --run-dir DIR``: rank 0 is the front (load generator or
HTTP endpoint, dynamic batcher, balancer); ranks ``1 + r*T .. r*T + T`` form replica ``r``. The job
writes ``DIR/summary.json``, ``DIR/requests.jsonl`` (one line per request) and ``DIR/config.json``.
"""
import argparse
import dataclasses
import json
import os
import signal
import sys
import time

import numpy
from mpi4py import MPI

from collectives.engine.policy import abort
from collectives.model.auto import select_allreduce

from inference.policies.balance import POLICIES, Balancer
from inference.policies.batching import DynamicBatcher
from inference.serve_config import ServeConfig, parse_pairs
from training.driver.preflight import agree
from inference.web.endpoint import EndpointOptions, HttpEndpoint
from inference.web.prometheus import ServingMetrics
from inference.front import Front, FrontOptions
from inference.loadgen import ClosedLoop, OpenLoop, make_payloads
from inference.metrics import request_record, summarize, write_jsonl
from inference.replicas.predictor import Predictor, dense_forward, load_spec
from inference.replicas.replica import ReplicaOptions, serve_replica
from inference.request import Request
from inference.policies.slo import LatencyObjective
from inference.replicas.tensor import TensorParallelForward, emulate_forward, row_parallel_widths
from training.runtime.checkpoint import root_bytes
from commlab.file_formats import CheckpointError
from commlab.run_files import run_info
from training.settings.options import Parser, as_flags, field_type

__all__ = ["run", "main", "parse_args", "PER_RANK"]

#: Serving settings that may differ between ranks: where the front writes (the run directory), and
#: the fault injection of the front rank; every other setting must be the same on every rank.
PER_RANK = frozenset(("run_dir", "fail_front"))

_HELP = {
    "checkpoint": "training run directory (its newest checkpoint: data-parallel .npz or sharded), a "
                  "ckpt-epochNNNN.npz file or a shards-epochNNNN directory",
    "replicas": "model replicas R (the job needs 1 + R * T ranks)",
    "tensor_parallel": "ranks per replica T: the model's Linear layers split column/row-parallel",
    "balance": "load balancing policy across replicas",
    "requests": "requests the load generator sends",
    "rate": "open-loop Poisson arrival rate (requests/s)",
    "clients": "closed-loop concurrent clients instead of the open loop (0: open loop)",
    "malformed": "how many of the requests are malformed (wrong count, NaN, non-numeric)",
    "max_batch": "dynamic batching: largest batch (requests)",
    "max_wait_ms": "dynamic batching: longest wait of the oldest request for a fuller batch (ms)",
    "straggler": "slow replicas REPLICA:FACTOR[,...] (service time multiplied by FACTOR)",
    "service_ms": "emulated accelerator time per batch (ms) slept by each replica after its forward",
    "fail_replica": "replicas that stop answering after some batches, REPLICA:BATCHES[,...]",
    "replica_timeout": "seconds a busy replica may stay silent before it is removed",
    "algorithm": "all-reduce algorithm of the tensor-parallel forward (collectives.ALGORITHMS)",
    "inflight": "batches a replica holds at once; the others wait at the front and merge into fuller batches",
    "slo_ms": "latency objective (ms): the batch size adapts (AIMD) and requests that cannot meet it are "
              "refused at once (HTTP 429); 0: none",
    "max_queue": "requests that may wait at the front; more are refused (HTTP 503)",
    "fail_front": "raise an error on the front after this many batches (fault injection; -1: never)",
    "http": "serve the Open Inference Protocol over HTTP on this port of the front rank (0: any free port, "
            "written to DIR/endpoint.json) instead of running the load generator; SIGTERM or SIGINT drains "
            "and ends the job",
    "host": "address the HTTP server binds",
    "model_name": "the model's name in the protocol's routes (/v2/models/NAME)",
    "max_body_bytes": "largest request body (bytes); larger ones are answered 413",
    "read_timeout": "seconds a request body may take to arrive (slower ones are answered 408), and a request head "
                    "(a connection whose head is slower is closed)",
    "max_connections": "HTTP connections served at once; a request on a further connection is answered 503 and "
                       "its connection closed",
    "seed": "seed of arrivals, test rows and power-of-two draws",
    "run_dir": "output directory",
}


_METAVAR = {"checkpoint": "RUN", "rate": "RPS", "max_wait_ms": "MS", "straggler": "R:FACTOR", "service_ms": "MS",
            "fail_replica": "R:BATCHES", "replica_timeout": "SECONDS", "algorithm": "NAME", "http": "PORT",
            "run_dir": "DIR", "slo_ms": "MS", "host": "ADDRESS", "model_name": "NAME", "max_body_bytes": "BYTES",
            "read_timeout": "SECONDS"}


def parse_args(argv=None):
    """Map the command line onto a :class:`~inference.serve_config.ServeConfig` (not yet validated)."""
    p = Parser(prog="python -m inference.serve", description=__doc__.split("\n\n")[0],
               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(ServeConfig):
        kw = {"choices": POLICIES} if f.name == "balance" else {"type": field_type(type(f.default))}
        p.add_argument("--" + f.name.replace("_", "-"), default=f.default,
                       help=_HELP[f.name], metavar=None if "choices" in kw else _METAVAR.get(f.name, "N"), **kw)

    @p.check
    def _valid(ns):  # every range but the job's rank count (known to run()), before any rank allocates
        try:
            ServeConfig(**vars(ns)).validate()
        except ValueError as e:
            raise ValueError(as_flags(e, [f.name for f in dataclasses.fields(ServeConfig)])) from None

    return ServeConfig(**vars(p.parse_args(argv)))


def _threads_one():
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=1)  # one BLAS thread per rank: ranks share the cores


def run(cfg, comm=None):
    """Run one serving job on ``comm``; return the summary on rank 0 and None elsewhere.

    Parameters
    ----------
    cfg : ServeConfig
    comm : mpi4py.MPI.Intracomm, optional
        Default ``COMM_WORLD``; it must have ``1 + replicas * tensor_parallel`` ranks.

    Returns
    -------
    dict or None

    Raises
    ------
    ValueError
        On every rank, before any message, when the configuration is invalid.
    CheckpointError
        On every rank when the checkpoint cannot be read or does not fit its data.
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    cfg.validate(comm.size)
    agree(cfg, comm, PER_RANK)  # one job, agreed by every rank (front, replicas, tensor-parallel groups)
    _threads_one()

    def make_dir():
        try:
            os.makedirs(cfg.run_dir, exist_ok=True)
        except OSError as e:
            raise OSError(f"--run-dir {cfg.run_dir}: cannot create it ({e.strerror or e})") from None
        return b""

    root_bytes(comm, make_dir, error=ValueError)
    spec, data = load_spec(cfg.checkpoint, comm)
    serving = comm.Dup()  # serving messages never match anyone else's
    T, rank = cfg.tensor_parallel, serving.rank
    replica = (rank - 1) // T if rank else MPI.UNDEFINED
    group = serving.Split(replica, rank)
    F, C = spec.n_features, spec.n_classes
    try:
        if rank:
            if cfg.http >= 0:  # Ctrl-C reaches every rank: the front drains, then stops the replicas
                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_IGN)
            forward = (TensorParallelForward(spec.weights, spec.activation, group, cfg.algorithm,
                                             timeout=max(30.0, cfg.replica_timeout)) if T > 1 else None)
            predictor = Predictor(forward or dense_forward(spec.weights, spec.activation), F, C, cfg.max_batch)
            slow, fail = parse_pairs(cfg.straggler, "straggler", float), parse_pairs(cfg.fail_replica, "fail_replica", int)
            opts = ReplicaOptions(straggler=slow.get(replica, 1.0), service_s=cfg.service_ms / 1e3,
                                  fail_after=fail.get(replica))
            try:
                serve_replica(serving, group, predictor, forward, opts, front=0)
            except Exception as e:  # noqa: BLE001 -- any failure ends the whole job, with its reason
                abort(f"replica {replica}: {type(e).__name__}: {e}")
            return None
        oracle = Predictor(emulate_forward(spec.weights, spec.activation, T) if T > 1
                           else dense_forward(spec.weights, spec.activation), F, C, cfg.max_batch)
        try:
            return _front(cfg, serving, spec, data, oracle, comm)
        except Exception as e:  # noqa: BLE001 -- the replicas wait for the front: end every rank, with the reason
            abort(f"front: {type(e).__name__}: {e}")
    finally:
        if group != MPI.COMM_NULL:
            group.Free()
        serving.Free()


def _front(cfg, serving, spec, data, oracle, world):
    """Run the front rank's part; ``oracle`` is the single-process reference whose bits count as correct."""
    T, http = cfg.tensor_parallel, cfg.http >= 0
    metrics = ServingMetrics(cfg.max_batch) if http else None
    objective = (LatencyObjective(cfg.slo_ms / 1e3, cfg.max_batch, cfg.service_ms / 1e3) if cfg.slo_ms else None)
    opts = FrontOptions(cfg.replica_timeout, cfg.inflight, cfg.max_queue, objective, keep=not http, metrics=metrics,
                        fail_after=cfg.fail_front if cfg.fail_front >= 0 else None)
    front = Front(serving, [1 + r * T for r in range(cfg.replicas)], spec.n_features, spec.n_classes,
                  DynamicBatcher(cfg.max_batch, cfg.max_wait_ms / 1e3), Balancer(cfg.balance, cfg.replicas, cfg.seed),
                  opts)
    t0 = time.perf_counter()
    base = {"config": cfg.to_dict(), **run_info(world)}
    with open(os.path.join(cfg.run_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(base, f, indent=1)
    progress = _Progress(os.path.join(cfg.run_dir, "summary.json"), front, t0, base)
    if http:
        _serve_http(cfg, front, metrics, progress)
    else:
        _load_test(cfg, front, data, t0, progress)
    t_end = max([r.answered for r in front.requests] or [time.perf_counter() if http else t0])
    missing = front.shutdown(fin_timeout=max(10.0, 2 * cfg.replica_timeout))
    correct = [r.status == "ok" and numpy.array_equal(r.logits, oracle.predict(r.x[None])[0])
               for r in front.requests]
    dense = dense_forward(spec.weights, spec.activation)
    ok = [r for r in front.requests if r.status == "ok"]
    plain = [dense(r.x[None])[0] for r in ok]  # the unsplit model, batch of one
    agree = [int(r.logits.argmax()) == int(d.argmax()) for r, d in zip(ok, plain)]
    diff = max((float(numpy.max(numpy.abs(r.logits - d))) for r, d in zip(ok, plain)), default=0.0)
    t_start = min([r.arrival for r in front.requests] or [t0])
    extra = {"offered_rps": cfg.rate if cfg.clients == 0 and cfg.http < 0 else None,
             "reference": "dense forward" if T == 1 else
             f"tensor-parallel forward of T = {T}, partial sums added in rank order (inference.replicas.tensor.emulate_forward)",
             "class_agrees_with_dense": int(sum(agree)), "max_abs_diff_vs_dense": diff, "replicas_without_fin": missing,
             "rows_per_forward": oracle.rows, "checkpoint_file": spec.path, "complete": True, **base}
    if T > 1:  # each row-parallel layer's all-reduce: T slots of (rows, width) float64, and what runs it
        extra["allreduce"] = [{"bytes": b, "algorithm": select_allreduce(T, b) if cfg.algorithm == "auto" else cfg.algorithm}
                              for b in (T * oracle.rows * c * 8 for c in row_parallel_widths(spec.weights))]
    summary = summarize(front, correct, t_start, t_end, extra)
    if http:  # bodies refused by the endpoint never reached the front; answers were not kept
        summary["correct"] = None
        for k in ("rejected", "refused"):
            summary[k] += int(metrics.count(k)) - front.outcomes[k]
    if opts.keep:
        write_jsonl(os.path.join(cfg.run_dir, "requests.jsonl"),
                    [request_record(r, t_start, c) for r, c in zip(front.requests, correct)])
    progress.write(summary)
    return summary


class _Progress:
    """Keeps ``DIR/summary.json`` up to date while the job serves, so a job ended from outside leaves one.

    A launcher may end every rank at once (MPICH's ``mpiexec`` kills the whole job with SIGKILL when
    one rank dies, unless started with ``-disable-auto-cleanup``), and then no shutdown runs. So every
    quarter of a second at least (and once as the load starts) the front rewrites the summary of what
    was answered so far, marked ``"complete": false`` with ``"correct": null`` (answers are compared
    with the single-process prediction only at the end) and a ``"note"`` saying why; the shutdown's
    summary replaces it with ``"complete": true``. Each write replaces the file in one step (``os.replace``), so a reader or a
    kill never meets half a file. The interval grows to 20 times the last write's cost, so writing
    takes at most 5 % of the front's time however many requests it holds.
    """

    NOTE = ("written while serving: the job ended before its shutdown (the front was killed, or the launcher "
            "ended every rank when one died, as MPICH's mpiexec does without -disable-auto-cleanup; "
            "docs/guide/serving.md)")

    def __init__(self, path, front, t0, extra, every=0.25):
        self.path, self.front, self.t0, self.extra, self.every = path, front, t0, extra, every
        self.due = t0

    def __call__(self, now):
        """Rewrite the partial summary when it is due (``now``: the front's clock, seconds)."""
        if now < self.due:
            return
        t_end = max([r.answered for r in self.front.requests if r.status == "ok"] or [now])
        summary = summarize(self.front, [], self.t0, t_end, {"complete": False, "note": self.NOTE, **self.extra})
        summary["correct"] = None
        self.write(summary)
        done = time.perf_counter()
        self.due = done + max(self.every, 20 * (done - now))

    def write(self, summary):
        """Replace the summary file with ``summary`` in one step."""
        with open(self.path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
        os.replace(self.path + ".tmp", self.path)


def _load_test(cfg, front, data, t0, progress):
    payloads, rows = make_payloads(data.x_test, cfg.requests, cfg.malformed, cfg.seed)
    gen = OpenLoop(cfg.requests, cfg.rate, cfg.seed) if cfg.clients == 0 else ClosedLoop(cfg.requests, cfg.clients)
    done = (lambda req: gen.answered(req.answered - t0)) if cfg.clients else None
    k = 0
    while not gen.finished() or front.pending():
        now = time.perf_counter()
        for _ in range(gen.due(now - t0)):
            arrival = t0 + float(gen.times[k]) if cfg.clients == 0 else now  # open loop: scheduled time
            front.submit(Request(k, payloads[k], arrival, int(rows[k]), done), now)
            k += 1
        # no request can come before those waiting are answered (every request sent, or every closed-loop
        # client waiting with nothing at a replica): what waits goes now, whatever its max wait
        last = gen.next_time() is None and (gen.finished() or front.in_flight() == 0)
        if not front.step(time.perf_counter(), force=last):
            _idle(front, gen, t0)
        progress(time.perf_counter())


def _idle(front, gen, t0):
    now, wake = time.perf_counter(), []
    nxt = gen.next_time()
    if nxt is not None:
        wake.append(t0 + nxt)
    if front.next_event() is not None:
        wake.append(front.next_event())
    if front.pending():
        wake.append(now + front.poll_s)
    left = min(wake, default=now + 0.002) - now
    if left > 0:
        time.sleep(min(left, 0.002))


def _serve_http(cfg, front, metrics, progress):
    opts = EndpointOptions(cfg.host, cfg.http, cfg.model_name, cfg.max_body_bytes, cfg.read_timeout,
                           cfg.max_connections, cfg.max_queue)
    ep = HttpEndpoint(opts, front.F, front.C, metrics)
    path = os.path.join(cfg.run_dir, "endpoint.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"host": ep.host, "port": ep.port, "pid": os.getpid()}, f)
    os.replace(path + ".tmp", path)
    summary = os.path.join(cfg.run_dir, "summary.json")

    def drain(signum, _frame):
        if not ep.closing:  # said once, as the drain begins: a launcher that ends the job on the signal
            print(f"{signal.Signals(signum).name}: draining (no new requests; every accepted one is answered), "
                  f"then {summary} is written", flush=True)  # (Open MPI's) may cut the output after it
        ep.close()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, drain)
    print(f"serving the Open Inference Protocol on http://{ep.host}:{ep.port}/v2/models/{cfg.model_name} "
          f"(SIGTERM drains and stops)", flush=True)
    try:
        while True:
            ep.check()  # the HTTP server's thread died: raise, and the job ends (run's MPI_Abort)
            now = time.perf_counter()
            for req in ep.take():
                front.submit(req, now)
            ep.replicas_alive = int(front.balancer.alive.sum())
            # once shutdown began no request can join a batch: dispatch what waits without its max wait
            if not front.step(time.perf_counter(), force=ep.closing):
                if ep.idle() and not front.pending():
                    break
                time.sleep(front.poll_s if front.pending() else 0.001)
            progress(time.perf_counter())
    finally:
        ep.stop()


def main(argv=None):
    """Command-line entry point; returns the process exit status."""
    cfg = parse_args(argv)
    comm = MPI.COMM_WORLD
    try:
        summary = run(cfg, comm)
    except (ValueError, CheckpointError) as e:
        if comm.rank == 0:
            print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    if summary is not None:
        check = "" if summary["correct"] is None else f", {summary['correct']} equal to the single-process prediction"
        if summary["latency_p50_ms"] is not None:
            latency = f"p50 {summary['latency_p50_ms']} ms, p99 {summary['latency_p99_ms']} ms"
        elif cfg.http >= 0:  # answers are not kept over HTTP: the latency histogram is the exporter's
            latency = "latency per request not kept over HTTP (GET /metrics: commlab_serving_request_latency_seconds)"
        else:
            latency = "no latency: no request answered"
        print(f"{summary['answered']}/{summary['requests']} answered{check}, {summary['rejected']} rejected, "
              f"{summary['refused']} refused, {summary['failed']} failed | {latency}, "
              f"{summary['throughput_rps']} req/s | {cfg.run_dir}/summary.json", flush=True)
        if summary["replicas_without_fin"]:  # stopped (SIGSTOP) or gone: MPI_Finalize would wait for them for ever
            print(f"replica(s) {', '.join(map(str, summary['replicas_without_fin']))} never answered the stop: the job "
                  "ends here with status 0, its summary written (MPI_Abort(0) ends the ranks left)", flush=True)
            sys.stderr.flush()
            # the launcher forwards a rank's output from a pipe: MPI_Abort tears the job down at once and
            # what it had not read yet (both lines above) is lost, so give it a moment to read them
            time.sleep(1.0)
            comm.Abort(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
