"""Data-parallel training driver: ``mpiexec -n P python -m training.train [flags]``.

Every rank holds a full model replica; each step a rank computes the gradient of its share of the
global batch B (B / P samples, the equal split when P does not divide B, or shares that follow the
ranks' measured speeds with ``--balance``: :mod:`training.dp.shares`), weighted by its share, the
flat gradient is averaged across ranks by the gradient hook (all-reduce with ``op="avg"``, or a
compressor), and every rank applies the same optimizer step, so replicas stay bitwise identical. ``--mode ps`` hands the run to :func:`training.ps_mode.worker.run_ps` instead.

User errors (a bad flag value, a taken ``--name``, a missing run to resume, an unusable tuning
table or checkpoint, CuPy missing for ``--device gpu``) are found on every rank before the run
directory is created and end the job with one ``error: ...`` line from rank 0 and status 1.
"""
import os
import sys
import time
import traceback
from dataclasses import dataclass

import numpy
from mpi4py import MPI

import collectives
import collectives.engine.context
import collectives.engine.policy
from collectives.engine.failures import finalize_within
from collectives.engine.waiting import wait_within
from commlab import tracing
from commlab.logs import get_logger, setup_logging
from ps.wire.messages import PSError, PSTimeout
from training.runtime.build import make_sampler, to_device
from training.runtime.checkpoint import (checkpoint_path, epochs_note, make_run_dir, nothing_to_do, prune_checkpoints,
                                         restart_hint, save_checkpoint, saved_epochs)
from commlab.file_formats import CheckpointError
from training.settings.cli import parse_args, parse_on_every_rank
from training.job import end_lost, set_threads
from commlab.job_control import all_failed
from training.driver.preflight import agree, agree_grid, check_run
from commlab.file_formats import write_json
from commlab.run_files import EpochTable, MetricsWriter, run_info, write_config
from training.monitor.setup import arrival, open_monitor, slow_factor, straggler_schedule
from training.model.optim import schedule_lr
from training.dp.data_parallel import CONTROL_ALGORITHM, evaluate, replicas_identical, train_step
from training.dp.hooks import make_grad_hook
from training.dp.shares import rank_batches, steps_per_epoch
from training.dp.local_sgd import local_step
from training.driver.elastic import (FINALIZE_S, ElasticStop, check_elastic, join_elastic, leave as leave_elastic,
                                     train_elastic)
from training.driver.trainer import build_trainer
from training.runtime.progress import progress_bar, write_trace
from training.ps_mode.finish import finish_ps
from training.ps_mode.worker import run_ps
from commlab.byte_sizes import format_bytes
from training.runtime.state import checkpoint_arrays

__all__ = ["main", "run", "train_dp", "lr_at"]

_log = get_logger("training.train")  # not __name__, which is "__main__" under python -m


def lr_at(cfg, step, total_steps):
    """Return the learning rate of global step ``step`` (0-based) of ``total_steps``.

    ``cfg.lr_schedule`` over ``cfg.lr`` by :func:`training.model.optim.schedule_lr`, the one implementation
    the parameter servers use as well.
    """
    return schedule_lr(cfg.lr_schedule, cfg.lr, step, total_steps)


def _write_config(cfg, comm, run_dir, resumed_from=None):
    if comm.rank == 0:
        write_config(run_dir, cfg.to_dict(), run_info(comm), resumed_from)


