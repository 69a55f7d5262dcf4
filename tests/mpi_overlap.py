"""Rank-side body of the overlap tests: ``python -m tests.mpi_overlap [CASE...]``.

Cases (every rank runs them in order):

bitwise     for every algorithm in ``collectives.ALGORITHMS``: 6 SGD steps (float32, 4 buckets, each
            rank its own batch, ``timeout`` set) with overlap end with exactly the parameters of the
            same steps without overlap (the blocking hook, itself tested against one rank in
            tests/mpi_training.py), identical on every rank; and the float64 run equals the oracle,
            one rank taking the same steps on the whole global batch (rtol 1e-12).
started     the buckets start during the backward pass: after layer k's backward, exactly the
            buckets whose first element lies in layers >= k have started, in order; with 20 ms of
            emulated computation per layer, the first bucket completes (tested between layers)
            before the backward pass ends, on some rank and step at least.
nonfinite   a NaN on one rank skips the step on every rank with overlap too: parameters unchanged,
            replicas identical, then training goes on.
deadline    the last rank leaves a step out: every other rank's overlapped all-reduce raises
            ``CollectiveTimeout`` within the deadline (0.5 s per round) instead of waiting forever.

Exits 0 when every case passes; prints each failing case and exits 1 otherwise.
"""
import sys
import time

import numpy as np
from mpi4py import MPI

import collectives
from training.model.nn import SoftmaxCrossEntropy, build_mlp
from training.model.optim import SGD
from training.dp.hooks import AllreduceHook, bucket_bounds
from training.dp.data_parallel import compute_gradient, train_step
from tests.mpicases import run_cases

SIZES = [12, 40, 40, 40, 5]  # 4 Linear layers: 520, 1640, 1640, 205 parameters; buckets of 1200 elements
                             # give 3: layers 3-2 (the last two Linear), layer 1, layer 0
LOCAL, STEPS = 8, 6  # samples per rank per step, steps per run


def _batches(size, steps, seed=7):
    """Return the global batches (x, y) of every step, the same on every rank."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((LOCAL * size, SIZES[0])), rng.integers(0, SIZES[-1], LOCAL * size))
            for _ in range(steps)]


def _train(comm, alg, overlap, dtype="float32", timeout=30.0):
    """Take STEPS steps on this rank's share of each global batch; return the final parameters."""
    model = build_mlp(SIZES, dtype=dtype, seed=4)
    opt, ce = SGD(model.params, model.grads, lr=0.05, momentum=0.9), SoftmaxCrossEntropy()
    buckets = bucket_bounds(model.slices, model.dtype.itemsize, 1200 * model.dtype.itemsize)
    assert len(buckets) >= 3, buckets
    hook = AllreduceHook(comm, alg, buckets, timeout, overlap)
    lo, hi = comm.rank * LOCAL, (comm.rank + 1) * LOCAL
    for x, y in _batches(comm.size, STEPS):
        r = train_step(model, ce, opt, hook, comm, x[lo:hi].astype(dtype), y[lo:hi])
        assert not r["skipped"] and r["bytes_sent"] > 0, r
    return model.params.copy()


def _identical(comm, a):
    everyone = np.empty((comm.size, a.size), a.dtype)
    comm.Allgather(a, everyone)
    return bool((everyone == everyone[0]).all())


def case_bitwise(comm):
    errors = []
    for alg in collectives.ALGORITHMS:
        off, on = _train(comm, alg, False), _train(comm, alg, True)
        if not np.array_equal(off, on):
            errors.append(f"{alg}: overlap differs by up to {np.abs(off - on).max():.3e}")
        if not _identical(comm, on):
            errors.append(f"{alg}: replicas differ with overlap")
    oracle = None
    if comm.rank == 0:  # one rank, the whole global batch, the blocking path
        model = build_mlp(SIZES, dtype="float64", seed=4)
        opt, ce = SGD(model.params, model.grads, lr=0.05, momentum=0.9), SoftmaxCrossEntropy()
        for x, y in _batches(comm.size, STEPS):
            compute_gradient(model, ce, x, y)
            opt.step()
        oracle = model.params.copy()
    oracle = comm.bcast(oracle, root=0)
    got = _train(comm, "ring", True, "float64")
    if not np.allclose(got, oracle, rtol=1e-12, atol=1e-13):
        errors.append(f"float64 overlap run differs from one rank by {np.abs(got - oracle).max():.3e}")
    if np.array_equal(got, build_mlp(SIZES, dtype="float64", seed=4).params):
        errors.append("the parameters did not change")
    assert not errors, "; ".join(errors)


