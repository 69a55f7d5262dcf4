"""Multi-rank trainer tests: P=4 vs P=1 equivalence for every all-reduce algorithm, bucketing,
the non-finite skip rule, bitwise resume and corrupt checkpoints (one mpiexec launch), and the
command line's clean failure on a corrupt checkpoint."""
from tests.mpirun import job_failed, run_mpi


def test_training_on_four_ranks(tmp_path):
    out = run_mpi(4, "tests.mpi_training", str(tmp_path), timeout=240).stdout
    for case in ("equivalence", "buckets", "nonfinite", "resume", "resume_compressed", "resume_local", "corrupt"):
        assert f"case_{case}: ok" in out, out


def test_equivalence_and_skip_on_three_ranks(tmp_path):
    """The same bodies on a non-power-of-two rank count (global batch 60)."""
    out = run_mpi(3, "tests.mpi_training", str(tmp_path), "equivalence", "nonfinite", timeout=180).stdout
    assert "case_equivalence: ok" in out and "case_nonfinite: ok" in out, out


def test_cli_reports_corrupt_checkpoint_without_hanging(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.json").write_text('{"config": {"hidden": [8], "epochs": 2}}')
    (run / "ckpt-epoch0002.npz").write_bytes(b"PK\x03\x04 this is not a checkpoint")
    res = run_mpi(2, "training.train", "--resume", str(run), "--no-progress", timeout=60, check=False)
    assert res.returncode == 1, res.stdout
    assert "ckpt-epoch0002.npz" in res.stdout and "corrupt or truncated" in res.stdout, res.stdout
    assert res.stdout.count("error:") == 1, res.stdout  # one message, from rank 0


def test_cli_user_errors_print_once_from_rank_0(tmp_path):
    """A taken --name (found by rank 0 alone) and a missing run to resume (found by every rank
    while parsing) each give one error line and status 1, no traceback, no hang."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text("{}")
    (tmp_path / "a" / "summary.json").write_text("{}")  # a finished run: its name is taken
    res = run_mpi(2, "training.train", "--run-dir", str(tmp_path), "--name", "a", "--hidden", "4",
                  "--no-progress", timeout=60, check=False)
    assert res.returncode == 1 and "Traceback" not in res.stdout, res.stdout
    assert res.stdout.count("error: run directory") == 1 and res.stdout.count("error:") == 1, res.stdout
    missing = str(tmp_path / "nonexist")
    res = run_mpi(2, "training.train", "--resume", missing, timeout=60, check=False)
    assert res.returncode == 1, res.stdout
    assert res.stdout.strip() == f"error: --resume {missing}: no such run directory or checkpoint", res.stdout


def test_default_run_reaches_97_percent_on_four_ranks(tmp_path):
    """The documented default (digits, 4 ranks) reaches >= 97% test accuracy in under a minute."""
    import json

    out = run_mpi(4, "training.train", "--run-dir", str(tmp_path), "--no-progress", timeout=180).stdout
    run = (tmp_path / "latest").resolve()
    summary = json.loads((run / "summary.json").read_text())
    config = json.loads((run / "config.json").read_text())
    assert summary["final_test_acc"] >= 0.97, out
    assert summary["wall_s"] < 60, out
    assert summary["replicas_identical"] and summary["skipped_steps"] == 0
    assert config["run"]["P"] == 4 and config["run"]["mpi_library"] and config["config"]["epochs"] == 40
    assert len((run / "metrics.jsonl").read_text().splitlines()) == summary["steps"]
    assert "test acc" in out and "sent/rank" in out


def _since_crash(out):
    """Return the seconds from the crash (the time ``experiments.faults.crash`` prints) to now.

    Measured from the crash, not from the launch: the start-up before it (imports, data loading on
    a loaded machine) is not part of how long the survivors take to end the job.
    """
    import re
    import time

    stamps = re.findall(r"injected crash at ([0-9.]+)", out)
    return time.time() - float(stamps[0]) if stamps else float("inf")


def _crash_run(tmp_path, nprocs, dead, batch, *flags):
    """Run the trainer with rank ``dead`` exiting at its 5th step; return (result, seconds after the crash)."""
    res = run_mpi(nprocs, "experiments.faults.crash", "dp", dead, 5, "--timeout", 3, "--hidden", 16, "--epochs", 2,
                  "--batch-size", batch, "--no-progress", "--run-dir", tmp_path, *flags, timeout=60, check=False,
                  mpiexec_args=("-disable-auto-cleanup",))  # MPICH must not end the survivors itself
    return res, _since_crash(res.stdout)


def test_crashed_rank_ends_the_job_within_the_timeout(tmp_path):
    """--timeout 3 on 2 ranks: rank 1 vanishes mid-training; the survivor names it on one line and
    aborts the job within 3 + 10 s (measured ~4 s), instead of waiting forever."""
    res, seconds = _crash_run(tmp_path, 2, 1, 64)
    out = res.stdout
    assert job_failed(res) and seconds < 3 + 10, (res.returncode, seconds, out)
    assert "injected crash" in out, out
    assert out.count("error: rank 0: CollectiveTimeout") == 1, out
    assert out.count("no answer from rank 1") == 1 and out.count("error:") == 1, out
    assert "Traceback" not in out, out
    # what to do: read the dead rank's output, then resume the run's own directory
    assert f"rank 1 may have died or hung (its own output says why); then restart with --resume {tmp_path}/" in out


def test_a_peer_lost_in_a_large_transfer_is_named_on_one_line():
    """Rank 1 dies with the first messages of a 4 MiB ring all-reduce posted; rank 0's receive of
    them fails inside the MPI library (before the 20 s timeout): one PeerLost line naming rank 1
    and what to do, no traceback."""
    res = run_mpi(2, "experiments.faults.dead", "ring", 20, "large", timeout=60, check=False,
                  mpiexec_args=("-disable-auto-cleanup",))
    out = res.stdout
    assert job_failed(res) and _since_crash(out) < 20, (res.returncode, out)
    assert out.count("error: rank 0: PeerLost: allreduce lost rank 1 in round 0") == 1, out
    assert "rank 1 may have died or hung" in out and "Traceback" not in out, out


def test_crashed_rank_ends_a_compressed_run_within_the_timeout(tmp_path):
    """The same with PowerSGD (its own two all-reduces per step): the compressor's collectives
    honour --timeout as the plain all-reduce does."""
    res, seconds = _crash_run(tmp_path, 2, 1, 64, "--compression", "powersgd")
    out = res.stdout
    assert job_failed(res) and seconds < 3 + 10, (res.returncode, seconds, out)
    assert out.count("error: rank 0: CollectiveTimeout") == 1 and "no answer from rank 1" in out, out


def test_crashed_rank_on_three_ranks(tmp_path):
    """The same on 3 ranks (rank 2 vanishes): the job ends within 3 + 10 s with one error line per
    survivor at most. The first survivor to abort may name a live peer it was waiting on (in the
    recursive-doubling fold rank 0 waits on rank 1, which waits on rank 2; a timeout alone cannot
    tell a dead peer from a blocked one), so only the rank of some silent peer is checked."""
    res, seconds = _crash_run(tmp_path, 3, 2, 60)
    out = res.stdout
    assert job_failed(res) and seconds < 3 + 10, (res.returncode, seconds, out)
    assert "CollectiveTimeout" in out and "no answer from rank " in out, out
    for r in (0, 1):
        assert out.count(f"error: rank {r}: ") <= 1, out
    assert "error: rank 2" not in out and "Traceback" not in out, out


def test_rank_0_dying_during_setup_ends_the_job(tmp_path):
    """Rank 0 dies before it broadcasts the run directory: rank 1's broadcast waits --timeout 3 s
    at most (the set-up's collectives honour the watchdog too), then names the cause and aborts."""
    res = run_mpi(2, "experiments.faults.crash", "setup", 0, 1, "--timeout", 3, "--hidden", 16, "--epochs", 1,
                  "--no-progress", "--run-dir", tmp_path, timeout=60, check=False,
                  mpiexec_args=("-disable-auto-cleanup",))
    seconds, out = _since_crash(res.stdout), res.stdout
    assert job_failed(res) and seconds < 3 + 10, (res.returncode, seconds, out)
    assert "injected crash" in out and out.count("error: rank 1: CollectiveTimeout") == 1, out
    assert "run setup" in out and "Traceback" not in out, out
