"""Skewed partitions and the shard sampler (pure NumPy, no MPI): coverage, reproducibility, the
requested label statistics, redraws, bad input, class-balanced resampling and the shared subset."""
import numpy as np
import pytest

from training.settings.cli import parse_args
from training.settings.config import Config
from training.data.partition import check_partition, draw_partition, label_histogram, parse_partition
from training.data.shard_sampler import ShardSampler, shared_subset
from training.data.skew import check_skew

C = 10
LABELS = np.random.default_rng(7).permutation(np.arange(1400) % C)  # 140 samples per class
SPECS = ("iid", "dirichlet:alpha=1", "dirichlet:alpha=0.1", "classes:k=3", "classes:k=5", "quantity:alpha=1")


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("workers", [4, 7])
def test_every_sample_lands_on_exactly_one_worker_and_the_seed_fixes_the_draw(spec, workers):
    p = draw_partition(LABELS, workers, spec, seed=3, n_classes=C)
    together = np.concatenate(p.shards)
    assert together.size == LABELS.size and np.array_equal(np.sort(together), np.arange(LABELS.size))
    again = draw_partition(LABELS, workers, spec, seed=3, n_classes=C)
    assert all(np.array_equal(a, b) for a, b in zip(p.shards, again.shards))
    other = draw_partition(LABELS, workers, spec, seed=4, n_classes=C)
    assert not all(np.array_equal(a, b) for a, b in zip(p.shards, other.shards))


def test_the_draw_depends_on_the_seed_alone():
    """PCG64 from the seed, no machine state: a fixed seed gives these shards on any machine (a NumPy
    release that changed its Dirichlet or permutation streams would change them too)."""
    p = draw_partition(LABELS, 4, "dirichlet:alpha=0.5", seed=11, n_classes=C)
    assert p.sizes == [428, 263, 336, 373]
    assert [s[:3].tolist() for s in p.shards] == [[1, 2, 4], [8, 9, 17], [7, 13, 14], [0, 3, 25]]


def test_every_rank_compares_the_skew_settings_before_training():
    from training.driver.preflight import PER_RANK

    keys = ("partition", "resample", "shared_fraction", "local_steps", "post_local_epoch", "average_optimizer",
            "weighted_average")
    assert set(keys) <= set(Config().to_dict()) and not set(keys) & PER_RANK


@pytest.mark.parametrize("alpha", [0.1, 1.0])
def test_dirichlet_proportions_have_the_dirichlet_mean_and_variance_over_many_seeds(alpha):
    """Each class's share on a worker is Dirichlet(alpha) distributed: mean 1/W and variance
    (1/W)(1 - 1/W) / (W alpha + 1) (the shares are cut at whole samples: 140 per class). Over 300
    seeds x 10 classes the mean's standard error is ~0.005 at alpha 0.1; the tolerances are ~5 of them."""
    W = 4
    shares = []
    for seed in range(300):
        hist = label_histogram(LABELS, draw_partition(LABELS, W, f"dirichlet:alpha={alpha}", seed, C,
                                                      max_redraws=0).shards, C)
        shares.append(hist / hist.sum(axis=0))  # (W, C): fraction of each class on each worker
    shares = np.stack(shares)
    assert np.allclose(shares.mean(axis=(0, 2)), 1 / W, atol=0.025), shares.mean(axis=(0, 2))
    want = (1 / W) * (1 - 1 / W) / (W * alpha + 1)
    assert abs(shares.var() - want) < 0.15 * want, (shares.var(), want)


def test_classes_k_gives_every_worker_k_classes_and_every_class_a_worker():
    for k in (2, 3, 5):
        p = draw_partition(LABELS, 5, f"classes:k={k}", seed=1, n_classes=C)
        hist = label_histogram(LABELS, p.shards, C)
        assert ((hist > 0).sum(axis=1) == k).all(), hist
        assert (hist.sum(axis=0) == 140).all()


def test_quantity_skew_keeps_the_labels_iid_but_not_the_sizes():
    p = draw_partition(LABELS, 4, "quantity:alpha=0.5", seed=2, n_classes=C)
    assert max(p.sizes) > 1.5 * min(p.sizes), p.sizes
    hist = label_histogram(LABELS, p.shards, C)
    big = int(np.argmax(p.sizes))
    assert np.allclose(hist[big] / hist[big].sum(), 0.1, atol=0.05), hist[big]


def test_a_draw_leaving_a_worker_without_a_batch_is_redrawn_with_the_next_seed():
    spec, min_size = "dirichlet:alpha=0.1", 150
    first = draw_partition(LABELS, 4, spec, 0, C, min_size=1, max_redraws=0)
    assert min(first.sizes) < min_size  # seed 0 alone would not do
    p = draw_partition(LABELS, 4, spec, 0, C, min_size=min_size)
    assert p.redraws >= 1 and p.seed == p.redraws and min(p.sizes) >= min_size
    same = draw_partition(LABELS, 4, spec, p.seed, C, min_size=1, max_redraws=0)
    assert all(np.array_equal(a, b) for a, b in zip(p.shards, same.shards))
    with pytest.raises(ValueError, match="draws .* fewer than 340 samples"):
        draw_partition(LABELS, 4, spec, 0, C, min_size=340, max_redraws=3)


