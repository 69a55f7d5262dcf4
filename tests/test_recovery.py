"""Recovery from faults around checkpoints (single process, plus file-level cases): a run that ended
before its first checkpoint starts again (by ``--resume`` or the same ``--name``) and ends exactly as
an uninterrupted run; a full disk or a file size limit is an error naming the file and leaves no
temporary behind; temporaries of killed writers are removed by the next write; a tampered counter is
an error naming the file; server checkpoints of different generations are refused, naming both, and those of another run or job
shape naming the file."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ps.checkpoints.shard_files import server_checkpoint_path as server_checkpoint
from commlab.file_formats import CheckpointError, read_npz, remove_stale_temporaries, write_npz
from ps.checkpoints.shard_files import run_id_entry
from training.runtime.checkpoint import find_checkpoint
from training.ps_mode.worker import check_server_checkpoints
from training.train import main

TINY = ["--data", "synthetic", "--samples", "200", "--features", "8", "--classes", "3", "--hidden", "8",
        "--batch-size", "32", "--epochs", "2", "--no-progress"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _final_params(run):
    return read_npz(find_checkpoint(str(run)))["model/params"]


def _as_if_killed_before_first_checkpoint(run):
    """Leave ``run`` as a job killed during epoch 1 leaves it: config and partial records only."""
    for name in os.listdir(run):
        if name.startswith("ckpt-epoch") or name == "summary.json":
            os.remove(run / name)
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"epoch": 1, "step": 99, "loss": 1.0}) + "\n")  # a stray record


def test_run_ended_before_first_checkpoint_starts_again(tmp_path, capsys):
    assert main([*TINY, "--run-dir", str(tmp_path), "--name", "ref"]) == 0
    reference = _final_params(tmp_path / "ref")
    steps = json.loads((tmp_path / "ref" / "summary.json").read_text())["steps"]
    assert main([*TINY, "--run-dir", str(tmp_path), "--name", "a"]) == 0
    _as_if_killed_before_first_checkpoint(tmp_path / "a")
    capsys.readouterr()

    # --resume: one note, then the whole run, bitwise equal to the uninterrupted one
    assert main(["--resume", str(tmp_path / "a"), "--no-progress"]) == 0
    err = capsys.readouterr().err  # rank 0's log line
    assert err.count("[rank 0] INFO: --resume") == 1 and err.count("ended before its first checkpoint") == 1, err
    assert np.array_equal(_final_params(tmp_path / "a"), reference)
    rows = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == steps and all(json.loads(r)["step"] != 99 for r in rows)

    # the same --name: reused (not "exists"), its old records dropped, the same result
    _as_if_killed_before_first_checkpoint(tmp_path / "a")
    assert main([*TINY, "--run-dir", str(tmp_path), "--name", "a"]) == 0
    cap = capsys.readouterr()
    assert "[rank 0] INFO: reusing run directory" in cap.err and "error" not in cap.out + cap.err, cap
    assert np.array_equal(_final_params(tmp_path / "a"), reference)
    assert len((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()) == steps

    # a finished run's name stays taken
    assert main([*TINY, "--run-dir", str(tmp_path), "--name", "a"]) == 1
    assert "exists" in capsys.readouterr().err


def test_tampered_counter_names_the_file(tmp_path, capsys):
    assert main([*TINY, "--run-dir", str(tmp_path), "--name", "a", "--stop-after", "1"]) == 0
    path = find_checkpoint(str(tmp_path / "a"))
    arrays = read_npz(path)
    arrays["train/epoch"] = np.array(-3, np.int64)
    write_npz(path, arrays)  # a valid checksum over a bad value
    capsys.readouterr()
    assert main(["--resume", str(tmp_path / "a"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert path in err and "train/epoch = -3" in err, err


_WRITE_BIG = """
import resource, sys, numpy
from commlab.file_formats import write_npz
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
try:
    write_npz(sys.argv[1], {"a": numpy.ones(100_000)})
except Exception as e:
    print(type(e).__name__, e)
