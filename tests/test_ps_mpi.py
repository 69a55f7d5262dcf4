"""Multi-rank parameter-server tests: each rank count launches ``tests.mpi_ps`` once under mpiexec with a
hard timeout, running every case of that count in turn; each test reads its own case's count line.

The rank-side checks and their oracles and tolerances are described in ``tests/mpi_ps.py``; rank
counts include a non-power of two of workers (3) and several servers.
"""
import re

import pytest

from tests.mpirun import run_mpi

#: (P, S) -> the cases of that launch, each as its words after S; ``fail`` last (see tests/mpi_ps.py).
LAUNCHES = {(4, 1): [("sum", 6), ("staleness",), ("oracle",), ("fail", "asp", "ssp")],
            (5, 2): [("sum", 6), ("staleness",), ("oracle",), ("resume", "DIR"), ("fail", "bsp")],
            (5, 1): [("balance",)]}


@pytest.fixture(scope="module")
def ps_case(tmp_path_factory):
    """Return ``check(P, S, case)``: assert that ``case`` passed in the launch of (P, S), launched once."""
    done = {}

    def check(P, S, case):
        if (P, S) not in done:
            directory = str(tmp_path_factory.mktemp("ps_resume"))
            argv = []
            for name, *more in LAUNCHES[P, S]:
                argv += ["+"] * bool(argv) + [name, S, *(directory if w == "DIR" else w for w in more)]
            done[P, S] = run_mpi(P, "tests.mpi_ps", *argv, timeout=240, check=False)
        res = done[P, S]
        assert f"mpi_ps {case}: 0 failures on {P} ranks" in res.stdout, (res.returncode, res.stdout)
        other = re.search(r"mpi_ps \w+: [1-9]\d* failures", res.stdout)  # a non-zero exit: another case failed
        assert res.returncode == 0 or other, (res.returncode, res.stdout)

    return check


@pytest.mark.parametrize("P, S", [(4, 1), (5, 2)])
def test_sum_check_is_exact(ps_case, P, S):
    ps_case(P, S, "sum")


@pytest.mark.parametrize("P, S", [(4, 1), (5, 2)])
def test_staleness_bounds_with_a_straggler(ps_case, P, S):
    ps_case(P, S, "staleness")


@pytest.mark.parametrize("P, S", [(4, 1), (5, 2)])
def test_bsp_equals_single_process_sgd(ps_case, P, S):
    ps_case(P, S, "oracle")


def test_end_of_run_check_never_waits_forever_for_the_reporter():
    run_mpi(3, "tests.mpi_ps", "finish", timeout=60)


def test_resume_from_server_checkpoints(ps_case):
    ps_case(5, 2, "resume")


def test_balance_gives_the_straggler_a_smaller_batch(ps_case):
    ps_case(5, 1, "balance")


@pytest.mark.parametrize("P, S", [(4, 1), (5, 2)])
def test_failed_worker(ps_case, P, S):
    """ASP/SSP (P = 4) drop the silent worker and finish; BSP (P = 5) stops every rank with the error; no hang."""
    ps_case(P, S, "fail")
