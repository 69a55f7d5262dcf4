"""Run a parameter-server job on a communicator: roles, the worker loop, and the final report.

The first ``S`` ranks serve (:class:`ps.serving.shard_server.Server`), the others work: pull, compute a gradient
with the caller's ``grad_fn``, wait out the injected delays, push, repeat until a server answers
STOP. The servers end their loops once every worker has finished, aborted or been dropped; then the
servers send their final shards, snapshots and staleness counts to rank 0 and the finished workers
their statistics, on a second duplicated communicator so that these reports never mix with the
protocol. Rank 0 returns the assembled :class:`RunResult`.

Heterogeneity and faults: ``straggler`` sleeps ``(FACTOR - 1)`` times the step's compute time,
``jitter`` sleeps a uniform ``[0, jitter]`` seconds per step, ``delay_prob`` / ``delay_s`` inject
transient delays as Cui et al. (USENIX ATC 2014) do (each worker, each clock, sleeps ``delay_s``
with probability ``delay_prob``; the draws depend on the seed, the worker and the clock only, so
every consistency model meets the same delays), ``fail_worker`` makes a worker stop
communicating before a given step (the servers drop it after ``ps_timeout``), ``balance`` hands
faster workers larger batches in proportion to their measured samples per second, with the total
kept at the global batch (``global_batch``, else ``W x worker_batch``), each at most ``max_batch``.
A worker starts with its equal share of the global batch (:func:`ps.shards.key_ranges.proportional`: 64 over
3 workers is 22, 21, 21) and scales its gradient by ``W b / B`` (its batch ``b`` of the global
``B``), so that the mean of the W pushes is the mean gradient over the global batch.

Replicated shards (``replicas`` > 1): each shard's chain of server ranks runs
:class:`ps.replicas.chain_replication.ReplicatedServer`, and the run's report is gathered by the first worker rank,
not by a server, so that it survives any one server's death (:mod:`ps.job.survivors`).
"""
import time

import numpy as np

from ps.checkpoints.shard_files import check_resume
from ps.job import survivors
from ps.job.reports import (STAT_FIELDS, RunResult, merge_reports, pack_report, receive_report, roles,
                            server_report, unpack_report, worker_stats)
from ps.job.settings import parse_rank_spec
from ps.replicas.chain_replication import FAILOVER_MARGIN, chains
from ps.serving.consistency import DONE
from ps.serving.shard_server import COUNTERS, Server
from ps.shards.key_ranges import proportional, shard_offsets
from ps.wire.messages import Msg, send, wait_all
from ps.worker.client import Client

__all__ = ["run"]

# A live server answers a waiting worker within ps_timeout (it drops a peer silent that long, then
# answers), so a worker gives up on its server ps_timeout + this many seconds after asking.
_REPLY_MARGIN = 2.0

