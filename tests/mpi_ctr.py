"""Rank-side bodies of the ctr tests: ``python -m tests.mpi_ctr CASE`` (or ``all``), P = 4.

``sparse``  2 servers, 2 workers, BSP, SGD, through :class:`ps.sparse.SparseClient`: each worker pulls
            random distinct rows (some never pulled by anyone, one pull empty), checks the values against a
            dense NumPy table updated the same way [the oracle: the dense table stepped by the mean of the
            workers' scattered gradients per clock], pushes a known gradient; the servers' final tables
            equal the oracle's. Bad ids (negative, out of range, repeated) raise ValueError before any message.
``modes``   ``dp`` (P = 4), ``ps`` (2 + 2), ``hybrid`` (2 + 2; hash, range, and hash with hot rows split)
            with SGD and Adagrad under BSP in float64 [one process, ``dp`` on COMM_SELF: within 1e-12].
"""
import sys

import numpy as np
from mpi4py import MPI

from ps.options import PSOptions
from ps.rows import RowSharding
from ps.sparse import SparseClient, SparseServer
from tests.mpicases import check, report
from training.config import Config
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
        shards = comm.gather(server.rows_table, root=0)
    else:
        w = RANK - S
        client = SparseClient(comm, w, [0, 1], [2, 3], sharding, np.float64, 20.0)
        for bad in (np.array([-1, 3]), np.array([3, 40]), np.array([3, 3])):
            try:
                client.pull_rows(0, bad)
                check(False, f"pull_rows({bad.tolist()}) was accepted")
            except ValueError:
                pass
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
        from ps.protocol import Msg
        client.finish(Msg.DONE)
        shards = comm.gather(None, root=0)
    if RANK == 0:
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


CASES = {"sparse": case_sparse, "modes": case_modes}

if __name__ == "__main__":
    for name in (CASES if sys.argv[1] == "all" else [sys.argv[1]]):
        CASES[name]()
    sys.exit(report(COMM, f"mpi_ctr {sys.argv[1]}"))
