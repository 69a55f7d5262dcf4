"""Rank-side body of the skewed-data tests: ``python -m tests.mpi_non_iid DIR [CASE...]``.

Cases (every rank, in order; DIR is a scratch directory shared by the ranks):

weighted    each rank's mean gradient over its own (unequal) Dirichlet shard, averaged with the sample
            weights, equals one process's gradient over all the data (float64, 1e-12); the plain
            average of the same means does not (the bias of the unweighted average).
weighted_step
            --weighted-average at H = 1: the weights W n_w / sum n (training.data.skew.gradient_scale) match
            MPI's sum of the shard sizes; the expected step (each rank's gradient averaged over batches
            that hold every shard sample equally often, scaled, then the plain all-reduce) and one
            train_step on the whole shards equal one process's full gradient (float64, 1e-12); the
            unscaled step does not.
local_h1    local SGD with H = 1 and SGD (momentum, weight decay) ends with the data-parallel
            parameters after 20 steps (float64, 1e-12); with Adam it does not.
average_optimizer
            local SGD (H = 2) with --average-optimizer: after an average, SGD's velocity and Adam's m and
            v equal the mean of the ranks' states before it (the oracle: MPI's allgather and NumPy's
            mean, 1e-12) on every rank; without the option they stay apart.
runs        the trainer with a skewed partition (also with --weighted-average at H = 1), resampling, a
            shared subset and local SGD (H = 4, post-local after epoch 1): replicas identical,
            partition.json records every sample once, bytes per epoch fall by H; local SGD through top-k keeps one model; --mode ps reads the
            same shards.
errors      a partition that leaves a class on no worker, one that cannot give every worker a batch,
            and ranks started with different partitions fail on every rank before the run directory
            exists.
"""
import json
import os
import sys

import numpy as np
from mpi4py import MPI

from training.runtime.build import build_model, to_device
from training.settings.config import Config
from training.data.datasets import load_dataset
from training.dp.hooks import AllreduceHook
from training.dp.data_parallel import compute_gradient, train_step
from training.dp.local_sgd import LocalSGD, local_step, weighted_average
from training.model.nn import SoftmaxCrossEntropy
from training.model.optim import make_optimizer
from training.model.optim import SGD
from training.data.partition import draw_partition
from training.data.skew import gradient_scale, shard_sampler
from training.train import run
from tests.mpicases import quiet, run_cases, shared_dir

TOL = 1e-12  # float64: the sums run in another order, a few ulp on values of order 1
SMALL = dict(data="synthetic", samples=900, features=12, classes=5, hidden=(16,), dtype="float64", seed=2,
             progress=False, checkpoint_every=0)


def _setup(cfg):
    ds = load_dataset(cfg)
    model = build_model(cfg, ds.n_features, ds.n_classes)
    return ds, model, to_device(ds, model.dtype)


def case_weighted(comm, base):
    cfg = Config(**SMALL)
    ds, model, (x, y, _, _) = _setup(cfg)
    loss_fn = SoftmaxCrossEntropy()
    shards = draw_partition(ds.y_train, comm.size, "dirichlet:alpha=0.3", seed=1, n_classes=5).shards
    mine = shards[comm.rank]
    compute_gradient(model, loss_fn, x[mine], y[mine])
    local = model.grads.copy()
    got = weighted_average(local, mine.size, comm=comm, algorithm="ring")
    plain = local.copy()
    AllreduceHook(comm, "ring")(plain)
    compute_gradient(model, loss_fn, x, y)  # the oracle: one process, every training sample
    want = model.grads
    err = float(np.abs(got - want).max())
    bias = float(np.abs(plain - want).max())
    if comm.rank == 0:
        sizes = [int(s.size) for s in shards]
        print(f"weighted: shard sizes {sizes}; max |weighted - full| = {err:.1e}, max |plain - full| = {bias:.1e}")
    assert np.allclose(got, want, rtol=TOL, atol=TOL), err
    assert bias > 1e-3, f"the plain average equals the full gradient ({bias:.1e}): the shards are not unequal"


