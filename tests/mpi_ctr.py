"""Rank-side bodies of the ctr tests: ``python -m tests.mpi_ctr CASE`` (or ``all``), P = 4.

``sparse``  2 servers, 2 workers, BSP, SGD, through :class:`ps.embedding.sparse_push_pull.SparseClient`: each worker pulls
            random distinct rows (some never pulled by anyone, one pull empty), checks the values against a
            dense NumPy table updated the same way [the oracle: the dense table stepped by the mean of the
            workers' scattered gradients per clock], pushes a known gradient; the servers' final tables
            equal the oracle's. Bad ids (negative, out of range, repeated) raise ValueError before any message.
``modes``   ``dp`` (P = 4), ``ps`` (2 + 2), ``hybrid`` (2 + 2; hash, range, and hash with hot rows split)
            with SGD and Adagrad under BSP in float64 [one process, ``dp`` on COMM_SELF: within 1e-12].
``async``   ``ps`` and ``hybrid`` under ASP and SSP (staleness 1): with 3 servers and one worker [one process,
            within 1e-12]; with 2 + 2 every clock runs, rows no sample touches keep their initial values.
``resume``  (``python -m tests.mpi_ctr resume DIR``) ``hybrid`` (top-k with error feedback on the MLP), ``ps``
            and ``dp`` (top-k), ``hybrid`` range-sharded and ``ps`` hash-sharded with hot rows split, stopped
            after epoch 1 of 2 and resumed [the uninterrupted run: bitwise]; a resume with another
            --ctr-sharding or --ctr-hot, or whose worker checkpoint is gone, is a ValueError on every rank
            naming the setting or the file.
"""
import os
import sys

import numpy as np
from mpi4py import MPI

from ps.job.settings import PSOptions
from ps.wire.messages import Msg
from ps.shards.rows import RowSharding
from ps.embedding.sparse_push_pull import SparseClient, SparseServer
from tests.mpicases import check, report, shared_dir
from training.settings.config import Config
from training.ctr.data import make_ctr_data
from training.ctr.model import init_table
from training.ctr.resume import rank_checkpoint_path
from training.ctr.run import train_ctr
from training.ctr.sparse_optim import SparseSGD

COMM = MPI.COMM_WORLD
RANK = COMM.Get_rank()


def _grad(w, clock, rows):
    rng = np.random.default_rng([w, clock])
    return rng.standard_normal((rows.size, 4))


def _rows(w, clock):
    rng = np.random.default_rng([w, clock, 1])
    if clock == 2 and w == 1:
        return np.zeros(0, np.int64)  # an empty pull
    return np.sort(rng.choice(30, size=6, replace=False)).astype(np.int64)  # rows 30 .. 39 are never pulled


def case_sparse():
    n, dim, S, clocks, lr = 40, 4, 2, 4, 0.1
    init = np.random.default_rng(5).standard_normal((n, dim))
    sharding = RowSharding(n, dim, S, "hash", hot=[0, 1, 2])
    oracle = init.copy()
    comm = COMM.Dup()
    opts = PSOptions(servers=S, consistency="bsp", budget=2 * clocks, lr=lr, ps_timeout=20.0)
    if RANK < S:
        server = SparseServer(comm, RANK, [2, 3], sharding.shard(init, RANK), init.size, opts,
                              lambda table: SparseSGD(table, lr))
        server.serve()
        shards = comm.gather(server.rows_table, root=S)  # to the first worker, which holds the oracle
    else:
        w = RANK - S
        client = SparseClient(comm, w, [0, 1], [2, 3], sharding, np.float64, 20.0)
        for bad in (np.array([-1, 3]), np.array([3, 40]), np.array([3, 3])):
            try:
                client.pull_rows(0, bad)
                check(False, f"pull_rows({bad.tolist()}) was accepted")
            except ValueError:
                pass
        check(client._rid == 0 and not client._pushes, "a refused pull_rows sent a message")
        clock, _ = client.join_rows()
        for c in range(clock, clocks):
            rows = _rows(w, c)
            status, values = client.pull_rows(c, rows)
            check(status == "params" and np.array_equal(values, oracle[rows]), f"worker {w} clock {c}: pulled rows")
            client.push_rows(c, _grad(w, c, rows))
            mean = np.zeros_like(oracle)
            for v in (0, 1):
                r = _rows(v, c)
                mean[r] += _grad(v, c, r)
            oracle -= (mean / 2) * lr
        client.finish(Msg.DONE)
        shards = comm.gather(None, root=S)
    if RANK == S:
        got = sharding.assemble(shards[:S])
        check(np.allclose(got, oracle, rtol=0, atol=1e-13), f"sparse table off the dense oracle by "
              f"{np.abs(got - oracle).max():.3g}")
        check(np.array_equal(got[30:], init[30:]), "rows never pulled changed")
    comm.Free()


BASE = dict(model="ctr", dtype="float64", ctr_rows=300, ctr_tables=3, ctr_dim=4, ctr_bag=2, ctr_train=256,
            ctr_test=64, batch_size=32, epochs=1, hidden=(8,), lr=0.05, lr_schedule="constant", progress=False,
            servers=2, ps_timeout=30.0)


