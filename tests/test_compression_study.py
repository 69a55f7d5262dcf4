"""The compression study end to end on 2 ranks (1 epoch, 2 compressors) and its plot."""
import json
import os

import pytest

from tests.mpirun import run_mpi

pytest.importorskip("training.train")


def test_sweep_writes_results_and_plot(tmp_path):
    out = tmp_path / "study"
    run_mpi(2, "experiments.studies.compression_sweep", "--compressor", "none", "--compressor",
            "topk:ratio=0.01", "--seeds", "0", "--epochs", "1", "--bench-steps", "2", "--out", out,
            "--set", "hidden=16", "--allow-noisy", timeout=180)  # the test machine may be busy
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
    result = run_mpi(2, "experiments.studies.compression_sweep", "--compressor", "gzip", "--out", tmp_path,
                     timeout=60, check=False)
    assert result.returncode == 2 and "gzip" in result.stdout


def test_check_lines_agree_with_their_verdicts():
    from experiments.studies.compression_report import check_lines

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
    result = run_mpi(2, "experiments.studies.compression_sweep", "--help", timeout=60)
    assert result.stdout.count("usage: python -m experiments.studies.compression_sweep ") == 1


def test_short_labels():
    from plots.compression import short_label

    assert [short_label(s) for s in ("none", "qsgd:levels=127", "qsgd:levels=1", "topk:ratio=0.01",
                                     "dgc:ratio=0.001,warmup_steps=92", "powersgd:rank=4",
                                     "threshold:threshold=0.05", "int8")] == [
        "none", "qsgd-8bit", "qsgd-2bit", "topk-1%", "dgc-0.1%", "powersgd-r4", "threshold-0.05", "int8"]


# (spec, payload bytes per step, test accuracy mean, min, max) of the 4-rank, 3-seed study
_STUDY = [("none", 153640, .9703, .9582, .9777), ("fp16", 76820, .9703, .9582, .9777),
          ("int8", 38414, .9712, .9582, .9777), ("qsgd:levels=127", 38714, .9703, .9582, .9777),
          ("terngrad", 9607, .9545, .9387, .9666), ("signsgd", 4806, .9610, .9443, .9694),
          ("efsignsgd", 4806, .9694, .9582, .9777), ("onebit", 4810, .9703, .9610, .9777),
          ("topk:ratio=0.01", 3080, .9675, .9554, .9749), ("randomk:ratio=0.01", 1540, .8951, .8719, .9164),
          ("threshold:threshold=0.05", 3542, .9703, .9582, .9777),
          ("dgc:ratio=0.01,warmup_steps=92", 7130, .9731, .9638, .9805),
          ("powersgd:rank=1", 6480, .9656, .9499, .9749), ("powersgd:rank=4", 19656, .9694, .9582, .9749)]

# wire bytes per step of the same study on 4 ranks (auto: recursive doubling for the all-reduced ones)
_WIRE = {"none": 307280, "fp16": 153640, "int8": 115242, "qsgd:levels=127": 116142, "terngrad": 28821,
         "signsgd": 28821, "efsignsgd": 14418, "onebit": 14430, "topk:ratio=0.01": 9240, "randomk:ratio=0.01": 3080,
         "dgc:ratio=0.01,warmup_steps=92": 9240, "powersgd:rank=1": 12960, "powersgd:rank=4": 39312}


def test_plot_labels_overlap_nothing_and_axes_agree():
    from matplotlib.text import Text

    from plots.compression import figure, short_label

    rows = [{"spec": s, "compressor": s.split(":")[0], "bytes_per_step": b, "test_acc_mean": m,
             "test_acc_min": lo, "test_acc_max": hi, "seeds": 3, "loss_curve": [1.0, 0.5, 0.3 + i / 100],
             "wire_bytes_per_step": _WIRE.get(s)}
            for i, (s, b, m, lo, hi) in enumerate(_STUDY)]
    fig = figure({"table": rows, "parameters": 38410, "run": {"P": 4}, "train_config": {}})
    ax_acc, ax_loss = fig.axes[:2]
    renderer = fig.canvas.get_renderer()
    labels = {t.get_text(): Text.get_window_extent(t, renderer) for t in ax_acc.texts[1:]}
    assert set(labels) == ({short_label(s) for s, *_ in _STUDY if s in _WIRE}
                           | {"threshold-0.05 (payload; wire not measured)"})
    boxes = list(labels.values())
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
    markers = [ln.get_window_extent(renderer) for ln in ax_acc.lines
               if len(ln.get_xdata()) == 1 and ln.get_marker() not in ("_", "None", "")]
    assert len(markers) == len(_STUDY)
    assert not [(t, m) for t, b in labels.items() for m in markers if b.overlaps(m)]
    # points of equal bytes (signsgd, efsignsgd) do not sit on each other
    centres = sorted(tuple(m.get_points().mean(axis=0).round()) for m in markers)
    assert len(set(centres)) == len(centres)
    # one quantity on the accuracy panel, named alike in the title and on the axis; every point has its bar
    assert "wire bytes per rank per step" in ax_acc.get_title()
    assert "wire bytes per rank per step" in ax_acc.get_xlabel()
    assert len(ax_acc.containers) == len(_STUDY)
    ticks = [t for t in ax_loss.get_xticks() if ax_loss.get_xlim()[0] <= t <= ax_loss.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
    fig.clf()
