"""The front's metrics in Prometheus text format (``GET /metrics``), with ``prometheus_client``.

Series, all prefixed ``commlab_serving_``:

- ``requests_total{outcome}`` (counter): requests answered, by outcome: ``ok``, ``rejected`` (bad
  input, 400), ``refused`` (latency objective or full queue, 429/503), ``failed`` (no replica
  answered, 503);
- ``request_latency_seconds`` (histogram): arrival to answer of the requests answered ``ok``;
- ``batch_size`` (histogram): requests per batch sent to a replica;
- ``queue_depth`` (gauge): requests waiting at the front for a replica;
- ``in_flight`` (gauge): requests sent to replicas and not yet answered;
- ``replicas_alive`` (gauge): replicas not removed;
- ``batch_size_limit`` (gauge): the batch size in force (adapted under a latency objective).

Each exporter has its own registry, so several can live in one process (tests) and nothing of the
process's default registry is exported.
"""
import threading

import prometheus_client as prom

__all__ = ["ServingMetrics", "OUTCOMES"]

#: Outcomes a request can end with.
OUTCOMES = ("ok", "rejected", "refused", "failed")

_LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0)


class ServingMetrics:
    """Counters, histograms and gauges of one serving front.

    Parameters
    ----------
    max_batch : int
        Largest batch; the batch-size histogram has a bucket per power of two up to it.

    Examples
    --------
    >>> m = ServingMetrics(max_batch=4)
    >>> m.request("ok", 0.003)
    >>> m.batch(3)
    >>> m.gauges(queue=2, in_flight=3, alive=1, limit=4)
    >>> text = m.text().decode()
    >>> 'commlab_serving_requests_total{outcome="ok"} 1.0' in text
    True
    >>> 'commlab_serving_batch_size_bucket{le="4.0"} 1.0' in text
    True
    """

    def __init__(self, max_batch):
        self.registry = r = prom.CollectorRegistry(auto_describe=True)
        self._lock, self._counts = threading.Lock(), dict.fromkeys(OUTCOMES, 0)  # both threads count
        self._requests = prom.Counter("commlab_serving_requests", "Requests answered, by outcome", ["outcome"],
                                      registry=r)
        for o in OUTCOMES:
            self._requests.labels(outcome=o)  # every outcome is exported from the start, at 0
        self._latency = prom.Histogram("commlab_serving_request_latency_seconds",
                                       "Arrival to answer of requests answered ok (seconds)",
                                       buckets=_LATENCY_BUCKETS, registry=r)
        edges, b = [], 1
        while b < max_batch:
            edges.append(b)
            b *= 2
        self._batch = prom.Histogram("commlab_serving_batch_size", "Requests per batch sent to a replica",
                                     buckets=tuple(edges) + (max_batch,), registry=r)
        self._queue = prom.Gauge("commlab_serving_queue_depth", "Requests waiting at the front", registry=r)
        self._in_flight = prom.Gauge("commlab_serving_in_flight", "Requests at replicas, not yet answered",
                                     registry=r)
        self._alive = prom.Gauge("commlab_serving_replicas_alive", "Replicas not removed", registry=r)
        self._limit = prom.Gauge("commlab_serving_batch_size_limit", "Batch size in force", registry=r)

    def request(self, outcome, latency_s):
        """Count one answered request; ``latency_s`` (seconds) enters the histogram when ``outcome`` is ok."""
        self._requests.labels(outcome=outcome).inc()
        with self._lock:
            self._counts[outcome] += 1
        if outcome == "ok":
            self._latency.observe(latency_s)

    def count(self, outcome):
        """Return how many requests ended with ``outcome`` so far.

        Examples
        --------
        >>> m = ServingMetrics(max_batch=2)
        >>> m.request("refused", 0.0)
        >>> m.count("refused"), m.count("ok")
        (1, 0)
        """
        with self._lock:
            return self._counts[outcome]

    def batch(self, size):
        """Record one batch of ``size`` requests sent to a replica."""
        self._batch.observe(size)

    def gauges(self, queue, in_flight, alive, limit):
        """Set the gauges: requests queued and in flight, replicas alive, the batch size in force."""
        self._queue.set(queue)
        self._in_flight.set(in_flight)
        self._alive.set(alive)
        self._limit.set(limit)

    def text(self):
        """Return the exposition (bytes, Prometheus text format 0.0.4)."""
        return prom.generate_latest(self.registry)


#: Content type of :meth:`ServingMetrics.text`.
CONTENT_TYPE = prom.CONTENT_TYPE_LATEST
