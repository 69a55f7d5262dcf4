"""Checkpoints, run directories, run records and plots (single process, COMM_SELF)."""
import json
import os
import zipfile

import numpy as np
import pytest
from mpi4py import MPI

from training.runtime.checkpoint import (RunDirError, find_checkpoint, load_checkpoint, make_run_dir,
                                         prune_checkpoints, save_checkpoint)
from commlab.file_formats import CheckpointError
from training.settings.config import Config
from commlab.file_formats import read_jsonl
from commlab.run_files import EpochTable, MetricsWriter
from training.dp.hooks import bucket_bounds
from commlab.byte_sizes import format_bytes, parse_bytes

SELF = MPI.COMM_SELF


def test_checkpoint_roundtrip_is_exact_and_atomic(tmp_path):
    arrays = {"model/params": np.random.default_rng(0).standard_normal(1000).astype(np.float32),
              "optim/steps": np.array(7, np.int64), "compression/q": np.arange(6.0).reshape(2, 3)}
    path = str(tmp_path / "ckpt-epoch0001.npz")
    save_checkpoint(path, arrays, SELF)
    assert os.listdir(tmp_path) == ["ckpt-epoch0001.npz"]  # no temporary file left behind
    name, back = load_checkpoint(str(tmp_path), SELF)
    assert name == path and set(back) == set(arrays) | {"meta/epoch"} and back["meta/epoch"].tolist() == [1]
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v)
    with zipfile.ZipFile(path) as z:
        assert "meta/sha256.npy" in z.namelist()
    with pytest.raises(TypeError, match="object"):
        save_checkpoint(str(tmp_path / "x.npz"), {"o": np.array([None], object)}, SELF)


def test_tampered_checkpoint_fails_its_checksum(tmp_path):
    path = str(tmp_path / "ckpt-epoch0002.npz")
    save_checkpoint(path, {"model/params": np.ones(10)}, SELF)
    with np.load(path) as z:
        entries = {k: z[k] for k in z.files}
    entries["model/params"][3] = 2.0  # a well-formed file whose content no longer matches
    with open(path, "wb") as f:
        np.savez(f, **entries)
    with pytest.raises(CheckpointError, match="ckpt-epoch0002.npz.*SHA-256"):
        load_checkpoint(path, SELF)


@pytest.mark.parametrize("cut", [0, 10, 0.5, -1])
def test_truncated_checkpoint_names_the_file(tmp_path, cut):
    path = str(tmp_path / "ckpt-epoch0003.npz")
    save_checkpoint(path, {"model/params": np.arange(500.0)}, SELF)
    data = open(path, "rb").read()
    n = int(len(data) * cut) if isinstance(cut, float) else (cut if cut >= 0 else len(data) + cut)
    with open(path, "wb") as f:
        f.write(data[:n])
    with pytest.raises(CheckpointError, match="ckpt-epoch0003.npz"):
        load_checkpoint(path, SELF)


