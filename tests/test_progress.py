"""Rank 0's progress bar and the rank-prefixed log, as a user sees them under ``mpiexec``.

The launcher is started as :func:`tests.mpirun.run_mpi` starts it (same command, environment and
hard timeout), but with its output on a pseudo-terminal, or its stderr in a file, instead of a
pipe: on a terminal the bar is redrawn in place (``\\r`` updates reach the terminal through
``mpiexec``) and the lines printed between updates stay whole; in a file it leaves one status
line per ``LOG_INTERVAL`` (30 s), none of tqdm's redraws. In one
process: ``--no-progress`` writes nothing, the log form writes whole lines.

Run as ``mpiexec -n 2 python -m tests.test_progress PAUSE`` for the multi-rank body (PAUSE: seconds
between the bar's updates).
"""
import io
import os
import pty
import subprocess
import sys
import time

from tests.mpirun import ROOT, finish, launcher_args, launcher_env, mpiexec_path
from commlab.logs import get_logger, setup_logging
from training.runtime import progress


def _launch(stderr, pause, stdout=subprocess.PIPE, timeout=60):
    """Run this module's body on 2 ranks with ``stdout``/``stderr`` as mpiexec's; return what it printed."""
    cmd = [mpiexec_path(), *launcher_args(), "-n", "2", sys.executable, "-m", "tests.test_progress", str(pause)]
    env = launcher_env()
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=stdout, stderr=stderr, text=True,
                            start_new_session=True)
    out, _ = finish(proc, timeout, " ".join(cmd))
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


def _screen(text):
    """Return the lines a terminal shows for ``text`` (``\\r`` back to column 0, ``\\n`` next line)."""
    screen, line, col = [], [], 0
    for ch in text:
        if ch == "\r":
            col = 0
        elif ch == "\n":
            screen.append("".join(line).rstrip())
            line, col = [], 0
        else:
            line[col:col + 1] = [ch]
            col += 1
    return screen + ["".join(line).rstrip()]


def test_bar_is_redrawn_in_place_when_mpiexec_writes_to_a_terminal():
    master, slave = pty.openpty()
    try:
        _launch(slave, 0.6, stdout=slave)  # 0.6 s > the 0.5 s between redraws on a terminal
        os.close(slave)
        slave = None
        seen = _read_all(master)
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert seen.count("terminal True") == 2, repr(seen)
    assert "\r" in seen and "2/3" in seen, repr(seen)  # redraws, as they came
    screen = _screen(seen)
    # the rows rank 0 prints between updates stand on lines of their own, never inside the bar's
    assert [line for line in screen if "row" in line] == ["row 1", "row 2", "row 3"], screen
    assert "[rank 1] INFO: done" in screen and "[rank 0] INFO: done" in screen, screen


def test_bar_leaves_one_status_line_per_interval_in_a_log_file(tmp_path):
    log = tmp_path / "job.log"
    with open(log, "w") as f:
        out = _launch(f, 0.0)
    text = log.read_text()
    assert out.count("terminal False") == 2 and out.count("row ") == 3, out
    assert "\r" not in text, repr(text)
    status = [line for line in text.splitlines() if "/3" in line]
    assert len(status) == 2 and "0/3" in status[0] and "3/3" in status[1], text  # < 30 s: the first and last
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
        for i in range(3):
            time.sleep(pause)
            bar.update()
            bar.write(f"row {i + 1}")  # as the epoch table's rows
        bar.close()
    MPI.COMM_WORLD.Barrier()
    setup_logging(rank)
    get_logger("tests").info("done")


if __name__ == "__main__":
    _body(float(sys.argv[1]))