def train_dp(cfg, comm, run_dir, trainer=None):
    """Train data-parallel on ``comm`` and write the run records into ``run_dir``.

    Parameters
    ----------
    cfg : Config
    comm : mpi4py.MPI.Comm
    run_dir : str
        From :func:`training.runtime.checkpoint.make_run_dir`.
    trainer : training.driver.trainer.Trainer, optional
        From :func:`build_trainer` (built here when not given).

    Returns
    -------
    dict
        The summary (also written to ``summary.json`` on rank 0), on every rank. A resumed run
        already at its last epoch trains nothing, writes nothing and says so on one line.

    Examples
    --------
    >>> import contextlib, io, tempfile
    >>> from mpi4py import MPI
    >>> from training.runtime.checkpoint import make_run_dir
    >>> from training.settings.cli import parse_args
    >>> with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):
    ...     cfg = parse_args(["--hidden", "16", "--epochs", "2", "--no-progress", "--run-dir", d])
    ...     summary = train_dp(cfg, MPI.COMM_WORLD, make_run_dir(cfg, MPI.COMM_WORLD))
    >>> summary["epochs"], summary["steps"], summary["replicas_identical"]   # 1,438 samples / 64 a step
    (2, 46, True)
    """
    t = trainer or build_trainer(cfg, comm)
    P, rank, state = comm.size, comm.rank, t.state
    sampler = make_sampler(cfg, len(t.ds.y_train), rank, P, t.ds.y_train, run_dir if rank == 0 else None)
    data = to_device(t.ds, t.model.dtype, t.xp)  # x_train, y_train, x_test, y_test
    per_epoch = steps_per_epoch(sampler, cfg.batch_size)  # global batches of B, any P (training.dp.shares)
    last = min(cfg.epochs, cfg.stop_after or cfg.epochs)
    if t.resumed_from and state.epoch >= last:
        if rank == 0:
            _log.info(nothing_to_do(cfg, run_dir, state.epoch))
        return _summary(t, comm, run_dir, data, cfg.eval_batch, timeout=cfg.timeout)
    _write_config(cfg, comm, run_dir, t.resumed_from)
    writer = MetricsWriter(run_dir, rank == 0, keep_epochs=state.epoch if cfg.resume else None)
    table, monitor = EpochTable(), open_monitor(cfg, comm, run_dir)  # live metrics (training.monitor)
    bar = _start_display(t, cfg, comm, run_dir, table, (last - state.epoch) * per_epoch) if rank == 0 else None
    if cfg.trace:  # a barrier first: it aligns the ranks' clocks
        tracing.start(lambda: wait_within(comm.Ibarrier(), None, "barrier", "trace start"))
    t_start = time.perf_counter() - state.wall_s
    jitter_rng = numpy.random.default_rng([cfg.seed, rank, state.epoch, 0x717])  # --jitter's draws: per rank, repeatable
    train_acc = test_acc = None
    while state.epoch < last:
        epoch = state.epoch + 1  # 1-based for people; the sampler's epoch index is state.epoch
        skipped0 = state.skipped
        moves = len(straggler_schedule(cfg.straggler)) > 1  # a slowdown that moves: its factor read at each step
        slow = (lambda: slow_factor(cfg, rank, state.step)) if moves else slow_factor(cfg, rank)
        arrive = arrival(monitor, slow, cfg.jitter, jitter_rng)  # injected slowness, heartbeat
        loop = _Loop(per_epoch, writer, bar, t_start, monitor, arrive)
        sums = _train_epoch(t, cfg, comm, rank_batches(sampler, state.epoch, t.shares, rank), data, loop)
        with tracing.span("evaluate", "step", {"epoch": epoch}):
            train_acc, _ = evaluate(t.model, t.loss_fn, data[0], data[1], comm, cfg.eval_batch, cfg.timeout)
            test_acc, _ = evaluate(t.model, t.loss_fn, data[2], data[3], comm, cfg.eval_batch, cfg.timeout)
        rec = _end_epoch(t, cfg, comm, epoch, sums, (train_acc, test_acc), state.skipped - skipped0, loop)
        writer.epoch(rec)
        if bar is not None:
            bar.write(table.row(rec))
        if (cfg.checkpoint_every and epoch % cfg.checkpoint_every == 0) or epoch == last:
            _checkpoint(t, cfg, comm, run_dir, epoch)
    writer.close()
    found = monitor.close()  # rank 0: stragglers and stalls named, the monitoring's own share of the step time
    bar.close() if bar is not None else None
    write_trace(cfg.trace, comm, cfg.timeout) if cfg.trace else None
    summary = _summary(t, comm, run_dir, data, cfg.eval_batch, (train_acc, test_acc), cfg.timeout)
    if rank == 0:
        summary.update(wait_s=writer.total("wait_s"), transfer_s=writer.total("transfer_s"),
                       load_average_end=round(os.getloadavg()[0], 2), **found)
        write_json(os.path.join(run_dir, "summary.json"), summary)
        print(f"test accuracy {summary['final_test_acc']:.2%} after {state.epoch} "
              f"epoch{'' if state.epoch == 1 else 's'} | wall {state.wall_s:.1f} s | "
              f"communication {summary['comm_fraction']:.0%} of step time | "
              f"{format_bytes(state.bytes_sent)} sent per rank | {run_dir}", flush=True)
    return summary


#: What each rank sums over an epoch's steps; all-reduced as one float64 vector in this order.
_EPOCH_SUMS = ("loss", "steps", "compute_s", "comm_s", "bytes_sent", "wait_s", "transfer_s")


