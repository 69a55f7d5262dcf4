"""Rank-side body of the multi-rank trainer tests: ``python -m tests.mpi_training DIR [CASE...]``.

Cases (run in order by every rank; DIR is a scratch directory shared by the ranks):

equivalence    P ranks with global batch 64 end, after 20 SGD steps in float64, with the weights
               of one rank with batch 64 (the oracle, run on rank 0 over COMM_SELF), for every
               algorithm in collectives.ALGORITHMS, and replicas stay identical.
buckets        bucketed all-reduce (tiny buckets) gives the fused all-reduce's weights.
nonfinite      a NaN batch on one rank makes every rank skip that step and count it; then
               evaluation on P ranks equals evaluation on one (each sample counted once).
resume         stop after epoch 3, resume (without --stop-after: not inherited) to 6 ==
               uninterrupted 6 epochs, bitwise (float64).
resume_compressed  the same with PowerSGD: its state is checkpointed under "compression/".
resume_local   local SGD (every rank steps its own optimizer state between averages): SGD with
               momentum on a skewed partition with --weighted-average and --resample, and Adam with
               top-k compression and error feedback, each stopped after epoch 2 of 4 and resumed
               == uninterrupted, bitwise (every rank's optimizer state included).
corrupt        a truncated or altered checkpoint raises CheckpointError naming the file, on
               every rank.

The global batch is 64 (60 when P does not divide 64, e.g. P = 3). Exits 0 when every case passes; prints each failing case and exits 1 otherwise. Unexpected errors
abort the whole job so nothing hangs.
"""
import os
import shutil
import struct
import sys
import zipfile

import numpy as np
from mpi4py import MPI

import collectives
from training.runtime.build import build_model, make_sampler, to_device
from training.runtime.checkpoint import load_checkpoint
from commlab.file_formats import CheckpointError
from training.settings.cli import parse_args
from training.settings.config import Config
from training.data.datasets import load_dataset
from training.model.nn import SoftmaxCrossEntropy
from training.model.optim import make_optimizer
from training.dp.data_parallel import evaluate, train_step
from training.dp.hooks import make_grad_hook
from training.train import run
from tests.mpicases import quiet, run_cases, shared_dir

# Equivalence tolerance (float64): the all-reduce sums the four 16-sample means in another order
# than one 64-sample mean, a difference of a few ulp per step; after 20 SGD steps the measured
# max |diff| is ~3e-16 on weights of size ~1, so rtol 1e-12 / atol 1e-13 leaves a wide margin,
# while averaging twice or summing instead of averaging differs by ~1e-1.
RTOL, ATOL = 1e-12, 1e-13

# 750 samples -> 600 train: P=1 takes 9 batches of 64 + one of 24 per epoch, P=4 9 of 16 + one
# of 6 per rank: 10 steps per epoch, 2 epochs = 20 steps, partial batches included.
SMALL = dict(data="synthetic", samples=750, features=12, classes=5, hidden=(16,), dtype="float64",
             optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=1e-3, batch_size=64, epochs=2,
             seed=3, progress=False, checkpoint_every=0)


def _final_params(run_dir, comm):
    _, arrays = load_checkpoint(run_dir, comm)
    return arrays["model/params"]


def _small(comm):
    return dict(SMALL, batch_size=64 if 64 % comm.size == 0 else 60)


def case_equivalence(comm, base):
    root = shared_dir(comm, base, "equiv")
    small = _small(comm)
    ref = None
    if comm.rank == 0:
        s = quiet(run, Config(**small, run_dir=root, name="p1"), MPI.COMM_SELF)
        assert s["steps"] == 20, f"P=1 took {s['steps']} steps, expected 20"
        ref = _final_params(os.path.join(root, "p1"), MPI.COMM_SELF)
    comm.Barrier()
    errors = []
    for alg in collectives.ALGORITHMS:
        s = quiet(run, Config(**small, run_dir=root, name=f"p{comm.size}-{alg}", algorithm=alg), comm)
        got = _final_params(os.path.join(root, f"p{comm.size}-{alg}"), comm)
        if not s["replicas_identical"]:
            errors.append(f"{alg}: replicas differ across ranks")
        if s["steps"] != 20:
            errors.append(f"{alg}: {s['steps']} steps, expected 20")
        if comm.rank == 0:
            diff = float(np.abs(got - ref).max())
            print(f"equivalence {alg}: max |w_P{comm.size} - w_P1| = {diff:.2e}", flush=True)
            if not np.allclose(got, ref, rtol=RTOL, atol=ATOL):
                errors.append(f"{alg}: P={comm.size} weights differ from P=1 by up to {diff:.3e}")
    assert not errors, "; ".join(errors)


