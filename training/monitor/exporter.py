"""The metrics a running job exposes, in Prometheus' text exposition format, from one rank.

One :class:`Exporter` lives on the rank that gathers the others' figures (rank 0: the first rank
of a synchronous run, server 0 of a parameter-server run). It holds the metrics of
:data:`METRICS` in a registry of its own (``prometheus_client.CollectorRegistry``: no process or
garbage-collector series beside them) and, given a port, serves them over HTTP
(``prometheus_client.make_wsgi_app`` on a threading server) on ``host:port`` (127.0.0.1 unless told
otherwise), in threads of their own, so a scrape never waits for the training loop nor the loop for
a scrape. The endpoint's threads are bounded as the serving front bounds its connections: at most
:data:`MAX_SCRAPES` connections are served at once (one more is answered 503 and closed), and a
connection is closed :data:`SCRAPE_SECONDS` seconds after it opened, whatever it has sent, so idle
or slow connections cannot hold the threads.

Names start with ``commlab_`` and are in base units (seconds, bytes); per-rank values carry a
``rank`` label and the parameter servers' a ``server`` label, so a job has at most P series of
each metric.
"""
import errno
import os
import socket
import time

__all__ = ["METRICS", "Exporter", "check_endpoint", "MAX_SCRAPES", "SCRAPE_SECONDS"]

#: Connections the metrics endpoint serves at once, and the seconds a connection may stay open.
MAX_SCRAPES, SCRAPE_SECONDS = 8, 5.0

#: (name, kind, label, help) of every metric. ``kind`` is ``gauge`` or ``counter`` (exposed with the
#: ``_total`` suffix); ``label`` is ``rank``, ``server`` or ``""`` (one series per job).
METRICS = (
    ("commlab_step", "gauge", "rank", "Last step (PS worker: clock) the rank reported."),
    ("commlab_step_seconds", "gauge", "rank", "Mean step time over the last interval (seconds)."),
    ("commlab_compute_seconds", "gauge", "rank",
     "Mean compute time per step over the last interval: forward, backward, optimizer, injected delay (seconds)."),
    ("commlab_arrival_seconds", "gauge", "rank",
     "Mean time from a step's start to the rank's arrival at the step's first collective (seconds)."),
    ("commlab_sync_seconds", "gauge", "rank",
     "Mean gradient-sync time per step: all-reduce with its wait, or PS push and pull (seconds)."),
    ("commlab_wait_seconds", "gauge", "rank",
     "Mean time per step spent waiting for other ranks (for the last rank at the step's collective, "
     "for a pipeline neighbour, or for the servers' answer to a pull) (seconds)."),
    ("commlab_compression_seconds", "gauge", "rank", "Mean compression and decompression time per step (seconds)."),
    ("commlab_batch_share", "gauge", "rank",
     "Mean samples per step the rank took of the global batch (its share; --balance moves it by speed)."),
    ("commlab_sent_bytes", "counter", "rank", "Gradient bytes the rank handed to the network (bytes)."),
    ("commlab_skipped_steps", "counter", "rank", "Steps skipped for a non-finite loss or gradient."),
    ("commlab_straggler", "gauge", "rank", "1 while the rank is named a straggler, else 0."),
    ("commlab_straggler_events", "counter", "rank", "Times the rank was named a straggler."),
    ("commlab_stalled", "gauge", "rank", "1 while the rank is named stalled (late at a collective, or silent), else 0."),
    ("commlab_monitor_overhead_ratio", "gauge", "rank",
     "The monitoring code's own time over the step time, since the start (ratio)."),
    ("commlab_report_age_seconds", "gauge", "rank", "Time since the rank's last report reached the exporter (seconds)."),
    ("commlab_ps_pushes_per_second", "gauge", "server", "Pushes folded into the server's shard per second."),
    ("commlab_ps_staleness_clocks", "gauge", "server",
     "Mean staleness of the pulls the server served over the last interval (clocks)."),
    ("commlab_ps_queue_depth", "gauge", "server", "Pulls waiting at the server for its consistency rule."),
    ("commlab_ps_pushes", "counter", "server", "Pushes folded into the server's shard."),
)


