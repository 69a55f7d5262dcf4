"""Single-process tests of the parameter server's pieces: sharding, clock rules, optimizer, checkpoints."""
import functools
import os

import numpy as np
import pytest

from ps.serving.consistency import DONE, DROPPED, ClockBuckets, ClockTable
from ps.job.settings import PSOptions, parse_rank_spec
from ps.shards.key_ranges import join_shards, shard_offsets, shard_sizes, shard_slice, split_shards
from ps.serving.server_optimizer import ServerOptimizer
from training.model.optim import lr_rule, schedule_lr
from commlab.file_formats import read_npz, write_npz
from training.model.optim import SGD, Adam


@pytest.mark.parametrize("S", [1, 2, 3, 7])
@pytest.mark.parametrize("n_of", [lambda S: 0, lambda S: 1, lambda S: S - 1, lambda S: 10**6 + 7])
def test_shard_sizes_cover_and_differ_by_at_most_one(S, n_of):
    n = n_of(S)
    sizes = shard_sizes(n, S)
    assert sizes.sum() == n and len(sizes) == S
    assert sizes.max() - sizes.min() <= 1
    oracle = [len(a) for a in np.array_split(np.arange(n), S)]  # the collectives' splitting rule
    assert sizes.tolist() == oracle
    offsets = shard_offsets(n, S)
    covered = np.concatenate([np.arange(n)[shard_slice(n, S, r)] for r in range(S)])
    assert offsets[0] == 0 and offsets[-1] == n and np.array_equal(covered, np.arange(n))


def test_split_and_join_shards_roundtrip():
    x = np.arange(10.0)
    parts = split_shards(x, 3)
    assert [p.shape[0] for p in parts] == [4, 3, 3] and all(np.shares_memory(p, x) for p in parts)
    assert np.array_equal(join_shards(parts), x)


@pytest.mark.parametrize("args, exc", [((-1, 2), ValueError), ((5, 0), ValueError), ((5.0, 2), TypeError),
                                       ((5, True), TypeError)])
def test_shard_sizes_rejects_bad_arguments(args, exc):
    with pytest.raises(exc):
        shard_sizes(*args)


def test_ssp_pull_rule_and_staleness():
    t = ClockTable(3, "ssp", staleness=2)
    t.folded[:] = [5, 3, 4]
    assert t.servable(0, 5)          # slowest at 3 >= 5 - 2
    assert not t.servable(0, 6)      # 3 < 6 - 2
    assert t.servable(1, 4)          # own pushes are folded with their clock: only the bound counts
    assert t.staleness_of(0, 5) == 2
    t.folded[0] = 6
    assert not t.servable(0, 6)
    t.status[1] = DONE               # a finished worker holds nobody back: slowest live is 4
    assert t.servable(0, 6) and t.staleness_of(0, 6) == 2


def test_ssp_with_staleness_0_serves_exactly_what_bsp_serves():
    """Oracle: BSP's rule, over every folded state of 3 workers up to clock 4 and every reader."""
    import itertools

    bsp, ssp = ClockTable(3, "bsp"), ClockTable(3, "ssp", staleness=0)
    for folded in itertools.product(range(4), repeat=3):
        bsp.folded[:] = ssp.folded[:] = folded
        for w, clock in itertools.product(range(3), range(5)):
            assert ssp.servable(w, clock) == bsp.servable(w, clock), (folded, w, clock)


def test_bsp_rule_and_buckets_sum_in_worker_order():
    t = ClockTable(3, "bsp")
    b = ClockBuckets(t)
    b.add(2, 0, np.array([1e16]))
    b.add(0, 0, np.array([1.0]))
    assert b.pop_ready() is None and not t.servable(0, 1)
    b.add(1, 0, np.array([-1e16]))
    clock, mean, workers = b.pop_ready()
    assert (clock, workers) == (0, [0, 1, 2])
    assert mean[0] == ((1.0 + -1e16) + 1e16) / 3  # worker order, not arrival order
    for w in workers:
        t.fold(w, clock)
    assert t.servable(1, 1) and t.staleness_of(1, 1) == 0


