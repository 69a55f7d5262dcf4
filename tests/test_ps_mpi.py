"""Multi-rank parameter-server tests: each launches ``tests.mpi_ps`` under mpiexec with a hard timeout.

The rank-side checks and their oracles and tolerances are described in ``tests/mpi_ps.py``; rank
counts include a non-power of two of workers (3) and several servers.
"""
import pytest

from tests.mpirun import run_mpi


@pytest.mark.parametrize("P, S", [(4, 1), (5, 2)])
def test_sum_check_is_exact(P, S):
    run_mpi(P, "tests.mpi_ps", "sum", S, 6, timeout=60)


@pytest.mark.parametrize("P, S", [(4, 1), (5, 2)])
def test_staleness_bounds_with_a_straggler(P, S):
    run_mpi(P, "tests.mpi_ps", "staleness", S, timeout=90)


@pytest.mark.parametrize("P, S", [(4, 1), (5, 2)])
def test_bsp_equals_single_process_sgd(P, S):
    run_mpi(P, "tests.mpi_ps", "oracle", S, timeout=60)


def test_resume_from_server_checkpoints(tmp_path):
    run_mpi(5, "tests.mpi_ps", "resume", 2, str(tmp_path), timeout=60)


def test_end_of_run_check_never_waits_forever_for_the_reporter():
    run_mpi(3, "tests.mpi_ps", "finish", timeout=60)


def test_balance_gives_the_straggler_a_smaller_batch():
    run_mpi(5, "tests.mpi_ps", "balance", 1, timeout=60)


@pytest.mark.parametrize("P, S, models", [(4, 1, ("asp", "ssp")), (5, 2, ("bsp",))])
def test_failed_worker(P, S, models):
    """ASP/SSP drop the silent worker and finish; BSP stops every rank with the error; no hang."""
    run_mpi(P, "tests.mpi_ps", "fail", S, *models, timeout=60)
