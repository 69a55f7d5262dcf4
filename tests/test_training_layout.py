"""Ranks whose models differ fail at the start of training with the same ValueError on every rank,
naming the first differing rank and both layouts (hard timeout: a hang fails the test), and ranks
whose models agree train. The oracle for the shapes is the model each rank builds: synthetic data
with 12 features and 5 classes, --hidden 8 or 16. The checks run on the ranks, in the cases of
tests/mpi_layout.py (tests.mpicases), each reported as ``case_NAME: ok`` or with its failing rank."""
import pytest

from tests.mpirun import run_mpi

#: The cases of each rank count, as ``CASE:FIRST:ALG``, in one launch per count (training last).
LAUNCHES = {2: ["mismatch:1:ring", "cli:1:ring", "match:2:ring"],
            3: ["mismatch:1:ring", "mismatch:2:mpi", "cli:2:ring", "match:3:ring"]}


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    """Return ``out(P)``: what the launch of ``P`` ranks printed (launched once); its exit status must be 0
    unless one of its cases failed."""
    done = {}

    def out(P):
        if P not in done:
            done[P] = run_mpi(P, "tests.mpi_layout", str(tmp_path_factory.mktemp("layout")), *LAUNCHES[P],
                              timeout=120, check=False)
        res = done[P]
        assert res.returncode == 0 or ": FAILED" in res.stdout, (res.returncode, res.stdout)
        return res.stdout

    return out


@pytest.mark.parametrize("P,first,alg", [(2, 1, "ring"), (3, 1, "ring"), (3, 2, "mpi")])
def test_mismatched_hidden_raises_the_same_error_on_every_rank(layout, P, first, alg):
    out = layout(P)
    assert f"case_mismatch:{first}:{alg}: ok" in out, out


@pytest.mark.parametrize("P", [2, 3])
def test_mismatched_hidden_ends_the_command_line_with_status_1(layout, P):
    out = layout(P)
    assert f"case_cli:{P - 1}:ring: ok" in out, out


@pytest.mark.parametrize("P", [2, 3])
def test_matching_models_train(layout, P):
    out = layout(P)
    assert f"case_match:{P}:ring: ok" in out, out
