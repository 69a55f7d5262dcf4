"""The three ways to train the ctr model: ``dp``, ``ps`` and ``hybrid`` (one worker's or one rank's loop).

Every loop takes global step ``t``'s batch (:func:`global_batch`: the same samples on any rank count) and
its own ``1 / W`` of it, reduces the ids to distinct rows, and:

* ``dp`` (:func:`dp_loop`): every rank holds every table; the embedding gradient is written into a dense
  table-sized gradient beside the MLP's and the whole flat vector is all-reduced (``op="avg"``, any of
  commlab's algorithms and compressors, :func:`training.dp.hooks.make_grad_hook`); one dense optimizer step.
* ``ps`` (:func:`ps_loop`, ``hybrid=False``): the MLP's parameters are extra rows of the servers' key space;
  a worker pulls its batch's rows and every MLP row, pushes their gradients.
* ``hybrid`` (:func:`ps_loop`, ``hybrid=True``): the embedding rows as in ``ps``; the MLP on every worker,
  its gradient all-reduced among the workers only (a sub-communicator) and stepped locally.

Under BSP with SGD (no momentum) or Adagrad the three give the same parameters as one process up to
rounding: a worker's gradient is the mean over its ``B / W`` samples, and both the servers (one update per
clock on the mean of the workers' pushes) and the all-reduce (``op="avg"``) average the ``W`` of them.
"""
import time

import numpy as np

from ps.wire.messages import Msg
from ps.embedding.sparse_push_pull import SparseClient
from training.ctr.model import unique_rows
from training.ctr.resume import checkpoint_due, load_rank, save_rank
from training.dp.hooks import make_grad_hook
from training.model.optim import optimizer_factory, schedule_lr

__all__ = ["global_batch", "dp_loop", "ps_loop", "FlatView", "dense_rows"]


class FlatView:
    """What the gradient hooks read of a model, for the ``dp`` flat vector ``[table, MLP]``."""

    def __init__(self, n_table, mlp, params, grads):
        self.dtype, self.params, self.grads = mlp.dtype, params, grads
        self.slices = [("table", 0, n_table)] + [(n, o + n_table, s) for n, o, s in mlp.slices]
        self._pairs = [(params[:n_table], grads[:n_table])] + mlp.parameters()

    def parameters(self):
        return self._pairs


def global_batch(cfg, step, cache):
    """Return the sample indices (shape (B,)) of global step ``step``: a seeded permutation per epoch, cut in B."""
    per_epoch = cfg.ctr_train // cfg.batch_size
    epoch, t = divmod(step, per_epoch)
    if cache.get("epoch") != epoch:
        order = np.random.default_rng([cfg.seed, 7, epoch]).permutation(cfg.ctr_train) if cfg.shuffle \
            else np.arange(cfg.ctr_train)
        cache.update(epoch=epoch, order=order)
    return cache["order"][t * cfg.batch_size:(t + 1) * cfg.batch_size]