def case_weighted_step(comm, base):
    cfg = Config(**SMALL, partition="dirichlet:alpha=0.3", batch_size=4 * comm.size, weighted_average=True)
    ds, model, (x, y, _, _) = _setup(cfg)
    loss_fn, hook = SoftmaxCrossEntropy(), AllreduceHook(comm, "ring")
    mine = shard_sampler(cfg, ds.y_train, 5, comm.rank, comm.size).shard  # the trainer's own shard
    total = comm.allreduce(mine.size, op=MPI.SUM)  # MPI's own sum: the oracle of the weights
    scale = gradient_scale(cfg, ds.y_train, comm.rank, comm.size)
    assert abs(scale - comm.size * mine.size / total) < 1e-15, (scale, mine.size, total)
    compute_gradient(model, loss_fn, x, y)  # the oracle: one process, every training sample
    full = model.grads.copy()
    b, acc = cfg.batch_size // comm.size, np.zeros_like(full)
    for j in range(mine.size):  # the n_w windows of b samples of a cyclic order: every sample b times
        window = mine[(j + np.arange(b)) % mine.size]
        compute_gradient(model, loss_fn, x[window], y[window], scale=scale)
        acc += model.grads
    expected, _ = hook(acc / mine.size)
    params0, steps = model.params.copy(), {}
    for name, s in (("weighted", scale), ("plain", 1.0)):  # one step on the whole shard: SGD, lr 1, no momentum
        opt = SGD(model.params, model.grads, lr=1.0, momentum=0.0)
        train_step(model, loss_fn, opt, hook, comm, x[mine], y[mine], scale=s)
        steps[name] = params0 - model.params
        model.params[...] = params0
    err = float(np.abs(expected - full).max())
    one = float(np.abs(steps["weighted"] - full).max())
    bias = float(np.abs(steps["plain"] - full).max())
    sizes, weights = comm.gather(int(mine.size)), comm.gather(round(scale, 4))
    if comm.rank == 0:
        print(f"weighted_step: shard sizes {sizes}, weights {weights}; max |expected step - full| = {err:.1e}, "
              f"max |train_step - full| = {one:.1e}, max |unscaled step - full| = {bias:.1e}")
    assert np.allclose(expected, full, rtol=TOL, atol=TOL), err
    assert np.allclose(steps["weighted"], full, rtol=TOL, atol=TOL), one
    assert bias > 1e-3, f"the unscaled step equals the full gradient ({bias:.1e}): the shards are not unequal"


def _steps(comm, optimizer, local):
    cfg = Config(**SMALL, optimizer=optimizer, lr=0.05, momentum=0.9, weight_decay=1e-3)
    ds, model, (x, y, _, _) = _setup(cfg)
    opt, loss_fn = make_optimizer(cfg, model), SoftmaxCrossEntropy()
    hook = AllreduceHook(comm, "ring")
    avg = LocalSGD(comm, hook, local_steps=1)
    avg.begin(model.params)
    shard = draw_partition(ds.y_train, comm.size, "classes:k=2", seed=0, n_classes=5).shards[comm.rank]
    for step in range(20):
        b = shard[(step * 8) % (shard.size - 8):][:8]
        if local:
            local_step(model, loss_fn, opt, avg, x[b], y[b], sync=True)
        else:
            train_step(model, loss_fn, opt, hook, comm, x[b], y[b])
    return model.params.copy()


def case_local_h1(comm, base):
    for optimizer in ("sgd", "adam"):
        dp, local = _steps(comm, optimizer, False), _steps(comm, optimizer, True)
        diff = float(np.abs(dp - local).max())
        if comm.rank == 0:
            print(f"local_h1 {optimizer}: max |local SGD H=1 - data-parallel| = {diff:.1e}")
        if optimizer == "sgd":
            assert np.allclose(dp, local, rtol=TOL, atol=TOL), diff
        else:
            assert diff > 1e-6, f"Adam: averaging models equals averaging gradients ({diff:.1e})?"


def case_average_optimizer(comm, base):
    for optimizer in ("sgd", "adam"):
        for on in (True, False):
            cfg = Config(**SMALL, optimizer=optimizer, lr=0.05, momentum=0.9)
            ds, model, (x, y, _, _) = _setup(cfg)
            opt, loss_fn = make_optimizer(cfg, model), SoftmaxCrossEntropy()
            local = LocalSGD(comm, AllreduceHook(comm, "ring"), local_steps=2, average_optimizer=on)
            local.begin(model.params)
            shard = draw_partition(ds.y_train, comm.size, "classes:k=2", seed=0, n_classes=5).shards[comm.rank]
            for step in range(2):  # two local steps on each rank's own classes, no exchange
                b = shard[step * 8:][:8]
                local_step(model, loss_fn, opt, local, x[b], y[b], sync=False)
            keys = ("velocity",) if optimizer == "sgd" else ("m", "v")
            state = opt.state_dict()
            want = {k: np.mean(comm.allgather(np.array(state[k])), axis=0) for k in keys}  # the oracle
            apart = comm.allreduce(any(not np.array_equal(state[k], want[k]) for k in keys), op=MPI.LOR)
            assert apart, f"{optimizer}: the ranks' states agree before the average: the test shows nothing"
            local.average(model.params, opt)
            err = max(float(np.abs(state[k] - want[k]).max()) for k in keys)
            first = comm.bcast([np.array(state[k]) for k in keys])  # rank 0's state after the average
            spread = comm.allreduce(max(float(np.abs(state[k] - f).max()) for k, f in zip(keys, first)), op=MPI.MAX)
            if on:
                assert err <= TOL and spread <= TOL, f"{optimizer}: state {keys} not averaged ({err:.1e}, {spread:.1e})"
            else:
                assert spread > 1e-6, f"{optimizer}: state {keys} averaged without --average-optimizer ({spread:.1e})"
            if comm.rank == 0:
                print(f"average_optimizer {optimizer} {'on' if on else 'off'}: max |state - mean of the ranks'| "
                      f"= {err:.1e}, largest difference between ranks {spread:.1e}")


