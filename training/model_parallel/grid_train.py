"""Hybrid data x tensor x pipeline training: ``mpiexec -n P python -m training.train --tensor-parallel T
--pipeline-parallel Q [--micro-batches M --schedule 1f1b]``.

The P ranks form a D x T x Q grid (:mod:`training.model_parallel.grid`). Each step, every data-parallel replica
d takes its B / D samples of the global batch (the trainer's ``DistributedSampler`` with D
parts), its pipeline (:mod:`training.model_parallel.pipeline`) runs the M micro-batches through the Q stages,
each stage's layers split over its tensor group (:mod:`training.model_parallel.layers`); then every rank
averages its shard's gradient over its data-parallel group with the trainer's gradient hook
(``collectives.allreduce`` with ``--algorithm``, ``--bucket-bytes`` or ``--compression``, as in
data-parallel training) and steps its optimizer on its shard. The step is the step of one
process with the same global batch (tested to 1e-12 in float64). Sharded checkpoints:
:mod:`training.model_parallel.sharded`.
"""
import os
import shutil
import sys
import time

import numpy

import collectives
import collectives.engine.context
import collectives.engine.policy
from commlab.logs import get_logger
from training.runtime.build import make_sampler, to_device
from training.runtime.checkpoint import find_checkpoint, make_run_dir, restart_hint
from commlab.file_formats import CheckpointError
from training.data.sampling import eval_shard
from training.data.datasets import load_dataset
from training.model_parallel.grid import Grid, build_stage, check_grid
from training.model_parallel.grid_report import gather_ranks, summarize
from training.job import array_module
from commlab.file_formats import write_json
from commlab.run_files import EpochTable, MetricsWriter, run_info, write_config
from training.monitor.setup import check_monitor, open_monitor
from training.model.nn import SoftmaxCrossEntropy
from commlab.arrays import get_array_module
from training.model.optim import make_optimizer
from training.dp.data_parallel import CONTROL_ALGORITHM, any_rank, is_finite
from training.dp.hooks import make_grad_hook
from training.dp.data_parallel import replicas_identical as replicas_same
from training.model_parallel.layers import ColumnParallelLinear, RowParallelLinear
from training.model_parallel.pipeline import PipelineStage
from training.model_parallel.sharded import (SHARDS_DIR, load_hook_state, load_sharded, newest_checkpoint, read_pieces,
                                             save_sharded)
from commlab.byte_sizes import format_bytes
from training.runtime.state import TrainState

__all__ = ["HybridTrainer", "build_hybrid", "hybrid_step", "train_hybrid", "run_hybrid", "evaluate_pipeline",
           "replicas_identical"]

_log = get_logger("training.model_parallel.grid_train")


class HybridTrainer:
    """What one rank of a hybrid run holds: its grid place, stage model, optimizer and counters."""

    __slots__ = ("xp", "ds", "sizes", "grid", "model", "ks", "stage", "opt", "hook", "state", "axes",
                 "resumed_from", "replicated")

    def __init__(self, **parts):
        for k in self.__slots__:
            setattr(self, k, parts.get(k))