def check_endpoint(host, port):
    """Return ``""`` when ``host:port`` can be bound for listening, else why not.

    Parameters
    ----------
    host : str
        Address to bind (``127.0.0.1``, ``0.0.0.0``, a host name).
    port : int
        TCP port, 1-65535.

    Returns
    -------
    str
        The reason (``"address already in use"``, ...) or ``""``.

    Examples
    --------
    >>> taken = socket.socket(); taken.bind(("127.0.0.1", 0)); taken.listen()
    >>> check_endpoint("127.0.0.1", taken.getsockname()[1])
    'address already in use'
    >>> taken.close()
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return f"cannot resolve the address ({e.strerror})"
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server will: TIME_WAIT is no conflict
        try:
            s.bind(addr)
            s.listen(1)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return "address already in use"
            return (e.strerror or os.strerror(e.errno or 0)).lower()
    return ""


class Exporter:
    """The job's metrics (:data:`METRICS`), optionally served on ``host:port``.

    Parameters
    ----------
    port : int
        TCP port of the HTTP endpoint (``/metrics``, or any path); 0: no endpoint (the values are
        still kept, for :meth:`text`).
    host : str
        Address it binds.

    Raises
    ------
    ImportError
        Without ``prometheus_client`` (the ``monitor`` extra).
    OSError
        When the endpoint cannot bind.

    Examples
    --------
    >>> ex = Exporter()
    >>> ex.set("commlab_sync_seconds", {0: 0.012, 1: 0.034})
    >>> ex.inc("commlab_sent_bytes", {0: 4096})
    >>> print([ln for ln in ex.text().splitlines() if ln.startswith("commlab_sync")][0])
    commlab_sync_seconds{rank="0"} 0.012
    >>> ex.close()
    """

    def __init__(self, port=0, host="127.0.0.1"):
        import prometheus_client
        from prometheus_client import CollectorRegistry, Counter, Gauge

        if hasattr(prometheus_client, "disable_created_metrics"):
            prometheus_client.disable_created_metrics()  # no _created series beside every counter
        self.registry = CollectorRegistry(auto_describe=True)
        self.metrics, self._children = {}, {}  # name -> metric; (name, label value) -> its labelled series
        for name, kind, label, text in METRICS:
            cls = Counter if kind == "counter" else Gauge
            self.metrics[name] = cls(name, text, [label] if label else [], registry=self.registry)
        self.port, self.host, self._httpd = int(port), host, None
        if self.port:
            self._httpd = _bounded_server(host, self.port, prometheus_client.make_wsgi_app(self.registry))

    def _series(self, name, key):
        """Return the series of ``name`` labelled ``key``, made at its first use and kept.

        ``metric.labels(...)`` looks the series up under the metric's lock and checks the label on
        every call; a gather sets every metric of every rank, so the series are looked up once.
        """
        series = self._children.get((name, key))
        if series is None:
            series = self._children[(name, key)] = self.metrics[name].labels(str(key))
        return series

    def set(self, name, values):
        """Set gauge ``name`` to ``values`` ({label value: float}, or a float for a metric without label)."""
        if not isinstance(values, dict):
            self.metrics[name].set(float(values))
            return
        for key, v in values.items():
            self._series(name, key).set(float(v))

    def inc(self, name, deltas):
        """Add ``deltas`` ({label value: non-negative number}) to counter ``name``."""
        for key, v in deltas.items():
            series = self._series(name, key)  # the series exists from the first report, at 0
            if v > 0:
                series.inc(float(v))

    def text(self):
        """Return the exposition of every metric (what a scrape reads), as text."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()

    def close(self):
        """Stop the HTTP endpoint (a scrape in flight finishes, within :data:`SCRAPE_SECONDS`)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


def _bounded_server(host, port, app):
    """Serve WSGI ``app`` on ``host:port`` from a daemon thread, its connections bounded; return the server.

    Each connection gets a thread, at most :data:`MAX_SCRAPES` at once (one more is answered 503 and
    closed at once), and is shut down :data:`SCRAPE_SECONDS` seconds after it opened.
    """
    import threading
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

    slots = threading.BoundedSemaphore(MAX_SCRAPES)
    open_until, lock = {}, threading.Lock()  # connection -> when it is shut down (time.monotonic())

    class Handler(WSGIRequestHandler):
        def setup(self):
            super().setup()
            self.connection.settimeout(SCRAPE_SECONDS)
            with lock:
                open_until[self.connection] = time.monotonic() + SCRAPE_SECONDS

        def finish(self):
            with lock:
                open_until.pop(self.connection, None)
            try:
                super().finish()
            except OSError:  # shut down by its deadline
                pass

        def log_message(self, *args):  # no line per scrape on stderr
            pass

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        allow_reuse_address = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        def process_request(self, request, client_address):
            if not slots.acquire(blocking=False):  # every slot taken: refused now, no thread
                try:
                    request.sendall(b"HTTP/1.0 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
                except OSError:
                    pass
                self.shutdown_request(request)
                return
            super().process_request(request, client_address)

        def process_request_thread(self, request, client_address):
            try:
                super().process_request_thread(request, client_address)
            finally:
                slots.release()

        def handle_error(self, request, client_address):  # a connection cut by its deadline: nothing to say
            pass

    def reap():  # one thread shuts every connection past its deadline (a slow one never times out a read)
        while True:
            time.sleep(0.1)
            now = time.monotonic()
            with lock:
                late = [c for c, t in open_until.items() if t <= now]
            for c in late:
                _shut(c)

    httpd = Server((host, port), Handler)
    httpd.set_app(app)
    threading.Thread(target=httpd.serve_forever, name="commlab-metrics", daemon=True).start()
    threading.Thread(target=reap, name="commlab-metrics-deadlines", daemon=True).start()
    return httpd


def _shut(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