def test_find_and_prune_checkpoints(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(str(tmp_path), SELF)
    for e in (1, 2, 10):
        save_checkpoint(str(tmp_path / f"ckpt-epoch{e:04d}.npz"), {"a": np.zeros(1)}, SELF)
    assert find_checkpoint(str(tmp_path)).endswith("ckpt-epoch0010.npz")
    prune_checkpoints(str(tmp_path), 2)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-epoch0002.npz", "ckpt-epoch0010.npz"]


def test_run_dir_names_and_latest_pointer(tmp_path):
    cfg = Config(run_dir=str(tmp_path), name="")
    a, b = make_run_dir(cfg, SELF), make_run_dir(cfg, SELF)
    assert a != b and os.path.isdir(a) and os.path.isdir(b)  # same second: suffixed, not reused
    assert os.path.basename(a).endswith("-dp-digits-p1")
    grid = make_run_dir(Config(run_dir=str(tmp_path / "g"), name="", tensor_parallel=2, pipeline_parallel=2), SELF)
    assert os.path.basename(grid).endswith("-tp2-pp2-digits-p1")  # a model-parallel run is not called dp
    ctr = make_run_dir(Config(run_dir=str(tmp_path / "c"), name="", model="ctr", mode="hybrid"), SELF)
    assert os.path.basename(ctr).endswith("-hybrid-ctr-p1")  # the ctr model, not the unused --data
    assert os.path.realpath(tmp_path / "latest") == os.path.realpath(b)
    named = make_run_dir(Config(run_dir=str(tmp_path), name="mine"), SELF)
    assert named == str(tmp_path / "mine")
    # still empty (a job killed before it wrote config.json): the same name starts it again
    assert make_run_dir(Config(run_dir=str(tmp_path), name="mine"), SELF) == named
    (tmp_path / "mine" / "config.json").write_text("{}")
    (tmp_path / "mine" / "summary.json").write_text("{}")  # a finished run is never reused
    with pytest.raises(RunDirError, match="exists"):
        make_run_dir(Config(run_dir=str(tmp_path), name="mine"), SELF)


def test_metrics_writer_truncates_an_interrupted_history(tmp_path):
    w = MetricsWriter(str(tmp_path), True)
    for e in (1, 2, 3):
        w.step({"step": e, "epoch": e, "loss": 1.0 / e})
        w.epoch({"epoch": e, "loss": 1.0 / e})
    w.close()
    MetricsWriter(str(tmp_path), True, keep_epochs=2).close()  # resuming from epoch 2
    assert [r["epoch"] for r in read_jsonl(str(tmp_path / "epochs.jsonl"))] == [1, 2]
    assert [r["step"] for r in read_jsonl(str(tmp_path / "metrics.jsonl"))] == [1, 2]
    MetricsWriter(str(tmp_path / "nowhere"), False).step({"x": 1})  # other ranks write nothing


def test_epoch_table_and_byte_units():
    t = EpochTable()
    row = t.row({"epoch": 3, "loss": 0.12345, "train_acc": 0.991, "test_acc": 0.9777,
                 "compute_s": 0.5, "comm_s": 0.25, "bytes_sent": 1_234_567, "skipped": 0})
    assert len(row) == len(t.header())
    assert "99.10%" in row and "97.77%" in row and "1.18 MiB" in row and "0.1235" in row  # 1234567 / 2**20
    assert format_bytes(999) == "999 bytes" and format_bytes(2500) == "2.44 KiB"  # binary units, 2 decimals
    assert format_bytes(64 << 20) == "64 MiB" and format_bytes(153_640) == "150.04 KiB"


@pytest.mark.parametrize("text, count", [("4096", 4096), ("4K", 4096), ("4k", 4096), ("64M", 64 << 20),
                                         ("64MB", 64 << 20), ("64 MiB", 64 << 20), ("1.5G", 3 << 29),
                                         ("0", 0), (8, 8)])
def test_byte_counts_parse_in_binary_units(text, count):
    assert parse_bytes(text) == count
    assert parse_bytes(format_bytes(count)) == count  # what is printed reads back


@pytest.mark.parametrize("text", ["inf", "nan", "-1", "", "abc", "1e3", "K4"])
def test_byte_counts_that_are_not_are_refused(text):
    with pytest.raises(ValueError, match="not a byte count"):
        parse_bytes(text)
    with pytest.raises(ValueError, match="below 1 byte"):
        parse_bytes("0", minimum=1)


def test_bucket_bounds_last_layer_first():
    slices = [("0.W", 0, 100), ("0.b", 100, 10), ("2.W", 110, 50), ("2.b", 160, 5)]
    assert bucket_bounds(slices, 4, 0) == [(0, 165)]
    assert bucket_bounds(slices, 4, 200) == [(110, 165), (0, 110)]  # closed once >= 200 bytes
    assert bucket_bounds(slices, 4, 20) == [(160, 165), (110, 160), (100, 110), (0, 100)]
    assert bucket_bounds(slices, 4, 10 ** 9) == [(0, 165)]
    got = bucket_bounds(slices, 8, 1)
    assert got == [(160, 165), (110, 160), (100, 110), (0, 100)]  # one parameter per bucket


def test_plots_draw_pngs_from_run_latest(tmp_path, capsys):
    from plots.training import main

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    rows = [{"epoch": e, "loss": 1.0 / e, "train_acc": 0.8 + e / 100, "test_acc": 0.78 + e / 100,
             "compute_s": 0.1, "comm_s": 0.05 * e, "wall_s": 0.2 * e, "bytes_sent": 100, "skipped": 0}
            for e in range(1, 5)]
    (run / "epochs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"comm_fraction": 0.4}))
    (tmp_path / "runs" / "latest").write_text(str(run) + "\n")  # the text-file form of the pointer
    assert main([str(tmp_path / "runs" / "latest")]) == 0
    for name in ("training_curves.png", "training_time.png"):
        data = (run / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert "training_curves.png" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:  # a usage error, as every plot command's
        main([str(tmp_path / "nothing")])
    assert info.value.code == 2 and "no such file or folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as info:  # a folder that holds no run
        main([str(tmp_path / "empty")])
    assert info.value.code == 2 and "not a training run directory" in capsys.readouterr().err


def _run_dir(path, run_id):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump({"config": {}, "run": {"run_id": run_id}}, f)
    return str(path)


def test_a_checkpoint_of_another_run_or_epoch_is_refused_unless_asked_for(tmp_path):
    """A checkpoint carries its run's id and its epoch; copied into another run, or renamed to another
    epoch, it is refused naming the file (the copy is accepted with foreign_ok, the flag
    --allow-foreign-checkpoint); a run directory without an id accepts what it holds."""
    import shutil

    mine, other = _run_dir(tmp_path / "a", "aaaa"), _run_dir(tmp_path / "b", "bbbb")
    path = os.path.join(mine, "ckpt-epoch0002.npz")
    save_checkpoint(path, {"model/params": np.ones(4)}, SELF)
    _, back = load_checkpoint(mine, SELF)
    assert bytes(back["meta/run_id"]).decode() == "aaaa" and back["meta/epoch"].tolist() == [2]
    copied = os.path.join(other, "ckpt-epoch0002.npz")
    shutil.copy(path, copied)
    with pytest.raises(CheckpointError, match=r"ckpt-epoch0002.npz was written by run aaaa, not by the run of .*b "
                                              r"\(bbbb\).*--allow-foreign-checkpoint"):
        load_checkpoint(other, SELF)
    assert load_checkpoint(other, SELF, foreign_ok=True)[1]["model/params"].tolist() == [1.0] * 4
    renamed = os.path.join(mine, "ckpt-epoch0005.npz")
    os.rename(path, renamed)
    for ok in (False, True):
        with pytest.raises(CheckpointError, match="ckpt-epoch0005.npz holds epoch 2, its name says epoch 5"):
            load_checkpoint(renamed, SELF, foreign_ok=ok)
    bare = tmp_path / "c"
    bare.mkdir()
    shutil.copy(renamed, bare / "ckpt-epoch0002.npz")  # no config.json: nothing to compare with
    assert load_checkpoint(str(bare), SELF)[1]["meta/epoch"].tolist() == [2]


@pytest.mark.parametrize("entry,value,why", [
    ("model/params", np.array([1.0, np.nan, 2.0]), "2 values that are not finite|1 values that are not finite"),
    ("model/params", np.array([1, 2, 3], np.int64), "int64 values, not floating-point"),
    ("optim/steps", np.array(-3, np.int64), "not a step count >= 0"),
    ("optim/velocity", np.array([np.inf, 0.0, 0.0]), "not finite"),
])
def test_values_that_make_no_sense_are_refused_naming_the_entry(entry, value, why):
    """Values that pass the checksum (a file rewritten with its checksum recomputed) but make no sense."""
    from types import SimpleNamespace

    from training.runtime.state import restore

    model = SimpleNamespace(params=np.zeros(3, np.float32), size=3, dtype=np.float32)
    arrays = {"model/params": np.zeros(3), "optim/steps": np.array(1, np.int64), entry: value}
    with pytest.raises(CheckpointError, match=f"ckpt-epoch0001.npz does not fit this run: entry {entry}.*({why})"):
        restore("ckpt-epoch0001.npz", arrays, model, None, None, None)
    assert model.params.tolist() == [0.0] * 3  # nothing written before the check