def run(comm, opts, init_params, grad_fn=None, on_push=None, *, make_optimizer, monitor=None):
    """Run one parameter-server job on every rank of ``comm``.

    Parameters
    ----------
    comm : MPI.Comm
        Communicator of all ranks (duplicated here; the caller's messages never mix with ours).
    opts : ps.job.settings.PSOptions
        Run settings; validated on every rank before any message is sent.
    init_params : ndarray, shape (n,), float32 or float64
        Initial flat parameters, identical on every rank (servers keep their shard).
    grad_fn : callable, optional
        Workers only: ``grad_fn(params, clock, batch) -> (grad, samples)`` with ``params`` and
        ``grad`` host arrays of shape (n,) and the same dtype (``grad`` the mean over the batch).
    on_push : callable, optional
        Rank 0 only (with replicas, the first worker rank): called as ``on_push(pushes)`` after every
        folded push, or every clock of the first worker (progress display).
    make_optimizer : callable
        The servers' update rule, given on every rank: ``make_optimizer(params, grads) ->
        optimizer`` over a shard's flat buffers, with the interface of :mod:`training.model.optim`
        (``lr`` attribute, ``step()``, ``state_dict()``, ``load_state_dict()``); each server sets
        ``lr`` before every update (:class:`ps.serving.server_optimizer.ServerOptimizer`).
    monitor : object, optional
        A live monitor (the trainer's): a worker calls ``monitor.worker_tick(clock, stats, sync_s,
        wait_s, nbytes)`` after every step (its running ``stats``, the step's push-and-pull seconds,
        its pull waits so far in seconds, the bytes pushed), a server ``monitor.server_tick(server)``
        between two messages (``on_tick`` of :class:`ps.serving.shard_server.Server`); both must return at once.

    Returns
    -------
    RunResult or dict or None
        Rank 0: the run's result; a finished worker: its statistics (dict); others: ``None``.

    Raises
    ------
    TypeError
        When ``init_params`` is not a float32/float64 NumPy vector, or ``make_optimizer`` is not
        callable.
    ValueError
        When an option is out of range (on every rank, before any message).
    commlab.file_formats.CheckpointError
        With ``opts.resume_dir``, on every rank before any message, naming the file, when a shard's
        checkpoint is missing, corrupt, of another run (:attr:`~ps.job.settings.PSOptions.run_id`, unless
        ``allow_foreign``), another server, layout or generation, or holds values that make no sense
        (:func:`ps.checkpoints.shard_files.check_resume`).
    PSError
        On every rank still running when BSP loses a worker.

    Examples
    --------
    A whole job needs a server and a worker, so at least two ranks: the user guide's
    ``ps_example.py`` (docs/guide/parameter_server.md) runs one on three ranks and checks it against
    NumPy. On one rank every check is made before any message:

    >>> import functools
    >>> import numpy as np
    >>> from mpi4py import MPI
    >>> from ps.job.settings import PSOptions
    >>> from training.model.optim import SGD
    >>> run(MPI.COMM_SELF, PSOptions(servers=1), np.zeros(4), make_optimizer=functools.partial(SGD, momentum=0.0))
    Traceback (most recent call last):
    ...
    ValueError: a parameter-server job needs at least 2 ranks (a server and a worker), got 1
    """
    if not isinstance(init_params, np.ndarray) or init_params.dtype not in (np.float32, np.float64):
        raise TypeError("init_params must be a float32 or float64 NumPy array")
    if init_params.ndim != 1:
        raise ValueError(f"init_params must be 1-D, got shape {init_params.shape}")
    if not callable(make_optimizer):
        raise TypeError(f"make_optimizer must be callable, got {type(make_optimizer).__name__}")
    opts.validate(comm.Get_size())
    servers, workers = roles(comm, opts.servers)
    if opts.resume_dir:  # every rank reads every shard's file: a refused one ends every rank here, not a server
        check_resume(opts.resume_dir, opts.shards, run_id=opts.run_id, allow_foreign=opts.allow_foreign,
                     servers=opts.servers, workers=len(workers), total=init_params.shape[0])
    pscomm, repcomm = comm.Dup(), comm.Dup()
    try:
        rank, n = comm.Get_rank(), init_params.shape[0]
        offsets = shard_offsets(n, opts.shards)
        pscomm.Barrier()
        t0 = time.monotonic()
        if rank < opts.servers and opts.replicas > 1:
            g = rank // opts.replicas
            shard = init_params[offsets[g]:offsets[g + 1]].copy()
            return survivors.serve_replica(pscomm, repcomm, opts, g, shard, n, make_optimizer, t0)
        if rank < opts.servers:
            shard = init_params[offsets[rank]:offsets[rank + 1]].copy()
            server = Server(pscomm, rank, workers, shard, n, opts, make_optimizer,
                            on_push=on_push if rank == 0 else None,
                            on_tick=None if monitor is None else monitor.server_tick)
            server.serve(t0)
            wall = server.elapsed()
            if rank != 0:
                _send_final(repcomm, server, opts)
                return None
            return _collect(repcomm, server, opts, workers, wall)
        return _work(pscomm, repcomm, opts, rank, init_params, grad_fn, on_push=on_push, monitor=monitor)
    finally:
        pscomm.Free()
        repcomm.Free()


def _work(comm, repcomm, opts, rank, init_params, grad_fn, *, on_push, monitor):
    # on_push: the replicated run's progress collector; monitor: the live monitor
    servers, workers = roles(comm, opts.servers)
    w = workers.index(rank)
    replicated = opts.replicas > 1
    margin = FAILOVER_MARGIN if replicated else _REPLY_MARGIN
    client = Client(comm, w, chains(servers, opts.replicas) if replicated else servers, workers,
                    init_params.shape[0], init_params.dtype, opts.ps_timeout + margin, retries=opts.retries,
                    retry_s=opts.retry_s, heartbeat_s=opts.ps_timeout / 3)
    factor = _mine(opts.straggler, "straggler", float, rank, 1.0)
    fail_step = _mine(opts.fail_worker, "fail_worker", int, rank, -1)
    rng = np.random.default_rng(opts.seed + 7919 * (w + 1))
    params, clock, stopped = client.join()
    push_buf = np.empty_like(params)
    total = opts.global_batch or opts.worker_batch * len(workers)  # samples per clock, all workers
    batch, stats = int(proportional(np.ones(len(workers)), total)[w]), dict.fromkeys(STAT_FIELDS, 0.0)
    window = [0.0, 0]  # (seconds, samples) since the last speed report
    stale = []
    result = "stop" if stopped else "params"
    while result == "params":
        if clock == fail_step:
            return None  # injected failure: stop communicating, say nothing to anyone
        t = time.perf_counter()
        grad, samples = grad_fn(params, clock, batch)
        compute = time.perf_counter() - t
        delay = (factor - 1.0) * compute + (rng.uniform(0.0, opts.jitter) if opts.jitter else 0.0)
        if opts.delay_prob and rng.random() < opts.delay_prob:
            delay += opts.delay_s
        if delay > 0:
            time.sleep(delay)
        np.multiply(grad, batch * len(workers) / total, out=push_buf)  # a share b of the global batch: W b / B
        t_sync = time.perf_counter()
        client.push(clock, push_buf)
        clock += 1
        stats["pushes"] += 1
        stats["samples"] += samples
        stats["compute_s"] += compute
        stats["delay_s"] += delay
        window[0] += compute + delay
        window[1] += samples
        if opts.balance and clock % opts.balance_every == 0:
            batch = int(client.report_speed(clock, window[0] / max(1, window[1]))[w])
            window = [0.0, 0]
        result = client.pull(clock, params)
        stopping = result == "stop"
        # cas: recompute on the new values, push to the refusing shards only; also when another server said
        # STOP at the same pull, or the push would stay applied on some shards and not on others
        while client.refused_shards and result in ("refused", "stop"):
            shards = client.refused_shards
            stats["refused"] += len(shards)
            stats["wasted_compute_s"] += compute
            t = time.perf_counter()
            grad, _ = grad_fn(params, clock - 1, batch)
            compute = time.perf_counter() - t
            stats["compute_s"] += compute
            np.multiply(grad, batch * len(workers) / total, out=push_buf)
            client.push(clock - 1, push_buf, shards)
            result = client.pull(clock, params, shards)
        if stopping and result != "dropped":
            result = "stop"
        if result == "params":  # a pull ended by STOP from some server is not used: not counted
            stale += client.last_staleness
        if monitor is not None:
            monitor.worker_tick(clock, stats, time.perf_counter() - t_sync, client.wait_seconds, push_buf.nbytes)
        if on_push is not None:
            on_push(clock * len(workers))  # the collector of a replicated run: pushes of every worker so far
    client.finish(Msg.DONE)
    stats.update(worker=w, clock=clock, batch=batch, wait_s=client.wait_seconds, resends=client.resends,
                 stale_replies=client.stale_replies, failovers=len(client.chains.failovers),
                 dropped=float(result == "dropped"),
                 mean_staleness=float(np.mean(stale)) if stale else 0.0,
                 max_staleness=float(max(stale)) if stale else 0.0)
    vec = np.array([stats[k] for k in STAT_FIELDS] + client.acked_clocks.tolist(), dtype=np.float64)
    if replicated and w == 0:
        return survivors.collect(repcomm, opts, init_params.dtype, worker_stats(vec), client.acked_clocks.copy())
    collector = workers[0] if replicated else 0
    wait_all(send(repcomm, collector, Msg.STATS, w, clock, vec), time.monotonic() + opts.ps_timeout, "statistics")
    return worker_stats(vec)


def _mine(spec, name, kind, rank, default):
    """Return the VALUE of a ``RANK:VALUE`` spec when it names ``rank``, else ``default``."""
    if not spec:
        return default
    target, value = parse_rank_spec(spec, name, kind)
    return value if target == rank else default


def _send_final(repcomm, server, opts):
    """Send rank 0 this server's report on the report communicator."""
    wait_all(send(repcomm, 0, Msg.FINAL, 0, server.index, pack_report(server_report(server))),
             time.monotonic() + opts.ps_timeout, "final report")


def _collect(repcomm, server, opts, workers, wall):
    """Rank 0: assemble the run's result from its own server, the other servers and the workers."""
    deadline = time.monotonic() + 2 * opts.ps_timeout + 10.0
    dtype, n_workers = server.params.dtype, len(workers)
    reps = [server_report(server)] + [unpack_report(receive_report(repcomm, r, Msg.FINAL, deadline), n_workers, dtype)
                                for r in range(1, opts.servers)]
    codes = reps[0]["status"]
    stats = [None] * n_workers
    for w, r in enumerate(workers):
        if codes[w] == DONE:
            vec = receive_report(repcomm, r, Msg.STATS, deadline)
            stats[w] = worker_stats(vec)
    return RunResult(pushes=server.pushes, wall=wall, start_pushes=server.resumed_pushes,
                     start_wall=server.resumed_seconds, workers=stats,
                     versions=[int(rep["counts"][len(COUNTERS)]) for rep in reps],
                     **merge_reports(reps, workers, opts.ps_timeout))
