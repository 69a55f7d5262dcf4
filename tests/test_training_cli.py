"""The trainer's command line as a user meets it (single process, ``training.train.main``):
resuming after ``--stop-after``, the note on a changed ``--epochs``, provenance in config.json,
one-line user errors that leave no run directory behind, and the help text. The multi-rank
side (one message from rank 0, no hang) is checked by ``tests/test_training_mpi.py``."""
import json
import re
import sys

import pytest
from mpi4py import MPI

from commlab.run_files import run_info
from training.train import main

# 200 synthetic samples -> 160 train, 5 steps per epoch with batch 32: well under a second per run
TINY = ["--data", "synthetic", "--samples", "200", "--features", "8", "--classes", "3", "--hidden", "8",
        "--batch-size", "32", "--no-progress"]


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_resume_runs_past_stop_after_and_keeps_provenance(tmp_path, capsys):
    run = str(tmp_path / "a")
    code, out, _ = _run(capsys, *TINY, "--run-dir", str(tmp_path), "--name", "a", "--epochs", "2",
                        "--stop-after", "1")
    assert code == 0 and "after 1 epoch |" in out, out
    first = json.loads((tmp_path / "a" / "config.json").read_text())["run"]

    # --stop-after 1 is saved in config.json but not inherited: the resume trains epoch 2
    code, out, err = _run(capsys, "--resume", run, "--no-progress")
    assert code == 0 and "after 2 epochs |" in out and "WARNING" not in err, err
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["epochs"] == 2

    # at the last epoch: one log line says so, and nothing is written
    code, out, err = _run(capsys, "--resume", run, "--no-progress")
    assert code == 0 and out == "" and err == f"[rank 0] INFO: nothing to do: {run} is already at epoch 2 of 2 " \
                                               "(a larger --epochs trains further)\n", (out, err)

    # a longer run redefines the cosine schedule: said once, before training
    code, out, err = _run(capsys, "--resume", run, "--epochs", "3", "--no-progress")
    assert code == 0 and err.count("WARNING") == 1 and err.splitlines()[0] == (
        "[rank 0] WARNING: --epochs 3 differs from the run's 2: the learning-rate schedule is recomputed for 3 "
        "epochs, so the result will not equal an uninterrupted 3-epoch run"), err
    assert "after 3 epochs |" in out, out

    # config.json keeps the first job's record; each resume that trained is appended
    record = json.loads((tmp_path / "a" / "config.json").read_text())
    assert record["run"] == first and record["config"]["epochs"] == 3
    assert [r["changed"] for r in record["resumes"]] == [{"stop_after": [1, 0]}, {"epochs": [2, 3]}]
    assert all(r["resumed_from"].endswith(".npz") and r["started"] for r in record["resumes"])


def test_mpi_library_version_has_no_padding():
    version = run_info(MPI.COMM_SELF)["mpi_library"]
    assert version and "  " not in version and version == version.strip(), repr(version)


def test_user_errors_are_one_line_and_leave_no_run_directory(tmp_path, capsys, monkeypatch):
    base = [*TINY, "--epochs", "1", "--run-dir", str(tmp_path)]
    assert _run(capsys, *base, "--name", "a")[0] == 0

    code, out, err = _run(capsys, *base, "--name", "a")  # the name is taken
    assert code == 1 and err == (f"error: run directory {tmp_path / 'a'} exists: choose another --name, "
                                 f"or continue it with --resume {tmp_path / 'a'}\n"), err

    missing = str(tmp_path / "nonexist")
    with pytest.raises(SystemExit) as e:
        main(["--resume", missing])
    assert e.value.code == f"error: --resume {missing}: no such run directory or checkpoint"

    with pytest.raises(SystemExit) as e:
        main([*base, "--algorithm", "foo"])
    printed = capsys.readouterr().err
    err = printed.splitlines()[-1]
    assert e.value.code == 2 and "error: --algorithm: algorithm must be one of ring, tree, " in err and "got 'foo'" in err, err
    assert err.endswith("(see --help)") and printed.count("\n") == 1, printed  # one line: no usage block

    # auto's tuning table is read before the run directory exists
    from collectives.model import auto as select

    with monkeypatch.context() as m:
        m.setenv("COMMLAB_TUNING", str(tmp_path / "no-table.json"))
        m.setitem(select._STATE, "loaded", False)
        code, _, err = _run(capsys, *base, "--name", "b")
    assert code == 1 and err.startswith(f"error: COMMLAB_TUNING={tmp_path / 'no-table.json'}: file not found")
    assert err.count("\n") == 1 and not (tmp_path / "b").exists(), err

    monkeypatch.setitem(sys.modules, "cupy", None)  # CuPy not installed
    code, _, err = _run(capsys, *base, "--name", "c", "--device", "gpu")
    assert code == 1 and err.startswith("error: --device gpu needs CuPy"), err
    assert err.endswith("install the gpu extra: pip install -e '.[gpu]'\n") and not (tmp_path / "c").exists()
    # --mode ps: its own checks (rank count, fault specs, server checkpoints) also come first
    code, _, err = _run(capsys, *base, "--name", "d", "--mode", "ps")
    assert code == 1 and err == ("error: --mode ps with --servers 1 needs at least 2 ranks (1 server(s) and "
                                 "at least one worker), got 1; launch with mpiexec -n 2 or more\n"), err
    from training.settings.cli import parse_args
    from training.ps_mode.worker import check_ps

    with pytest.raises(ValueError, match="straggler rank must be a worker rank in \\[1, 1\\], got 9"):
        check_ps(parse_args([*base, "--mode", "ps", "--straggler", "9:2"]), 2)
    with pytest.raises(ValueError, match="no parameter-server checkpoint .*ps_server0.npz"):
        check_ps(parse_args(["--resume", str(tmp_path / "a"), "--mode", "ps"]), 2)
    assert json.loads((tmp_path / "a" / "config.json").read_text())["config"]["mode"] == "dp"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "latest"]


