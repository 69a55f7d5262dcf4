"""Replicated parameter-server shards (``--ps-replicas``): chain order, fencing, failover, and crashes.

The oracle is a fault-free run (unreplicated, or replicated without a fault): under BSP the final
parameters must be equal bit for bit, and the servers' records must show no acknowledged update
lost. The rank-side checks are described in ``tests/mpi_ps_replicas.py``. Crashed ranks leave with
a non-zero exit (MPICH, ``mpiexec -disable-auto-cleanup``; Open MPI: ``SIGKILL`` under
``--enable-recovery``): success is read from the records the survivors write, never from the
launcher's exit status. Time bounds: a failover within ``--ps-timeout`` + 0.5 s of a request, plus
2 s of slack for a loaded machine.
"""
import glob
import json
import os
import re
import time

import numpy as np
import pytest

from ps.options import PSOptions
from tests.mpirun import run_mpi

TIMEOUT = 1.0  # --ps-timeout of the crash runs (seconds), as tests/mpi_ps_replicas.py's
SLACK = 2.0    # seconds of slack on a loaded 2-core machine
CRASH = ("-disable-auto-cleanup",)  # MPICH keeps the survivors of a non-zero exit running


def _crash_time(out):
    times = [float(t) for t in re.findall(r"injected crash at ([0-9.]+)", out)]
    assert times, out
    return min(times)


@pytest.mark.parametrize("case", ["chain", "fence"])
def test_replication_without_a_crash(case):
    """Chain order and equality with the unreplicated run; a delayed old primary is fenced off."""
    run_mpi(5, "tests.mpi_ps_replicas", case, timeout=90)


def test_a_backups_death_loses_nothing(tmp_path):
    res = run_mpi(5, "tests.mpi_ps_replicas", "backup", str(tmp_path), timeout=60, check=False, mpiexec_args=CRASH)
    _crash_time(res.stdout)
    with open(tmp_path / "result.json") as f:
        got = json.load(f)
    assert got["equal"] and got["lost_acknowledged"] == 0 and got["servers_lost"] == [1], (got, res.stdout)
    assert got["replicas"][0]["cut"] == 1 and got["status"] == ["done"] * 3, got
    assert got["failovers"] == [0, 0, 0], got  # the primary never stopped answering


def test_every_replica_of_a_shard_dead_stops_every_worker(tmp_path):
    """Both replicas of the only shard exit: each worker fails over once, then stops with a clear
    error within two failover timeouts of the second crash; nothing hangs."""
    start = time.time()
    res = run_mpi(5, "tests.mpi_ps_replicas", "all", str(tmp_path), timeout=60, check=False, mpiexec_args=CRASH)
    crashes = [float(t) for t in re.findall(r"injected crash at ([0-9.]+)", res.stdout)]
    assert len(crashes) == 2, res.stdout
    files = sorted(glob.glob(str(tmp_path / "worker-*.json")))
    assert [os.path.basename(f) for f in files] == ["worker-2.json", "worker-3.json", "worker-4.json"], res.stdout
    for path in files:
        with open(path) as f:
            got = json.load(f)
        assert "every replica of shard 0 (server ranks [0, 1]) stopped answering" in got["error"], got
        assert got["time"] - max(crashes) <= 2 * (TIMEOUT + 0.5) + SLACK, (got, crashes)
    assert time.time() - start < 45, res.stdout


COMMON = ["--data", "digits", "--hidden", "16", "--epochs", "1", "--batch-size", "48", "--no-progress",
          "--threads", "1", "--mode", "ps", "--servers", "2", "--ps-replicas", "2", "--ps-timeout", str(TIMEOUT),
          "--optimizer", "sgd", "--momentum", "0.9"]
TWO_SHARDS = [*COMMON, "--servers", "4"]  # ranks 0-1 hold shard 0, ranks 2-3 shard 1; two workers


def test_training_survives_the_primarys_crash(tmp_path):
    """``--servers 4 --ps-replicas 2`` (two shards): the primary of shard 1 (rank 2) exits at its 40th
    message; the run ends with the fault-free run's parameters (bitwise) and test accuracy, its
    records written by a worker, and the next update applied within the failover timeout + 1 s of the
    crash. The workers waiting out shard 1's failover stay alive to shard 0 (heartbeats)."""
    run_mpi(6, "training.train", *TWO_SHARDS, "--run-dir", str(tmp_path), "--name", "clean", timeout=90)
    res = run_mpi(6, "experiments.faults.crash", "ps", 2, 40, *TWO_SHARDS, "--run-dir", str(tmp_path), "--name",
                  "crash", timeout=90, check=False, mpiexec_args=CRASH)
    crash = _crash_time(res.stdout)
    runs = {}
    for name in ("clean", "crash"):
        assert (tmp_path / name / "summary.json").exists(), res.stdout
        with open(tmp_path / name / "summary.json") as f:
            runs[name] = json.load(f)
        with np.load(tmp_path / name / "ps_model.npz", allow_pickle=False) as z:
            runs[name]["params"] = z["params"]
    clean, crashed = runs["clean"], runs["crash"]
    assert np.array_equal(clean["params"], crashed["params"]), res.stdout
    assert crashed["final_test_acc"] == clean["final_test_acc"] and crashed["worker_status"] == ["done"] * 2
    assert crashed["servers_lost"] == [2] and crashed["lost_acknowledged"] == 0, crashed
    backup = crashed["replica_records"][3]
    assert backup["took_over_s"] > 0 and crashed["failovers"] == 2, crashed
    assert backup["first_update_time"] - crash <= TIMEOUT + 0.5 + 1.0 + SLACK, (backup, crash)
    assert "server rank 3 took over shard 1" in res.stdout and "Traceback" not in res.stdout, res.stdout


@pytest.mark.parametrize("replicas, servers, needle", [
    (3, 2, "is larger than the servers"), (0, 2, "must be an integer >= 1"), (-1, 2, "must be an integer >= 1"),
    (2, 3, "must divide the servers")])
def test_bad_replica_options(replicas, servers, needle):
    with pytest.raises(ValueError, match=needle) as e:
        PSOptions(servers=servers, replicas=replicas).validate(size=servers + 2)
    assert "--ps-replicas" in str(e.value)


def test_bad_replica_options_stop_every_rank_before_training(tmp_path):
    """``--ps-replicas 3`` with ``--servers 2``: one error line, exit 1, from every rank's preflight."""
    out = run_mpi(4, "training.train", *COMMON[:-6], "--servers", "2", "--ps-replicas", "3",
                  "--run-dir", str(tmp_path), timeout=60, check=False)
    assert out.returncode == 1 and out.stdout.count("error:") == 1, out.stdout
    assert "--ps-replicas" in out.stdout and "Traceback" not in out.stdout, out.stdout
