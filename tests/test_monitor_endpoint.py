"""The training job's metrics endpoint bounds its connections as the serving front does.

Oracle: the process's thread count and what a scrape gets. Idle connections (opened, nothing sent)
and a slow one (a byte every 0.2 s) held a thread each for as long as they stayed open; now at most
``MAX_SCRAPES`` are served at once, one more is answered 503 at once, and every connection is closed
``SCRAPE_SECONDS`` after it opened, after which a scrape is served again.
"""
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from training.monitor import exporter


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_idle_and_slow_connections_do_not_hold_the_endpoint(monkeypatch):
    pytest.importorskip("prometheus_client")
    monkeypatch.setattr(exporter, "SCRAPE_SECONDS", 3.0)
    port = _free_port()
    ex = exporter.Exporter(port=port)
    ex.set("commlab_sync_seconds", {0: 0.25})
    url = f"http://127.0.0.1:{port}/metrics"
    before = threading.active_count()  # (the server and its deadlines thread included)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(exporter.MAX_SCRAPES)]
    slow = None
    try:
        wait = time.monotonic() + 3
        while threading.active_count() < before + exporter.MAX_SCRAPES and time.monotonic() < wait:
            time.sleep(0.02)  # every idle connection accepted: each holds its slot
        t0 = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url, timeout=5).read()
        assert e.value.code == 503 and time.monotonic() - t0 < 2.0
        idle += [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
        slow = socket.create_connection(("127.0.0.1", port))
        for _ in range(10):  # a byte every 0.2 s: its deadline counts from its opening
            try:
                slow.sendall(b"G")
            except OSError:
                break
            time.sleep(0.2)
        assert threading.active_count() - before <= exporter.MAX_SCRAPES + 1, threading.enumerate()
        deadline = time.monotonic() + 10
        while threading.active_count() > before + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threading.active_count() <= before + 1, threading.enumerate()
        assert b'commlab_sync_seconds{rank="0"} 0.25' in urllib.request.urlopen(url, timeout=5).read()
    finally:
        for s in idle + ([slow] if slow else []):
            s.close()
        ex.close()