def _start_display(t, cfg, comm, run_dir, table, steps):
    """Log the run's opening lines, then open rank 0's progress bar over ``steps`` steps and print the table head.

    The log lines come first: written to stderr while a bar is drawn there, they would land inside it.
    """
    note = epochs_note(cfg, (t.saved_config or {}).get("epochs", cfg.epochs))
    if note:
        _log.warning(note)
    _log.info("%s: %d train / %d test samples, %d parameters (%s), P=%d, global batch %d, algorithm %s, "
              "compression %s -> %s", cfg.data, len(t.ds.y_train), len(t.ds.y_test), t.model.size, cfg.dtype,
              comm.size, cfg.batch_size, cfg.algorithm, cfg.compression, run_dir)
    bar = progress_bar(steps, "step", cfg.progress)
    bar.write(table.header())
    return bar


@dataclass
class _Loop:
    """What every step and epoch of a data-parallel run reports to."""

    per_epoch: int  # steps per epoch
    writer: object  # the step-record writer (commlab.run_files.MetricsWriter)
    bar: object  # the progress bar (rank 0; None elsewhere)
    t_start: float  # the run's start (time.perf_counter(), seconds)
    monitor: object  # the live monitor (training.monitor)
    arrive: object  # called with the step's compute seconds at its first collective (train_step's arrive)


def _train_epoch(t, cfg, comm, batches, data, loop):
    """Run the steps of one epoch on this rank's ``batches`` (index arrays); write one record per step.

    Returns
    -------
    dict
        This rank's sums over the epoch, keyed by :data:`_EPOCH_SUMS` (loss and steps count only the
        steps that were not skipped).
    """
    state, opt, x_tr, y_tr = t.state, t.opt, data[0], data[1]
    per_epoch, writer, bar, t_start, monitor, arrive = (loop.per_epoch, loop.writer, loop.bar, loop.t_start,
                                                        loop.monitor, loop.arrive)
    sums = dict.fromkeys(_EPOCH_SUMS, 0.0)
    local = None if t.local is None or t.local.data_parallel(state.epoch + 1) else t.local
    if local is not None:
        local.begin(t.model.params)  # replicas agree at an epoch's start: averaged at the end of the last
    for i, (batch, share) in enumerate(batches):
        batch = t.xp.asarray(batch)
        opt.lr = lr_at(cfg, state.step, cfg.epochs * per_epoch)
        if local is None:
            # this rank's weight: its share of the global batch (P b_r / B), times --weighted-average's; local SGD
            # weights the models instead
            r = train_step(t.model, t.loss_fn, opt, t.hook, comm, x_tr[batch], y_tr[batch], arrive=arrive,
                           scale=t.weight * share)
        else:
            r = local_step(t.model, t.loss_fn, opt, local, x_tr[batch], y_tr[batch], local.due(i, per_epoch),
                           arrive=arrive)
        r["samples"] = int(batch.shape[0])
        state.step += 1
        if local is None:
            t.shares.observe(r["arrival_s"], r["samples"])
            if t.shares.due(state.step):  # --balance: every K steps, the speeds gathered and B re-split
                t.shares.update(comm, cfg.timeout)
        state.skipped += r["skipped"]
        if not r["skipped"]:
            sums["loss"] += r["loss"]
            sums["steps"] += 1
        for key in _EPOCH_SUMS[2:]:
            sums[key] += r[key]
        writer.step({"step": state.step, "epoch": state.epoch + 1, "lr": opt.lr, **r,
                     "wall_s": time.perf_counter() - t_start})
        monitor.step(state.step, r)
        bar.update() if bar is not None else None
    return sums


def _end_epoch(t, cfg, comm, epoch, sums, accs, skipped, loop):
    """Sum the ranks' ``sums``, add the epoch to the run's counters and return its record.

    The epoch's times and bytes are means over ranks; its loss is the mean over every rank's
    steps that were not skipped.
    """
    P, state, per_epoch, t_start = comm.size, t.state, loop.per_epoch, loop.t_start
    vec = numpy.array([sums[k] for k in _EPOCH_SUMS])
    collectives.allreduce(vec, comm=comm, op="sum", algorithm=CONTROL_ALGORITHM, out=vec,
                          timeout=cfg.timeout)  # per-rank sums -> sums over ranks
    total = dict(zip(_EPOCH_SUMS, vec))
    state.compute_s += total["compute_s"] / P
    state.comm_s += total["comm_s"] / P
    state.bytes_sent += int(total["bytes_sent"] / P)
    state.epoch = epoch
    state.wall_s = time.perf_counter() - t_start
    return {"epoch": epoch, "loss": total["loss"] / max(total["steps"], 1), "train_acc": accs[0],
            "test_acc": accs[1], "compute_s": total["compute_s"] / P, "comm_s": total["comm_s"] / P,
            "wait_s": total["wait_s"] / P, "transfer_s": total["transfer_s"] / P,
            "bytes_sent": int(total["bytes_sent"] / P), "skipped": skipped, "steps": per_epoch,
            "shares": t.shares.shares.tolist(), "wall_s": state.wall_s}


