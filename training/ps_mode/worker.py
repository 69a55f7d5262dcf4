"""Parameter-server training of the trainer's model: ``python -m training.train --mode ps``.

``run_ps`` maps the training configuration onto :class:`ps.job.settings.PSOptions`, builds the model and
the data with the trainer's own functions on every rank (so the initial parameters agree), and runs
:func:`ps.job.runner.run`: workers compute gradients of their share of each global batch, the servers
apply the trainer's own optimizer (:func:`training.model.optim.optimizer_factory`) to their shards. Rank 0
then evaluates the snapshots the servers kept, and writes the run records (:mod:`training.ps_mode.run_records`).

Batches: with ``W`` workers, clock ``c`` takes the trainer's global batch ``c`` of the epoch
(:meth:`training.data.sampling.DistributedSampler.global_batches`) and each worker its equal share of it
(:func:`training.data.sampling.deal`; ``batch_size / W``, or 22/21/21 for 64 over 3), exactly the samples
data-parallel training on ``W`` ranks takes; each worker weights its mean gradient by its share so
that the servers' mean of the pushes is the batch's mean gradient, and BSP with plain SGD reproduces
data-parallel training for any ``W``. With ``--balance`` a worker reads its sampler's order as a
stream, as many samples per clock as its batch, each share at most what ``--memory-gb`` allows.
"""
import dataclasses
import os

import numpy

from collectives.engine.waiting import wait_within
from commlab import tracing
from commlab.arrays import to_host
from commlab.logs import get_logger
from ps.job.settings import PSOptions
from ps.shards.key_ranges import proportional
from ps.job.reports import roles
from ps.job.runner import run
from ps.checkpoints.shard_files import server_checkpoint_path
from ps.checkpoints.shard_files import check_resume, newest_generation, read_server_checkpoint
from training.runtime.checkpoint import root_bytes, unfinished_without_checkpoint
from commlab.run_files import run_id_of
from training.runtime.build import build_model, make_sampler, to_device
from training.data.datasets import load_dataset
from training.model.nn import SoftmaxCrossEntropy
from training.model.optim import lr_rule, optimizer_factory
from training.dp.shares import memory_cap, steps_per_epoch
from training.dp.data_parallel import compute_gradient, is_finite
from training.data.sampling import deal
from training.monitor.setup import close_monitor, open_ps_monitor
from training.runtime.progress import progress_bar, write_trace
from training.ps_mode.finish import reporter_rank
from training.ps_mode.run_records import evaluate_snapshots, write_records

_log = get_logger("training.ps_mode.worker")

__all__ = ["run_ps", "ps_options", "check_ps", "check_server_checkpoints", "BatchStream",
           "PS_EXTRA"]

_SNAPSHOTS_PER_EPOCH = 4  # accuracy-versus-time resolution of the recorded curve
#: Settings beyond the training configuration (``extra`` of :func:`ps_options`): the transient delays
#: and the balancing interval (:class:`PSOptions` fields) and the resolution of a study's curves.
PS_EXTRA = ("delay_prob", "delay_s", "balance_every", "snapshots_per_epoch", "retry_s", "drop_replies",
            "late_replies", "late_s")