def case_modes():
    for opt in ("sgd", "adagrad"):
        base = Config(**BASE, optimizer=opt, momentum=0.0)
        ref = train_ctr(base.replace(mode="dp"), MPI.COMM_SELF)
        runs = [("dp", {}), ("ps", {}), ("hybrid", {}), ("hybrid", {"ctr_sharding": "range"}),
                ("hybrid", {"ctr_hot": 20}), ("ps", {"ctr_hot": 20, "ctr_sharding": "range"})]
        for mode, extra in runs:
            out = train_ctr(base.replace(mode=mode, **extra), COMM)
            if "table" in out:
                err = max(np.abs(out["table"] - ref["table"]).max(), np.abs(out["dense"] - ref["dense"]).max())
                check(err <= 1e-12, f"{opt} {mode} {extra}: off the one-process run by {err:.3g}")
                check(out["steps"] == ref["steps"] == 8, f"{opt} {mode}: {out['steps']} steps")


def case_async():
    touched = np.zeros(BASE["ctr_rows"], bool)
    for opt in ("sgd", "adagrad"):
        base = Config(**BASE, optimizer=opt, momentum=0.0)
        ref = train_ctr(base.replace(mode="dp"), MPI.COMM_SELF)
        touched[np.unique(make_ctr_data(base).train_ids)] = True  # one epoch: every training sample
        init = init_table(base.ctr_rows, base.ctr_dim, base.dtype, base.seed)
        for mode in ("ps", "hybrid"):
            for consistency, staleness in (("asp", 0), ("ssp", 1)):
                for servers in (3, 2):  # one worker: the rule is BSP's; two: pushes of other clocks interleave
                    cfg = base.replace(mode=mode, servers=servers, consistency=consistency, staleness=staleness)
                    out = train_ctr(cfg, COMM)
                    if "table" not in out:
                        continue
                    what = f"{opt} {mode} {consistency} with {4 - servers} worker(s)"
                    check(out["steps"] == 8 and out["consistency"] == consistency, f"{what}: {out['steps']} steps")
                    if servers == 3:
                        err = max(np.abs(out["table"] - ref["table"]).max(), np.abs(out["dense"] - ref["dense"]).max())
                        check(err <= 1e-12, f"{what}: off the one-process run by {err:.3g}")
                    else:
                        check(np.isfinite(out["dense"]).all() and np.isfinite(out["test_logloss"]), f"{what}: not finite")
                        check(np.array_equal(out["table"][~touched], init[~touched]), f"{what}: untouched rows moved")
                        check(not np.array_equal(out["table"][touched], init[touched]), f"{what}: nothing learned")


def case_resume(base_dir):
    runs = [("hybrid", dict(compression="topk", compression_args={"ratio": 0.3})), ("ps", {}),
            ("dp", dict(compression="topk", compression_args={"ratio": 0.3})),
            ("hybrid", dict(ctr_sharding="range", ctr_hot=6)), ("ps", dict(ctr_hot=6))]
    for k, (mode, extra) in enumerate(runs):
        cfg = Config(**BASE, optimizer="adagrad").replace(mode=mode, epochs=2, checkpoint_every=1, **extra)
        name = mode if k < 3 else f"{mode}{k}"
        full, part = (shared_dir(COMM, base_dir, f"{name}-{end}") for end in ("full", "part"))
        a = train_ctr(cfg, COMM, full)
        train_ctr(cfg.replace(stop_after=1), COMM, part)
        b = train_ctr(cfg.replace(resume=part), COMM, part)  # clocks 8 .. 15 from the checkpoints of clock 8
        if "table" in a:
            check(b["steps"] == 8, f"resumed {mode}: {b['steps']} steps, want 8")
            for key in ("table", "dense"):
                check(np.array_equal(a[key], b[key]), f"resumed {mode}: {key} off the uninterrupted run by "
                      f"{np.abs(a[key] - b[key]).max():.3g}")
    # a resume with the rows laid out otherwise is refused naming the setting, before any message
    for name, change, flag in (("ps", dict(ctr_sharding="range"), "--ctr-sharding"), ("ps4", dict(ctr_hot=0), "--ctr-hot"),
                               ("hybrid3", dict(ctr_hot=9), "--ctr-hot")):
        mode = name.rstrip("34")
        extra = dict(ctr_sharding="range", ctr_hot=6) if name == "hybrid3" else dict(ctr_hot=6) if name == "ps4" else {}
        cfg = Config(**BASE, optimizer="adagrad").replace(mode=mode, epochs=2, checkpoint_every=1, **extra)
        try:
            train_ctr(cfg.replace(resume="x", **change), COMM, os.path.join(base_dir, f"{name}-part"))
            check(False, f"{name}: a resume with {change} was accepted")
        except ValueError as e:
            check(flag in str(e) and "ps_server0.npz" in str(e), f"{name} resumed with {change}: {e}")
    worker = rank_checkpoint_path(os.path.join(base_dir, "hybrid-part", "ps"), 2, 16)
    check(os.path.exists(worker), f"no {worker}")
    COMM.Barrier()
    if RANK == 0:
        os.remove(worker)
    COMM.Barrier()
    try:
        cfg = Config(**BASE, optimizer="adagrad").replace(mode="hybrid", epochs=2, checkpoint_every=1, **runs[0][1])
        train_ctr(cfg.replace(resume="x"), COMM, os.path.join(base_dir, "hybrid-part"))
        check(False, "a resume without a worker's checkpoint was accepted")
    except ValueError as e:
        check("is missing" in str(e), f"resume without a worker's checkpoint: {e}")


CASES = {"sparse": case_sparse, "modes": case_modes, "async": case_async, "resume": case_resume}

if __name__ == "__main__":
    for name in (CASES if sys.argv[1] == "all" else [sys.argv[1]]):
        CASES[name](*([sys.argv[2]] if name == "resume" else []))
    sys.exit(report(COMM, f"mpi_ctr {sys.argv[1]}"))
