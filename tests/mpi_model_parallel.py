"""Rank-side body of the model-parallel tests: ``python -m tests.mpi_model_parallel DIR [CASE...]``.

Cases (every rank runs them in order; DIR is a scratch directory shared by the ranks):

gradcheck    a column-parallel, tanh, row-parallel block over all P ranks (uneven widths): forward
             equals NumPy's dense forward; every parameter-shard gradient and the input gradient
             equal central finite differences of the dense loss (float64, rtol 1e-6).
equivalence  for every grid (T, Q, micro-batches, schedule) of ``GRIDS[P]``, 20 float64 SGD steps
             on the grid end with the parameters of one process with the same global batch (the
             oracle: the data-parallel trainer on COMM_SELF), within rtol 1e-12; data-parallel
             replicas and tensor-replicated parameters stay bitwise identical, also with top-k
             compression (P >= 4).
schedules    GPipe and 1F1B give bitwise the same parameters; the activation memory each stage
             holds is m buffers' worth for GPipe and min(Q - s, m) for 1F1B, measured.
memory       parameters + optimizer state per rank fall as 1 / (T Q) (a layer-balanced MLP).
resume       stop after epoch 1 and resume: on the same grid bitwise equal to an uninterrupted
             run (also with top-k compression, whose per-rank error feedback is checkpointed); on
             another grid (re-sharded on load) and from a data-parallel checkpoint within rtol 1e-12;
             a grid's shards resumed by the data-parallel driver (one whole model per rank), whose
             checkpoint, the newest, the grid then resumes: within rtol 1e-12 of the grid's run.
errors       a grid that does not divide P, a width smaller than T, more stages than layers and
             micro-batches that do not divide the local batch raise ValueError on every rank,
             before any message.
"""
import json
import os
import shutil
import sys

import numpy as np
from mpi4py import MPI

from training.runtime.checkpoint import load_checkpoint
from training.settings.config import Config
from training.model_parallel.grid import Grid, build_stage
from training.model_parallel.grid_train import build_hybrid, run_hybrid
from training.model.optim import make_optimizer
from training.model_parallel.layers import ColumnParallelLinear, RowParallelLinear, shard_bounds
from training.model.nn import Tanh
from training.model_parallel.sharded import dense_params, find_sharded
from training.train import lr_at, run
from tests.mpicases import quiet, run_cases, shared_dir

RTOL, ATOL = 1e-12, 1e-13  # as tests/mpi_training.py: summation order differs by a few ulp per step
# 750 samples -> 600 train: 9 global batches of 64 and one of 24 per epoch: 2 epochs = 20 steps.
SMALL = dict(data="synthetic", samples=750, features=12, classes=5, hidden=(10, 7, 9, 6), dtype="float64",
             optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=1e-3, batch_size=64, epochs=2, seed=3,
             progress=False, checkpoint_every=0)
SIZES = [12, 10, 7, 9, 6, 5]
# (T, Q, micro-batches, schedule) per P; D = P / (T Q)
GRIDS = {1: [(1, 1, 4, "1f1b")],
         2: [(2, 1, 1, "1f1b"), (1, 2, 2, "gpipe"), (1, 1, 2, "1f1b")],
         4: [(2, 2, 4, "1f1b"), (4, 1, 2, "gpipe"), (1, 4, 4, "1f1b"), (2, 1, 1, "1f1b"), (1, 2, 2, "gpipe"),
             (1, 1, 2, "gpipe")],
         8: [(2, 2, 2, "1f1b"), (4, 2, 2, "gpipe"), (1, 4, 2, "1f1b"), (2, 1, 1, "1f1b")]}
# D = 4 tensor pairs with top-k: each tensor rank compresses its own flat gradient, so the
# replicated parameters stay identical only through the tensor-group broadcast of their gradient.
COMPRESSED = dict(compression="topk", compression_args={"ratio": 0.3})


def _oracle(root, cfg):
    """Rank 0 only: the data-parallel trainer on one process; returns its final parameters."""
    quiet(run, cfg.replace(run_dir=root, name="p1", tensor_parallel=1, pipeline_parallel=1, micro_batches=1),
           MPI.COMM_SELF)
    return load_checkpoint(os.path.join(root, "p1"), MPI.COMM_SELF)[1]["model/params"]