@pytest.mark.parametrize("saved, message", [
    ({"epochs": None}, "epochs must be an integer, got None"),
    ({"hidden": 5}, "hidden must be a list of integers, got 5"),
    ({"lr": "fast"}, "lr must be a number, got 'fast'"),
])
def test_damaged_saved_config_is_one_error_naming_file_and_key(tmp_path, saved, message):
    (tmp_path / "config.json").write_text(json.dumps({"config": saved}))
    with pytest.raises(SystemExit) as e:
        main(["--resume", str(tmp_path)])
    assert e.value.code == (f"error: --resume {tmp_path}: bad configuration in {tmp_path / 'config.json'}: "
                            f"{message}"), e.value.code


@pytest.mark.parametrize("flags, message", [
    (["--lr", "inf"], "argument --lr: must be a number in [-1e+15, 1e+15], got 'inf'"),
    (["--weight-decay", "nan"], "argument --weight-decay: must be a number in [-1e+15, 1e+15], got 'nan'"),
    (["--momentum", "nan"], "argument --momentum: must be a number in [-1e+15, 1e+15], got 'nan'"),
    (["--eps", "inf"], "argument --eps: must be a number in [-1e+15, 1e+15], got 'inf'"),
    (["--momentum", "5"], "--momentum: momentum must be in [0, 1), got 5.0"),
    (["--samples", "1"], "--samples: samples (1) with test_fraction 0.2 leaves no training sample"),
])
def test_values_that_cannot_train_are_flag_errors(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as e:
        main([*TINY, "--run-dir", str(tmp_path), *flags])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"error: {message}" in err and not any(tmp_path.iterdir()), err


def test_compressor_argument_that_is_not_a_number_is_named(tmp_path, capsys):
    code, _, err = _run(capsys, *TINY, "--run-dir", str(tmp_path), "--compression", "topk",
                        "--compression-arg", "ratio=abc")
    assert code == 1 and err == "error: ratio must be a number, got 'abc'\n" and not any(tmp_path.iterdir()), err


def test_help_explains_modes_grid_and_resume():
    from training.settings.cli import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "--mode ps" in text and "parameter server" in text.split("options:")[0]
    assert "squarest factorization of P" in text and "nodes x ranks per node" in text
    resume = text.split("--resume PATH ")[-1]
    stop = text.split("--stop-after EPOCH ")[-1]
    for part in (resume, stop):
        assert "--epochs unchanged" in part.split("(default")[0] and "bitwise" in part.split("(default")[0]
    assert "not inherited" in stop.split("(default")[0] and "not inherited" in resume.split("(default")[0]


def test_ranks_started_with_different_settings_stop_with_one_line(tmp_path):
    """Oracle: the settings each rank was given; the per-rank --log-level is not compared. One MPMD launch
    runs five jobs: data-parallel ranks with other options, a pipeline whose stages differ in width,
    in options, or in whether they were started on the grid at all, and ctr ranks with another table count,
    mode and hot split (ctr took its own driver before the comparison); every rank ends with status 1."""
    from tests.mpirun import run_mpi

    runs = str(tmp_path / "runs")  # MPMD: three programs, each its own command line
    res = run_mpi(1, "tests.mpi_agree", runs, "base", more=[(1, [runs, "lr"]), (1, [runs, "seed"])], timeout=90)
    line = "error: the ranks were started with different settings"
    said = {job: [t for t in res.stdout.splitlines() if t.startswith(line) and f"--{key}:" in t]
            for job, key in (("options", "seed"), ("widths", "hidden"), ("stage-options", "micro-batches"),
                             ("driver", "pipeline-parallel"), ("ctr", "ctr-hot"))}
    assert res.stdout.count(line) == 5 and all(len(v) == 1 for v in said.values()), res.stdout
    assert "--lr: rank 0: 0.001; ranks 1,2: 0.01" in said["options"][0], res.stdout
    assert "--seed: ranks 0,1: 0; rank 2: 3" in said["options"][0] and "log-level" not in said["options"][0]
    # a pipeline: the stages' widths (no layout check of whole models can compare them), the stages'
    # options, and a rank started without the grid, which takes another driver
    assert "--hidden: ranks 0,1: [16, 16]; rank 2: [16, 8]" in said["widths"][0], res.stdout
    assert "--lr: rank 0: 0.001; ranks 1,2: 0.01" not in said["stage-options"][0], res.stdout
    assert "--lr: ranks 0,2: 0.001; rank 1: 0.01" in said["stage-options"][0], res.stdout
    assert "--micro-batches: ranks 0,1: 1; rank 2: 2" in said["stage-options"][0], res.stdout
    assert "--pipeline-parallel: ranks 0,1: 3; rank 2: 1" in said["driver"][0], res.stdout
    for setting in ("--ctr-tables: ranks 0,2: 3; rank 1: 4", '--mode: ranks 0,1: "dp"; rank 2: "ps"',
                    "--ctr-hot: ranks 0,1: 0; rank 2: 10"):
        assert setting in said["ctr"][0], (setting, res.stdout)
    for job in said:  # "options rank" is also inside "stage-options rank"; the launcher may join a rank's end
        ends = re.findall(rf"(?<!-){re.escape(job)} rank \d+ status (\d+) made (\w+)", res.stdout)  # to a line
        assert ends == [("1", "False")] * 3, res.stdout
    assert "Traceback" not in res.stdout, res.stdout
    # a command line that fails to parse on one rank only: every rank ends (status 2), none waits
    res = run_mpi(3, "tests.mpi_agree", str(tmp_path / "runs2"), "parse", timeout=60, check=False)
    assert "error: rank 2: python -m training.train: error: argument --lr: must be a number in [-1e+15, 1e+15], got 'abc' (see --help)" in res.stdout
    assert "the command line fails on rank(s) 2 only" in res.stdout and res.stdout.count("status 2 made False") == 3
    # serving: a replica started with another --max-batch; one line names the setting and the ranks
    res = run_mpi(3, "tests.mpi_agree", str(tmp_path / "serve"), "serve", timeout=60)
    assert res.stdout.count("error: the ranks were started with different settings") == 1, res.stdout
    assert "--max-batch: ranks 0,1: 8; rank 2: 4" in res.stdout and res.stdout.count("status 2") == 3, res.stdout


def test_kills_before_the_configuration_and_foreign_checkpoints(tmp_path, capsys):
    """A run killed before it wrote config.json (its directory empty, or holding a temporary file)
    starts again by --resume with its flags and by the same --name; by --resume with no flag that
    says which job (the defaults would train a run nobody asked for) it is refused with one line and
    nothing written; a checkpoint copied in from another run is refused naming
    --allow-foreign-checkpoint, which then starts from it."""
    import shutil

    for leftover in ([], ["config.json.tmp.4242"]):
        run = tmp_path / f"bare{len(leftover)}"
        run.mkdir()
        for name in leftover:
            (run / name).write_text('{"conf')
        for extra in ([], ["--no-progress", "--timeout", "5", "--stop-after", "1"]):
            with pytest.raises(SystemExit) as e:
                main(["--resume", str(run), *extra])
            assert e.value.code == (f"error: --resume {run}: the run has no configuration yet (no config.json: it "
                                    "stopped before writing one), so there is nothing to continue; give the "
                                    "run's flags with --resume to start it there"), e.value.code
            assert sorted(p.name for p in run.iterdir()) == leftover
    for how in ("resume", "name"):
        run = tmp_path / how
        run.mkdir()
        (run / "config.json.tmp.4242").write_text('{"conf')  # a writer killed mid-write
        argv = ["--resume", str(run)] if how == "resume" else ["--run-dir", str(tmp_path), "--name", how]
        code, out, err = _run(capsys, *TINY, *argv, "--epochs", "1")
        assert code == 0 and "after 1 epoch |" in out, (how, out, err)
        assert not list(run.glob("*.tmp*")) and json.loads((run / "config.json").read_text())["run"]["run_id"]
    assert _run(capsys, *TINY, "--run-dir", str(tmp_path), "--name", "other", "--epochs", "1")[0] == 0
    shutil.copy(tmp_path / "name" / "ckpt-epoch0001.npz", tmp_path / "other" / "ckpt-epoch0001.npz")
    code, out, err = _run(capsys, "--resume", str(tmp_path / "other"), "--epochs", "2", "--no-progress")
    assert code != 0 and "ckpt-epoch0001.npz was written by run" in out + err and "--allow-foreign-checkpoint" in out + err
    code, out, err = _run(capsys, "--resume", str(tmp_path / "other"), "--epochs", "2", "--no-progress",
                          "--allow-foreign-checkpoint")
    assert code == 0 and "after 2 epochs |" in out, (out, err)
