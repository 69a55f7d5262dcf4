"""Data loading, distributed sampling and configuration parsing (single process)."""
import gzip

import numpy as np
import pytest

from training.settings.cli import parse_args
from collectives.compression import parse_compression_arg
from training.settings.config import Config
from training.data.sampling import DistributedSampler, eval_shard
from training.data.datasets import load_digits, load_mnist, make_synthetic, read_idx, write_idx


def _shares(n, P, **kw):
    return [DistributedSampler(n, r, P, shuffle=False, **kw).indices(0).tolist() for r in range(P)]


def test_sampler_examples_from_pytorch_semantics():
    assert _shares(10, 4) == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]
    assert _shares(10, 4, drop_last=True) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert _shares(3, 7) == [[0], [1], [2], [0], [1], [2], [0]]
    assert _shares(3, 7, drop_last=True) == [[]] * 7
    assert _shares(0, 3) == [[], [], []]


@pytest.mark.parametrize("n,P", [(10, 4), (97, 3), (5, 5), (1, 2)])
def test_sampler_shuffled_epoch_is_one_shared_permutation(n, P):
    for epoch in (0, 1):
        parts = [DistributedSampler(n, r, P, seed=3).indices(epoch) for r in range(P)]
        assert len({len(p) for p in parts}) == 1  # every rank: same number of samples
        merged = np.empty(len(parts[0]) * P, np.int64)
        for r, p in enumerate(parts):
            merged[r::P] = p
        perm = np.random.default_rng(3 + epoch).permutation(n)
        np.testing.assert_array_equal(merged[:n], perm)  # the permutation, then wrapped padding
        np.testing.assert_array_equal(merged[n:], np.resize(perm, len(merged))[n:])
    a = DistributedSampler(n, 0, P, seed=3)
    if n > 2:
        assert not np.array_equal(a.indices(0), a.indices(1))  # reshuffled each epoch


def test_eval_shards_cover_every_sample_once():
    for n, P in [(10, 4), (3, 7), (0, 2), (100, 3)]:
        got = np.concatenate([np.arange(n)[eval_shard(n, r, P)] for r in range(P)])
        np.testing.assert_array_equal(got, np.arange(n))


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_loader(tmp_path, gz):
    rng = np.random.default_rng(0)
    sfx = ".gz" if gz else ""
    xtr = rng.integers(0, 256, (12, 4, 3), dtype=np.uint8)
    ytr = rng.integers(0, 10, 12).astype(np.uint8)
    xte = rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)
    yte = np.array([9, 0, 1, 2, 3], np.uint8)
    for stem, arr in (("train-images-idx3-ubyte", xtr), ("train-labels-idx1-ubyte", ytr),
                      ("t10k-images-idx3-ubyte", xte), ("t10k-labels-idx1-ubyte", yte)):
        write_idx(str(tmp_path / (stem + sfx)), arr)
    raw = (tmp_path / ("train-labels-idx1-ubyte" + sfx)).read_bytes()
    if gz:
        assert raw[:2] == b"\x1f\x8b"
        raw = gzip.decompress(raw)
    assert raw[:8] == bytes([0, 0, 8, 1, 0, 0, 0, 12])  # the IDX header, by hand
    ds = load_mnist(str(tmp_path))
    assert ds.x_train.shape == (12, 12) and ds.x_test.shape == (5, 12) and ds.n_classes == 10
    np.testing.assert_array_equal(ds.y_train, ytr)
    np.testing.assert_array_equal(ds.y_test, yte)
    flat = xtr.reshape(12, -1) / 255.0
    mu, sd = flat.mean(0), flat.std(0)
    sd[sd == 0] = 1
    np.testing.assert_allclose(ds.x_train, (flat - mu) / sd, rtol=1e-12)
    np.testing.assert_allclose(ds.x_test, (xte.reshape(5, -1) / 255.0 - mu) / sd, rtol=1e-12)


def test_idx_roundtrip_types_and_errors(tmp_path):
    p = str(tmp_path / "a.idx")
    for arr in (np.arange(6, dtype=np.int32).reshape(2, 3), np.linspace(0, 1, 4).astype(np.float32)):
        write_idx(p, arr)
        back = read_idx(p)
        assert back.dtype == arr.dtype
        np.testing.assert_array_equal(back, arr)
    with open(p, "rb") as f:
        data = f.read()
    with open(p, "wb") as f:
        f.write(data[:-3])
    with pytest.raises(ValueError, match="a.idx"):
        read_idx(p)
    with open(p, "wb") as f:
        f.write(b"PK\x03\x04junk")
    with pytest.raises(ValueError, match="not an IDX"):
        read_idx(p)
    with pytest.raises(FileNotFoundError, match="train-images"):
        load_mnist(str(tmp_path))


