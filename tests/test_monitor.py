"""Live monitoring (training/monitor/): the straggler and stall rules, the exposition, TensorBoard files,
the options, and the multi-rank cases of ``tests/mpi_monitor.py`` (3 ranks, one launch)."""
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

from tests.mpirun import run_mpi
from training.settings.cli import parse_args
from training.monitor.detect import StragglerRule, stalled
from training.monitor.exporter import METRICS, Exporter, check_endpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(ROOT, "docs", "guide", "monitoring.md")
OVERHEAD = os.path.join(ROOT, "plots", "reference", "bench", "metrics_overhead_p4.json")


def test_straggler_rule_names_the_injected_rank_after_n_intervals_and_no_one_on_noise():
    rng = np.random.default_rng(0)
    clean, slow = StragglerRule(4, 2.0, 3), StragglerRule(4, 2.0, 3)
    named = {"clean": [], "slow": []}
    for i in range(200):
        times = 0.01 * rng.uniform(0.8, 1.2, 4)  # +-20 % noise: never 2 x the median
        named["clean"] += clean.update(times)
        times[3] *= 4.0 if i >= 50 else 1.0      # rank 3 slowed 4 x from interval 50 on: above 2 x at once
        named["slow"] += [(i, r) for r in slow.update(times)]
    assert named["clean"] == []
    assert named["slow"] == [(52, 3)]  # the third interval in a row, once
    assert slow.slow.tolist() == [False, False, False, True]


def test_straggler_rule_ignores_ranks_that_did_not_report_and_checks_its_arguments():
    rule = StragglerRule(3, 2.0, 1)
    assert rule.update([0.01, 0.01, 9.0], live=[True, True, False]) == []  # rank 2 silent: not in the median
    assert rule.update([0.01, 0.01, 0.05]) == [2]
    for bad in (dict(size=0), dict(size=3, factor=1.0), dict(size=3, intervals=0)):
        with pytest.raises(ValueError, match=next(iter(k for k in bad if k != "size" or bad[k] == 0))):
            StragglerRule(**{"size": 3, **bad})


def test_stall_rule():
    assert stalled([7, 7, 7], since=0.0, now=100.0, threshold=1.0) == []  # nobody behind
    assert stalled([7, 6, 5], since=10.0, now=10.5, threshold=1.0) == []
    assert stalled([7, 6, 5], since=10.0, now=11.5, threshold=1.0) == [1, 2]


def _families(text):
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text)}


def test_exposition_names_units_labels_and_the_http_endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ex = Exporter(port, "127.0.0.1")
    try:
        for name, kind, label, _ in METRICS:
            values = {0: 1.5, 1: 2.5}
            ex.inc(name, values) if kind == "counter" else ex.set(name, values)
        assert check_endpoint("127.0.0.1", port) == "address already in use"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            page = r.read().decode()
    finally:
        ex.close()
    assert check_endpoint("127.0.0.1", port) == ""  # freed
    fams = _families(page)
    assert sorted(fams) == sorted(name for name, _, _, _ in METRICS)  # nothing else: an own registry
    for name, kind, label, help_ in METRICS:
        assert name.startswith("commlab_") and fams[name].type == kind
        for unit in ("seconds", "bytes"):  # base units, named in the suffix (a counter's before _total)
            assert (f"({unit})" in help_) == name.endswith(f"_{unit}"), (name, help_)
        samples = [s for s in fams[name].samples if not s.name.endswith("_created")]
        assert {tuple(s.labels) for s in samples} == {(label,)}, (name, samples)
        assert sorted(s.value for s in samples) == [1.5, 2.5]  # the values set, read back by the parser
    assert "_created" not in page


def test_the_exporter_updates_the_series_it_keeps():
    ex = Exporter()
    ex.set("commlab_sync_seconds", {0: 1.0, 1: 2.0})
    ex.set("commlab_sync_seconds", {0: 3.0, np.int64(1): 4.0})  # a NumPy rank is the same series
    ex.inc("commlab_sent_bytes", {0: 5, 1: 0})
    ex.inc("commlab_sent_bytes", {0: 7, 1: 0})
    fams = _families(ex.text())
    assert {s.labels["rank"]: s.value for s in fams["commlab_sync_seconds"].samples} == {"0": 3.0, "1": 4.0}
    assert {s.labels["rank"]: s.value for s in fams["commlab_sent_bytes"].samples} == {"0": 12.0, "1": 0.0}


