"""Skewed data across ranks (one mpiexec launch at P = 3, a non-power of two): the sample-weighted
average equals the full-batch gradient, H = 1 local SGD equals data-parallel SGD, the trainer's
partitions, remedies and local SGD end to end in both modes, and bad partitions fail before training."""
from tests.mpirun import run_mpi


def test_non_iid_on_three_ranks(tmp_path):
    out = run_mpi(3, "tests.mpi_non_iid", str(tmp_path), timeout=120).stdout
    for case in ("weighted", "local_h1", "runs", "errors"):
        assert f"case_{case}: ok" in out, out
