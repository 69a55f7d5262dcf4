"""Compressed collectives on 2, 3 and 4 ranks against the oracle "decompress every rank's payload and
average" (the rank-side body and its tolerances are in tests/mpi_compression.py)."""
import pytest

from tests.mpirun import run_mpi


@pytest.mark.parametrize("nprocs,algorithm,gather", [(2, "ring", "ring"), (3, "auto", "mpi"),
                                                     (4, "rabenseifner", "ring")])
def test_compressed_allreduce_matches_oracle(nprocs, algorithm, gather):
    result = run_mpi(nprocs, "tests.mpi_compression", algorithm, gather, timeout=120)
    assert "0 failures" in result.stdout
