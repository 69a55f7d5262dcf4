"""Run records that survive a kill: a torn last JSONL line is dropped with a warning naming the file,
a damaged earlier line is an error naming the file and the line (oracle: the records written whole)."""
import json
import logging
import os
import subprocess

import pytest

from commlab.file_formats import read_jsonl, write_json
from commlab.run_files import MetricsWriter


def test_a_torn_last_line_is_dropped_with_a_warning_naming_the_file(tmp_path, caplog):
    path = tmp_path / "epochs.jsonl"
    whole = [{"epoch": 1, "loss": 0.5}, {"epoch": 2, "loss": 0.25}]
    text = "".join(json.dumps(r) + "\n" for r in whole)
    for torn in ('{"epoch": 3, "lo', '{"epoch": 3}\x00\x00', "[1, 2"):
        path.write_text(text + torn)
        with caplog.at_level(logging.WARNING):
            assert read_jsonl(str(path)) == whole
        assert str(path) in caplog.text and "torn last line 3" in caplog.text
        caplog.clear()


def test_a_damaged_line_before_the_last_names_the_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2 is not a JSON object"):
        read_jsonl(str(path))


def test_resuming_writer_rewrites_the_records_without_the_torn_line(tmp_path):
    for name in ("metrics.jsonl", "epochs.jsonl"):
        (tmp_path / name).write_text('{"epoch": 1, "step": 1}\n{"epoch": 2, "step": 2}\n{"epoch": 3, "st')
    writer = MetricsWriter(str(tmp_path), True, keep_epochs=2)
    writer.epoch({"epoch": 3, "loss": 0.1})
    writer.close()
    assert [r["epoch"] for r in read_jsonl(str(tmp_path / "epochs.jsonl"))] == [1, 2, 3]


def test_a_writer_appending_to_a_torn_file_starts_a_line_of_its_own(tmp_path, caplog):
    """A parameter-server run appends its records (no keep_epochs): after a kill tore the last line, the
    next record must not be glued to the torn piece (the record would be lost, a later line damaged)."""
    for name in ("metrics.jsonl", "epochs.jsonl"):
        (tmp_path / name).write_text('{"epoch": 1, "step": 1}\n{"epo')
    with caplog.at_level(logging.WARNING):
        writer = MetricsWriter(str(tmp_path), True)
    assert str(tmp_path / "epochs.jsonl") in caplog.text and "torn last line 2" in caplog.text
    writer.step({"epoch": 2, "step": 2})
    writer.epoch({"epoch": 2})
    writer.close()
    for name in ("metrics.jsonl", "epochs.jsonl"):
        assert [r["epoch"] for r in read_jsonl(str(tmp_path / name))] == [1, 2]
    (tmp_path / "epochs.jsonl").write_text('{"epoch": 1}\n')  # whole: appended to as it is
    MetricsWriter(str(tmp_path), True).close()
    assert (tmp_path / "epochs.jsonl").read_text() == '{"epoch": 1}\n'


def test_a_killed_writers_temporary_json_file_is_removed_by_the_next_write(tmp_path):
    """A writer of config.json killed mid-write leaves config.json.tmp.PID: the next write of config.json
    removes it, and keeps a live writer's and another file's temporaries."""
    proc = subprocess.Popen(["true"])
    proc.wait()  # its id is one of a process that has ended
    dead = tmp_path / f"config.json.tmp.{proc.pid}"
    live = tmp_path / f"config.json.tmp.{os.getppid()}"  # a writer still running
    other = tmp_path / f"summary.json.tmp.{proc.pid}"
    for f in (dead, live, other):
        f.write_text('{"conf')
    write_json(str(tmp_path / "config.json"), {"config": {}})
    assert not dead.exists() and live.exists() and other.exists()
    assert json.loads((tmp_path / "config.json").read_text()) == {"config": {}}