def _checkpoint(t, cfg, comm, run_dir, epoch):
    """Save the epoch's checkpoint (collective) and, on rank 0, prune the old ones."""
    with tracing.span("checkpoint", "step", {"epoch": epoch}):
        save_checkpoint(checkpoint_path(run_dir, epoch), {**checkpoint_arrays(cfg, t.model, t.opt, t.hook, t.state),
                                                          **t.shares.state_dict()}, comm, cfg.timeout)
    if comm.rank == 0:
        prune_checkpoints(run_dir, cfg.keep_checkpoints)


def _summary(t, comm, run_dir, data, eval_batch, accs=(None, None), timeout=None):
    """Return the run summary; the accuracies are evaluated here when not given.

    ``data`` is ``(x_train, y_train, x_test, y_test)``. Every collective here waits at most ``timeout``
    seconds for a peer.
    """
    model, state = t.model, t.state
    x_tr, y_tr, x_te, y_te = data
    train_acc, test_acc = accs
    if test_acc is None:
        train_acc, _ = evaluate(model, t.loss_fn, x_tr, y_tr, comm, eval_batch, timeout)
        test_acc, _ = evaluate(model, t.loss_fn, x_te, y_te, comm, eval_batch, timeout)
    busy = state.compute_s + state.comm_s
    return {"final_test_acc": test_acc, "final_train_acc": train_acc, "epochs": state.epoch,
            "steps": state.step, "wall_s": state.wall_s, "compute_s": state.compute_s,
            "comm_s": state.comm_s, "comm_fraction": state.comm_s / busy if busy else 0.0,
            "bytes_sent_per_rank": state.bytes_sent, "skipped_steps": state.skipped,
            "parameters": model.size, "P": comm.size, "shares": t.shares.shares.tolist(),
            "share_moves": t.shares.moves,
            "replicas_identical": replicas_identical(model.params, comm, timeout), "run_dir": run_dir}


def run(cfg, comm=None):
    """Run one training job described by ``cfg`` on ``comm`` (default: ``MPI.COMM_WORLD``).

    The communicator is duplicated for the run's own messages. In data-parallel mode every
    collective of the training loop waits at most ``cfg.timeout`` seconds for a peer; a
    :class:`collectives.CollectiveError` (a crashed or hung rank, a mismatched call) ends the whole
    job with one ``error: rank R: ...`` line per failing rank and ``MPI_Abort``
    (:func:`collectives.engine.policy.abort_on_failure`), before any cleanup that could wait for the dead peer.

    Returns
    -------
    dict
        The run summary (``train_dp``'s, or whatever :func:`training.ps_mode.worker.run_ps` returns).

    Examples
    --------
    >>> import contextlib, io, tempfile
    >>> from training.settings.cli import parse_args
    >>> with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):
    ...     summary = run(parse_args(["--hidden", "16", "--epochs", "1", "--no-progress", "--run-dir", d]))
    >>> summary["epochs"], summary["P"], summary["parameters"]
    (1, 1, 1210)
    """
    comm = (comm or MPI.COMM_WORLD).Dup()
    try:
        agree(cfg, comm)  # every model and mode: one job, or one line naming what differs, before any driver
        set_threads(cfg, comm)
        if cfg.model == "ctr":  # embedding tables: dp, ps or hybrid (training.ctr)
            from training.ctr.run import run_ctr

            return run_ctr(cfg, comm, make_run_dir, _write_config)
        if cfg.tensor_parallel * cfg.pipeline_parallel > 1 or cfg.micro_batches > 1:
            from training.model_parallel.grid_train import run_hybrid  # data x tensor x pipeline grid

            agree_grid(cfg, comm)  # one job, the stages' widths included, before the first stage is built
            return run_hybrid(cfg, comm, lr_at)
        if cfg.mode == "ps":
            xp = check_run(cfg, comm)
            run_dir = make_run_dir(cfg, comm)
            if comm.rank == 0 and cfg.resume and epochs_note(cfg, saved_epochs(run_dir)):
                _log.warning(epochs_note(cfg, saved_epochs(run_dir)))
            _write_config(cfg, comm, run_dir, cfg.resume)
            return run_ps(cfg, comm, run_dir, xp)
        if cfg.elastic:
            check_elastic(cfg, comm)  # no ULFM, --elastic-min above P: one line before anything starts
        trainer = build_trainer(cfg, comm)
        try:
            with collectives.engine.policy.abort_on_failure():
                run_dir = make_run_dir(cfg, comm)
            with collectives.engine.policy.abort_on_failure(hint=restart_hint(cfg, run_dir)):
                if cfg.elastic:
                    return train_elastic(cfg, comm, run_dir, trainer)
                return train_dp(cfg, comm, run_dir, trainer)
        finally:
            trainer.hook.close()  # a compressor's duplicated communicator
    finally:
        tracing.stop()  # a run that failed mid-way leaves no recorder on
        collectives.engine.context.free_context(comm)
        comm.Free()