def case_buckets(comm, base):
    root = shared_dir(comm, base, "buckets")
    fused = quiet(run, Config(**_small(comm), run_dir=root, name="fused", algorithm="ring"), comm)
    bucketed = quiet(run, Config(**_small(comm), run_dir=root, name="bucketed", algorithm="ring",
                                  bucket_bytes=200), comm)
    a = _final_params(os.path.join(root, "fused"), comm)
    b = _final_params(os.path.join(root, "bucketed"), comm)
    assert bucketed["replicas_identical"] and fused["replicas_identical"]
    assert np.allclose(a, b, rtol=RTOL, atol=ATOL), f"bucketed differs by {np.abs(a - b).max():.3e}"


def case_nonfinite(comm, base):
    cfg = Config(**_small(comm))
    ds = load_dataset(cfg)
    model = build_model(cfg, ds.n_features, ds.n_classes)
    opt, loss_fn = make_optimizer(cfg, model), SoftmaxCrossEntropy()
    hook = make_grad_hook(cfg, comm, model)
    x, y, _, _ = to_device(ds, model.dtype)
    batches = list(make_sampler(cfg, len(y), comm.rank, comm.size).batches(0, cfg.batch_size // comm.size))
    bad_rank = comm.size - 1
    results, snapshots = [], []
    for step in range(4):
        xb = x[batches[step]].copy()
        if step == 1 and comm.rank == bad_rank:
            xb[0, 0] = np.nan
        if step == 2 and comm.rank == 0:
            xb[1, 1] = np.inf
        with np.errstate(invalid="ignore", over="ignore"):  # the injected NaN/inf, expected
            results.append(train_step(model, loss_fn, opt, hook, comm, xb, y[batches[step]]))
        snapshots.append(model.params.copy())
    skipped = [r["skipped"] for r in results]
    assert skipped == [0, 1, 1, 0], f"skipped flags {skipped}, expected [0, 1, 1, 0]"
    assert np.array_equal(snapshots[0], snapshots[1]) and np.array_equal(snapshots[1], snapshots[2]), \
        "a skipped step changed the parameters"
    assert not np.array_equal(snapshots[2], snapshots[3]), "training did not continue after the skips"
    assert opt.steps == 2, f"optimizer took {opt.steps} steps, expected 2"
    assert np.isfinite(snapshots[3]).all()
    everyone = np.empty((comm.size, model.size))
    comm.Allgather(snapshots[3], everyone)
    assert (everyone == everyone[0]).all(), "replicas differ after the skipped steps"
    # evaluation over P ranks counts every sample once: it equals one rank evaluating them all
    # (accuracy exactly; loss to 1e-12, the shards' sums being added in another order)
    for n in (len(y), 7, 1):
        acc_p, loss_p = evaluate(model, loss_fn, x[:n], y[:n], comm, batch=50)
        acc_1, loss_1 = evaluate(model, loss_fn, x[:n], y[:n], MPI.COMM_SELF, batch=50)
        assert acc_p == acc_1 and abs(loss_p - loss_1) <= 1e-12 * abs(loss_1), (n, acc_p, acc_1)


def case_resume(comm, base):
    root = shared_dir(comm, base, "resume")
    B = _small(comm)["batch_size"]
    per_epoch = -(-(-(-1438 // comm.size)) // (B // comm.size))  # steps per epoch on 1438 digits
    common = ["--data", "digits", "--hidden", "24", "--dtype", "float64", "--epochs", "6",
              "--batch-size", str(B), "--run-dir", root, "--no-progress", "--checkpoint-every", "2",
              "--seed", "5", "--algorithm", "ring"]
    quiet(run, parse_args(common + ["--name", "full"]), comm)
    quiet(run, parse_args(common + ["--name", "part", "--stop-after", "3"]), comm)
    part = os.path.join(root, "part")
    assert os.path.exists(os.path.join(part, "ckpt-epoch0003.npz")), "no checkpoint after epoch 3"
    s = quiet(run, parse_args(["--resume", part]), comm)  # --stop-after 3 is not inherited
    assert s["epochs"] == 6 and s["steps"] == 6 * per_epoch, f"resumed run ended at {s['epochs']}, {s['steps']}"
    _, full = load_checkpoint(os.path.join(root, "full"), comm)
    _, resumed = load_checkpoint(part, comm)
    for key in ("model/params", "optim/m", "optim/v", "optim/steps", "train/step"):
        assert np.array_equal(full[key], resumed[key]), f"{key} differs after resume"
    if comm.rank == 0:
        from commlab.file_formats import read_jsonl

        a = read_jsonl(os.path.join(root, "full", "epochs.jsonl"))
        b = read_jsonl(os.path.join(part, "epochs.jsonl"))
        assert [r["epoch"] for r in b] == [1, 2, 3, 4, 5, 6], f"epochs.jsonl of the resumed run: {b}"
        assert [r["loss"] for r in a] == [r["loss"] for r in b], "epoch losses differ after resume"
        steps = read_jsonl(os.path.join(part, "metrics.jsonl"))
        assert [r["step"] for r in steps] == list(range(1, 6 * per_epoch + 1)), "metrics.jsonl steps"


def case_resume_compressed(comm, base):
    """Resume is bitwise exact with a stateful compressor too (PowerSGD's Q and error feedback)."""
    root = shared_dir(comm, base, "resume_c")
    common = ["--data", "digits", "--hidden", "24", "--dtype", "float64", "--epochs", "4",
              "--batch-size", str(_small(comm)["batch_size"]), "--run-dir", root, "--no-progress", "--seed", "2", "--compression", "powersgd",
              "--compression-arg", "rank=2"]
    quiet(run, parse_args(common + ["--name", "full"]), comm)
    quiet(run, parse_args(common + ["--name", "part", "--stop-after", "2"]), comm)
    quiet(run, parse_args(["--resume", os.path.join(root, "part")]), comm)
    _, full = load_checkpoint(os.path.join(root, "full"), comm)
    _, resumed = load_checkpoint(os.path.join(root, "part"), comm)
    comp = [k for k in full if k.startswith("compression/")]
    assert comp, "the checkpoint holds no compression state"
    for key in ["model/params", "optim/m", "optim/v", *comp]:
        assert np.array_equal(full[key], resumed[key]), f"{key} differs after resume"


def case_resume_local(comm, base):
    root = shared_dir(comm, base, "resume_l")
    common = ["--data", "digits", "--hidden", "16", "--dtype", "float64", "--epochs", "4", "--run-dir", root,
              "--batch-size", str(_small(comm)["batch_size"]), "--no-progress", "--seed", "4", "--checkpoint-every", "1"]
    for name, flags in (("momentum", ["--local-steps", "3", "--optimizer", "sgd", "--momentum", "0.9", "--partition",
                                      "classes:k=4", "--weighted-average", "--resample"]),
                        ("adam", ["--local-steps", "4", "--compression", "topk", "--compression-arg", "ratio=0.1"])):
        quiet(run, parse_args(common + flags + ["--name", f"{name}-full"]), comm)
        quiet(run, parse_args(common + flags + ["--name", f"{name}-part", "--stop-after", "2"]), comm)
        quiet(run, parse_args(["--resume", os.path.join(root, f"{name}-part")]), comm)
        _, full = load_checkpoint(os.path.join(root, f"{name}-full"), comm)
        _, resumed = load_checkpoint(os.path.join(root, f"{name}-part"), comm)
        assert sorted(full) == sorted(resumed), f"{name}: entries differ"
        assert any(k.startswith("ranks/optim/") for k in full), f"{name}: no rank's own optimizer state saved"
        for key in full:
            if key.startswith(("model/", "optim/", "ranks/", "compression/", "train/step")):
                assert np.array_equal(full[key], resumed[key]), f"{name}: {key} differs after resume"


def case_corrupt(comm, base):
    root = shared_dir(comm, base, "corrupt")
    src = os.path.join(base, "resume", "full", "ckpt-epoch0006.npz")
    if not os.path.exists(src):  # run on its own: make a checkpoint first
        quiet(run, Config(**dict(_small(comm), epochs=6, checkpoint_every=1),
                           run_dir=os.path.join(base, "resume"), name="full"), comm)
    truncated = os.path.join(root, "ckpt-epoch0001.npz")
    flipped = os.path.join(root, "flipped.npz")
    if comm.rank == 0:
        with open(src, "rb") as f:
            data = f.read()
        with open(truncated, "wb") as f:
            f.write(data[: len(data) // 2])
        mid = bytearray(data)
        with zipfile.ZipFile(src) as z:  # a byte in the middle of the parameters' stored data: the zip CRC
            info = z.getinfo("model/params.npy")  # catches it (a fixed file offset may land in a header)
        name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
        mid[info.header_offset + 30 + name_len + extra_len + info.compress_size // 2] ^= 0xFF
        with open(flipped, "wb") as f:
            f.write(bytes(mid))
        shutil.copy(os.path.join(base, "resume", "full", "config.json"), root)
    comm.Barrier()
    for path in (truncated, flipped, os.path.join(root, "missing.npz")):
        try:
            load_checkpoint(path, comm)
        except CheckpointError as e:
            assert os.path.basename(path) in str(e) or root in str(e), f"error does not name the file: {e}"
        else:
            raise AssertionError(f"loading {path} raised nothing")
    # the driver refuses to resume from it, on every rank, before training
    try:
        quiet(run, parse_args(["--resume", root, "--no-progress"]), comm)
    except CheckpointError as e:
        assert "ckpt-epoch0001.npz" in str(e), str(e)
    else:
        raise AssertionError("resuming from a truncated checkpoint raised nothing")


CASES = [case_equivalence, case_buckets, case_nonfinite, case_resume, case_resume_compressed, case_resume_local,
         case_corrupt]


def main():
    comm = MPI.COMM_WORLD
    base = sys.argv[1]
    chosen = [c for c in CASES if len(sys.argv) < 3 or c.__name__[5:] in sys.argv[2:]]
    failed = run_cases(comm, chosen, base)
    if comm.rank == 0 and not failed:
        shutil.rmtree(os.path.join(base, "equiv"), ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