def case_started(comm):
    model = build_mlp(SIZES, dtype="float32", seed=4)
    ce = SoftmaxCrossEntropy()
    buckets = bucket_bounds(model.slices, 4, 1200 * 4)
    hook = AllreduceHook(comm, "ring", buckets, 30.0, overlap=True)
    firsts = {}  # layer -> flat offset of its first parameter
    off = 0
    for i, layer in enumerate(model.layers):
        if layer.param_shapes():
            firsts[i] = off
        off += sum(int(np.prod(s)) for s in layer.param_shapes())
    early = 0
    for x, y in _batches(comm.size, STEPS, seed=9):
        step = hook.begin(model)
        seen = []

        def on_grad(i, step=step, seen=seen):
            step.layer_done(i)
            seen.append((i, step._next, [r.done for r in step._reqs]))
            if i:
                time.sleep(0.02)  # an earlier layer's computation, during which the peers catch up

        compute_gradient(model, ce, x[:LOCAL].astype("float32"), y[:LOCAL], on_grad)
        low = model.grads.size
        for i, started, done in seen:
            low = min(low, firsts.get(i, low))
            want = sum(1 for b_lo, _ in buckets if b_lo >= low)
            assert started == want, f"after layer {i}: {started} buckets started, expected {want}"
        early += any(seen[-1][2][:1])  # the first bucket finished while the backward pass ran
        step.wait()
    early = comm.allreduce(early, op=MPI.SUM)
    assert early > 0, "no bucket completed during the backward pass on any rank and step"


def case_nonfinite(comm):
    model = build_mlp(SIZES, dtype="float32", seed=4)
    opt, ce = SGD(model.params, model.grads, lr=0.05, momentum=0.9), SoftmaxCrossEntropy()
    hook = AllreduceHook(comm, "auto", bucket_bounds(model.slices, 4, 1200 * 4), 30.0, overlap=True)
    lo, hi = comm.rank * LOCAL, (comm.rank + 1) * LOCAL
    snaps, skipped = [], []
    for k, (x, y) in enumerate(_batches(comm.size, 3, seed=5)):
        xb = x[lo:hi].astype("float32")
        if k == 1 and comm.rank == comm.size - 1:
            xb[0, 0] = np.nan
        with np.errstate(invalid="ignore"):
            skipped.append(train_step(model, ce, opt, hook, comm, xb, y[lo:hi])["skipped"])
        snaps.append(model.params.copy())
    assert skipped == [0, 1, 0], f"skipped {skipped}, expected [0, 1, 0]"
    assert np.array_equal(snaps[0], snaps[1]), "the skipped step changed the parameters"
    assert not np.array_equal(snaps[1], snaps[2]) and np.isfinite(snaps[2]).all()
    assert _identical(comm, snaps[2]), "replicas differ after the skipped step"


def case_deadline(comm):
    sub = comm.Dup()
    collectives.allreduce(np.ones(1), comm=sub)  # the library's context of sub, made by every rank
    model = build_mlp(SIZES, dtype="float32", seed=4)
    ce = SoftmaxCrossEntropy()
    hook = AllreduceHook(sub, "ring", bucket_bounds(model.slices, 4, 1200 * 4), 0.5, overlap=True)
    x, y = _batches(comm.size, 1)[0]
    if comm.rank != comm.size - 1:  # the last rank never takes part
        step = hook.begin(model)
        compute_gradient(model, ce, x[:LOCAL].astype("float32"), y[:LOCAL], step.layer_done)
        t0 = time.perf_counter()
        try:
            step.wait()
            raise AssertionError("no CollectiveTimeout")
        except collectives.CollectiveTimeout as e:
            waited = time.perf_counter() - t0
            assert waited < 0.5 + 5, f"the timeout took {waited:.1f} s"
            assert f"rank {comm.size - 1}" in str(e) or comm.size > 2, str(e)
    comm.Barrier()


CASES = {c.__name__[5:]: c for c in (case_bitwise, case_started, case_nonfinite, case_deadline)}

if __name__ == "__main__":
    names = sys.argv[1:] or list(CASES)
    sys.exit(1 if run_cases(MPI.COMM_WORLD, [CASES[n] for n in names]) else 0)