def test_asp_serves_without_bound_but_waits_for_own_push():
    t = ClockTable(2, "asp")
    t.folded[:] = [50, 0]
    assert t.servable(0, 50) and t.staleness_of(0, 50) == 50
    assert not t.servable(0, 51)
    t.status[1] = DROPPED
    assert t.staleness_of(0, 50) == 0


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_server_optimizer_matches_trainer_optimizer(kind):
    """Oracle: the trainer's own SGD/Adam on the same gradients; bitwise equal in float64."""
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(50)
    params, grads = p0.copy(), np.zeros(50)
    ref = SGD(params, grads, lr=0.1, momentum=0.9, weight_decay=1e-3) if kind == "sgd" else \
        Adam(params, grads, lr=0.01, weight_decay=1e-3)
    make = functools.partial(SGD, momentum=0.9, weight_decay=1e-3) if kind == "sgd" else \
        functools.partial(Adam, weight_decay=1e-3)
    p = p0.copy()
    mine = ServerOptimizer(p, make, lr=0.1 if kind == "sgd" else 0.01)
    for _ in range(20):
        g = rng.standard_normal(50)
        grads[:] = g
        ref.step()
        mine.step(g, mine.rate())
    np.testing.assert_allclose(p, params, rtol=1e-15, atol=0)


def test_staleness_aware_rate_and_cosine():
    opt = ServerOptimizer(np.zeros(1), SGD, lr=0.8, staleness_lr=True, lr_at=lr_rule("cosine", 0.8))
    assert opt.rate(0, 10, 4, 2) == pytest.approx(0.8 / 2 / 4)
    assert opt.rate(0, 10, 0.5) == pytest.approx(0.8)  # staleness below 1 does not raise the step
    assert opt.rate(10, 10, 0) == pytest.approx(0.0)


def test_one_cosine_schedule_for_trainer_and_servers():
    """The trainer's lr_at and the servers' rate are the one function: equal bits at equal arguments;
    oracle for the values: the cosine written out with NumPy."""
    from training.settings.config import Config
    from training.train import lr_at

    cfg = Config(lr=0.3, lr_schedule="cosine")
    opt = ServerOptimizer(np.zeros(1), SGD, lr=0.3, lr_at=lr_rule("cosine", 0.3))
    for step, total in ((0, 7), (3, 7), (7, 7), (9, 7), (123, 1000), (5, 0)):
        assert lr_at(cfg, step, total) == opt.rate(step, total) == schedule_lr("cosine", 0.3, step, total)
        want = 0.3 if total == 0 else 0.3 * (1 + np.cos(np.pi * min(step, total) / total)) / 2
        assert schedule_lr("cosine", 0.3, step, total) == pytest.approx(want, rel=1e-15, abs=1e-17)
    assert lr_at(Config(lr=0.3, lr_schedule="constant"), 3, 7) == 0.3
    with pytest.raises(ValueError, match="lr_schedule"):
        schedule_lr("linear", 0.3, 1, 2)


def test_checkpoint_is_atomic_npz_without_pickle(tmp_path):
    path = str(tmp_path / "s.npz")
    opt = ServerOptimizer(np.zeros(4, np.float32), Adam, lr=0.1)
    opt.step(np.ones(4, np.float32), 0.1)
    write_npz(path, {"params": np.arange(4.0), **opt.state_dict()})
    assert os.listdir(tmp_path) == ["s.npz"]  # no temporary file left behind
    state = read_npz(path)
    again = ServerOptimizer(np.zeros(4, np.float32), Adam, lr=0.1)
    again.load_state_dict(state)
    m, v = again.optimizer.m, again.optimizer.v
    assert again.steps == 1 and np.array_equal(m, opt.optimizer.m) and np.array_equal(v, opt.optimizer.v)
    legacy = {k.replace("optim/", "opt_"): v for k, v in state.items()}  # keys of older server checkpoints
    older = ServerOptimizer(np.zeros(4, np.float32), Adam, lr=0.1)
    older.load_state_dict(legacy)
    assert older.steps == 1 and np.array_equal(older.optimizer.m, m) and np.array_equal(older.optimizer.v, v)
    with pytest.raises(TypeError):
        write_npz(path, {"bad": np.array([{}], dtype=object)})
    with pytest.raises(ValueError):
        ServerOptimizer(np.zeros(5, np.float32), Adam, lr=0.1).load_state_dict(state)


@pytest.mark.parametrize("change, word", [
    ({"servers": 4}, "servers"), ({"consistency": "eventual"}, "consistency"),
    ({"staleness": -1}, "staleness"), ({"ps_timeout": 0.0}, "ps_timeout"),
    ({"straggler": "0:4"}, "straggler"), ({"straggler": "2:x"}, "straggler"),
    ({"straggler": "2:0.5"}, "straggler"), ({"fail_worker": "9:3"}, "fail_worker"),
    ({"fail_worker": "2"}, "fail_worker"), ({"jitter": -1.0}, "jitter"), ({"worker_batch": 0}, "batch"),
    ({"straggler": "2:inf"}, "straggler factor must be a finite"), ({"straggler": "2:nan"}, "straggler"),
    ({"jitter": float("inf")}, "jitter must be a finite"), ({"jitter": float("nan")}, "jitter"),
    ({"lr": float("nan")}, "lr must be a finite"),
])
def test_options_reject_bad_values_naming_the_field(change, word):
    opts = PSOptions(servers=1, **{k: v for k, v in change.items() if k != "servers"})
    if "servers" in change:
        opts.servers = change["servers"]
    with pytest.raises(ValueError, match=word):
        opts.validate(4)