def main(argv=None):
    """Command-line entry point.

    Sets up the log output first (:func:`commlab.logs.setup_logging`: ``[rank R] LEVEL: message``
    on stderr at ``--log-level``, else ``$COMMLAB_LOG_LEVEL``, else INFO); the epoch table and the
    result line stay on stdout. User errors print one ``error: ...`` line (from rank 0 when every
    rank failed alike) and return 1, as does a parameter-server run that cannot continue
    (``ps.wire.messages.PSError``: BSP lost a worker). In ``--mode ps`` the ranks then check that all of
    them reached the end (:func:`training.ps_mode.finish.finish_ps`): when a rank died, rank 0 names
    it and aborts the job ``--ps-timeout`` seconds later instead of leaving everyone in
    ``MPI_Finalize``; a rank whose server never answered (``ps.wire.messages.PSTimeout``) reports it and
    aborts at once. A failed collective (``collectives.CollectiveError``: a peer silent for
    ``--timeout`` seconds or lost, whose rank the line names, with how to restart) and any other
    failure with P > 1 abort the job.

    Returns
    -------
    int
        0 after a finished run, 1 after a user error or a parameter-server run that cannot continue.

    Examples
    --------
    >>> import contextlib, io, tempfile
    >>> out = io.StringIO()
    >>> with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(out):
    ...     status = main(["--hidden", "16", "--epochs", "1", "--no-progress", "--run-dir", d])
    >>> status, "test accuracy" in out.getvalue()
    (0, True)
    """
    world = MPI.COMM_WORLD
    cfg = parse_on_every_rank(parse_args, argv, world.rank)  # one copy of --help and of flag errors
    summary = None
    try:
        setup_logging(world.rank, cfg.log_level)  # a bad $COMMLAB_LOG_LEVEL: a setup error like the others
        if cfg.elastic_respawn and MPI.Comm.Get_parent() != MPI.COMM_NULL:  # a replacement (--elastic-respawn)
            with collectives.engine.policy.abort_on_failure():
                join_elastic(cfg, MPI.Comm.Get_parent())
            finalize_within(FINALIZE_S)  # a job that lost a rank: Open MPI's closing fence may hang
            return 0
        summary = run(cfg, world)
        if cfg.elastic:
            leave_elastic(summary)  # a rank died: exit 0 without MPI_Finalize, which could wait for it
    except (CheckpointError, ValueError, TypeError, OSError, ImportError) as e:
        # setup errors are raised identically on every rank: then exit cleanly with one message
        everyone = all_failed(world)
        if not everyone or world.rank == 0:
            where = "" if everyone else f"rank {world.rank}: "
            print(f"error: {where}{str(e) or type(e).__name__}", file=sys.stderr, flush=True)
        if not everyone:
            collectives.engine.policy.abort(None, world)
        return 1
    except ElasticStop:  # --elastic: fewer than --elastic-min survivors; each printed its line, the checkpoint is written
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # dead ranks in COMM_WORLD: no MPI_Finalize
    except (PSTimeout, collectives.CollectiveError, MPI.Exception) as e:  # a peer may be dead: MPI_Finalize would wait
        end_lost(e, restart_hint(cfg), world.rank)
    except PSError as e:
        # the run cannot continue (BSP lost a worker): the servers and the workers still running
        # have all stopped the protocol; rank 0, a server, states why once, another rank only
        # what rank 0 does not know (its peers drop it after --ps-timeout, so nothing hangs)
        if world.rank == 0 or not str(e).startswith("BSP cannot continue"):
            where = f"rank {world.rank}: " if world.rank else ""
            print(f"error: {where}{e}", file=sys.stderr, flush=True)
        finish_ps(world, cfg)
        return 1
    except Exception:  # noqa: BLE001 - any other failure: report and abort the whole job
        traceback.print_exc()
        if world.size > 1:
            collectives.engine.policy.abort(None, world)
        raise
    if cfg.mode == "ps":
        finish_ps(world, cfg, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