def dense_rows(n, dim):
    """Rows of width ``dim`` that hold ``n`` MLP parameters in ``--mode ps`` (the last one zero-padded)."""
    return -(-n // dim)


def dp_loop(cfg, comm, data, model, table0, run):
    """Train data-parallel on ``comm``; return ``(table, dense, records)``.

    ``run``: ``(start, stop, total, ckpt)``: the global steps ``start .. stop - 1`` of a run of ``total``
    (the learning-rate schedule's horizon), and the checkpoint directory ("" for none;
    :mod:`training.ctr.resume`), from whose file of clock ``start`` a resumed rank loads its state.
    ``records``: ``bytes_sent`` (this rank's all-reduce bytes), ``loss`` (sum), ``steps``, ``wall_s``
    (the steps' seconds, the last checkpoint not counted).
    """
    start, stop, total, ckpt = run
    n_table, mlp, every = table0.size, model.mlp, cfg.ctr_train // cfg.batch_size * cfg.checkpoint_every
    flat = np.concatenate([table0.ravel(), mlp.params])
    grads = np.zeros_like(flat)
    table, tgrad = flat[:n_table].reshape(table0.shape), grads[:n_table].reshape(table0.shape)
    opt = optimizer_factory(cfg)(flat, grads)
    hook = make_grad_hook(cfg, comm, FlatView(n_table, mlp, flat, grads))
    b, r, cache = cfg.batch_size // comm.Get_size(), comm.Get_rank(), {}
    rec = {"bytes_sent": 0, "loss": 0.0, "steps": 0}
    if start:
        load_rank(ckpt, r, start, flat, opt, hook)
    t0 = time.perf_counter()
    try:
        for step in range(start, stop):
            idx = global_batch(cfg, step, cache)[r * b:(r + 1) * b]
            rows, inv = unique_rows(data.train_ids[idx])
            mlp.params[...] = flat[n_table:]
            loss, row_grads = model.step(table[rows], inv, data.train_y[idx])
            tgrad.fill(0)  # the dense embedding gradient: zero but for the batch's rows
            tgrad[rows] = row_grads
            grads[n_table:] = mlp.grads
            avg, info = hook(grads)
            if avg is not grads:
                grads[...] = avg
            opt.lr = schedule_lr(cfg.lr_schedule, cfg.lr, step, total)
            opt.step()
            rec["bytes_sent"] += int(info["bytes_sent"])
            rec["loss"] += loss
            rec["steps"] += 1
            if ckpt and step + 1 < stop and checkpoint_due(step + 1, stop, every):
                save_rank(ckpt, r, step + 1, flat, opt, hook)
        rec["wall_s"] = time.perf_counter() - t0
        if ckpt and stop > start:
            save_rank(ckpt, r, stop, flat, opt, hook)
    finally:
        hook.close()
    mlp.params[...] = flat[n_table:]
    return table, mlp.params.copy(), rec


def ps_loop(cfg, comms, w, model, data, sharding, run, hybrid):
    """One worker's loop of ``--mode ps`` or ``hybrid``: pull rows, compute, (all-reduce the MLP,) push.

    Parameters
    ----------
    cfg : training.settings.config.Config
    comms : (MPI.Comm, MPI.Comm, list, list)
        The servers' protocol communicator, the workers' sub-communicator, server and worker ranks.
    w : int
        This worker's index.
    model : training.ctr.model.CTRModel
    data : training.ctr.data.CTRData
    sharding : ps.shards.rows.RowSharding
    run : (int, int, float, str)
        ``(stop, total, timeout, ckpt)``: run the clocks up to ``stop`` of a run of ``total`` (the learning-rate
        schedule's horizon), a server may stay silent ``timeout`` seconds; ``ckpt`` is the checkpoint
        directory ("" for none): in ``hybrid`` the worker writes its MLP, optimizer and hook state there
        at the servers' checkpoint clocks and loads the file of the clock it resumes at
        (:mod:`training.ctr.resume`).
    hybrid : bool

    Returns
    -------
    dict
        ``pull_bytes``, ``push_bytes`` (PS payload bytes), ``allreduce_bytes``, ``loss``, ``steps``, ``wall_s``.
    """
    pscomm, wcomm, servers, workers = comms
    stop, total, timeout, ckpt = run
    mlp, W, n_emb = model.mlp, len(workers), sharding.n_rows - (0 if hybrid else dense_rows(model.mlp.size, model.dim))
    client = SparseClient(pscomm, w, servers, workers, sharding, mlp.dtype, timeout, retries=cfg.ps_retries)
    hook = make_grad_hook(cfg, wcomm, mlp) if hybrid else None
    opt = optimizer_factory(cfg)(mlp.params, mlp.grads) if hybrid else None
    extra = np.arange(n_emb, sharding.n_rows, dtype=np.int64)  # ps: the MLP's rows, pulled every step
    b, cache = cfg.batch_size // W, {}
    rec = {"allreduce_bytes": 0, "loss": 0.0, "steps": 0}
    every, rank = cfg.ctr_train // cfg.batch_size * cfg.checkpoint_every, pscomm.Get_rank()
    clock, stopped = client.join_rows()
    if hybrid and clock:
        load_rank(ckpt, rank, clock, mlp.params, opt, hook)
    start, t0 = clock, time.perf_counter()
    try:
        while not stopped and clock < stop:
            idx = global_batch(cfg, clock, cache)[w * b:(w + 1) * b]
            rows, inv = unique_rows(data.train_ids[idx])
            status, values = client.pull_rows(clock, np.concatenate([rows, extra]))
            if status != "params":
                break
            if not hybrid:
                mlp.params[...] = values[rows.size:].reshape(-1)[:mlp.size]
            loss, row_grads = model.step(values[:rows.size], inv, data.train_y[idx])
            if hybrid:
                avg, info = hook(mlp.grads)
                if avg is not mlp.grads:
                    mlp.grads[...] = avg
                opt.lr = schedule_lr(cfg.lr_schedule, cfg.lr, clock, total)
                opt.step()
                rec["allreduce_bytes"] += int(info["bytes_sent"])
                push = row_grads
            else:
                pad = np.zeros(extra.size * model.dim, mlp.dtype)
                pad[:mlp.size] = mlp.grads
                push = np.concatenate([row_grads, pad.reshape(extra.size, model.dim)])
            client.push_rows(clock, push)
            clock += 1
            rec["loss"] += loss
            rec["steps"] += 1
            if hybrid and ckpt and clock < stop and checkpoint_due(clock, stop, every):
                save_rank(ckpt, rank, clock, mlp.params, opt, hook)
        rec["wall_s"] = time.perf_counter() - t0
        if hybrid and ckpt and clock > start:
            save_rank(ckpt, rank, clock, mlp.params, opt, hook)
        client.finish(Msg.DONE)
    finally:
        if hook is not None:
            hook.close()
    rec.update(pull_bytes=client.received_bytes, push_bytes=client.sent_bytes, clock=clock)
    return rec