def build_hybrid(cfg, comm):
    """Check the grid, build this rank's stage and optimizer, and restore a checkpoint with ``--resume``.

    Every check that can fail on a bad configuration runs on every rank alike before the first
    message (:func:`training.model_parallel.grid.check_grid`).

    Raises
    ------
    ValueError
        A grid that does not fit P or the model, micro-batches that do not divide the local batch.
    CheckpointError
        When the checkpoint to resume from is unusable or does not fit.
    """
    ds = load_dataset(cfg)
    sizes = [ds.n_features, *cfg.hidden, ds.n_classes]
    check_grid(comm.Get_size(), cfg.tensor_parallel, cfg.pipeline_parallel, sizes, cfg.batch_size,
               cfg.micro_batches)
    check_monitor(cfg, comm)  # libraries, TensorBoard directory, the metrics port on rank 0
    if cfg.algorithm == "auto":
        from collectives.model.auto import select_allreduce

        select_allreduce(comm.Get_size(), 8)  # loads the tuning table now, not mid-run
    xp = array_module(cfg, comm)
    if xp is not numpy and cfg.pipeline_parallel > 1 and not collectives.backend.cuda_aware():
        raise ValueError("--pipeline-parallel > 1 with --device gpu needs a CUDA-aware MPI (pipeline stages send "
                         "device arrays point-to-point); tensor and data parallelism stage through the host")
    grid = Grid(comm, cfg.tensor_parallel, cfg.pipeline_parallel)
    model, ks = build_stage(sizes, grid, cfg.activation, cfg.dtype, cfg.seed, cfg.algorithm, cfg.timeout, xp)
    stage = PipelineStage(model, grid.pipeline, cfg.timeout)
    hook = make_grad_hook(cfg, grid.data, model)
    # the compressor's memory applies momentum (DGC): the optimizer then has none
    opt = make_optimizer(cfg, model, momentum=0.0 if getattr(hook, "owns_momentum", False) else None)
    state, resumed = TrainState(), None
    if cfg.resume:
        resumed = newest_checkpoint(cfg.resume) or _dense_checkpoint(cfg.resume)  # either kind, the newest
        pieces, common = read_pieces(resumed, sizes, cfg.allow_foreign_checkpoint)
        load_sharded(pieces, common, model, ks, opt, path=resumed)
        load_hook_state(resumed, grid, hook)
        state.load_state_dict(common)
    axes = {"tensor_bytes": 0, "pipeline_bytes": 0, "data_bytes": 0, "steps": 0, "wait_s": 0.0,
            "wall_s": 0.0, "activation_bytes": 0}
    replicated = [pg for layer in model.layers if hasattr(layer, "n_in")
                  for pg in ([(layer.b, layer.db)] if isinstance(layer, RowParallelLinear) else
                             [] if isinstance(layer, ColumnParallelLinear) else layer.parameters())]
    return HybridTrainer(xp=xp, ds=ds, sizes=sizes, grid=grid, model=model, ks=ks, stage=stage, opt=opt,
                         hook=hook, state=state, axes=axes, resumed_from=resumed, replicated=replicated)


def _sync_replicated(t, timeout):
    """Give every tensor rank tensor rank 0's averaged gradient of the replicated parameters.

    Row-parallel biases and an unpaired last layer are held whole by every rank of a tensor
    group and get bitwise the same local gradient; but each tensor rank averages its own flat
    gradient over its data-parallel group, where message sizes (uneven shards), hence chunking and
    summation order, or a compressor's choices may differ. One broadcast over the tensor group
    keeps the copies identical. Returns the bytes this rank sent.
    """
    if t.grid.T == 1 or t.grid.D == 1 or not t.replicated:
        return 0
    xp = get_array_module(t.model.grads)
    buf = xp.concatenate([g.ravel() for _, g in t.replicated])
    collectives.broadcast(buf, root=0, comm=t.grid.tensor, timeout=timeout)
    off = 0
    for _, g in t.replicated:
        g[...] = buf[off:off + g.size].reshape(g.shape)
        off += g.size
    return int(collectives.engine.context.last_stats(t.grid.tensor).get("bytes_sent", 0))


def _dense_checkpoint(path):
    try:
        return find_checkpoint(path)
    except FileNotFoundError as e:
        raise CheckpointError(f"--resume {path}: no sharded (shards-epochNNNN/manifest.json) or "
                              f"data-parallel checkpoint ({e})") from None


def _tensor_bytes(model):
    seen = {id(layer.stats): layer.stats for layer in model.layers if hasattr(layer, "stats")}
    return sum(s["bytes_sent"] for s in seen.values())