def test_digits_match_scikit_learn_and_split_is_standardized(monkeypatch, tmp_path):
    """Oracle: scikit-learn's raw digits, the indices its seeded, stratified ``train_test_split`` holds
    out, and NumPy's mean and (population) standard deviation of the train rows; tolerance 1e-12."""
    sk = pytest.importorskip("sklearn.datasets").load_digits()
    split = pytest.importorskip("sklearn.model_selection").train_test_split
    monkeypatch.setenv("COMMLAB_CACHE", str(tmp_path))  # built here, not read from an earlier run
    ds = load_digits(test_fraction=0.2, seed=0)
    assert len(ds.y_train) + len(ds.y_test) == 1797 and len(ds.y_test) == 359
    assert ds.n_features == 64 and ds.n_classes == 10
    assert ds.x_train.dtype == np.float64 and ds.y_train.dtype == np.int64
    tr, te = split(np.arange(1797), test_size=359, random_state=0, stratify=sk.target)
    assert sorted(np.concatenate([tr, te]).tolist()) == list(range(1797))  # a partition
    assert not np.array_equal(np.sort(te), np.arange(359))  # shuffled, not the first rows
    np.testing.assert_array_equal(ds.y_train, sk.target[tr])
    np.testing.assert_array_equal(ds.y_test, sk.target[te])
    share = np.bincount(ds.y_test, minlength=10) / np.bincount(sk.target, minlength=10)
    assert np.all(np.abs(share - 0.2) < 0.01), share  # every digit held out in its proportion
    x = sk.data[tr]
    mu, sd = x.mean(0), x.std(0)
    sd[sd == 0] = 1  # constant pixels are only centred
    np.testing.assert_allclose(ds.x_train, (x - mu) / sd, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ds.x_test, (sk.data[te] - mu) / sd, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ds.x_train.mean(0), 0, atol=1e-12)
    np.testing.assert_array_equal(load_digits(test_fraction=0.2, seed=0).x_test, ds.x_test)  # seeded
    assert not np.array_equal(load_digits(test_fraction=0.2, seed=1).y_test, ds.y_test)


def test_digits_cache_returns_what_was_built_and_rebuilds_a_damaged_entry(monkeypatch, tmp_path):
    """Oracle: the first, uncached load (scikit-learn's split); equal arrays bitwise."""
    pytest.importorskip("sklearn")
    monkeypatch.setenv("COMMLAB_CACHE", str(tmp_path))
    built = load_digits(test_fraction=0.25, seed=3)
    (entry,) = tmp_path.glob("digits-*.npz")
    cached = load_digits(test_fraction=0.25, seed=3)
    for key in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(cached, key), getattr(built, key))
        assert getattr(cached, key).dtype == getattr(built, key).dtype
    assert cached.n_classes == 10 and cached.name == "digits"
    other = load_digits(test_fraction=0.25, seed=4)  # other arguments, another entry
    assert len(list(tmp_path.glob("digits-*.npz"))) == 2 and not np.array_equal(other.y_test, built.y_test)
    small = make_synthetic(samples=300, features=20, classes=3, seed=2)  # cached the same way
    cached_small = make_synthetic(samples=300, features=20, classes=3, seed=2)
    assert len(list(tmp_path.glob("synthetic-*.npz"))) == 1 and cached_small.n_classes == 3
    np.testing.assert_array_equal(cached_small.x_train, small.x_train)
    np.testing.assert_array_equal(cached_small.y_test, small.y_test)
    entry.write_bytes(b"PK\x03\x04 damaged")
    again = load_digits(test_fraction=0.25, seed=3)
    np.testing.assert_array_equal(again.x_test, built.x_test)
    assert not list(tmp_path.glob("*.tmp"))


def test_synthetic_is_seeded_and_sized():
    a = make_synthetic(samples=500, features=33, classes=4, seed=1)
    b = make_synthetic(samples=500, features=33, classes=4, seed=1)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert a.x_train.shape == (400, 33) and a.x_test.shape == (100, 33) and a.n_classes == 4
    assert set(np.unique(a.y_train)) == {0, 1, 2, 3}
    # nearest class mean classifies well: the problem is learnable but not trivially separable
    means = np.stack([a.x_train[a.y_train == c].mean(0) for c in range(4)])
    pred = ((a.x_test[:, None, :] - means) ** 2).sum(-1).argmin(1)
    assert (pred == a.y_test).mean() > 0.9


def test_config_cli_roundtrip_and_rejections(tmp_path):
    cfg = parse_args(["--hidden", "32,16", "--lr", "0.01", "--no-shuffle", "--compression", "topk",
                      "--compression-arg", "ratio=0.01", "--compression-arg", "ef=true",
                      "--compression-arg", "mode=fast", "--algorithm", "ring", "--bucket-bytes", "4096"])
    assert cfg.hidden == (32, 16) and cfg.lr == 0.01 and cfg.shuffle is False
    assert cfg.compression_args == {"ratio": 0.01, "ef": True, "mode": "fast"}
    assert Config.from_dict(cfg.to_dict()) == cfg
    assert parse_compression_arg("k=3") == ("k", 3)
    with pytest.raises(ValueError, match="unknown configuration key"):
        Config.from_dict({"learning_rate": 1})
    with pytest.raises(ValueError, match="algorithm"):
        Config(algorithm="bogus").validate()
    with pytest.raises(ValueError, match="batch_size"):
        Config(batch_size=0).validate()
    with pytest.raises(SystemExit):
        parse_args(["--no-such-flag"])
    # --resume takes the saved configuration as the base; given flags override it
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.json").write_text('{"config": {"lr": 0.5, "epochs": 3, "hidden": [7]}}')
    got = parse_args(["--resume", str(run), "--epochs", "6"])
    assert (got.lr, got.epochs, got.hidden, got.resume) == (0.5, 6, (7,), str(run))


def test_help_documents_every_flag():
    from training.settings.cli import HELP, build_parser

    text = build_parser().format_help()
    for name in HELP:
        flag = "--compression-arg" if name == "compression_args" else "--" + name.replace("_", "-")
        assert flag in text, flag