"""


def test_file_size_limit_is_an_error_naming_the_file(tmp_path):
    """The kernel refuses the write past RLIMIT_FSIZE (EFBIG, as a full disk gives ENOSPC)."""
    path = str(tmp_path / "ckpt-epoch0001.npz")
    out = subprocess.run([sys.executable, "-c", _WRITE_BIG, path], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT}).stdout
    assert out.startswith("CheckpointError cannot write checkpoint " + path), out
    assert "too large" in out.lower(), out
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)  # no temporary, no partial file


def test_full_disk_is_an_error_naming_the_file(tmp_path, monkeypatch):
    """ENOSPC from the write itself (``/dev/full`` stands in for the full disk)."""
    path = str(tmp_path / "x.npz")
    real_open = open

    def full_open(name, mode="r", *args, **kwargs):
        if str(name).startswith(path + ".tmp.") and "w" in mode:
            return real_open("/dev/full", mode, *args, **kwargs)
        return real_open(name, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", full_open)
    with pytest.raises(CheckpointError, match=f"cannot write checkpoint {path}: No space left on device"):
        write_npz(path, {"a": np.ones(100_000)})


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temporaries_of_killed_writers_are_removed(tmp_path):
    dead = tmp_path / f"ckpt-epoch0002.npz.tmp.{_dead_pid()}"
    live = tmp_path / f"ckpt-epoch0002.npz.tmp.{os.getppid()}"  # a writer still running
    other = tmp_path / "notes.tmp.1"
    for f in (dead, live, other):
        f.write_bytes(b"x" * 1000)
    write_npz(str(tmp_path / "ckpt-epoch0003.npz"), {"a": np.zeros(3)})
    assert not dead.exists() and live.exists() and other.exists()
    assert remove_stale_temporaries(str(tmp_path)) == []


def _shard_file(ckpt, index, pushes, run_id="5f2a"):
    """Write server ``index``'s checkpoint of a two-shard job (8 parameters, one worker) as a server writes it."""
    write_npz(server_checkpoint(ckpt, index), {
        "params": np.zeros(4), "offset": np.array(4 * index), "total": np.array(8), "servers": np.array(2),
        "pushes": np.array(pushes), "version": np.array(pushes), "elapsed": np.array(1.5),
        "folded": np.array([pushes]), "status": np.array([0]), "optim/steps": np.array(pushes),
        "meta/server": np.array([index]), **run_id_entry(run_id)})


def test_a_job_killed_inside_or_between_server_writes_resumes_from_the_newest_complete_generation(tmp_path):
    """Oracle: the states the servers wrote. A first generation only one shard wrote (a job killed inside
    it) is no checkpoint yet, not a refusal naming --servers (unless the file is of another job); a shard
    whose next write was never made leaves the others' previous generation beside their newer one, and
    resume takes the newest generation every shard holds; a replica writing a generation again keeps the
    previous one."""
    from mpi4py import MPI

    from ps.job.settings import PSOptions
    from ps.serving.shard_server import Server
    from training.model.optim import SGD

    ckpt, init = str(tmp_path / "ps"), np.linspace(-1.0, 1.0, 8)

    def server(g, pushes=0, **opts):
        srv = Server(MPI.COMM_SELF, g, [2], init[4 * g:4 * g + 4].copy(), 8,
                     PSOptions(servers=2, checkpoint_dir=ckpt, run_id="5f2a", **opts),
                     lambda p, gr: SGD(p, gr, lr=0.1, momentum=0.9))
        if pushes:
            srv.pushes = srv.version = pushes
            srv.table.folded[:] = pushes
            srv.params += pushes  # a state of its own per generation
            srv.checkpoint()
        return srv

    server(0, 8)  # the first generation: shard 1 never wrote it
    assert check_server_checkpoints(ckpt, 2, run_id="5f2a", job=(2, 1)) is False
    with pytest.raises(CheckpointError, match="written by a job of 2 server.*this job has 3: resume with the same servers"):
        check_server_checkpoints(ckpt, 3, run_id="5f2a", job=(3, 1))
    from ps.checkpoints.shard_files import newest_generation, previous_checkpoint_path

    assert newest_generation(ckpt, 2) is None
    server(1, 8)
    server(0, 16)  # shard 1 is killed before its write of 16
    first, second = server_checkpoint(ckpt, 0), server_checkpoint(ckpt, 1)
    assert newest_generation(ckpt, 2) == [previous_checkpoint_path(first), second]
    assert check_server_checkpoints(ckpt, 2, run_id="5f2a", job=(2, 1)) is True
    for g in (0, 1):
        resumed = server(g, resume_dir=ckpt)
        assert resumed.pushes == 8 and np.array_equal(resumed.params, init[4 * g:4 * g + 4] + 8), (g, resumed.params)
    server(1, 16)
    assert newest_generation(ckpt, 2) == [first, second] and server(0, resume_dir=ckpt).pushes == 16
    server(0, 16)  # another replica of shard 0 writes generation 16 again: generation 8 stays
    assert int(read_npz(previous_checkpoint_path(first))["pushes"]) == 8


