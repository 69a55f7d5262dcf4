"""The compression study end to end on 2 ranks (1 epoch, 2 compressors) and its plot."""
import json
import os

import pytest

from tests.mpirun import run_mpi

pytest.importorskip("training.train")


def test_sweep_writes_results_and_plot(tmp_path):
    out = tmp_path / "study"
    run_mpi(2, "experiments.compression_sweep", "--compressor", "none", "--compressor",
            "topk:ratio=0.01", "--seeds", "0", "--epochs", "1", "--bench-steps", "2", "--out", out,
            "--set", "hidden=16", timeout=180)
    with open(out / "compression_sweep.json", encoding="utf-8") as f:
        results = json.load(f)
    assert results["run"]["P"] == 2 and "mpi_library" in results["run"]
    rows = {r["spec"]: r for r in results["table"]}
    n = results["parameters"]
    assert rows["none"]["bytes_per_step"] == 4 * n  # float32 dense gradient
    # top-1%: k = ceil(0.01 n) indices (int32) and values (float32) per step, exactly
    assert rows["topk:ratio=0.01"]["bytes_per_step"] == 8 * -(-n // 100)
    assert rows["topk:ratio=0.01"]["ratio_to_none"] > 40
    assert 0 < rows["none"]["test_acc_mean"] <= 1 and len(rows["none"]["loss_curve"]) == 1
    assert (out / "compression_sweep.csv").exists()
    from plots.compression import main

    assert main([str(out / "compression_sweep.json")]) == 0
    assert os.path.getsize(out / "compression.png") > 10_000


def test_sweep_rejects_unknown_compressor(tmp_path):
    result = run_mpi(2, "experiments.compression_sweep", "--compressor", "gzip", "--out", tmp_path,
                     timeout=60, check=False)
    assert result.returncode == 1 and "gzip" in result.stdout