def hybrid_step(t, cfg, comm, x, y, *, arrive=None):
    """Take one step of the hybrid run on this rank's batch ``x`` (B / D, F), ``y`` (B / D,).

    ``arrive``, when given, is called with no argument as this rank reaches the step's first
    collective (the live monitor's heartbeat, :mod:`training.monitor`).

    Returns
    -------
    dict
        ``loss`` (NaN off the last stage), ``skipped``, and per-axis ``tensor_bytes``,
        ``pipeline_bytes``, ``data_bytes`` sent by this rank, ``wait_s``, ``wall_s``, ``comm_s``, and
        ``arrival_s`` (from the step's start to the first collective) and ``sync_s`` (the data-parallel
        gradient average), in seconds.
    """
    t0, tb0 = time.perf_counter(), _tensor_bytes(t.model)
    info = t.stage.step(x, y, min(cfg.micro_batches, len(y)), cfg.schedule)
    bad = not is_finite(0.0 if numpy.isnan(info["loss"]) else info["loss"], t.model.grads)
    t_arrive = time.perf_counter()
    if arrive is not None:
        arrive()  # heartbeat: this rank reached the step's first collective
    skip = any_rank(bad, comm, cfg.timeout)
    t1 = time.perf_counter()
    sent = tensor_sync = 0
    if skip:
        t.model.grads.fill(0)
    elif t.grid.D > 1:
        avg, h = t.hook(t.model.grads)
        if avg is not t.model.grads:
            t.model.grads[...] = avg
        sent = int(h["bytes_sent"])
        tensor_sync = _sync_replicated(t, cfg.timeout)
    t2 = time.perf_counter()
    if not skip:
        t.opt.step()
    return {"loss": info["loss"], "skipped": int(skip), "tensor_bytes": _tensor_bytes(t.model) - tb0 + tensor_sync,
            "pipeline_bytes": info["bytes_sent"], "data_bytes": sent, "wait_s": info["wait_s"],
            "wall_s": time.perf_counter() - t0, "comm_s": info["wait_s"] + (t2 - t1),
            "activation_bytes": info["activation_bytes"], "bubble": info["bubble"], "arrival_s": t_arrive - t0,
            "sync_s": t2 - t1}


def evaluate_pipeline(t, x, y, batch, comm, timeout=None):
    """Return (accuracy, mean loss) over all of (x, y), each sample counted once, through the pipeline."""
    g, loss_fn = t.grid, SoftmaxCrossEntropy()
    part = eval_shard(len(y), g.d, g.D)
    counts = numpy.zeros(3)
    for lo in range(part.start, part.stop, batch):
        hi = min(lo + batch, part.stop)
        logits = t.stage.forward(x[lo:hi] if g.q == 0 else None, hi - lo)
        if logits is not None and g.t == 0:
            counts += (int((logits.argmax(axis=1) == y[lo:hi]).sum()), loss_fn.forward(logits, y[lo:hi]) * (hi - lo),
                       hi - lo)
    collectives.allreduce(counts, comm=comm, op="sum", algorithm=CONTROL_ALGORITHM, out=counts, timeout=timeout)
    return (counts[0] / counts[2], counts[1] / counts[2]) if counts[2] else (float("nan"),) * 2


def replicas_identical(t, comm, timeout=None):
    """Return True on every rank when the data-parallel replicas hold bitwise the same shards and
    every tensor rank the same copy of the replicated parameters (collective over all ranks)."""
    xp = get_array_module(t.model.params)
    reps = xp.concatenate([p.ravel() for p, _ in t.replicated]) if t.replicated else t.model.params[:0]
    ok = replicas_same(t.model.params, t.grid.data, timeout) and replicas_same(reps, t.grid.tensor, timeout)
    return not any_rank(not ok, comm, timeout)


