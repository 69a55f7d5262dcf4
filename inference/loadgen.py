"""Load generators: open-loop Poisson arrivals and closed-loop concurrent clients.

Open loop (arrivals do not wait for answers, so a queue can grow without bound, as real traffic
does): inter-arrival times are exponential with mean ``1 / rate``, a Poisson process. Closed loop:
``clients`` clients each send a request, wait for its answer, and send the next at once, so the
offered load adapts to the server (the throughput it measures is the server's capacity when
``clients`` is large enough). Each request carries a test-set row drawn with a seeded generator,
so its answer can be checked against the single-process prediction; ``malformed`` requests
(a wrong feature count, a NaN, a string) are mixed in at seeded positions.
"""
import collections

import numpy

__all__ = ["MALFORMED_KINDS", "make_payloads", "OpenLoop", "ClosedLoop"]

#: Kinds of malformed request the generator can send, in turn.
MALFORMED_KINDS = ("wrong-count", "nan", "non-numeric")


def make_payloads(x_test, n, malformed=0, seed=0):
    """Return ``n`` request payloads and the test rows they came from (-1 for malformed ones).

    Parameters
    ----------
    x_test : ndarray, shape (N, F), float64
    n : int
        Requests, >= 1.
    malformed : int
        How many of them are malformed (0 <= malformed <= n), cycling through :data:`MALFORMED_KINDS`.
    seed : int

    Returns
    -------
    (list, ndarray (n,) int64)
        Payloads (a float64 row, or a malformed list) and their rows.
    """
    if n < 1 or not 0 <= malformed <= n:
        raise ValueError(f"need n >= 1 and 0 <= malformed <= n, got n={n}, malformed={malformed}")
    rng = numpy.random.default_rng([seed, 7])
    rows = rng.integers(0, x_test.shape[0], n).astype(numpy.int64)
    payloads = [x_test[r] for r in rows]
    for k, i in enumerate(sorted(rng.choice(n, malformed, replace=False))):
        good = x_test[rows[i]].tolist()
        kind = MALFORMED_KINDS[k % len(MALFORMED_KINDS)]
        payloads[i] = good[:-1] if kind == "wrong-count" else (
            good[:3] + [float("nan")] + good[4:] if kind == "nan" else good[:2] + ["x"] + good[3:])
        rows[i] = -1
    return payloads, rows


class OpenLoop:
    """Poisson arrivals at ``rate`` requests per second.

    Parameters
    ----------
    n : int
        Requests to send.
    rate : float
        Mean arrival rate (requests/s), > 0.
    seed : int
    """

    def __init__(self, n, rate, seed=0):
        if not rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {rate!r}")
        gaps = numpy.random.default_rng([seed, 11]).exponential(1.0 / rate, n)
        self.times = numpy.cumsum(gaps) - gaps[0]  # first request at t = 0 (seconds)
        self.sent = 0

    def due(self, t):
        """Return how many new requests arrive by ``t`` seconds after the start."""
        k = int(numpy.searchsorted(self.times, t, side="right")) - self.sent
        self.sent += k
        return k

    def next_time(self):
        """Return when the next request arrives (seconds after the start), or None."""
        return float(self.times[self.sent]) if self.sent < self.times.size else None

    def answered(self, t):
        """Closed-loop hook: nothing to do for open-loop arrivals."""

    def finished(self):
        """Return whether every request has been sent."""
        return self.sent >= self.times.size


class ClosedLoop:
    """``clients`` clients, each sending its next request as soon as the previous is answered.

    Parameters
    ----------
    n : int
        Requests in all.
    clients : int
        Concurrent clients, >= 1.
    """

    def __init__(self, n, clients):
        if clients < 1:
            raise ValueError(f"clients must be >= 1, got {clients!r}")
        self.n, self.sent = int(n), 0
        self._ready = collections.deque([0.0] * min(clients, n))

    def due(self, t):
        """Return how many clients send a request by ``t`` seconds after the start."""
        k = 0
        while self._ready and self._ready[0] <= t and self.sent < self.n:
            self._ready.popleft()
            self.sent, k = self.sent + 1, k + 1
        return k

    def next_time(self):
        """Return when the next request is sent, or None while every client waits."""
        return self._ready[0] if self._ready and self.sent < self.n else None

    def answered(self, t):
        """Let the client whose request was answered at ``t`` send its next one."""
        self._ready.append(t)

    def finished(self):
        """Return whether every request has been sent."""
        return self.sent >= self.n
