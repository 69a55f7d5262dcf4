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


def test_check_lines_agree_with_their_verdicts():
    from experiments.compression_sweep import check_lines

    n = 38410
    results = {"parameters": n, "targets": [
        {"spec": "int8", "what": "ratio", "bound": 4.0, "value": 4 * n / (n + 4), "met": False},
        {"spec": "fp16", "what": "ratio", "bound": 2.0, "value": 2.0, "met": True},
        {"spec": "topk", "what": "ratio", "bound": 40.0, "value": 39.999996, "met": False},
        {"spec": "topk", "what": "accuracy", "bound": 1.5, "value": 1.500001, "met": False},
        {"spec": "qsgd", "what": "accuracy", "bound": 0.5, "value": -0.0929, "met": True}]}
    int8, fp16, topk, acc, qsgd = check_lines(results)
    # 4n/(n+4) = 3.99958...: shown with 4 decimals, never as 4.000, with the reason in the line
    assert "3.9996x" in int8 and "not reached" in int8 and "4n/(n+4) = 3.9996" in int8 and "38,410" in int8
    assert "2.0000x" in fp16 and fp16.endswith("; met)")
    # more decimals whenever 4 (ratios) or 2 (points) would round an unmet value onto its bound
    assert "39.999996x" in topk and "not reached" in topk
    assert "1.500001 points below" in acc and "not reached" in acc
    assert "0.09 points above none" in qsgd and "met" in qsgd
    assert not any("MISSED" in line or "target" in line for line in (int8, fp16, topk, acc, qsgd))


def test_help_prints_once_under_mpiexec():
    result = run_mpi(2, "experiments.compression_sweep", "--help", timeout=60)
    assert result.stdout.count("usage: python -m experiments.compression_sweep ") == 1