def case_runs(comm, base):
    root = shared_dir(comm, base, "runs")
    common = dict(SMALL, epochs=3, batch_size=12 * comm.size, optimizer="sgd", lr=0.05, run_dir=root)
    dp = quiet(run, Config(**common, name="dp", partition="dirichlet:alpha=0.5"), comm)
    loc = quiet(run, Config(**common, name="local", partition="dirichlet:alpha=0.5", resample=True,
                            shared_fraction=0.05, local_steps=4, post_local_epoch=1, weighted_average=True), comm)
    wdp = quiet(run, Config(**dict(common, name="weighted", epochs=1, partition="dirichlet:alpha=0.5",
                                   weighted_average=True)), comm)  # H = 1: every step's gradient weighted
    assert dp["replicas_identical"] and loc["replicas_identical"] and wdp["replicas_identical"]
    with open(os.path.join(root, "local", "partition.json"), encoding="utf-8") as f:
        rec = json.load(f)
    assert sum(rec["sizes"]) == 720 and len(rec["sizes"]) == comm.size and rec["shared_samples"] == 36
    assert np.array(rec["label_histogram"]).sum() == 720
    with open(os.path.join(root, "local", "epochs.jsonl"), encoding="utf-8") as f:
        sent = [json.loads(line)["bytes_sent"] for line in f]
    steps = -(-720 // common["batch_size"])
    syncs = steps // 4 + (steps % 4 > 0)
    assert sent[1] == sent[2] and abs(sent[1] / sent[0] - syncs / steps) < 0.05, (sent, syncs, steps)
    topk = quiet(run, Config(**dict(common, name="topk", epochs=1, partition="classes:k=3", local_steps=4,
                                    compression="topk", compression_args={"ratio": 0.1})), comm)
    assert topk["replicas_identical"], "local SGD through a compressor left the replicas apart"
    ps = quiet(run, Config(**dict(common, name="ps", mode="ps", batch_size=12 * (comm.size - 1),
                                  partition="classes:k=3")), comm)
    if comm.rank == 0:
        with open(os.path.join(root, "ps", "partition.json"), encoding="utf-8") as f:
            assert json.load(f)["workers"] == comm.size - 1
        assert ps["final_test_acc"] > 0


def case_errors(comm, base):
    root = shared_dir(comm, base, "errors")
    for changes, message in ((dict(partition="classes:k=1", batch_size=12 * comm.size), "some class would be on no worker"),
                             (dict(partition="quantity:alpha=0.05", batch_size=200 * comm.size), "one batch")):
        try:
            quiet(run, Config(**SMALL, run_dir=root, name="bad", **changes), comm)
        except ValueError as e:
            assert message in str(e), str(e)
        else:
            raise AssertionError(f"{changes} raised nothing")
        assert not os.path.exists(os.path.join(root, "bad")), "the run directory was created"
    try:  # ranks started with different partitions: every rank names the setting (preflight's agree)
        quiet(run, Config(**SMALL, run_dir=root, name="bad", batch_size=12 * comm.size,
                          partition="iid" if comm.rank else "classes:k=5"), comm)
    except ValueError as e:
        assert "--partition" in str(e) and "different settings" in str(e), str(e)
    else:
        raise AssertionError("different partitions on different ranks raised nothing")


CASES = [case_weighted, case_weighted_step, case_local_h1, case_average_optimizer, case_runs, case_errors]


def main():
    comm = MPI.COMM_WORLD
    chosen = [c for c in CASES if len(sys.argv) < 3 or c.__name__[5:] in sys.argv[2:]]
    sys.exit(1 if run_cases(comm, chosen, sys.argv[1]) else 0)


if __name__ == "__main__":
    main()
