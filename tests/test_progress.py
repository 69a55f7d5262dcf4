"""Rank 0's progress bar and the rank-prefixed log, as a user sees them under ``mpiexec``.

The launcher is started as :func:`tests.mpirun.run_mpi` starts it (same command, environment and
hard timeout), but with its stderr on a pseudo-terminal or in a file instead of a pipe: on a
terminal the bar is redrawn in place (``\\r`` updates reach the terminal through ``mpiexec``); in a
file it leaves one status line per ``LOG_INTERVAL`` (30 s), none of tqdm's redraws. In one
process: ``--no-progress`` writes nothing, the log form writes whole lines.

Run as ``mpiexec -n 2 python -m tests.test_progress PAUSE`` for the multi-rank body (PAUSE: seconds
between the bar's updates).
"""
import io
import os
import pty
import signal
import subprocess
import sys
import time

from tests.mpirun import ROOT, launcher_args, launcher_env, mpiexec_path
from training import progress


def _launch(stderr, pause, timeout=60):
    """Run this module's body on 2 ranks with ``stderr`` as mpiexec's stderr; return its stdout."""
    cmd = [mpiexec_path(), *launcher_args(), "-n", "2", sys.executable, "-m", "tests.test_progress", str(pause)]
    env = launcher_env()
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {' '.join(cmd)}\n{out}")
    assert proc.returncode == 0, out
    return out


def _read_all(fd):
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: every writer of the terminal has closed it
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def test_bar_is_redrawn_in_place_when_mpiexec_writes_to_a_terminal():
    master, slave = pty.openpty()
    try:
        out = _launch(slave, 0.6)  # > the 0.5 s between redraws on a terminal
        os.close(slave)
        slave = None
        seen = _read_all(master)
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert out.count("terminal True") == 2, out
    assert "\r" in seen and "2/3" in seen, repr(seen)  # redraws, as they came
    assert "[rank 1] INFO: done" in seen and "[rank 0] INFO: done" in seen, repr(seen)


def test_bar_leaves_one_status_line_per_interval_in_a_log_file(tmp_path):
    log = tmp_path / "job.log"
    with open(log, "w") as f:
        out = _launch(f, 0.0)
    text = log.read_text()
    assert out.count("terminal False") == 2, out
    assert "\r" not in text, repr(text)
    status = [line for line in text.splitlines() if "/3" in line]
    assert len(status) == 1 and "0/3" in status[0], text  # the first line only: the job took < 30 s
    assert sorted(line for line in text.splitlines() if "INFO" in line) == [
        "[rank 0] INFO: done", "[rank 1] INFO: done"], text


def test_no_progress_writes_nothing_and_log_form_writes_lines(monkeypatch):
    out = io.StringIO()
    bar = progress.progress_bar(4, "step", enabled=False, stream=out)
    bar.update(4)
    bar.close()
    assert out.getvalue() == ""
    monkeypatch.setattr(progress, "LOG_INTERVAL", 0.0)
    bar = progress.progress_bar(4, "step", stream=out)
    for _ in range(4):
        bar.update()
    bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and [line.split("|")[-1].split()[0] for line in lines] == [
        "0/4", "1/4", "2/4", "3/4", "4/4"], lines


def _body(pause):
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    print(f"terminal {progress.launcher_terminal()}", flush=True)
    if rank == 0:
        bar = progress.progress_bar(3, "step")
        for _ in range(3):
            time.sleep(pause)
            bar.update()
        bar.close()
    MPI.COMM_WORLD.Barrier()
    progress.get_logger(rank).info("done")


if __name__ == "__main__":
    _body(float(sys.argv[1]))