class BatchStream:
    """Per-clock sample indices of one worker, from the trainer's distributed sampler.

    Parameters
    ----------
    sampler : training.data.sampling.DistributedSampler or training.data.shard_sampler.ShardSampler
        This worker's sampler (rank = worker index, size = W).
    batch : int
        Global batch B (samples per clock over all workers), >= W.
    stream : bool
        False: clock ``c`` takes this worker's equal share (:func:`training.data.sampling.deal`) of global
        batch ``c % per_epoch`` of epoch ``c // per_epoch`` (the data-parallel order, the epoch's
        last batch possibly shorter; a skewed partition's sampler: its own slice). True: consecutive
        batches of any size run through the epochs' orders back to back (load balancing).

    Examples
    --------
    >>> from training.data.sampling import DistributedSampler
    >>> s = BatchStream(DistributedSampler(10, rank=0, size=3, shuffle=False), 4)
    >>> s.per_epoch, s.indices(0, 2).tolist(), s.indices(2, 1).tolist(), s.weight(2, 2, 1)  # batches 4, 4, 3
    (3, [0, 3], [8], 0.6666666666666666)
    """

    __slots__ = ("sampler", "batch", "stream", "per_epoch", "shares", "_epoch", "_order", "_pos")

    def __init__(self, sampler, batch, stream=False):
        if batch < sampler.size:
            raise ValueError(f"the global batch ({batch}) is smaller than the number of workers ({sampler.size})")
        if sampler.num_samples < 1:
            raise ValueError("the training set is empty: no samples for this worker")
        self.sampler, self.batch, self.stream = sampler, int(batch), bool(stream)
        self.shares = proportional(numpy.ones(sampler.size), self.batch)  # the equal split of B
        self.per_epoch = steps_per_epoch(sampler, self.batch)  # clocks per epoch
        self._epoch, self._order, self._pos = -1, None, 0

    def _global(self, clock):
        """Return (global batch, its shares) of ``clock`` (fixed mode, a :class:`DistributedSampler`)."""
        epoch, s = divmod(int(clock), self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._order = epoch, self.sampler.epoch_order(epoch, self.batch)
        batch = self._order[s * self.batch:(s + 1) * self.batch]
        shares = self.shares if len(batch) == self.batch else proportional(self.shares.astype(float), len(batch))
        return batch, shares

    def weight(self, clock, batch, samples):
        """Return the factor of a worker's mean gradient over ``samples`` samples of clock ``clock``.

        :func:`ps.job.runner.run` scales each push by ``W batch / B``; this factor makes the product
        ``W samples / m``, with ``m`` the clock's global batch (shorter at an epoch's end), so
        that the servers' mean of the W pushes is the global batch's mean gradient. 1.0 for a full batch.
        """
        if self.stream or not hasattr(self.sampler, "global_batches"):
            return 1.0
        m = len(self._global(clock)[0])
        return samples * self.batch / (m * batch)

    def indices(self, clock, batch):
        """Return the int64 sample indices for ``clock`` (stream mode: ``batch`` samples)."""
        if not self.stream:
            if not hasattr(self.sampler, "global_batches"):  # a skewed partition: the worker's own shard
                epoch, s = divmod(int(clock), self.per_epoch)
                lb = self.sampler.local_batch
                if epoch != self._epoch:
                    self._epoch, self._order = epoch, self.sampler.indices(epoch)
                return self._order[s * lb:(s + 1) * lb]
            order, shares = self._global(clock)
            return deal(order, shares)[self.sampler.rank]
        out = []
        while batch > 0:
            if self._order is None or self._pos >= len(self._order):
                self._order_of(self._epoch + 1)
                self._pos = 0
            take = self._order[self._pos:self._pos + batch]
            out.append(take)
            self._pos += len(take)
            batch -= len(take)
        return numpy.concatenate(out)

    def _order_of(self, epoch):
        self._epoch, self._order = epoch, self.sampler.indices(epoch)
        return self._order


def ps_options(cfg, comm, per_epoch, run_dir, extra=None):
    """Return the :class:`PSOptions` of a training configuration.

    Parameters
    ----------
    cfg : training.settings.config.Config
        The resolved configuration.
    comm : MPI.Comm or int
        The job's communicator (servers plus workers), or its size.
    per_epoch : int
        Clocks per epoch of one worker.
    run_dir : str
        Run directory; server checkpoints go to ``run_dir/ps``.
    extra : dict, optional
        :data:`PS_EXTRA` settings: ``delay_prob`` (probability per worker and clock) and
        ``delay_s`` (seconds) of the transient delays, ``balance_every`` (clocks between the speed
        reports of ``--balance``, default 10), ``snapshots_per_epoch`` (the points of the
        accuracy-versus-time curve per epoch, default 4).

    Raises
    ------
    ValueError
        When the configuration cannot run on this communicator, or ``extra`` names another
        field (on every rank).
    """
    size = comm if isinstance(comm, int) else comm.Get_size()
    W = size - cfg.servers
    extra = dict(extra or {})
    unknown = sorted(set(extra) - set(PS_EXTRA))
    if unknown:
        raise ValueError(f"parameter-server settings {unknown} cannot be set here; allowed: {list(PS_EXTRA)}")
    per_snapshot = extra.pop("snapshots_per_epoch", _SNAPSHOTS_PER_EPOCH)
    if not (isinstance(per_snapshot, int) and per_snapshot >= 1):
        raise ValueError(f"snapshots_per_epoch must be an integer >= 1, got {per_snapshot!r}")
    last = min(cfg.epochs, cfg.stop_after or cfg.epochs)
    ckpt = os.path.join(run_dir, "ps")
    opts = PSOptions(
        servers=cfg.servers, consistency=cfg.consistency, staleness=cfg.staleness,
        staleness_lr=cfg.staleness_lr, budget=W * per_epoch * last, lr=cfg.lr,
        lr_at=lr_rule(cfg.lr_schedule, cfg.lr), horizon=W * per_epoch * cfg.epochs,
        ps_timeout=cfg.ps_timeout, straggler=cfg.straggler, jitter=cfg.jitter,
        fail_worker=cfg.fail_worker, worker_batch=max(1, cfg.batch_size // W), global_batch=cfg.batch_size,
        balance=cfg.balance, balance_every=cfg.balance_every,
        snapshot_every=max(1, W * per_epoch // per_snapshot), checkpoint_dir=ckpt,
        checkpoint_every_pushes=W * per_epoch * cfg.checkpoint_every,
        resume_dir=ckpt if cfg.resume and newest_generation(ckpt, cfg.servers // max(1, cfg.ps_replicas)) else "",
        seed=cfg.seed, conflict=cfg.ps_conflict, conflict_lag=cfg.ps_conflict_lag, retries=cfg.ps_retries,
        replicas=cfg.ps_replicas, allow_foreign=cfg.allow_foreign_checkpoint)
    opts = dataclasses.replace(opts, **extra)
    opts.validate(size)
    return opts


def check_ps(cfg, size):
    """Check what a ``--mode ps`` run needs from a job of ``size`` ranks, before anything is created.

    Called by :func:`training.driver.preflight.check_run` on every rank alike, so a bad setting (rank count,
    straggler or jitter spec, missing server checkpoint of ``--resume``) fails before the run
    directory exists or its ``config.json`` is rewritten.

    Parameters
    ----------
    cfg : training.settings.config.Config
        The resolved configuration (``mode == "ps"``).
    size : int
        Number of ranks in the job (servers plus workers).

    Raises
    ------
    ValueError
        Naming the offending flag.
    """
    S = cfg.servers
    if size < S + 1:
        raise ValueError(f"--mode ps with --servers {S} needs at least {S + 1} ranks ({S} server(s) and "
                         f"at least one worker), got {size}; launch with mpiexec -n {S + 1} or more")
    if S < 1:
        raise ValueError(f"--servers must be >= 1, got {S}")
    W = size - S
    if cfg.batch_size < W:
        raise ValueError(f"the global batch ({cfg.batch_size}) is smaller than the number of workers ({W} = {size} "
                         f"ranks - {S} servers): every worker needs at least one sample of each batch")
    ps_options(cfg, size, 1, cfg.run_dir)  # PSOptions.validate: straggler, jitter, fail_worker...
    optimizer_factory(cfg)
    if cfg.resume:
        run_dir = cfg.resume if os.path.isdir(cfg.resume) else (os.path.dirname(cfg.resume) or ".")
        check_server_checkpoints(os.path.join(run_dir, "ps"), S // max(1, cfg.ps_replicas),
                                 unfinished_without_checkpoint(run_dir), run_id=run_id_of(run_dir) or "",
                                 allow_foreign=cfg.allow_foreign_checkpoint, job=(S, W))  # one file per shard


def check_server_checkpoints(ckpt, servers, missing_ok=False, *, run_id="", allow_foreign=False, job=None,
                             layout=None):
    """Check that the servers' checkpoints in ``ckpt`` exist, belong to one generation of this run, and
    each holds its own server's shard with values that make sense.

    Each server writes its own shard's file when its count of folded pushes crosses a multiple of
    the checkpoint interval, so a job killed between two servers' writes leaves shards of different
    generations (one at 184 pushes, another at 92): resuming from them would mix two models. They
    are refused, naming both files.

    Parameters
    ----------
    ckpt : str
        The run's ``ps`` directory.
    servers : int
        Number of servers (files ``ps_server0.npz`` ...).
    missing_ok : bool
        Accept a directory with no server checkpoint at all (a run that ended before its first):
        the run then starts from the beginning.
    run_id : str
        The run's id (``config.json``): every file must carry it (``""``: not checked).
    allow_foreign : bool
        Accept files that another run wrote (``--allow-foreign-checkpoint``).
    job : tuple of (int, int), optional
        The job's server ranks and workers ``(S, W)``: the files must come from a job of that shape.
    layout : ndarray, optional
        The rows' layout over sparse servers (:meth:`ps.shards.rows.RowSharding.fingerprint`): the files must
        hold the same (a refusal names the setting that differs).

    Returns
    -------
    bool
        True when there are checkpoints to resume from; False when none (``missing_ok``), or when some
        shards have none and those present are of this job: a job killed inside its first write has no
        checkpoint yet.

    Raises
    ------
    ValueError
        When a server's file is missing (some present).
    CheckpointError
        Naming the file, when it is unreadable, of another run (unless ``allow_foreign``), holds
        another server's shard, comes from a job of another shape or generation, or holds values
        that make no sense (:func:`ps.checkpoints.shard_files.check_resume`).

    Examples
    --------
    >>> import tempfile
    >>> check_server_checkpoints(tempfile.mkdtemp(), 2, missing_ok=True)  # a run ended before its first
    False
    """
    paths = [server_checkpoint_path(ckpt, r) for r in range(servers)]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing_ok and len(missing) == servers:
        return False
    S, W = job if job is not None else (None, None)
    if missing and len(missing) < servers:  # no complete generation: killed inside its first write, so nothing to
        for g, p in enumerate(paths):        # resume from, unless the files there are of another job
            if p not in missing:
                read_server_checkpoint(p, g, run_id=run_id, allow_foreign=allow_foreign, servers=S, workers=W,
                                       layout=layout)
        return False
    if missing:
        raise ValueError(f"resume: no parameter-server checkpoint {missing[0]} (was the run a "
                         f"--mode ps run with --servers {servers}?)")
    check_resume(ckpt, servers, run_id=run_id, allow_foreign=allow_foreign, servers=S, workers=W, layout=layout)
    return True


def run_ps(cfg, comm, run_dir, xp, extra=None):
    """Train ``cfg``'s model with a parameter server on ``comm`` and write the run records.

    The first ``cfg.servers`` ranks serve, the others work. Rank 0 shows a progress bar of the
    pushes, prints the epoch table, the staleness histogram and a summary line, and writes
    ``summary.json``, ``epochs.jsonl``, ``metrics.jsonl`` (the accuracy-versus-time curve),
    ``staleness.json`` and ``ps_model.npz`` (the final flat parameters) into ``run_dir``.

    Parameters
    ----------
    cfg : training.settings.config.Config
        Resolved configuration with ``mode == "ps"``.
    comm : MPI.Comm
        Communicator of all ranks (servers and workers).
    run_dir : str
        The run directory (created by the trainer, ``config.json`` already written).
    xp : module
        The workers' array module for ``cfg.device``, as :func:`training.driver.preflight.check_run` returned
        it (NumPy or CuPy); servers always work on the host.
    extra : dict, optional
        :data:`PS_EXTRA` settings beyond the configuration (see :func:`ps_options`).

    Returns
    -------
    dict
        Rank 0: the summary. Other ranks: ``{"role": ..., ...}`` with what they know.

    Raises
    ------
    ValueError
        When the configuration does not fit the communicator (every rank, before any message).
    ps.wire.messages.PSError
        When BSP loses a worker (every rank still running).
    """
    P, S = comm.Get_size(), cfg.servers
    W = P - S
    ds = load_dataset(cfg)
    rank = comm.Get_rank()
    servers, workers = roles(comm, S)
    w = workers.index(rank) if rank in workers else 0
    stream = BatchStream(make_sampler(cfg, len(ds.y_train), w, W, ds.y_train, run_dir if rank == 0 else None),
                         cfg.batch_size, cfg.balance)  # rank 0, a server, records the partition
    run_id = root_bytes(comm, lambda: (run_id_of(run_dir) or "").encode(), timeout=cfg.timeout).decode()
    opts = dataclasses.replace(ps_options(cfg, comm, stream.per_epoch, run_dir, extra), run_id=run_id)
    model = build_model(cfg, ds.n_features, ds.n_classes, xp if rank in workers else numpy)
    opts = dataclasses.replace(opts, max_batch=memory_cap(cfg, ds, model) or 0)  # --memory-gb: each worker's batch
    init = numpy.ascontiguousarray(to_host(model.params))
    loss_fn = SoftmaxCrossEntropy()
    make_optimizer = optimizer_factory(cfg)
    monitor = open_ps_monitor(cfg, comm, run_dir)  # live metrics (training.monitor), or None
    if cfg.trace:
        # a barrier first, within --ps-timeout: it aligns the ranks' clocks
        tracing.start(lambda: wait_within(comm.Ibarrier(), cfg.ps_timeout, "barrier", "trace start"))
    grad_fn, skipped = None, [0]
    if rank in workers:
        x_tr, y_tr, _, _ = to_device(ds, model.dtype, xp)

        def grad_fn(params, clock, batch):
            model.params[...] = xp.asarray(params)
            idx = xp.asarray(stream.indices(clock, batch))
            loss = compute_gradient(model, loss_fn, x_tr[idx], y_tr[idx])
            factor = stream.weight(clock, batch, int(idx.shape[0]))  # the epoch's last, shorter global batch
            if factor != 1.0:
                model.grads *= factor
            if not is_finite(loss, model.grads):
                model.grads.fill(0)  # a non-finite step contributes nothing
                skipped[0] += 1
                if monitor is not None:
                    monitor.skipped += 1  # commlab_skipped_steps_total, with the worker's next report
            return to_host(model.grads), int(idx.shape[0])

    if rank != reporter_rank(cfg):
        stats = run(comm, opts, init, grad_fn, make_optimizer=make_optimizer, monitor=monitor)
        close_monitor(monitor)
        if cfg.trace:
            write_trace(cfg.trace, comm, cfg.ps_timeout)
        if rank in workers:
            return {"role": "worker", "failed": stats is None, "skipped_steps": skipped[0], "stats": stats}
        return {"role": "server"}
    bar = _progress_bar(cfg, ds, model, S, W, run_dir, opts)
    last = [0]

    def on_push(pushes):
        bar.update(min(pushes, opts.budget) - last[0])
        last[0] = min(pushes, opts.budget)

    try:
        result = run(comm, opts, init, grad_fn, on_push=on_push, make_optimizer=make_optimizer, monitor=monitor)
    finally:
        bar.close()
    if cfg.trace:
        write_trace(cfg.trace, comm, cfg.ps_timeout)
    evals = dict(evaluate_snapshots(result, model, loss_fn, to_device(ds, model.dtype), cfg.eval_batch,
                                    W * stream.per_epoch), monitor=close_monitor(monitor))
    return write_records(cfg, comm, run_dir, result, evals, opts, model.size, stream.per_epoch)


def _progress_bar(cfg, ds, model, S, W, run_dir, opts):
    bar = progress_bar(opts.budget, "push", cfg.progress)
    s = f", s={cfg.staleness}" if cfg.consistency == "ssp" else ""
    _log.info("%s: %d train / %d test samples, %d parameters (%s), %d server(s) + %d worker(s), %s%s, "
              "global batch %d, %s lr %g -> %s", cfg.data, len(ds.y_train), len(ds.y_test), model.size, cfg.dtype,
              S, W, cfg.consistency.upper(), s, cfg.batch_size, cfg.optimizer, cfg.lr, run_dir)  # as data-parallel's
    return bar
