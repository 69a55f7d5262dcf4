"""A latency objective: AIMD batch size and admission control, so p99 holds and the queue stays bounded.

Clipper (Crankshaw et al., "Clipper: A Low-Latency Online Prediction Serving System", NSDI 2017,
section 4.3) adapts each model's batch size with additive increase, multiplicative decrease: grow
the batch by a fixed step while a batch is processed within the objective, cut it by 10 % when one
is not. Here a request's latency is its wait for a free replica (at most one batch's service time
when the queue is short) plus its own batch's service time, so the service time of a batch is held
to half the objective: each answered batch of service time ``s`` adds ``increase`` to the batch
size when ``s <= slo / 2`` and multiplies it by ``decrease`` otherwise (never below 1 or above
``max_batch``).

Admission control, as Triton's queue policy with a timeout and rejection: a request is refused at
once (HTTP 429, with the reason) when the front predicts it cannot be answered within the objective:
the time until a replica frees, plus one service time for each full round of batches queued ahead
of it over the live replicas, plus its own batch. A request whose wait has already used the
objective minus one service time is refused when its batch would leave. So the queue never holds
more than the objective allows, however high the offered load. The service time is an exponential
moving average of the batches' round trips (dispatch to reply, front clock).
"""
import math

__all__ = ["LatencyObjective"]


class LatencyObjective:
    """AIMD batch size and admission control against a latency objective of ``slo_s`` seconds.

    Parameters
    ----------
    slo_s : float
        The objective (seconds, > 0) on each request's latency, arrival to answer.
    max_batch : int
        Largest batch (requests).
    service_s : float
        First estimate of one batch's service time (seconds, >= 0), e.g. the emulated service time.
    increase : int
        Additive step of the batch size (requests, >= 1).
    decrease : float
        Multiplicative cut of the batch size, in (0, 1); Clipper's is 0.9.
    smoothing : float
        Weight of the newest batch in the service-time average, in (0, 1].

    Attributes
    ----------
    size : int
        The current batch size limit; it starts at ``max_batch``.
    service_s : float
        Estimated service time of a batch (seconds).

    Raises
    ------
    ValueError
        Naming the argument out of range, or when ``slo_s`` does not exceed ``service_s``.

    Examples
    --------
    >>> obj = LatencyObjective(0.060, max_batch=8, service_s=0.020)
    >>> obj.size                        # starts at the largest batch
    8
    >>> obj.observe(0.040)              # over half the objective: cut by 10 %
    >>> obj.size
    7
    >>> obj.observe(0.045); obj.size
    6
    >>> obj.observe(0.020); obj.size    # within half the objective: one more per batch
    7
    >>> obj.admit(0.0, queued=3, replicas=1, busy_left=0.010) is None
    True
    >>> obj.admit(0.0, queued=40, replicas=1, busy_left=0.010)[:40]
    'cannot be answered within the latency ob'
    """

    __slots__ = ("slo_s", "max_batch", "size", "service_s", "increase", "decrease", "smoothing")

    def __init__(self, slo_s, max_batch, service_s=0.0, increase=1, decrease=0.9, smoothing=0.2):
        if not (math.isfinite(slo_s) and slo_s > 0):
            raise ValueError(f"slo_s must be > 0 seconds, got {slo_s!r}")
        if int(max_batch) < 1 or int(increase) < 1:
            raise ValueError(f"max_batch and increase must be >= 1, got {max_batch!r}, {increase!r}")
        if not 0 < decrease < 1 or not 0 < smoothing <= 1:
            raise ValueError(f"decrease must be in (0, 1) and smoothing in (0, 1], got {decrease!r}, {smoothing!r}")
        if not 0 <= service_s < slo_s:
            raise ValueError(f"the latency objective ({slo_s * 1e3:g} ms) must exceed one batch's service time "
                             f"({service_s * 1e3:g} ms)")
        self.slo_s, self.max_batch, self.size = float(slo_s), int(max_batch), int(max_batch)
        self.service_s, self.increase, self.decrease, self.smoothing = float(service_s), int(increase), decrease, smoothing

    def observe(self, service_s):
        """Record one answered batch's service time (seconds): update the estimate and the batch size."""
        self.service_s += self.smoothing * (service_s - self.service_s)
        if service_s <= self.slo_s / 2:
            self.size = min(self.max_batch, self.size + self.increase)
        else:
            self.size = max(1, int(self.size * self.decrease))

    def predict(self, queued, replicas, busy_left):
        """Return the predicted latency (seconds) of a request arriving now.

        Parameters
        ----------
        queued : int
            Requests waiting ahead of it.
        replicas : int
            Batches that can be in service at once (live replicas x batches in flight each), >= 1.
        busy_left : float
            Seconds until the first of them frees (0 when one is free now).
        """
        rounds = queued // (self.size * max(1, replicas))
        return busy_left + (rounds + 1) * self.service_s

    def admit(self, now, queued, replicas, busy_left):
        """Return None when a request arriving at ``now`` can meet the objective, else the reason (a string)."""
        t = self.predict(queued, replicas, busy_left)
        if t <= self.slo_s:
            return None
        return (f"cannot be answered within the latency objective of {self.slo_s * 1e3:g} ms: predicted "
                f"{t * 1e3:.1f} ms ({queued} requests ahead, {self.service_s * 1e3:.1f} ms per batch)")

    def expired(self, now, arrival):
        """Return the reason a request that arrived at ``arrival`` can no longer meet the objective, or None."""
        waited = now - arrival
        if waited + self.service_s <= self.slo_s:
            return None
        return (f"waited {waited * 1e3:.1f} ms: with {self.service_s * 1e3:.1f} ms of service it cannot meet the "
                f"latency objective of {self.slo_s * 1e3:g} ms")
