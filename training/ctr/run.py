"""A ``--model ctr`` job: checks, data, roles, the loops of :mod:`.modes`, the final table and the records.

``--mode dp``: every rank trains (:func:`training.ctr.modes.dp_loop`); rank 0 reports. ``--mode ps`` and
``hybrid``: the first ``--servers`` ranks run :class:`ps.embedding.sparse_push_pull.SparseServer` on their shard of the rows
(:class:`ps.shards.rows.RowSharding`, ``--ctr-sharding``, ``--ctr-hot``), the others run
:func:`training.ctr.modes.ps_loop`; once the servers' loops end (every worker done), each server sends the
first worker its counters and its shard, and that worker assembles the table and reports.

Everything a bad configuration can fail on (rank counts, batch split, memory, ids) is checked on every rank
before the first message of training, each rank deciding alike (the memory on the smallest free memory per
rank that any node reports). The report (``summary.json`` in the run directory) holds the test AUC and log
loss beside the planted truth's (``best_auc``), samples per second, bytes per step, and each server's load.
"""
import json
import os
import time

import numpy as np
from mpi4py import MPI

from commlab.logs import get_logger
from ps.job.settings import PSOptions
from ps.job.reports import roles
from ps.shards.rows import RowSharding
from ps.embedding.sparse_push_pull import SparseServer
from ps.checkpoints.shard_files import newest_generation
from training.ctr.data import available_bytes, check_ids, check_memory, make_ctr_data
from training.ctr.model import CTRModel, auc_logloss, init_table
from training.ctr.modes import dense_rows, dp_loop, ps_loop
from training.ctr.resume import resume_clock
from training.ctr.sparse_optim import make_sparse_optimizer
from training.model.optim import lr_rule

__all__ = ["train_ctr", "run_ctr", "check_ctr_job", "hot_rows"]

_log = get_logger("training.ctr")
_TAG = 0x7C7  # the servers' final counters and shards, on their own communicator


def check_ctr_job(cfg, size):
    """Return ``(S, W)`` for ``cfg`` on ``size`` ranks, or raise ``ValueError`` naming the flag (every rank)."""
    S = 0 if cfg.mode == "dp" else cfg.servers
    W = size - S
    if W < 1:
        raise ValueError(f"--mode {cfg.mode} with --servers {S} needs at least {S + 1} ranks, got {size}")
    if cfg.batch_size % W:
        raise ValueError(f"batch_size ({cfg.batch_size}) must be a multiple of the {W} worker(s)")
    if cfg.ctr_train < cfg.batch_size:
        raise ValueError(f"ctr_train ({cfg.ctr_train}) must hold at least one batch ({cfg.batch_size})")
    if cfg.ctr_hot and S > 1 and cfg.ctr_dim % S:
        raise ValueError(f"--ctr-hot splits rows over the {S} servers: --ctr-dim ({cfg.ctr_dim}) must divide by {S}")
    make_sparse_optimizer(cfg) if S else None
    return S, W


def hot_rows(train_ids, rows, k):
    """Return the ``k`` rows the training ids touch most (ties by id), int64."""
    if not k:
        return np.zeros(0, np.int64)
    counts = np.bincount(np.asarray(train_ids).ravel(), minlength=rows)
    return np.sort(np.argsort(-counts, kind="stable")[:k]).astype(np.int64)


