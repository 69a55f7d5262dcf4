"""The ctr model: sparse optimizers against their dense forms, the model's gradient against finite
differences, unique-id handling, the synthetic data, memory and configuration refusals, the hot-key
remedy, and (one 4-rank launch, ``tests/mpi_ctr.py``) sparse pulls and pushes against a dense oracle and
the three modes against one process.
"""
import numpy as np
import pytest

from ps.shards.rows import RowSharding
from tests.mpirun import run_mpi
from training.settings.config import Config
from training.ctr.data import check_ids, check_memory, make_ctr_data, memory_need
from training.ctr.hotkeys import server_load
from training.ctr.model import CTRModel, unique_rows
from training.ctr.run import check_ctr_job
from training.ctr.sparse_optim import SparseAdagrad, SparseSGD
from training.model.optim import SGD, Adagrad


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "momentum"])
def test_sparse_update_of_touched_rows_equals_the_dense_update(kind):
    rng = np.random.default_rng(0)
    dense, table = rng.standard_normal(24), None
    table = dense.copy().reshape(6, 4)
    grads = np.zeros(24)
    d = {"sgd": SGD(dense, grads, lr=0.1, momentum=0.0), "adagrad": Adagrad(dense, grads, lr=0.1, eps=1e-8),
         "momentum": SGD(dense, grads, lr=0.1, momentum=0.9)}[kind]
    s = {"sgd": SparseSGD(table, 0.1), "adagrad": SparseAdagrad(table, 0.1, 1e-8),
         "momentum": SparseSGD(table, 0.1, momentum=0.9)}[kind]
    for ids in ([0, 2], [2, 5], [1]):
        ids = np.array(ids)
        g = rng.standard_normal((ids.size, 4))
        grads[:] = 0
        grads.reshape(6, 4)[ids] = g
        d.step()
        s.sparse_step(ids, g)
    if kind == "momentum":  # lazy momentum: rows not in a batch keep their velocity unused
        assert not np.array_equal(table.ravel(), dense)
    else:
        assert np.array_equal(table.ravel(), dense)


def test_model_gradient_matches_finite_differences_and_sums_repeated_ids():
    m = CTRModel(2, 3, 2, (5,), dtype="float64", seed=1)
    ids = np.array([[[4, 4], [7, 1]], [[4, 0], [7, 7]], [[2, 4], [1, 1]]])  # row 4 and 7 repeated
    rows, inv = unique_rows(ids)
    assert rows.tolist() == [0, 1, 2, 4, 7] and np.array_equal(rows[inv], ids)
    values = np.random.default_rng(2).standard_normal((rows.size, 3))
    y = np.array([1.0, 0.0, 1.0])
    _, g = m.step(values, inv, y)
    num = np.zeros_like(values)
    for i in np.ndindex(values.shape):
        for sign in (1, -1):
            v = values.copy()
            v[i] += sign * 1e-6
            z = m.logits(v, inv)
            num[i] += sign * np.mean(np.logaddexp(0, z) - y * z) / 2e-6
    assert np.allclose(g, num, atol=1e-7)


def test_synthetic_data_is_seeded_and_reports_the_planted_truth():
    cfg = Config(model="ctr", ctr_rows=2000, ctr_tables=4, ctr_train=3000, ctr_test=4000)
    a, b = make_ctr_data(cfg), make_ctr_data(cfg)
    assert np.array_equal(a.train_ids, b.train_ids) and np.array_equal(a.test_y, b.test_y)
    assert 0.65 < a.best_auc < 0.95 and a.train_ids.max() < 2000 and a.train_ids.min() >= 0
    first = a.train_ids[:, 3] - a.offsets[3]  # Zipf: the table's first rows are the hot ones
    assert (first == 0).mean() > 10 * (first == 50).mean()


def test_bad_ids_and_configurations_are_refused_with_their_reason():
    with pytest.raises(ValueError, match="negative"):
        check_ids(np.array([3, -1]), 10)
    with pytest.raises(ValueError, match="out of range"):
        check_ids(np.array([10]), 10)
    big = Config(model="ctr", mode="dp", ctr_rows=10 ** 6, memory_gb=0.1)
    with pytest.raises(ValueError, match=r"needs \d+\.\d+ GiB per rank"):
        check_memory(big, 4, 4)
    assert memory_need(big.replace(mode="hybrid", servers=2, optimizer="sgd"), 6) < memory_need(big, 6)
    with pytest.raises(ValueError, match="multiple of the 3 worker"):
        check_ctr_job(Config(model="ctr", mode="hybrid", servers=1, batch_size=64), 4)
    with pytest.raises(ValueError, match="sgd or adagrad"):
        Config(model="ctr", mode="ps", optimizer="adam").validate()
    with pytest.raises(ValueError, match="needs model 'ctr'"):
        Config(mode="hybrid").validate()


def test_hot_rows_are_split_over_every_server():
    sh = RowSharding(100, 8, 4, "range", hot=[0, 1])
    assert sh.split == 4 and sorted(sh.server_of[:4]) == [0, 1, 2, 3]
    assert sh.load(np.array([0])).tolist() == [0.25] * 4
    table = np.arange(800.0).reshape(100, 8)
    assert np.array_equal(sh.assemble([sh.shard(table, s) for s in range(4)]), table)


def test_hot_key_remedy_balances_the_servers_at_four():
    cfg = Config(model="ctr", ctr_rows=20000, ctr_tables=8, ctr_train=8192, ctr_test=10, batch_size=1024)
    data = make_ctr_data(cfg)
    rng_load = server_load(cfg, data, 4, 4, "range", steps=4)
    hash_load = server_load(cfg, data, 4, 4, "hash", steps=4)
    assert rng_load["max_over_mean"] > 1.2
    fixed = server_load(cfg, data, 4, 4, "range", hot=4096, steps=4)  # hot_for_balance's answer here
    assert fixed["max_over_mean"] <= 1.2 < rng_load["max_over_mean"]
    assert hash_load["max_over_mean"] >= 1.0


def test_sparse_push_pull_three_modes_async_and_resume_match_their_oracles_on_four_ranks(tmp_path):
    run_mpi(4, "tests.mpi_ctr", "all", str(tmp_path), timeout=240)


def test_study_commands_and_report_at_tiny_sizes(tmp_path):
    from experiments.cluster.ctr import commands, report
    from plots.ctr import draw

    cmds = commands(str(tmp_path), repeats=3)
    assert len(cmds) == 2 * 4 * 3 * 3 and all("--model ctr" in c and "--nodes" in c for c in cmds)
    tiny = ["--model", "ctr", "--ctr-rows", "300", "--ctr-tables", "3", "--ctr-train", "512", "--ctr-test", "256",
            "--batch-size", "64", "--epochs", "1", "--hidden", "8", "--optimizer", "adagrad", "--lr", "0.05",
            "--no-progress", "--run-dir", str(tmp_path)]
    run_mpi(2, "training.train", *tiny, "--name", "dp-100mbit-n300-r1", timeout=60)
    run_mpi(3, "training.train", *tiny, "--mode", "hybrid", "--servers", "1", "--name", "hybrid-100mbit-n300-r1",
            timeout=60)
    rec = report(str(tmp_path), str(tmp_path / "ctr_study.json"))
    assert {p["mode"] for p in rec["points"]} == {"dp", "hybrid"} and 0 < rec["curve"][300] <= 300
    assert draw(rec, str(tmp_path / "ctr.png")).endswith(".png")
