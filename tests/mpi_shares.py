"""Rank-side body of the batch-share tests: ``python -m tests.mpi_shares DIR [CASE...]`` (any P).

Cases (run in order by every rank; DIR is a scratch directory shared by the ranks):

every_step    the parameters after every step, with uneven shares that change every step (drawn
              from a seeded generator, the same on every rank, as --balance would re-split) and an
              epoch's shorter last batch, equal those of one process applying the same optimizer
              (SGD with momentum and weight decay, float64) to the mean gradient of the same global
              batches (rank 0 over COMM_SELF), for the fused, the bucketed and the overlapped
              all-reduce. Tolerance rtol 1e-12, atol 1e-13: the weighted average sums P weighted
              means in another order than one mean of B samples (a few ulp per step); a mean over
              ranks instead of over samples differs by ~1e-3.
balance       --balance --balance-every 2 with rank 1 measuring 4x the others' seconds per sample
              (the measurement replaced, the host being loaded): at the first gather the shares
              become ps.shards.key_ranges.proportional's split of B by speed and stay, the final parameters
              equal one process's run of the same configuration (same global batches), tolerance as
              above, and replicas stay identical; --resume from the epoch-1 checkpoint continues
              with its shares. Then with the host's own timing and --straggler 1:4 (shares
              whatever the load makes them): the final parameters still equal one process's.
resume_compressed  --balance with top-k compression and error feedback, rank 1 measuring 2x: the shares
              move, and a run stopped after epoch 1 and resumed ends bitwise equal to the uninterrupted
              one (the shares and the error feedback from the checkpoint).
no_straggler  --balance, ranks measuring equal speeds within 1 % (below --balance-gain 0.05): no
              re-split, and the run ends bitwise equal to the run without --balance.
defaults      every default (digits, global batch 64, Adam, float32), 2 epochs: the final parameters
              equal one process's (rtol 1e-4, atol 1e-6: float32 sums in another order, ~1e-6
              relative after 46 Adam steps; a wrong weight differs by ~1e-2).
ps            --mode ps BSP (plain SGD, float64, 1 server or 2 when P >= 5: W = P - S workers, a
              global batch W does not divide) ends with one process's data-parallel weights on
              the same global batches (rtol 1e-9, atol 1e-12: the servers average W pushes).
"""
import contextlib
import os
import shutil
import sys

import numpy as np
from mpi4py import MPI

from ps.shards.key_ranges import proportional
from training.runtime.build import build_model, make_sampler, to_device
from training.runtime.checkpoint import load_checkpoint
from training.settings.cli import parse_args
from training.settings.config import Config
from training.data.datasets import load_dataset
from training.dp.data_parallel import compute_gradient, train_step
from training.dp.hooks import make_grad_hook
from training.dp.shares import BatchShares
from training.model.nn import SoftmaxCrossEntropy
from training.model.optim import make_optimizer
from training.data.sampling import deal
from training.train import run
from tests.mpicases import quiet, run_cases, shared_dir

RTOL, ATOL = 1e-12, 1e-13

# 750 samples -> 600 train; global batch 61 (no P of 2..7 divides it): 9 batches of 61, one of 51.
SMALL = dict(data="synthetic", samples=750, features=12, classes=5, hidden=(16,), dtype="float64",
             optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=1e-3, batch_size=61, epochs=2,
             seed=3, progress=False, checkpoint_every=0)


def _final(run_dir, comm):
    _, arrays = load_checkpoint(run_dir, comm)
    return arrays["model/params"], arrays


def _random_shares(rng, m, P):
    """Uneven shares of m samples over P ranks, each >= 1 (the same draw on every rank)."""
    cuts = np.sort(rng.choice(np.arange(1, m), P - 1, replace=False)) if P > 1 else np.array([], int)
    return np.diff(np.concatenate([[0], cuts, [m]])).astype(np.int64)