def train_ctr(cfg, comm, run_dir=""):
    """Train ``cfg``'s ctr model on ``comm``; return the report on the reporting rank, ``{"role": ...}`` elsewhere.

    Parameters
    ----------
    cfg : training.settings.config.Config
        ``model == "ctr"``.
    comm : MPI.Comm
    run_dir : str
        Run directory (the servers' and the ranks' checkpoints go to ``run_dir/ps``,
        :mod:`training.ctr.resume`); "" for none. With ``cfg.resume`` the run continues from them.

    Returns
    -------
    dict
        On the reporter (rank 0 in ``dp``, the first worker otherwise): the summary, plus ``table`` (shape
        (ctr_rows, ctr_dim)) and ``dense`` (the MLP's flat parameters) as arrays.

    Raises
    ------
    ValueError
        A configuration the job cannot run, an id out of range, or checkpoints to resume from that are
        missing or of different generations (every rank alike, before any message but the ranks'
        agreement on the free memory).
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    S, W = check_ctr_job(cfg, size)
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_ranks = local.Get_size()
    local.Free()
    per_rank = comm.allreduce(available_bytes() / local_ranks, op=MPI.MIN)  # the tightest node: every rank alike
    check_memory(cfg, size, 1, per_rank)
    data = make_ctr_data(cfg)
    check_ids(data.train_ids, cfg.ctr_rows)
    check_ids(data.test_ids, cfg.ctr_rows)
    model = CTRModel(cfg.ctr_tables, cfg.ctr_dim, cfg.ctr_bag, cfg.hidden, cfg.activation, cfg.dtype, cfg.seed)
    table0 = init_table(cfg.ctr_rows, cfg.ctr_dim, cfg.dtype, cfg.seed)
    per_epoch = cfg.ctr_train // cfg.batch_size
    total = per_epoch * cfg.epochs
    stop = per_epoch * min(cfg.epochs, cfg.stop_after or cfg.epochs)
    rows = _row_layout(cfg, data, model, table0, S) if S else None  # (table and dense rows, their sharding)
    layout = rows[1].fingerprint() if rows else None
    clocks = resume_clock(cfg, run_dir, S, W, layout) if run_dir else None  # every rank, before any message
    if S == 0:
        start = clocks[rank] if clocks else 0
        table, dense, rec = dp_loop(cfg, comm, data, model, table0,
                                    (start, stop, total, os.path.join(run_dir, "ps") if run_dir else ""))
        wall = rec["wall_s"]
        out = np.array([rec["bytes_sent"], rec["loss"], rec["steps"]], np.float64)
        comm.Allreduce(MPI.IN_PLACE, out, op=MPI.SUM)
        if rank != 0:
            return {"role": "worker"}
        steps = rec["steps"]
        extra = {"allreduce_bytes_per_step": out[0] / size / max(1, steps), "loss": out[1] / max(1, out[2])}
        return _report(cfg, data, model, table, dense, (size, S, W, steps, wall), extra, run_dir)
    return _train_ps(cfg, comm, data, model, rows, (S, W, total, stop), run_dir)


def _row_layout(cfg, data, model, table0, S):
    """Return the servers' initial rows (the tables, in ``ps`` the MLP's rows after them) and their sharding."""
    n_dense = 0 if cfg.mode == "hybrid" else dense_rows(model.mlp.size, cfg.ctr_dim)
    init = table0
    if n_dense:
        pad = np.zeros(n_dense * cfg.ctr_dim, table0.dtype)
        pad[:model.mlp.size] = model.mlp.params
        init = np.concatenate([table0, pad.reshape(n_dense, cfg.ctr_dim)])
    return init, RowSharding(init.shape[0], cfg.ctr_dim, S, cfg.ctr_sharding,
                             hot_rows(data.train_ids, cfg.ctr_rows, cfg.ctr_hot))


def _train_ps(cfg, comm, data, model, rows, counts, run_dir):
    S, W, total, stop = counts
    rank, hybrid = comm.Get_rank(), cfg.mode == "hybrid"
    servers, workers = roles(comm, S)
    init, sharding = rows
    ckpt = os.path.join(run_dir, "ps") if run_dir else ""
    opts = PSOptions(servers=S, consistency=cfg.consistency, staleness=cfg.staleness, budget=W * stop, lr=cfg.lr,
                     lr_at=lr_rule(cfg.lr_schedule, cfg.lr), horizon=W * total, ps_timeout=cfg.ps_timeout,
                     worker_batch=cfg.batch_size // W, checkpoint_dir=ckpt,
                     checkpoint_every_pushes=W * (cfg.ctr_train // cfg.batch_size) * cfg.checkpoint_every,
                     resume_dir=ckpt if cfg.resume and newest_generation(ckpt, S) else "",
                     seed=cfg.seed, retries=cfg.ps_retries)
    opts.validate(comm.Get_size())
    pscomm, endcomm = comm.Dup(), comm.Dup()
    wcomm = comm.Split(1 if rank in workers else 0, rank)
    try:
        pscomm.Barrier()
        t0 = time.monotonic()
        if rank < S:
            server = SparseServer(pscomm, rank, workers, sharding.shard(init, rank), init.size, opts,
                                  make_sparse_optimizer(cfg), layout=sharding.fingerprint())
            server.serve(t0)
            stats = np.array([server.served_pieces, server.served_bytes, server.version], np.float64)
            endcomm.Send(stats, dest=workers[0], tag=_TAG)
            endcomm.Send(server.rows_table, dest=workers[0], tag=_TAG + 1)
            return {"role": "server"}
        w = workers.index(rank)
        rec = ps_loop(cfg, (pscomm, wcomm, servers, workers), w, model, data, sharding,
                      (stop, total, cfg.ps_timeout + 2.0, ckpt), hybrid)
        vec = np.array([rec["pull_bytes"], rec["push_bytes"], rec["allreduce_bytes"], rec["loss"], rec["steps"],
                        rec["wall_s"]], np.float64)
        wcomm.Allreduce(MPI.IN_PLACE, vec, op=MPI.SUM)
        if w != 0:
            return {"role": "worker"}
        stats, shards = np.empty((S, 3)), []
        for s in range(S):
            endcomm.Recv(stats[s], source=s, tag=_TAG)
            shards.append(np.empty((int(sharding.sizes[s]), sharding.width), init.dtype))
            endcomm.Recv(shards[s], source=s, tag=_TAG + 1)
        full = sharding.assemble(shards)
        table = full[:cfg.ctr_rows]
        dense = model.mlp.params.copy() if hybrid else full[cfg.ctr_rows:].reshape(-1)[:model.mlp.size].copy()
        steps = int(rec["steps"])
        per = max(1, steps)
        rows_per_step = stats[:, 0] / sharding.split / per
        extra = {"pull_bytes_per_step": vec[0] / W / per, "push_bytes_per_step": vec[1] / W / per,
                 "allreduce_bytes_per_step": vec[2] / W / per, "loss": vec[3] / max(1, vec[4]),
                 "server_rows_per_step": rows_per_step.tolist(), "server_bytes_per_step": (stats[:, 1] / per).tolist(),
                 "load_max_over_mean": float(rows_per_step.max() / max(rows_per_step.mean(), 1e-12)),
                 "sharding": cfg.ctr_sharding, "hot_rows": cfg.ctr_hot, "consistency": cfg.consistency}
        return _report(cfg, data, model, table, dense, (comm.Get_size(), S, W, steps, vec[5] / W), extra, run_dir)
    finally:
        wcomm.Free()
        pscomm.Free()
        endcomm.Free()


def _report(cfg, data, model, table, dense, shape, extra, run_dir):
    """Evaluate on the test set, print one line, write ``summary.json``; return the summary with the arrays."""
    P, S, W, steps, wall = shape
    model.mlp.params[...] = dense
    auc, logloss = auc_logloss(data.test_y, model.predict(table, data.test_ids))
    samples = steps * cfg.batch_size
    summary = {"model": "ctr", "mode": cfg.mode, "P": P, "servers": S, "workers": W, "rows": cfg.ctr_rows,
               "steps": steps, "samples": samples, "wall_s": wall, "samples_per_s": samples / wall if wall else 0.0,
               "test_auc": auc, "test_logloss": logloss, "best_auc": data.best_auc,
               "best_logloss": data.best_logloss, "optimizer": cfg.optimizer, "batch_size": cfg.batch_size, **extra}
    if run_dir:
        with open(os.path.join(run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
    print(f"ctr --mode {cfg.mode}: test AUC {auc:.4f} (planted truth {data.best_auc:.4f}), log loss {logloss:.4f} "
          f"after {samples} samples | {summary['samples_per_s']:.0f} samples/s" + (f" | {run_dir}" if run_dir else ""),
          flush=True)
    return dict(summary, table=table, dense=np.array(dense, copy=True))


def run_ctr(cfg, comm, make_run_dir, write_config):
    """Run a ``--model ctr`` job from the trainer: the run directory and its ``config.json``, then :func:`train_ctr`.

    ``make_run_dir(cfg, comm)`` and ``write_config(cfg, comm, run_dir)`` are the trainer's own.
    """
    check_ctr_job(cfg, comm.Get_size())  # before the run directory exists
    run_dir = make_run_dir(cfg, comm)
    write_config(cfg, comm, run_dir)
    out = train_ctr(cfg, comm, run_dir)
    return {k: v for k, v in out.items() if k not in ("table", "dense")}