def _hybrid(comm, root, name, **kw):
    cfg = Config(**{**SMALL, **kw, "run_dir": root, "name": name})
    summary = quiet(run_hybrid, cfg, comm, lr_at)
    return summary, (dense_params(find_sharded(os.path.join(root, name)), SIZES) if comm.rank == 0 else None)


def case_gradcheck(comm, base):
    P, rng = comm.size, np.random.default_rng(7)
    n_in, width, n_out, B = 6, 2 * P + 3, 4, 5
    W1, b1 = rng.standard_normal((n_in, width)), rng.standard_normal(width)
    W2, b2 = rng.standard_normal((width, n_out)), rng.standard_normal(n_out)
    x, R = rng.standard_normal((B, n_in)), rng.standard_normal((B, n_out))
    col = ColumnParallelLinear.from_dense(W1, b1, comm, algorithm="ring")
    row = RowParallelLinear.from_dense(W2, b2, comm, algorithm="recursive_doubling")
    act = Tanh()

    def loss(inp):
        return float((row.forward(act.forward(col.forward(inp))) * R).sum())

    dense = (np.tanh(x @ W1 + b1) @ W2 + b2)
    got = row.forward(act.forward(col.forward(x))).copy()
    assert np.allclose(got, dense, rtol=1e-12, atol=1e-12), f"forward differs by {np.abs(got - dense).max():.2e}"
    dx = col.backward(act.backward(row.backward(R.copy()))).copy()
    grads = [col.dW.copy(), col.db.copy(), row.dW.copy(), row.db.copy()]
    eps, bad = 1e-6, []
    for name, param, grad, shared in (("W1", col.W, grads[0], False), ("b1", col.b, grads[1], False),
                                      ("W2", row.W, grads[2], False), ("b2", row.b, grads[3], True)):
        for owner in ([None] if shared else range(P)):
            shape = param.shape if owner is None else _shard_shape(name, owner, P, n_in, width, n_out)
            for idx in np.ndindex(*shape):
                mine = owner is None or owner == comm.rank
                fd = []
                for sign in (1, -1):
                    if mine:
                        param[idx] += sign * eps
                    fd.append(loss(x))
                    if mine:
                        param[idx] -= sign * eps
                if mine and not np.isclose((fd[0] - fd[1]) / (2 * eps), grad[idx], rtol=1e-6, atol=1e-8):
                    bad.append(f"{name}{idx} on rank {comm.rank}: {grad[idx]:.8g} vs fd {(fd[0] - fd[1]) / (2 * eps):.8g}")
    for idx in np.ndindex(*x.shape):
        fd = []
        for sign in (1, -1):
            xp = x.copy()
            xp[idx] += sign * eps
            fd.append(loss(xp))
        if not np.isclose((fd[0] - fd[1]) / (2 * eps), dx[idx], rtol=1e-6, atol=1e-8):
            bad.append(f"dx{idx}: {dx[idx]:.8g} vs fd {(fd[0] - fd[1]) / (2 * eps):.8g}")
    assert not bad, "; ".join(bad[:5])


def _shard_shape(name, owner, P, n_in, width, n_out):
    lo, hi = shard_bounds(width, P, owner)
    return {"W1": (n_in, hi - lo), "b1": (hi - lo,), "W2": (hi - lo, n_out)}[name]


