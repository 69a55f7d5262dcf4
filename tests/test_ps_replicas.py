"""Replicated parameter-server shards (``--ps-replicas``): chain order, fencing, failover, and crashes.

The oracle is a fault-free run (unreplicated, or replicated without a fault): under BSP the final
parameters must be equal bit for bit, and the servers' records must show no acknowledged update
lost. The rank-side checks are described in ``tests/mpi_ps_replicas.py``. Crashed ranks leave with
a non-zero exit (MPICH, ``mpiexec -disable-auto-cleanup``; Open MPI: ``SIGKILL`` under
``--enable-recovery``): success is read from the records the survivors write, never from the
launcher's exit status. Time bounds: a failover within ``--ps-timeout`` + 0.5 s of a request, plus
2 s of slack for a loaded machine.
"""
import functools
import glob
import json
import os
import re
import time

import numpy as np
import pytest

from ps.job.settings import PSOptions
from tests.mpirun import run_mpi

TIMEOUT = 1.0  # --ps-timeout of the crash runs (seconds), as tests/mpi_ps_replicas.py's
SLACK = 2.0    # seconds of slack on a loaded 2-core machine
CRASH = ("-disable-auto-cleanup",)  # MPICH keeps the survivors of a non-zero exit running


@functools.lru_cache(maxsize=None)
def _fault_free():
    """Both fault-free cases, in one launch of 6 ranks (two workers beside a chain of four)."""
    return run_mpi(6, "tests.mpi_ps_replicas", "chain", "fence", timeout=150, check=False)


@pytest.mark.parametrize("case", ["chain", "fence"])
def test_replication_without_a_crash(case):
    """Chain order, every replica's shard and equality with the unreplicated run for R = 2, 3, 4; a delayed
    old primary is fenced off."""
    res = _fault_free()
    assert f"mpi_ps_replicas {case}: 0 failures on 6 ranks" in res.stdout, (res.returncode, res.stdout)
    other = re.search(r"mpi_ps_replicas \w+: [1-9]\d* failures", res.stdout)  # a non-zero exit: the other case failed
    assert res.returncode == 0 or other, (res.returncode, res.stdout)


def test_a_server_stopped_past_the_timeout_drops_no_worker():
    """SIGSTOP on a server past --ps-timeout while the workers' messages queue unread: unreplicated, and a
    primary resuming before the failover, the run ends as the fault-free one with every worker done; a
    stop past the failover fails over. Its own launch: a fenced primary's last messages are never taken,
    so no later run of the same processes follows it."""
    res = run_mpi(6, "tests.mpi_ps_replicas", "stall", timeout=120, check=False)
    assert "mpi_ps_replicas stall: 0 failures on 6 ranks" in res.stdout and res.returncode == 0, res.stdout


def test_checkpoints_written_after_a_primarys_crash_resume_to_the_uninterrupted_result(tmp_path):
    """A run with server checkpoints whose primary (rank 0) exits at its 60th message: the backup takes
    over and writes the later checkpoints; a run resumed from them on the survivors and a fresh replica
    ends with the uninterrupted run's parameters, bit for bit (one launch, 6 ranks)."""
    res = run_mpi(6, "tests.mpi_ps_replicas", "head", str(tmp_path), timeout=60, check=False, mpiexec_args=CRASH)
    assert re.findall(r"rank (\d+): exiting \(injected crash", res.stdout) == ["0"], res.stdout
    with open(tmp_path / "result.json") as f:
        got = json.load(f)
    crash, resumed, W = got["crash"], got["resumed"], got["workers"]
    assert crash["servers_lost"] == [0] and crash["lost_acknowledged"] == 0, (crash, res.stdout)
    took_over = crash["replicas"][1]["took_over_s"]
    assert took_over > 0 and crash["failovers"] == [1] * W and crash["pushes"] == 30 * W, crash
    assert got["checkpoint"]["pushes"] == 30 * W, got
    assert got["checkpoint"]["elapsed_s"] > took_over, got  # the last checkpoint came from the new primary
    assert resumed["start_pushes"] == 30 * W and resumed["pushes"] == 60 * W, resumed
    assert resumed["servers_lost"] == [] and resumed["lost_acknowledged"] == 0, resumed
    assert resumed["status"] == ["done"] * W and got["equal"], (got, res.stdout)


