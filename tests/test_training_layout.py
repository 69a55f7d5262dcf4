"""Ranks whose models differ fail at the start of training with the same ValueError on every rank,
naming the first differing rank and both layouts (hard timeout: a hang fails the test), and ranks
whose models agree train. The oracle for the shapes is the model each rank builds: synthetic data
with 12 features and 5 classes, --hidden 8 or 16. The checks run on the ranks, in the cases of
tests/mpi_layout.py (tests.mpicases), each reported as ``case_NAME: ok`` or with its failing rank."""
import pytest

from tests.mpirun import run_mpi


@pytest.mark.parametrize("P,first,alg", [(2, 1, "ring"), (3, 1, "ring"), (3, 2, "mpi")])
def test_mismatched_hidden_raises_the_same_error_on_every_rank(tmp_path, P, first, alg):
    out = run_mpi(P, "tests.mpi_layout", str(tmp_path), first, alg, "mismatch", timeout=60).stdout
    assert "case_mismatch: ok" in out, out


@pytest.mark.parametrize("P", [2, 3])
def test_mismatched_hidden_ends_the_command_line_with_status_1(tmp_path, P):
    out = run_mpi(P, "tests.mpi_layout", str(tmp_path), P - 1, "ring", "cli", timeout=60).stdout
    assert "case_cli: ok" in out, out


@pytest.mark.parametrize("P", [2, 3])
def test_matching_models_train(tmp_path, P):
    out = run_mpi(P, "tests.mpi_layout", str(tmp_path), P, "ring", "match", timeout=60).stdout
    assert "case_match: ok" in out, out