@pytest.mark.parametrize("text, message", [
    ("dirichlet:alpha=0", "alpha must be a finite number > 0"),
    ("dirichlet:alpha=-1", "alpha must be a finite number > 0"),
    ("quantity:alpha=nan", "alpha must be a finite number > 0"),
    ("dirichlet:k=3", "expected dirichlet:alpha=VALUE"),
    ("classes:k=0", "k must be >= 1"),
    ("classes:k=two", "k must be an integer"),
    ("shards:k=2", "partition must be iid, dirichlet"),
    ("iid:alpha=1", "iid takes no parameter"),
])
def test_bad_partitions_are_refused_naming_the_option(text, message):
    with pytest.raises(ValueError, match=message):
        parse_partition(text)
    with pytest.raises(SystemExit):  # the command line refuses it too (argparse: usage + reason)
        parse_args(["--partition", text])


def test_classes_k_beyond_the_classes_or_leaving_a_class_out_is_refused():
    with pytest.raises(ValueError, match="at most the number of classes"):
        check_partition(parse_partition("classes:k=11"), C, 4)
    with pytest.raises(ValueError, match="some class would be on no worker"):
        check_skew(Config(partition="classes:k=2", batch_size=8), LABELS, C, 4)
    with pytest.raises(ValueError, match="one batch"):
        check_skew(Config(partition="quantity:alpha=0.01", batch_size=1200), LABELS, C, 4)


@pytest.mark.parametrize("changes, message", [
    ({"local_steps": 0}, "local_steps must be >= 1"),
    ({"shared_fraction": 1.0}, "shared_fraction must be in"),
    ({"post_local_epoch": 2}, "need local_steps > 1"),
    ({"local_steps": 4, "mode": "ps"}, "needs mode 'dp'"),
    ({"local_steps": 4, "weighted_average": True, "compression": "topk"}, "needs compression 'none'"),
    ({"weighted_average": True, "compression": "topk"}, "needs compression 'none'"),
    ({"weighted_average": True, "mode": "ps"}, "weighted_average needs mode 'dp'"),
    ({"average_optimizer": True}, "need local_steps > 1"),
    ({"partition": "classes:k=3", "tensor_parallel": 2}, "not the model-parallel grid"),
])
def test_bad_skew_settings_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        Config().replace(**changes)


def test_an_epoch_is_n_over_b_steps_with_each_worker_wrapping_around_its_shard():
    p = draw_partition(LABELS, 4, "quantity:alpha=1", seed=0, n_classes=C, min_size=16)
    samplers = [ShardSampler(s, LABELS, r, 4, 64, seed=0) for r, s in enumerate(p.shards)]
    for s, shard in zip(samplers, p.shards):
        assert s.num_batches(16) == -(-1400 // 64) and len(s) == 22 * 16
        idx = s.indices(0)
        assert np.isin(idx, shard).all()
        first = idx[:min(shard.size, idx.size)]  # the first pass over the shard repeats no sample
        assert np.unique(first).size == first.size
        assert np.array_equal(idx, s.indices(0)) and not np.array_equal(idx, s.indices(1))


def test_resampling_gives_class_balanced_batches():
    p = draw_partition(LABELS, 4, "dirichlet:alpha=0.1", seed=1, n_classes=C, min_size=16)
    w = int(np.argmax([(h > 0).sum() for h in label_histogram(LABELS, p.shards, C)]))
    present = np.flatnonzero(label_histogram(LABELS, [p.shards[w]], C)[0])
    plain = ShardSampler(p.shards[w], LABELS, w, 4, 64, seed=0)
    balanced = ShardSampler(p.shards[w], LABELS, w, 4, 64, seed=0, balance=True)
    spread = []
    for b in balanced.batches(0, 16):
        counts = np.bincount(LABELS[b], minlength=C)[present]
        assert counts.max() - counts.min() <= 1 and counts.sum() == 16, counts
        assert np.isin(b, p.shards[w]).all()
    for b in plain.batches(0, 16):
        counts = np.bincount(LABELS[b], minlength=C)[present]
        spread.append(counts.max() - counts.min())
    assert max(spread) > 1  # the skewed shard's own batches are not balanced: the check can fail


def test_the_shared_subset_is_iid_and_mixed_into_every_worker():
    shared = shared_subset(1400, 0.05, seed=0)
    assert shared.size == 70 and np.array_equal(shared, shared_subset(1400, 0.05, seed=0))
    assert np.bincount(LABELS[shared], minlength=C).min() >= 2  # every class, roughly 7 each
    p = draw_partition(LABELS, 4, "classes:k=3", seed=0, n_classes=C)
    s = ShardSampler(p.shards[0], LABELS, 0, 4, 64, seed=0, shared=shared)
    seen = np.unique(np.concatenate([s.indices(e) for e in range(5)]))
    assert np.isin(shared, seen).mean() > 0.9 and np.unique(LABELS[seen]).size == C