def case_equivalence(comm, base):
    root = shared_dir(comm, base, "equiv")
    cfg = Config(**SMALL)
    ref = _oracle(root, cfg) if comm.rank == 0 else None
    errors = []
    for T, Q, M, sched in GRIDS[comm.size]:
        name = f"t{T}q{Q}m{M}{sched}"
        s, got = _hybrid(comm, root, name, tensor_parallel=T, pipeline_parallel=Q, micro_batches=M, schedule=sched)
        if s["steps"] != 20:
            errors.append(f"{name}: {s['steps']} steps, expected 20")
        if not s["replicas_identical"]:
            errors.append(f"{name}: data-parallel replicas or tensor-replicated copies differ")
        if comm.rank == 0:
            diff = float(np.abs(got - ref).max() / np.abs(ref).max())
            print(f"equivalence D={comm.size // (T * Q)} T={T} Q={Q} m={M} {sched}: max relative |w - w_P1| = "
                  f"{diff:.1e}", flush=True)
            if not np.allclose(got, ref, rtol=RTOL, atol=ATOL):
                errors.append(f"{name}: parameters differ from one process by up to {diff:.3e}")
    if comm.size >= 4:
        s, _ = _hybrid(comm, root, "topk", tensor_parallel=2, **COMPRESSED)
        if not s["replicas_identical"]:
            errors.append("top-k with T=2: tensor-replicated parameters differ across the tensor group")
    assert not errors, "; ".join(errors)


def case_schedules(comm, base):
    root = shared_dir(comm, base, "sched")
    kw = dict(samples=800, pipeline_parallel=comm.size, micro_batches=8, epochs=1)  # 640 train: full batches
    g, a = _hybrid(comm, root, "gpipe", schedule="gpipe", **kw)
    f, b = _hybrid(comm, root, "1f1b", schedule="1f1b", **kw)
    if comm.rank == 0:
        assert np.array_equal(a, b), "GPipe and 1F1B parameters differ"
        Q, m = comm.size, 8
        for s in range(Q):
            ratio = g["activation_bytes_per_stage"][s] / f["activation_bytes_per_stage"][s]
            print(f"stage {s}: activation bytes GPipe {g['activation_bytes_per_stage'][s]}, 1F1B "
                  f"{f['activation_bytes_per_stage'][s]} (ratio {ratio:.2f}, expected {m / min(Q - s, m):.2f}); "
                  f"bubble measured GPipe {g['bubble_per_stage'][s]:.2f}, 1F1B {f['bubble_per_stage'][s]:.2f}, "
                  f"formula {g['bubble_formula']:.2f}", flush=True)
            assert abs(ratio - m / min(Q - s, m)) < 1e-9, f"stage {s}: activation ratio {ratio}"


def case_memory(comm, base):
    sizes = [32, 32, 32, 32, 32, 5]
    total = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
    for T, Q in [(t, q) for t in (1, 2, 4) for q in (1, 2, 4) if comm.size % (t * q) == 0]:
        grid = Grid(comm, T, Q)
        model, _ = build_stage(sizes, grid, dtype="float64")
        opt = make_optimizer(Config(optimizer="adam"), model)
        held = model.params.nbytes + sum(v.nbytes for v in opt.state_dict().values())
        most = comm.allreduce(held, op=MPI.MAX)
        ideal = 3 * 8 * total / (T * Q)  # parameters, Adam m and v, float64
        if comm.rank == 0:
            print(f"memory T={T} Q={Q}: max {most} bytes per rank, ideal {ideal:.0f} ({most / ideal:.3f}x)", flush=True)
        assert most <= 1.2 * ideal + 64, f"T={T} Q={Q}: {most} bytes per rank, ideal {ideal:.0f}"
        grid.free()


def case_resume(comm, base):
    root = shared_dir(comm, base, "resume")
    P = comm.size
    A = dict(tensor_parallel=2 if P % 2 == 0 else 1, pipeline_parallel=2 if P % 4 == 0 else 1, micro_batches=2)
    B = dict(tensor_parallel=1, pipeline_parallel=P, micro_batches=4)
    _, full = _hybrid(comm, root, "full", **A)
    _hybrid(comm, root, "same", stop_after=1, **A)
    _, same = _hybrid(comm, root, "same", resume=os.path.join(root, "same"), **A)
    _hybrid(comm, root, "other", stop_after=1, **A)
    _, other = _hybrid(comm, root, "other", resume=os.path.join(root, "other"), **B)
    dp = Config(**SMALL, run_dir=root, name="dp", stop_after=1)
    quiet(run, dp, comm)
    _, from_dp = _hybrid(comm, root, "dp", resume=os.path.join(root, "dp"), **A)
    quiet(run, dp.replace(name="dpfull", stop_after=0), comm)
    C = dict(tensor_parallel=P // 2, compression="topk", compression_args={"ratio": 0.3})  # D = 2
    _, cfull = _hybrid(comm, root, "cfull", **C)
    _hybrid(comm, root, "cstop", stop_after=1, **C)
    _, cres = _hybrid(comm, root, "cstop", resume=os.path.join(root, "cstop"), **C)
    # the grid's shards resumed by the data-parallel driver (TP = 1, one whole model per rank) to epoch 2,
    # then that run's checkpoint (the newer kind now) by the grid again to epoch 3
    _, full3 = _hybrid(comm, root, "full3", epochs=3, **A)
    _hybrid(comm, root, "mix", epochs=3, stop_after=1, **A)
    mix = os.path.join(root, "mix")
    quiet(run, Config(**{**SMALL, "epochs": 3, "stop_after": 2}, run_dir=root, name="mix", resume=mix), comm)
    dp_mid = load_checkpoint(os.path.join(mix, "ckpt-epoch0002.npz"), comm)[1]
    summary, mixed = _hybrid(comm, root, "mix", epochs=3, resume=mix, **A)
    if comm.rank == 0:
        with open(os.path.join(mix, "config.json"), encoding="utf-8") as f:
            resumes = [r["resumed_from"] for r in json.load(f)["resumes"]]
        assert [os.path.basename(r) for r in resumes] == ["shards-epoch0001", "ckpt-epoch0002.npz"], resumes
        assert int(dp_mid["train/epoch"]) == 2 and summary["epochs"] == 3, (int(dp_mid["train/epoch"]), summary)
        assert np.allclose(mixed, full3, rtol=RTOL, atol=ATOL), \
            f"grid -> data-parallel -> grid resume differs by {np.abs(mixed - full3).max():.2e}"
    if comm.rank == 0:
        assert np.array_equal(cres, cfull), f"resume with error feedback differs by {np.abs(cres - cfull).max():.2e}"
        dp_full = load_checkpoint(os.path.join(root, "dpfull"), MPI.COMM_SELF)[1]["model/params"]
        assert np.array_equal(same, full), f"same-grid resume differs by {np.abs(same - full).max():.2e}"
        assert np.allclose(other, full, rtol=RTOL, atol=ATOL), f"re-sharded resume differs by {np.abs(other - full).max():.2e}"
        assert np.allclose(from_dp, dp_full, rtol=RTOL, atol=ATOL), \
            f"resume from a data-parallel checkpoint differs by {np.abs(from_dp - dp_full).max():.2e}"
        print(f"resume: same grid bitwise; re-sharded {A} -> {B} max |diff| {np.abs(other - full).max():.1e}; "
              f"from data-parallel {np.abs(from_dp - dp_full).max():.1e}", flush=True)


def case_errors(comm, base):
    P = comm.size
    bad = [(dict(tensor_parallel=P + 1), "does not divide"),
           (dict(tensor_parallel=P, hidden=(P - 1 or 1, 8)), "fewer than the tensor group"),
           (dict(pipeline_parallel=P, hidden=()), "stages for 1 linear layers"),
           (dict(micro_batches=3), "does not divide the local batch")]
    for kw, words in bad:
        if P == 1 and ("hidden" in kw or "pipeline_parallel" in kw):
            continue
        try:
            build_hybrid(Config(**{**SMALL, **kw}), comm)
        except ValueError as e:
            assert words in str(e), f"{kw}: unexpected message {e}"
        else:
            raise AssertionError(f"{kw}: no error")


CASES = [case_gradcheck, case_equivalence, case_schedules, case_memory, case_resume, case_errors]


def main():
    comm = MPI.COMM_WORLD
    base = sys.argv[1]
    chosen = [c for c in CASES if len(sys.argv) < 3 or c.__name__[5:] in sys.argv[2:]]
    failed = run_cases(comm, chosen, base)
    if comm.rank == 0 and not failed:
        for d in ("equiv", "sched", "resume"):
            shutil.rmtree(os.path.join(base, d), ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