def test_server_checkpoints_of_different_generations_are_refused(tmp_path):
    ckpt = str(tmp_path)
    for index, pushes in ((0, 184), (1, 92)):
        _shard_file(ckpt, index, pushes)
    with pytest.raises(ValueError, match="different generations") as err:
        check_server_checkpoints(ckpt, 2)
    assert server_checkpoint(ckpt, 0) in str(err.value) and server_checkpoint(ckpt, 1) in str(err.value)
    assert "184" in str(err.value) and "92" in str(err.value)
    _shard_file(ckpt, 1, 184)
    assert check_server_checkpoints(ckpt, 2, run_id="5f2a", job=(2, 1)) is True
    assert check_server_checkpoints(str(tmp_path / "none"), 2, missing_ok=True) is False
    with pytest.raises(ValueError, match="no parameter-server checkpoint"):
        check_server_checkpoints(str(tmp_path / "none"), 2)
    # another run's files: refused naming the file and the way to accept them, which then works
    with pytest.raises(CheckpointError, match="ps_server0.npz was written by run 5f2a, not by run 77aa") as err:
        check_server_checkpoints(ckpt, 2, run_id="77aa")
    assert "--allow-foreign-checkpoint" in str(err.value)
    assert check_server_checkpoints(ckpt, 2, run_id="77aa", allow_foreign=True) is True
    with pytest.raises(CheckpointError, match="ps_server0.npz was written by a job of 1 worker"):
        check_server_checkpoints(ckpt, 2, job=(2, 3))


def test_replicas_keeping_the_same_previous_generation_leave_no_temporary(tmp_path, monkeypatch):
    """Two replicas of a shard both link the file there before either replaces it: the second's rename onto
    the previous generation, which is already the same file, does nothing and must not leave its temporary
    behind, or that replica's next checkpoint fails on it (``File exists``; a fault-free 5-rank run with
    ``--ps-replicas 2`` stopped so). Oracle: the directory listing and the generations' pushes."""
    from ps.checkpoints.shard_files import _keep_previous, previous_checkpoint_path

    path = str(tmp_path / "ps_server0.npz")
    write_npz(path, {"pushes": np.array([8], np.int64)})
    for pid in (101, 202):  # both replicas, before either writes generation 16
        monkeypatch.setattr(os, "getpid", lambda pid=pid: pid)
        _keep_previous(path, 16)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["ps_server0.npz", "ps_server0.prev.npz"]
    write_npz(path, {"pushes": np.array([16], np.int64)})
    monkeypatch.setattr(os, "getpid", lambda: 202)
    _keep_previous(path, 24)  # the second replica's next generation
    monkeypatch.undo()
    assert int(read_npz(previous_checkpoint_path(path))["pushes"][0]) == 16
    assert sorted(os.listdir(tmp_path)) == ["ps_server0.npz", "ps_server0.prev.npz"]