def test_parse_rank_spec():
    assert parse_rank_spec("3:2.5", "straggler", float) == (3, 2.5)
    assert parse_rank_spec("2:10", "fail_worker", int) == (2, 10)
    with pytest.raises(ValueError, match="RANK:STEP"):
        parse_rank_spec("2:1.5", "fail_worker", int)


def test_batch_stream_matches_the_data_parallel_slices_and_streams():
    from training.ps_mode.worker import BatchStream
    from training.data.sampling import DistributedSampler

    from training.data.sampling import deal

    sampler = DistributedSampler(23, 1, 2, shuffle=True, seed=3)  # 12 samples per epoch
    fixed = BatchStream(sampler, 10)  # global batch 10: batches of 10, 10 and 3 samples per epoch
    assert fixed.per_epoch == 3
    order = sampler.epoch_order(1, 10)
    assert np.array_equal(fixed.indices(5, 5), deal(order[20:], [2, 1])[1])  # clock 5 = epoch 1, last batch (3)
    assert fixed.weight(5, 5, 1) == 1 * 10 / (3 * 5)  # x W b / B in the push: W x 1 / 3 of the short batch
    assert fixed.weight(4, 5, 5) == 1.0
    for W, B in [(3, 64), (5, 64), (3, 7)]:  # every worker's share of every global batch, each sample once
        streams = [BatchStream(DistributedSampler(100, w, W, seed=1), B) for w in range(W)]
        for clock in range(streams[0].per_epoch):
            got = np.concatenate([s.indices(clock, 0) for s in streams])
            want = DistributedSampler(100, 0, W, seed=1).epoch_order(0, B)[clock * B:(clock + 1) * B]
            assert np.array_equal(np.sort(got), np.sort(want))
    stream = BatchStream(sampler, 10, stream=True)
    got = np.concatenate([stream.indices(c, b) for c, b in enumerate([7, 7, 7])])
    assert np.array_equal(got, np.concatenate([sampler.indices(0), sampler.indices(1)[:9]]))


def test_run_records_end_with_the_final_parameters():
    """The last epoch (and the whole record of a one-epoch run) comes from the final parameters when
    no snapshot fell on the last push: oracle = evaluating those parameters directly."""
    from training.ps_mode.run_records import evaluate_snapshots
    from ps.job.reports import RunResult
    from training.settings.config import Config
    from training.model.nn import SoftmaxCrossEntropy
    from training.dp.data_parallel import evaluate
    from training.runtime.build import build_model
    from mpi4py import MPI

    rng = np.random.default_rng(0)
    x_tr, x_te = rng.standard_normal((12, 4)), rng.standard_normal((6, 4))
    y_tr, y_te = rng.integers(0, 3, 12), rng.integers(0, 3, 6)
    model, loss_fn = build_model(Config(hidden=(5,), dtype="float64"), 4, 3), SoftmaxCrossEntropy()
    final = rng.standard_normal(model.size)
    snap = rng.standard_normal(model.size)
    data = (x_tr, y_tr, x_te, y_te)
    # one epoch = 8 pushes; a snapshot at 4, training ends at 8 (a snapshot-free last epoch)
    result = RunResult(params=final, pushes=8, wall=2.0, staleness_histogram={}, snapshots=[(4, 1.0, snap)],
                       status=["done", "done"])
    ev = evaluate_snapshots(result, model, loss_fn, data, 64, 8)
    model.params[...] = final
    want_test = evaluate(model, loss_fn, x_te, y_te, MPI.COMM_SELF, 64)
    want_train = evaluate(model, loss_fn, x_tr, y_tr, MPI.COMM_SELF, 64)
    assert [p["pushes"] for p in ev["curve"]] == [4, 8] and ev["curve"][-1]["wall_s"] == 2.0
    assert (ev["curve"][-1]["test_acc"], ev["curve"][-1]["test_loss"]) == want_test  # exact: same inputs
    assert len(ev["epochs"]) == 1 and ev["epochs"][0]["epoch"] == 1
    assert (ev["epochs"][0]["train_acc"], ev["epochs"][0]["loss"]) == want_train
    # a snapshot at the final push count is not repeated
    result.snapshots.append((8, 2.0, final))
    assert [p["pushes"] for p in evaluate_snapshots(result, model, loss_fn, data, 64, 8)["curve"]] == [4, 8]
