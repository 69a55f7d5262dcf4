"""A real Prometheus server scrapes a short training job (tests/test_monitor_scrape.py).

The server is Debian's ``prometheus`` package, which the test set-up installs where it can
(``make prometheus``, called by ``make test``); without the binary the test is skipped, saying why.
It runs on 127.0.0.1 with a generated configuration that scrapes the job's ``--metrics-port`` every
0.2 s and loads the shipped alerting rules (``training/monitor/alerts.yml``, its ``for`` shortened
from 1 minute to 1 s). A 3-rank data-parallel job with an injected straggler (``--straggler 2:6``)
trains while the test reads, through Prometheus' HTTP query API, the gradient-sync series of every
rank and the ``CommlabStraggler`` alert firing for rank 2 alone (within 30 s).
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

from experiments.job_stop import marked_env, stop_job
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


@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary: `make prometheus` installs Debian's "
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
           "--samples", "2400", "--features", "64", "--hidden", "192", "--batch-size", "96", "--epochs", "40",
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