def train_hybrid(cfg, comm, run_dir, t, lr_at):
    """Train on the grid and write ``config.json``, ``epochs.jsonl``, ``summary.json`` and sharded checkpoints.

    ``lr_at(cfg, step, total_steps)`` gives each step's learning rate (``training.train.lr_at``).
    Steps: write the configuration, log the grid (:func:`_open_run`); per epoch, train on this
    rank's batches (:func:`_train_epoch`), evaluate, sum the epoch over the ranks and print its row
    (:func:`_end_epoch`), checkpoint; then evaluate (when no epoch ran) and summarize (:func:`_close_run`).

    Returns
    -------
    dict
        The summary on every rank (rank 0's copy holds the per-rank table).
    """
    g, state, rank = t.grid, t.state, comm.Get_rank()
    if rank == 0:
        write_config(run_dir, cfg.to_dict(), run_info(comm), t.resumed_from)
    sampler = make_sampler(cfg, len(t.ds.y_train), g.d, g.D)
    data = to_device(t.ds, t.model.dtype, t.xp)  # x_train, y_train, x_test, y_test
    local_b, per_epoch = cfg.batch_size // g.D, sampler.num_batches(cfg.batch_size // g.D)
    last = min(cfg.epochs, cfg.stop_after or cfg.epochs)
    writer, table = MetricsWriter(run_dir, rank == 0, state.epoch if cfg.resume else None), EpochTable()
    monitor = open_monitor(cfg, comm, run_dir)  # live metrics (training.monitor)
    _open_run(cfg, comm, run_dir, t, table)
    t_start = time.perf_counter() - state.wall_s
    accs = (None, None)
    while state.epoch < last:
        skipped0 = state.skipped
        sums = _train_epoch(t, cfg, comm, sampler.batches(state.epoch, local_b), data, per_epoch, writer, lr_at,
                            monitor)
        accs = tuple(evaluate_pipeline(t, x, y, cfg.eval_batch, comm, cfg.timeout)[0]
                     for x, y in ((data[0], data[1]), (data[2], data[3])))
        rec = _end_epoch(t, cfg, comm, sums, accs, state.skipped - skipped0, per_epoch, t_start)
        writer.epoch(rec)
        if rank == 0:
            print(table.row(rec), flush=True)
        if (cfg.checkpoint_every and state.epoch % cfg.checkpoint_every == 0) or state.epoch == last:
            save_sharded(run_dir, state.epoch, g, t.model, t.ks, t.opt, _extra(cfg, state), comm, timeout=cfg.timeout,
                         hook_state=t.hook.state_dict())
            if rank == 0:
                _prune(run_dir, cfg.keep_checkpoints)
    writer.close()
    return _close_run(cfg, comm, run_dir, t, data, accs, monitor.close())


#: What each rank sums over an epoch's steps; all-reduced as one float64 vector in this order. The loss
#: and its count come from the last pipeline stage's tensor rank 0 alone (the other ranks hold no loss).
_EPOCH_SUMS = ("loss", "losses", "compute_s", "comm_s", "bytes_sent", "wait_s")


def _open_run(cfg, comm, run_dir, t, table):
    """Log the grid and every rank's share, then print the table head (rank 0; collective)."""
    g, ranks = t.grid, gather_ranks(t, comm)
    if comm.Get_rank() != 0:
        return
    _log.info("grid D=%d x T=%d x Q=%d (data x tensor x pipeline), %d micro-batches (%s), widths %s, %s -> %s",
              g.D, g.T, g.Q, cfg.micro_batches, cfg.schedule, t.sizes, cfg.dtype, run_dir)
    for r, row in enumerate(ranks):
        _log.info("rank %d (d=%d t=%d q=%d): %d parameters, %s parameters + optimizer state", r, row["d"], row["t"],
                  row["q"], row["parameters"], format_bytes(row["param_bytes"] + row["optimizer_bytes"]))
    print(table.header(), flush=True)


def _train_epoch(t, cfg, comm, batches, data, per_epoch, writer, lr_at, monitor):
    """Take the steps of one epoch on this rank's ``batches``; write one record per step (and to ``monitor``).

    Returns
    -------
    dict
        This rank's sums over the epoch, keyed by :data:`_EPOCH_SUMS`.
    """
    g, state, x_tr, y_tr = t.grid, t.state, data[0], data[1]
    sums = dict.fromkeys(_EPOCH_SUMS, 0.0)
    for batch in batches:
        t.opt.lr = lr_at(cfg, state.step, cfg.epochs * per_epoch)
        r = hybrid_step(t, cfg, comm, x_tr[batch], y_tr[batch], arrive=monitor.arrive)
        state.step += 1
        state.skipped += r["skipped"]
        if g.q == g.Q - 1 and g.t == 0 and not r["skipped"]:
            sums["loss"] += r["loss"]
            sums["losses"] += 1
        sums["compute_s"] += r["wall_s"] - r["comm_s"]
        sums["comm_s"] += r["comm_s"]
        sent = r["tensor_bytes"] + r["pipeline_bytes"] + r["data_bytes"]
        sums["bytes_sent"] += sent
        sums["wait_s"] += r["wait_s"]
        for k in ("tensor_bytes", "pipeline_bytes", "data_bytes", "wait_s", "wall_s"):
            t.axes[k] += r[k]
        t.axes["steps"] += 1
        t.axes["activation_bytes"] = r["activation_bytes"]
        writer.step({"step": state.step, "epoch": state.epoch + 1, "lr": t.opt.lr,
                     **{k: v for k, v in r.items() if k != "loss"}})
        monitor.step(state.step, {"step_s": r["wall_s"], "compute_s": r["wall_s"] - r["comm_s"],
                                    "arrival_s": r["arrival_s"], "sync_s": r["sync_s"], "wait_s": r["wait_s"],
                                    "bytes_sent": sent, "skipped": r["skipped"]})
    return sums


def _end_epoch(t, cfg, comm, sums, accs, skipped, per_epoch, t_start):
    """Sum the ranks' ``sums``, add the epoch to the run's counters and return its record.

    Times and bytes are means over ranks; the loss is the mean over the last stage's steps that
    were not skipped; ``wait_s`` is the waiting on pipeline neighbours, ``transfer_s`` the rest.
    """
    vec = numpy.array([sums[k] for k in _EPOCH_SUMS])
    collectives.allreduce(vec, comm=comm, op="sum", algorithm=CONTROL_ALGORITHM, out=vec, timeout=cfg.timeout)
    total, P, state = dict(zip(_EPOCH_SUMS, vec)), comm.Get_size(), t.state
    state.epoch += 1
    state.compute_s += total["compute_s"] / P
    state.comm_s += total["comm_s"] / P
    state.bytes_sent += int(total["bytes_sent"] / P)
    state.wall_s = time.perf_counter() - t_start
    return {"epoch": state.epoch, "loss": total["loss"] / max(total["losses"], 1), "train_acc": accs[0],
            "test_acc": accs[1], "compute_s": total["compute_s"] / P, "comm_s": total["comm_s"] / P,
            "bytes_sent": int(total["bytes_sent"] / P), "wait_s": total["wait_s"] / P,
            "transfer_s": (total["comm_s"] - total["wait_s"]) / P, "skipped": skipped, "steps": per_epoch,
            "wall_s": state.wall_s}


def _close_run(cfg, comm, run_dir, t, data, accs, found):
    """Evaluate when no epoch ran, gather the per-rank table and write ``summary.json``; return the summary."""
    train_acc, test_acc = accs
    if test_acc is None:
        train_acc, _ = evaluate_pipeline(t, data[0], data[1], cfg.eval_batch, comm, cfg.timeout)
        test_acc, _ = evaluate_pipeline(t, data[2], data[3], cfg.eval_batch, comm, cfg.timeout)
    g, state, ranks = t.grid, t.state, gather_ranks(t, comm)
    summary = summarize(cfg, t, comm, run_dir, ranks, train_acc, test_acc, replicas_identical(t, comm, cfg.timeout))
    summary.update(found)  # the live monitor's findings (rank 0)
    if comm.Get_rank() == 0:
        write_json(os.path.join(run_dir, "summary.json"), summary)
        print(f"test accuracy {test_acc:.2%} after {state.epoch} epochs | wall {state.wall_s:.1f} s | grid "
              f"{g.D}x{g.T}x{g.Q} | bubble {summary['bubble_measured']:.2f} (formula "
              f"{summary['bubble_formula']:.2f}) | {run_dir}", flush=True)
    return summary


def _extra(cfg, state):
    import json

    return {**state.state_dict(), "meta/config": numpy.frombuffer(json.dumps(cfg.to_dict()).encode(), numpy.uint8)}


def _prune(run_dir, keep):
    found = sorted(p for p in os.listdir(run_dir) if SHARDS_DIR.match(p))
    for p in found[:-keep]:
        shutil.rmtree(os.path.join(run_dir, p), ignore_errors=True)


def run_hybrid(cfg, comm, lr_at):
    """Build, create the run directory and train; a failed collective aborts the job (as data-parallel).

    ``lr_at(cfg, step, total_steps)`` is the learning-rate schedule (``training.train.lr_at``).
    """
    t = build_hybrid(cfg, comm)
    try:
        run_dir = make_run_dir(cfg, comm)
        with collectives.engine.policy.abort_on_failure(hint=restart_hint(cfg, run_dir)):
            return train_hybrid(cfg, comm, run_dir, t, lr_at)
    finally:
        close = getattr(t.hook, "close", None)
        if close is not None:
            close()
        t.stage.free()
        t.grid.free()
        sys.stdout.flush()
