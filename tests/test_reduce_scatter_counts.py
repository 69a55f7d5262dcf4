"""Reduce-scatter-v (``collectives.reduce_scatter(x, counts=...)``) against ``MPI_Reduce_scatter``.

The rank-side body and its oracle are in ``tests/mpi_counts.py``: uneven and zero counts, every op and
dtype, ``ring``, ``mpi`` and ``auto``, equal bit for bit to mpi4py's ``Comm.Reduce_scatter``; counts
that differ between ranks raise ``CollectiveMismatch`` on every rank. One launch per P = 1..8.
"""
import pytest

from tests.mpirun import run_mpi


@pytest.mark.parametrize("nprocs", range(1, 9))
def test_reduce_scatter_counts_equal_mpi_reduce_scatter(nprocs):
    result = run_mpi(nprocs, "tests.mpi_counts", timeout=180)
    assert f"reduce_scatter counts: 0 failures on {nprocs} ranks" in result.stdout
    assert "483 reduce-scatter-v calls" in result.stdout