def case_every_step(comm, base):
    P = comm.size
    for extra in (dict(), dict(bucket_bytes=256), dict(bucket_bytes=256, overlap=True)):
        cfg = Config(**SMALL, **extra)
        ds = load_dataset(cfg)
        x, y, _, _ = to_device(ds, "float64")
        model = build_model(cfg, ds.n_features, ds.n_classes)
        opt, loss_fn, hook = make_optimizer(cfg, model), SoftmaxCrossEntropy(), make_grad_hook(cfg, comm, model)
        ref = opt_ref = None
        if comm.rank == 0:
            ref = build_model(cfg, ds.n_features, ds.n_classes)
            opt_ref = make_optimizer(cfg, ref)
        sampler = make_sampler(cfg, len(y), comm.rank, P)
        rng = np.random.default_rng(7)
        worst = 0.0
        for k, batch in enumerate(sampler.global_batches(0, cfg.batch_size)):  # 10 steps, the last of 51
            shares = _random_shares(rng, len(batch), P)
            mine = deal(batch, shares)[comm.rank]
            r = train_step(model, loss_fn, opt, hook, comm, x[mine], y[mine],
                           scale=P * int(shares[comm.rank]) / len(batch))
            assert not r["skipped"]
            if comm.rank == 0:
                compute_gradient(ref, SoftmaxCrossEntropy(), x[batch], y[batch])  # the mean over the batch
                opt_ref.step()
                worst = max(worst, float(np.abs(model.params - ref.params).max()))
                assert np.allclose(model.params, ref.params, rtol=RTOL, atol=ATOL), \
                    f"{extra}: step {k} (shares {shares.tolist()}) differs from one process by " \
                    f"{np.abs(model.params - ref.params).max():.3e}"
        hook.close() if hasattr(hook, "close") else None
        if comm.rank == 0:
            print(f"every_step {extra}: largest |difference| {worst:.2e} over 10 steps", flush=True)


def _one_process(cfg, comm, root, name):
    """Rank 0 runs ``cfg`` alone (COMM_SELF) into root/name; every rank gets the final parameters."""
    params = None
    if comm.rank == 0:
        quiet(run, cfg.replace(run_dir=root, name=name), MPI.COMM_SELF)
        params = _final(os.path.join(root, name), MPI.COMM_SELF)[0]
    return comm.bcast(params, root=0)


@contextlib.contextmanager
def _measured(slow):
    """Make every rank measure ``slow[rank]`` ms per sample (the host's timing is noise on a loaded machine)."""
    real = BatchShares.observe
    rank = MPI.COMM_WORLD.rank
    BatchShares.observe = lambda self, seconds, samples: real(self, 1e-3 * slow[rank] * samples, samples)
    try:
        yield
    finally:
        BatchShares.observe = real


def case_balance(comm, base):
    root = shared_dir(comm, base, "balance")
    cfg = Config(**{**SMALL, "checkpoint_every": 1}, balance=True, balance_every=2, straggler="1:4")
    want = _one_process(cfg.replace(balance=False, straggler=""), comm, root, "p1")
    slow = [4.0 if r == 1 else 1.0 for r in range(comm.size)]
    with _measured(slow):  # rank 1 four times slower, as --straggler 1:4 makes it, measured exactly
        s = quiet(run, cfg.replace(run_dir=root, name="bal"), comm)
    got, arrays = _final(os.path.join(root, "bal"), comm)
    expect = proportional(1.0 / np.array(slow), cfg.batch_size)
    assert s["replicas_identical"]
    assert s["shares"] == expect.tolist() and s["share_moves"] == 1, f"shares {s['shares']}, expected {expect}"
    assert np.allclose(got, want, rtol=RTOL, atol=ATOL), f"differs from one process by {np.abs(got - want).max():.3e}"
    assert arrays["balance/shares"].tolist() == s["shares"]
    # --resume from epoch 1 continues with that checkpoint's shares (no gather after it: K = 1000)
    _, first = load_checkpoint(os.path.join(root, "bal", "ckpt-epoch0001.npz"), comm)
    again = quiet(run, cfg.replace(run_dir=root, name="", resume=os.path.join(root, "bal", "ckpt-epoch0001.npz"),
                                   balance_every=1000), comm)
    assert first["balance/shares"].tolist() == expect.tolist() and again["shares"] == expect.tolist(), again["shares"]
    # the host's own timing, with the straggler's sleep: the update is the one process's whatever the shares
    s = quiet(run, cfg.replace(run_dir=root, name="timed"), comm)
    got = _final(os.path.join(root, "timed"), comm)[0]
    assert s["replicas_identical"]
    assert np.allclose(got, want, rtol=RTOL, atol=ATOL), f"differs from one process by {np.abs(got - want).max():.3e}"


