"""A real Prometheus server scrapes a short training job (tests/test_monitor_scrape.py).

The server is Debian's ``prometheus`` package, which the test set-up installs where it can
(the Makefile's ``.venv/.prometheus``, part of the test set-up that ``make test`` runs); without the binary
the test is skipped, saying why.
It runs on 127.0.0.1 with a generated configuration that scrapes the job's ``--metrics-port`` every
0.2 s and loads the shipped alerting rules (``training/monitor/alerts.yml``, its ``for`` shortened
from 1 minute to 1 s). A 3-rank data-parallel job with an injected straggler (``--straggler 2:6``)
trains while the test reads, through Prometheus' HTTP query API, the gradient-sync series of every
rank and the ``CommlabStraggler`` alert firing for rank 2 alone (within 30 s). ``promtool`` (same package)
checks the rules and runs a rule unit test: the straggler alert fires for the slow rank only, after its minute.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from commlab.job_control import marked_env, stop_job
from tests.mpirun import launcher_args, launcher_env, mpiexec_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = os.path.join(ROOT, "training", "monitor", "alerts.yml")
PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(port, expr):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.load(r)["data"]["result"]
    except OSError:
        return None


@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary: `make .venv/.prometheus` installs Debian's "
                    "package with apt-get, which needs root and the package registry")
def test_prometheus_scrapes_the_sync_time_and_the_straggler_alert_fires(tmp_path):
    job, prom = _port(), _port()
    with open(RULES, encoding="utf-8") as f:
        rules = f.read()
    assert "for: 1m" in rules
    (tmp_path / "alerts.yml").write_text(rules.replace("for: 1m", "for: 1s"))
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 200ms, evaluation_interval: 200ms}\n"
        "rule_files: [alerts.yml]\n"
        f"scrape_configs:\n  - job_name: commlab\n    static_configs: [{{targets: ['127.0.0.1:{job}']}}]\n")
    server = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{prom}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    env, mark = marked_env(launcher_env())
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [mpiexec_path(), *launcher_args(), "-n", "3", sys.executable, "-m", "training.train", "--data", "synthetic",
           "--samples", "2400", "--features", "256", "--hidden", "512", "--batch-size", "96", "--epochs", "400",
           "--no-progress", "--threads", "1", "--checkpoint-every", "0", "--run-dir", str(tmp_path),
           "--metrics-port", str(job), "--metrics-every", "4", "--straggler", "2:6"]
    train = subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    sync = firing = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (sync is None or firing is None):
            time.sleep(0.5)
            got = _query(prom, "last_over_time(commlab_sync_seconds[1m])")
            if got and len(got) == 3:
                sync = got
            got = _query(prom, 'ALERTS{alertname="CommlabStraggler", alertstate="firing"}')
            if got:
                firing = got
            assert train.poll() is None or sync is not None, "the job ended before Prometheus saw it"
    finally:
        stop_job(train, mark)
        server.terminate()
        server.wait(10)
    assert sync is not None, "no commlab_sync_seconds series for every rank within 30 s"
    assert sorted(s["metric"]["rank"] for s in sync) == ["0", "1", "2"]
    assert all(float(s["value"][1]) >= 0 for s in sync)
    assert firing is not None, "the straggler alert did not fire within 30 s"
    assert [a["metric"]["rank"] for a in firing] == ["2"], firing


PROMTOOL = shutil.which("promtool") or ("/usr/bin/promtool" if os.path.exists("/usr/bin/promtool") else None)

_RULE_TESTS = """
rule_files: [alerts.yml]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: 'commlab_arrival_seconds{job="commlab", instance="h:9100", rank="0"}'
        values: '0.010+0x12'
      - series: 'commlab_arrival_seconds{job="commlab", instance="h:9100", rank="1"}'
        values: '0.011+0x12'
      - series: 'commlab_arrival_seconds{job="commlab", instance="h:9100", rank="2"}'
        values: '0.012 0.012 0.012 0.040+0x9'
      - series: 'commlab_arrival_seconds{job="commlab", instance="h:9100", rank="3"}'
        values: '0.019+0x12'
    alert_rule_test:
      - eval_time: 1m
        alertname: CommlabStraggler
        exp_alerts: []
      - eval_time: 2m
        alertname: CommlabStraggler
        exp_alerts:
          - exp_labels: {job: commlab, instance: "h:9100", rank: "2", severity: warning}
            exp_annotations:
              summary: commlab rank 2 is a straggler
              description: "Rank 2 takes 40ms per step to reach the step's collective, more than twice the median over the ranks, for a minute.\\n"
"""


@pytest.mark.skipif(PROMTOOL is None, reason="no promtool (Debian's prometheus package): `make .venv/.prometheus`")
def test_alert_rules_are_valid_and_the_straggler_rule_fires_for_the_slow_rank_only(tmp_path):
    """promtool's rule unit test: 4 ranks, rank 2's arrival rises from 0.012 s to 0.040 s at 45 s, above
    2 x the median (0.015 s); rank 3 at 0.019 s, above the median but not 2 x, never fires. The alert
    is pending for its minute (none at 1 m) and fires at 2 m for rank 2 alone."""
    ok = subprocess.run([PROMTOOL, "check", "rules", RULES], capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    shutil.copy(RULES, tmp_path / "alerts.yml")
    (tmp_path / "tests.yml").write_text(_RULE_TESTS)
    res = subprocess.run([PROMTOOL, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr
