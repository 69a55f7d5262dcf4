"""Log output: ``[rank R] LEVEL: message`` on stderr, set up once by a program, level from ``--log-level``
or ``COMMLAB_LOG_LEVEL``; library code never configures the root logger. Oracles: the exact lines
expected, the root logger's handlers before and after, and each rank's own rank in its lines under
``mpiexec``."""
import io
import logging

import pytest

from commlab.logs import ENV, LOGGER, get_logger, log_level, setup_logging
from tests.mpirun import run_mpi
from training.train import main

TINY = ["--data", "synthetic", "--samples", "200", "--features", "8", "--classes", "3", "--hidden", "8",
        "--batch-size", "32", "--epochs", "1", "--no-progress", "--checkpoint-every", "0"]


@pytest.fixture(autouse=True)
def _restore_commlab_logger():
    log = logging.getLogger(LOGGER)
    saved = (list(log.handlers), log.level, log.propagate)
    yield
    log.handlers[:] = saved[0]
    log.setLevel(saved[1])
    log.propagate = saved[2]


def test_format_level_and_environment(monkeypatch):
    root = list(logging.getLogger().handlers)
    out = io.StringIO()
    monkeypatch.delenv(ENV, raising=False)
    setup_logging(3, stream=out)
    get_logger("training.train").info("step %d", 7)
    get_logger("training.train").debug("hidden at INFO")
    setup_logging(3, "warning", stream=out)  # again: replaces its handler, no doubled lines
    get_logger("x").info("hidden at WARNING")
    get_logger("x").warning("shown")
    assert out.getvalue() == "[rank 3] INFO: step 7\n[rank 3] WARNING: shown\n"
    assert logging.getLogger().handlers == root  # the root logger is left alone
    monkeypatch.setenv(ENV, "DEBUG")
    assert log_level() == logging.DEBUG and log_level("error") == logging.ERROR  # the argument wins
    monkeypatch.setenv(ENV, "loud")
    with pytest.raises(ValueError, match=f"{ENV} must be one of debug, info, warning, error, critical, got 'loud'"):
        log_level()
    with pytest.raises(ValueError, match="--log-level must be one of"):
        log_level("verbose")


def test_trainer_logs_through_the_level(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert main([*TINY, "--run-dir", str(tmp_path), "--name", "a"]) == 0
    out, err = capsys.readouterr()
    assert err.startswith("[rank 0] INFO: synthetic: 160 train / 40 test samples") and "test accuracy" in out, err
    assert main([*TINY, "--run-dir", str(tmp_path), "--name", "b", "--log-level", "warning"]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(ENV, "warning")
    assert main([*TINY, "--run-dir", str(tmp_path), "--name", "c"]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(ENV, "loud")  # a bad environment: one error line, no run directory
    assert main([*TINY, "--run-dir", str(tmp_path), "--name", "d"]) == 1
    assert capsys.readouterr().err.startswith(f"error: {ENV} must be one of") and not (tmp_path / "d").exists()
    with pytest.raises(SystemExit) as e:
        main([*TINY, "--run-dir", str(tmp_path), "--log-level", "verbose"])
    assert e.value.code == 2 and "log_level must be one of debug" in capsys.readouterr().err


def test_every_rank_logs_with_its_rank(tmp_path):
    out = run_mpi(2, "training.train", *TINY, "--run-dir", str(tmp_path), "--log-level", "debug", timeout=90).stdout
    for r in (0, 1):
        assert any(ln.startswith(f"[rank {r}] DEBUG: ") and "per rank" in ln for ln in out.splitlines()), out
    assert out.count("[rank 0] INFO: synthetic:") == 1 and "[rank 1] INFO" not in out, out
