"""Skewed data across ranks (one mpiexec launch at P = 3, a non-power of two): the sample-weighted
average equals the full-batch gradient, and so does the expected step of --weighted-average at H = 1;
H = 1 local SGD equals data-parallel SGD; --average-optimizer averages the optimizer state; the
trainer's partitions, remedies and local SGD end to end in both modes; bad partitions fail before
training."""
from tests.mpirun import run_mpi


def test_non_iid_on_three_ranks(tmp_path):
    out = run_mpi(3, "tests.mpi_non_iid", str(tmp_path), timeout=120).stdout
    for case in ("weighted", "weighted_step", "local_h1", "average_optimizer", "runs", "errors"):
        assert f"case_{case}: ok" in out, out


def test_the_study_runs_end_to_end_in_quick_mode_and_its_figure_draws(tmp_path):
    """Two workers, a data-parallel launch (two methods, one with a remedy) and a parameter-server
    launch, --quick; the results file holds every (method, skew) and the plot reads both files."""
    import json

    from plots import non_iid

    out = str(tmp_path)
    run_mpi(2, "experiments.studies.non_iid_study", "--workers", "2", "--quick", "--methods", "bsp,local4+resample",
            "--out", out, "--allow-noisy", timeout=120)  # the test machine may be busy
    run_mpi(3, "experiments.studies.non_iid_study", "--workers", "2", "--quick", "--methods", "ssp2+shared",
            "--out", out, "--allow-noisy", timeout=120)
    files = [str(tmp_path / "non_iid_w2_dp.json"), str(tmp_path / "non_iid_w2_ps.json")]
    with open(files[0], encoding="utf-8") as f:
        dp = json.load(f)
    assert [(r["method"], r["skew"]) for r in dp["table"]] == [
        ("bsp", "iid"), ("local4+resample", "iid"), ("bsp", "classes:k=5"), ("local4+resample", "classes:k=5")]
    assert all(0 < r["accuracy"] <= 1 and r["bytes_per_sample"] > 0 for r in dp["table"])
    local = next(r for r in dp["table"] if r["method"] == "local4+resample")
    bsp = next(r for r in dp["table"] if r["method"] == "bsp")
    assert 3 < bsp["bytes_per_sample"] / local["bytes_per_sample"] <= 4  # H = 4, one average at each epoch's end
    assert "provenance" in dp
    with open(files[1], encoding="utf-8") as f:
        ps = json.load(f)
    for run in dp["runs"] + ps["runs"]:  # each run keeps the default target and the epochs to its first crossing
        assert run["target"] == 0.95 and (run["time_to_target_s"] is None) == (run["epochs_to_target"] is None)
        assert run["epochs_to_target"] is None or 0 < run["epochs_to_target"] <= 2, run
    assert non_iid.main([*files, "--out", str(tmp_path / "f.png")]) == 0
    assert (tmp_path / "f.png").stat().st_size > 10000


def test_the_study_refuses_a_method_of_the_other_kind_before_training(tmp_path):
    res = run_mpi(2, "experiments.studies.non_iid_study", "--workers", "2", "--methods", "bsp,asp",
                  "--out", str(tmp_path), "--allow-noisy", timeout=60, check=False)
    assert res.returncode == 2 and "method asp is not a data-parallel method" in res.stderr, res.stderr
    assert not (tmp_path / "runs").exists()
