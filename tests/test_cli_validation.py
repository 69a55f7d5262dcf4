"""Command-line checks of the experiment scripts, in one process: a bad argument gives one argparse-style
error line (``PROG: error: ...``, no traceback) and exit status 2, before any measurement.

Oracle: the exit status and the stderr text; each case also asserts no results file was written.
"""
import json

import pytest

from experiments import demo

from experiments.bench import sweep_options as bench_collectives

from experiments.bench import trainer_vs_torch as bench_trainer

from experiments.studies import compression_sweep

from experiments.studies import scale_sim

from experiments.bench import tune


def _fails(capsys, main, argv, needle):
    """Run ``main(argv)``; assert exit 2 and one error line containing ``needle``; return that line."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ": error: " in ln]
    assert info.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("argv, needle", [(["--mib", "nan"], "--mib"), (["--mib", "-1"], "--mib"),
                                          (["--iters", "0"], "--iters")])
def test_demo(capsys, argv, needle):
    _fails(capsys, demo.main, argv, needle)


@pytest.mark.parametrize("argv, needle", [
    (["--ranks-per-node", "0"], "--ranks-per-node"), (["--alpha-intra", "-1"], "--alpha-intra"),
    (["--gamma", "nan"], "--gamma"), (["--beta-inter", "inf"], "--beta-inter"), (["--sizes", "0"], "--sizes"),
    (["--fit", "no-such-file.json"], "No such file"), (["--out", "FILE/x.json"], "--out")])
def test_scale_sim(capsys, tmp_path, argv, needle):
    (tmp_path / "FILE").write_text("a file, so FILE/x.json cannot be made, even by root")
    argv = [a.replace("FILE", str(tmp_path / "FILE")) for a in argv]
    argv = argv if "--out" in argv else argv + ["--out", str(tmp_path / "s.json")]
    _fails(capsys, scale_sim.main, ["--max-p", "8"] + argv, needle)
    assert not (tmp_path / "s.json").exists()


def test_scale_sim_rejects_a_foreign_fit_file(capsys, tmp_path):
    (tmp_path / "list.json").write_text("[1, 2]")
    _fails(capsys, scale_sim.main, ["--fit", str(tmp_path / "list.json"), "--out", str(tmp_path / "s.json")],
           "not an experiments.bench.collectives results file")


@pytest.mark.parametrize("content, needle", [([1, 2], "not an experiments.bench.collectives results file"),
                                             ({"rows": [{"collective": "allreduce"}]}, "lacks"),
                                             ({"rows": []}, "no all-reduce rows of the algorithms auto may choose")])
def test_tune(capsys, tmp_path, content, needle):
    (tmp_path / "r.json").write_text(json.dumps(content))
    _fails(capsys, tune.main, [str(tmp_path / "r.json"), "--out", str(tmp_path / "t.json")], needle)
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--max-time", "nan"], "--max-time"), (["--ops", ""], "no ops"), (["--ops", ","], "no ops"),
    (["--min-bytes", "1", "--max-bytes", "2"], "no sizes/ops to measure"),
    (["--max-bytes", "inf"], "--max-bytes")])
def test_bench_collectives(capsys, argv, needle):
    _fails(capsys, bench_collectives.parse_args, argv, needle)


def test_bench_collectives_allgather_needs_p_elements(capsys):
    def parse(argv):
        return bench_collectives.parse_args(argv, size=4)

    _fails(capsys, parse, ["--ops", "allgather", "--min-bytes", "8", "--max-bytes", "8"], "no sizes/ops")
    assert bench_collectives.parse_args(["--ops", "allgather", "--max-bytes", "16"], size=4).max_bytes == 16


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--repeats", "0"], ["--batch", "-5"], ["--batch", "0"],
                                  ["--threads", "0"], ["--threads", "-1"]])
def test_bench_trainer(capsys, tmp_path, argv):
    _fails(capsys, bench_trainer.main, argv + ["--out", str(tmp_path / "b.json")], argv[0])
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--compressor", "topk:ratio=abc"], "topk:ratio=abc"), (["--set", "mode=ps"], "mode=ps"),
    (["--set", "foo=1"], "foo"), (["--set", "seed=1"], "seed"), (["--seeds", "a"], "--seeds"),
    (["--epochs", "0"], "--epochs")])
def test_compression_sweep(capsys, tmp_path, argv, needle):
    _fails(capsys, compression_sweep.main, argv + ["--out", str(tmp_path)], needle)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("module, argv, needle", [
    ("experiments.demo", ["--mib", "nan"], "--mib"),
    ("experiments.studies.compression_sweep", ["--set", "batch_size=1"], "smaller than the number of ranks"),
    ("experiments.bench.collectives", ["--ops", "allgather", "--min-bytes", "4", "--max-bytes", "4"],
     "no sizes/ops")])
def test_error_printed_once_under_mpiexec(tmp_path, module, argv, needle):
    from tests.mpirun import run_mpi

    out = ["--out", str(tmp_path / "r")] if module != "experiments.demo" else []
    proc = run_mpi(2, module, *argv, *out, timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout.count(": error: ") == 1 and needle in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stdout and not list(tmp_path.iterdir())


#: Every study and plot command, with an input it needs that does not exist (None: it reads none;
#: no MISSING: its required flags only).
_COMMANDS = [
    ("experiments.studies.compression_sweep", None), ("experiments.studies.model_parallel_study", None),
    ("experiments.studies.non_iid_study", ["--workers", "2"]), ("experiments.studies.ps_study", None),
    ("experiments.studies.replica_study", None), ("experiments.studies.staleness_sweep", None),
    ("experiments.studies.hot_rows", None),
    ("experiments.studies.scale_sim", ["--fit", "MISSING"]),
    ("experiments.studies.serving_study", ["--checkpoint", "MISSING"]),
    ("plots.bench", ["MISSING"]), ("plots.cluster", ["MISSING"]), ("plots.compression", ["MISSING"]),
    ("plots.model_parallel", ["MISSING"]), ("plots.non_iid", ["MISSING"]), ("plots.publish", None),
    ("plots.scaling", ["MISSING"]), ("plots.serving", ["MISSING"]), ("plots.staleness", ["MISSING"]),
    ("plots.training", ["MISSING"])]


def _one_line(capsys, main, argv):
    """Run ``main(argv)`` (exiting or returning); return (status, the one error line of stderr)."""
    try:
        code = main(argv)
    except SystemExit as info:
        code = info.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error: " in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return code, lines[0]


@pytest.mark.parametrize("module, missing", _COMMANDS, ids=[m for m, _ in _COMMANDS])
def test_every_study_and_plot_answers_a_bad_flag_and_a_missing_file_with_one_line(capsys, tmp_path, module,
                                                                                   missing):
    """A flag no command has, then (where the command reads a file) a path that does not exist:
    status 2 and one error line naming the flag or the path, before any measurement or drawing."""
    import importlib

    mod = importlib.import_module(module)  # a package's command is its __main__ (python -m plots.publish)
    main = getattr(mod, "main", None) or importlib.import_module(module + ".__main__").main
    present = tmp_path / "present.json"  # an input that exists: the unknown flag is the one error
    present.write_text("{}")
    code, line = _one_line(capsys, main, ["--no-such-flag", *[str(present) if a == "MISSING" else a
                                                               for a in missing or []]])
    assert code == 2 and "--no-such-flag" in line, line
    if missing is not None and "MISSING" in missing:
        path = str(tmp_path / "no-such-file.json")
        code, line = _one_line(capsys, main, [path if a == "MISSING" else a for a in missing]
                               + ["--out", str(tmp_path / "out")])
        assert code == 2 and path in line, line
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["present.json"]