def case_resume_compressed(comm, base):
    """--balance with top-k compression and error feedback (rank 1 measuring 2x the others' seconds per
    sample): the shares move, replicas stay identical, and a run stopped after epoch 1 and resumed
    ends bitwise equal to the uninterrupted one (shares and error feedback from the checkpoint)."""
    root = shared_dir(comm, base, "resume")
    common = ["--data", "digits", "--hidden", "24", "--dtype", "float64", "--epochs", "2", "--batch-size", "61",
              "--run-dir", root, "--no-progress", "--seed", "2", "--compression", "topk", "--compression-arg",
              "ratio=0.3", "--balance", "--balance-every", "3"]
    with _measured([2.0 if r == 1 else 1.0 for r in range(comm.size)]):
        full = quiet(run, parse_args(common + ["--name", "full"]), comm)
        quiet(run, parse_args(common + ["--name", "part", "--stop-after", "1"]), comm)
        again = quiet(run, parse_args(["--resume", os.path.join(root, "part")]), comm)
    a, arrays = _final(os.path.join(root, "full"), comm)
    b, resumed = _final(os.path.join(root, "part"), comm)
    assert full["replicas_identical"] and full["share_moves"] >= 1 and full["shares"][1] < full["shares"][0], full
    assert any(k.startswith("compression/") for k in arrays) and again["shares"] == full["shares"]
    assert np.array_equal(a, b), f"resumed differs from uninterrupted by {np.abs(a - b).max():.3e}"
    for k in arrays:
        if k.startswith(("compression/", "balance/", "optim/")):
            assert np.array_equal(arrays[k], resumed[k]), k


def case_no_straggler(comm, base):
    root = shared_dir(comm, base, "still")
    cfg = Config(**SMALL)
    plain = quiet(run, cfg.replace(run_dir=root, name="plain"), comm)
    with _measured([1.0 + 0.01 * r for r in range(comm.size)]):  # equal speeds, 1 % of noise: below the gain
        bal = quiet(run, cfg.replace(run_dir=root, name="bal", balance=True, balance_every=2), comm)
    a, b = _final(os.path.join(root, "plain"), comm)[0], _final(os.path.join(root, "bal"), comm)[0]
    assert bal["share_moves"] == 0 and bal["shares"] == plain["shares"], (bal["shares"], plain["shares"])
    assert np.array_equal(a, b), f"--balance changed a run without a straggler by {np.abs(a - b).max():.3e}"


def case_defaults(comm, base):
    root = shared_dir(comm, base, "defaults")
    cfg = Config(epochs=2, progress=False)  # every other setting its default: digits, batch 64, Adam, float32
    want = _one_process(cfg, comm, root, "p1")
    s = quiet(run, cfg.replace(run_dir=root, name="pP"), comm)
    got = _final(os.path.join(root, "pP"), comm)[0]
    assert s["steps"] == 46 and s["replicas_identical"], s
    assert np.allclose(got, want, rtol=1e-4, atol=1e-6), f"differs from one process by {np.abs(got - want).max():.3e}"


def case_ps(comm, base):
    root = shared_dir(comm, base, "ps")
    S = 2 if comm.size >= 5 else 1
    W = comm.size - S
    batch = 61 if W > 1 else 60
    cfg = Config(**{**SMALL, "momentum": 0.0, "weight_decay": 0.0, "batch_size": batch})
    want = _one_process(cfg, comm, root, "p1")
    s = quiet(run, cfg.replace(run_dir=root, name="ps", mode="ps", servers=S, consistency="bsp"), comm)
    got = None
    if comm.rank == 0:
        with np.load(os.path.join(root, "ps", "ps_model.npz"), allow_pickle=False) as z:
            got = z["params"]
        assert s["worker_status"] == ["done"] * W, s["worker_status"]
    got = comm.bcast(got, root=0)
    assert np.allclose(got, want, rtol=1e-9, atol=1e-12), \
        f"BSP on {W} workers, batch {batch}: differs from one process by {np.abs(got - want).max():.3e}"


CASES = [case_every_step, case_balance, case_resume_compressed, case_no_straggler, case_defaults, case_ps]


def main():
    comm = MPI.COMM_WORLD
    base = sys.argv[1]
    chosen = [c for c in CASES if len(sys.argv) < 3 or c.__name__[5:] in sys.argv[2:]]
    failed = run_cases(comm, chosen, base)
    if comm.rank == 0 and not failed:
        for name in ("balance", "resume", "still", "defaults", "ps"):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
