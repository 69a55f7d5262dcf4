"""Parameter-server versions, conflict policies and retries applied exactly once.

The multi-rank cases and their oracles (a fault-free run, ps-lite's sum check, a run without bad
requests) are described in ``tests/mpi_ps_versions.py``; here they run in one launch with a hard
timeout, beside the single-process checks of the options.
"""
import pytest

from ps.job.settings import PSOptions
from tests.mpirun import run_mpi
from training.settings.cli import parse_args


def test_versions_conflicts_retries_and_bad_requests_on_four_ranks():
    run_mpi(4, "tests.mpi_ps_versions", "all", timeout=180)


@pytest.mark.parametrize("fields, words", [
    ({"conflict": "cas"}, ["needs asp or ssp"]),
    ({"consistency": "asp", "conflict": "merge"}, ["conflict must be one of"]),
    ({"consistency": "asp", "conflict": "cas", "conflict_lag": -1}, ["conflict_lag"]),
    ({"retries": -2}, ["retries"]),
    ({"retries": 2, "retry_s": 0.0}, ["retry_s"]),
    ({"drop_replies": 1.0}, ["drop_replies"]),
    ({"late_replies": 0.1, "late_s": float("nan")}, ["late_s"]),
])
def test_bad_conflict_and_retry_settings_are_refused_before_any_message(fields, words):
    with pytest.raises(ValueError) as info:
        PSOptions(**fields).validate(size=3)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_trainer_flags_reach_the_options():
    cfg = parse_args(["--mode", "ps", "--consistency", "ssp", "--ps-conflict", "cas", "--ps-conflict-lag", "3",
                      "--ps-retries", "4"])
    assert (cfg.ps_conflict, cfg.ps_conflict_lag, cfg.ps_retries) == ("cas", 3, 4)
    with pytest.raises(SystemExit):
        parse_args(["--ps-conflict", "merge"])