def test_the_benchmarks_scraper_reads_the_endpoint_from_a_process_of_its_own():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ex = Exporter(port, "127.0.0.1")
    try:
        done = subprocess.run([sys.executable, "-m", "experiments.bench.scrape", "--port", str(port), "--every",
                               "0.05", "--count", "3"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    finally:
        ex.close()
    assert done.returncode == 0 and done.stdout == "scrapes 3 failed 0\n", (done.stdout, done.stderr)


def test_metrics_guide_lists_every_metric_with_unit_and_label():
    with open(GUIDE, encoding="utf-8") as f:
        text = f.read()
    for name, kind, label, _ in METRICS:
        shown = name + ("_total" if kind == "counter" else "")
        row = [ln for ln in text.splitlines() if ln.startswith(f"| `{shown}`")]
        assert len(row) == 1, shown
        assert f"`{label}`" in row[0], row


def test_tensorboard_scalars_read_back_with_tensorboards_reader(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from training.monitor.board import Board

    board = Board(str(tmp_path))
    for step in (10, 20, 30):
        board.add(step, {"sync_seconds": {"rank0": step / 1000, "rank1": step / 500}})
    board.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["sync_seconds/rank0", "sync_seconds/rank1"]
    points = acc.Scalars("sync_seconds/rank1")
    assert [p.step for p in points] == [10, 20, 30]
    np.testing.assert_allclose([p.value for p in points], [0.02, 0.04, 0.06], rtol=1e-6)  # float32 on disk


@pytest.mark.parametrize("flags, match", [
    (["--metrics-port", "70000"], "metrics_port"),
    (["--straggler-factor", "1"], "straggler_factor"),
    (["--metrics-every", "0"], "metrics_every"),
    (["--stall-seconds", "-1"], "stall_seconds"),
    (["--straggler", "1:3", "--pipeline-parallel", "2"], "straggler"),
])
def test_bad_monitoring_options_are_refused_naming_them(flags, match, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(flags)
    assert e.value.code == 2 and match in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--monitor"], ["--metrics-port", "9100"], ["--tensorboard", "tb"],
                                   ["--mode", "ps", "--optimizer", "sgd", "--monitor"]])
def test_monitoring_a_ctr_run_is_refused_with_one_error_line(flags, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--model", "ctr", *flags])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert [ln for ln in err.splitlines() if "error:" in ln] == [next(ln for ln in err.splitlines() if "error:" in ln)]
    assert "--model ctr runs are not watched by live monitoring" in err, err


def test_the_committed_overhead_measurement_meets_the_documented_targets():
    """docs/guide/monitoring.md, Cost: each monitored variant's median step within the off runs' range, and
    the monitoring's own time (largest rank, median of the repeats) at most 2 % of the step."""
    with open(OVERHEAD, encoding="utf-8") as f:
        r = json.load(f)
    assert r["provenance"]["noisy"] is False and len(r["step_s"]["off"]) >= 5, r["provenance"]
    off = r["step_s"]["off"]
    for arm in ("watch", "serve"):
        step = statistics.median(r["step_s"][arm])
        assert r[arm]["within_off_spread"] and min(off) <= step <= max(off), (arm, step, off)
        own = statistics.median(r[arm]["monitor_overhead"])
        assert own <= 0.02, f"{arm}: the monitoring's own time is {own:.2%} of the step, above the 2 % target"


def test_monitoring_on_three_ranks(tmp_path):
    out = run_mpi(3, "tests.mpi_monitor", tmp_path, timeout=300).stdout
    for case in ("port", "clean", "straggler", "stall", "stopped", "ps", "ps_clean", "ps_stall", "ps_bsp_stall",
                 "grid"):
        assert f"case_{case}: ok" in out, out


def test_the_guide_shows_the_shipped_alerting_rules_as_they_are():
    with open(GUIDE, encoding="utf-8") as f:
        blocks = re.findall(r"^```yaml\n(.*?)^```", f.read(), flags=re.M | re.S)
    with open(os.path.join(ROOT, "training", "monitor", "alerts.yml"), encoding="utf-8") as f:
        assert f.read() in blocks