def test_every_surviving_replica_holds_the_fault_free_shard_after_deaths(tmp_path):
    """A chain of four losing its second replica, and a chain of three losing its primary and then its middle
    replica: each run ends with the unreplicated run's parameters bit for bit, every surviving replica
    holding them, nothing acknowledged lost (one launch, 6 ranks). A replica that forwarded a gradient
    after applying it changed it in place first, and the tail drifted from the primary."""
    res = run_mpi(6, "tests.mpi_ps_replicas", "deaths", str(tmp_path), timeout=120, check=False, mpiexec_args=CRASH)
    assert sorted(re.findall(r"rank (\d+): exiting \(injected crash", res.stdout)) == ["0", "1", "2"], res.stdout
    assert (tmp_path / "deaths.json").exists(), res.stdout
    with open(tmp_path / "deaths.json") as f:
        got = json.load(f)
    assert sorted(got) == ["R=3", "R=4"], got
    for name, v in got.items():
        assert v["equal"] and v["lost_acknowledged"] == 0 and v["status"] == ["done"] * 2, (name, v, res.stdout)
        assert v["servers_lost"] == v["want_lost"], (name, v)
        assert [s for r, s in enumerate(v["same_shard"]) if r not in v["want_lost"]] == [1] * (
            len(v["same_shard"]) - len(v["want_lost"])), (name, v)


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


def test_training_survives_a_primarys_and_a_backups_crash(tmp_path):
    """``--servers 4 --ps-replicas 2`` (two shards): the primary of shard 1 (rank 2) and the backup of
    shard 0 (rank 1) each exit at their 40th message (the primary early in the epoch, the backup
    later). The run ends with the fault-free run's parameters (bitwise) and test accuracy, its records
    written by a worker: shard 1 failed over once per worker, its next update applied within the
    failover timeout + 1 s of the crash; shard 0's primary cut its backup off and answered on, with
    no failover. The workers waiting out shard 1's failover stay alive to shard 0 (heartbeats)."""
    run_mpi(6, "training.train", *TWO_SHARDS, "--run-dir", str(tmp_path), "--name", "clean", timeout=90)
    res = run_mpi(6, "experiments.faults.crash", "ps", "1,2", 40, *TWO_SHARDS, "--run-dir", str(tmp_path), "--name",
                  "crash", timeout=90, check=False, mpiexec_args=CRASH)
    crashes = dict(re.findall(r"rank (\d+): exiting \(injected crash at ([0-9.]+)", res.stdout))
    assert sorted(crashes) == ["1", "2"], res.stdout
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
    assert crashed["servers_lost"] == [1, 2] and crashed["lost_acknowledged"] == 0, crashed
    records = crashed["replica_records"]
    assert records[0]["cut"] == 1 and records[0]["head"] == 1 and records[0]["took_over_s"] < 0, records[0]
    backup = records[3]
    assert backup["took_over_s"] > 0 and crashed["failovers"] == 2, crashed  # shard 1 only, once per worker
    assert backup["first_update_time"] - float(crashes["2"]) <= TIMEOUT + 0.5 + 1.0 + SLACK, (backup, crashes)
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


def test_a_forward_after_a_lost_one_is_neither_applied_nor_acknowledged():
    """A backup whose upstream died between a FORWARD's header and its payload must not apply (and so
    acknowledge) a later FORWARD of that stream: the acknowledgement would cover the lost update too. The
    later FORWARDs of a peer that lost one are taken without waiting for their payloads."""
    from ps.wire.messages import H_EPOCH, H_SEQ, HEADER_LEN, Msg
    from ps.replicas.chain_replication import REPLICA_COUNTERS, ReplicatedServer

    backup = object.__new__(ReplicatedServer)  # the chain logic alone, no communicator
    backup.epoch, backup.head, backup.deposed, backup.seq = 0, False, False, 4
    backup.counters, backup._broken = dict.fromkeys(REPLICA_COUNTERS, 0), set()
    applied = []
    backup._apply = lambda header, data: applied.append(int(header[H_SEQ]))
    backup._send_down = lambda seq, fields, data: applied.append(("down", seq))
    header = np.zeros(HEADER_LEN, np.int64)
    header[H_EPOCH], header[H_SEQ] = 0, 6  # seq 5 never came
    backup._chain_message(0, Msg.FORWARD, header, np.ones(3))
    assert applied == [] and backup.seq == 4 and backup._broken == {0}
    assert backup.counters["skipped_forwards"] == 1
    header[H_SEQ] = 5  # the next in sequence, from another upstream (a resend after a cut): applied
    backup._chain_message(2, Msg.FORWARD, header, np.ones(3))
    assert applied == [5, ("down", 5)] and backup.seq == 5
