"""Ranks whose models differ fail at the start of training with the same ValueError on every rank,
naming the first differing rank and both layouts (hard timeout: a hang fails the test), and ranks
whose models agree train. The oracle for the shapes is the model each rank builds: synthetic data
with 12 features and 5 classes, --hidden 8 or 16."""
import pytest

from tests.mpirun import run_mpi

SMALL = "parameter shapes [(12, 8), (8,), (8, 5), (5,)] (float32, 149 parameters)"
LARGE = "parameter shapes [(12, 16), (16,), (16, 5), (5,)] (float32, 293 parameters)"


@pytest.mark.parametrize("P,first,alg", [(2, 1, "ring"), (3, 1, "ring"), (3, 2, "mpi")])
def test_mismatched_hidden_raises_the_same_error_on_every_rank(tmp_path, P, first, alg):
    res = run_mpi(P, "tests.mpi_layout", str(tmp_path), "each", first, alg, timeout=60, check=False)
    assert res.returncode != 0, res.stdout
    said = [(tmp_path / f"rank-{r}.txt").read_text() for r in range(P)]
    assert all(s.startswith("ValueError: ") for s in said), said  # every rank raised
    assert len(set(said)) == 1, said  # the same message everywhere
    msg = said[0]
    assert f"rank {first} has 3 layers, {LARGE}" in msg, msg
    assert f"rank 0 has 3 layers, {SMALL}" in msg, msg
    assert not (tmp_path / "each").exists()  # found before the run directory is created


@pytest.mark.parametrize("P", [2, 3])
def test_mismatched_hidden_ends_the_command_line_with_status_1(tmp_path, P):
    res = run_mpi(P, "tests.mpi_layout", str(tmp_path), "cli", P - 1, "ring", timeout=60, check=False)
    assert res.returncode == 1, res.stdout
    assert res.stdout.count("error:") == 1 and "Traceback" not in res.stdout, res.stdout
    assert f"error: the model differs across ranks: rank {P - 1} has 3 layers, {LARGE}" in res.stdout


@pytest.mark.parametrize("P", [2, 3])
def test_matching_models_train(tmp_path, P):
    run_mpi(P, "tests.mpi_layout", str(tmp_path), "each", P, "ring", timeout=60)
    assert [(tmp_path / f"rank-{r}.txt").read_text() for r in range(P)] == ["ok"] * P
