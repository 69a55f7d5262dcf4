"""One prediction request: its features, checked at the front, and the times it passed through.

A request is accepted only with exactly ``n_features`` finite numbers; anything else (another
count, NaN or infinity, a string, a nested list, no list at all) gets an error response naming
the problem, and the server goes on.
"""
import math
import numbers

import numpy

__all__ = ["Request", "parse_features"]


def parse_features(payload, n_features):
    """Return ``payload`` as a float64 row, or raise ``ValueError`` saying what is wrong with it.

    Parameters
    ----------
    payload : sequence of numbers or ndarray
        One sample's features, as sent by a client (a JSON list, or a NumPy row).
    n_features : int

    Returns
    -------
    ndarray, shape (n_features,), float64

    Raises
    ------
    ValueError
        When ``payload`` is not a flat list of ``n_features`` finite real numbers.
    """
    if isinstance(payload, numpy.ndarray):
        if payload.ndim != 1 or payload.dtype.kind not in "fiu":
            raise ValueError(f"features must be a flat list of numbers, got an array of shape "
                             f"{payload.shape} and dtype {payload.dtype}")
        row = payload.astype(numpy.float64)
    else:
        if not isinstance(payload, (list, tuple)):
            raise ValueError(f"features must be a list of {n_features} numbers, got {type(payload).__name__}")
        for i, v in enumerate(payload):
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise ValueError(f"features[{i}] is not a number: {v!r}")
        row = numpy.array(payload, dtype=numpy.float64)
    if row.shape != (n_features,):
        raise ValueError(f"expected {n_features} features, got {row.size}")
    if not numpy.isfinite(row).all():
        bad = int(numpy.flatnonzero(~numpy.isfinite(row))[0])
        raise ValueError(f"features[{bad}] is not finite: {row[bad]!r}")
    return row


class Request:
    """A request's identity, payload and timeline (seconds on the front's ``perf_counter`` clock).

    Attributes
    ----------
    rid : int
        Request id (the load generator's order).
    row : int
        Test-set row the features were drawn from (-1 when unknown, e.g. HTTP).
    payload : object
        What the client sent; ``x`` the parsed float64 row once accepted.
    arrival, dispatched, answered : float
        When it arrived, left in a batch (last attempt), was answered.
    batch_wait : float
        Seconds from arrival to the first dispatch.
    attempts : int
        Batches it was sent in (2 after a retry).
    replica, batch_size : int
        Replica and batch of the answering attempt.
    compute_s, comm_s, busy_s : float
        The replica's forward compute, tensor-parallel all-reduce time and total busy time.
    status : str
        ``"pending"``, ``"ok"``, ``"rejected"`` (bad input) or ``"failed"`` (no replica answered).
    error : str
    logits : ndarray (n_classes,) or None
    done : callable or None
        Called with the request once it is answered (HTTP responses).
    """

    __slots__ = ("rid", "row", "payload", "x", "arrival", "dispatched", "answered", "batch_wait",
                 "attempts", "replica", "batch_size", "compute_s", "comm_s", "busy_s", "status",
                 "error", "logits", "done")

    def __init__(self, rid, payload, arrival, row=-1, done=None):
        self.rid, self.row, self.payload, self.arrival, self.done = rid, row, payload, arrival, done
        self.x = self.logits = None
        self.dispatched = self.answered = math.nan
        self.batch_wait = self.compute_s = self.comm_s = self.busy_s = math.nan
        self.attempts, self.replica, self.batch_size = 0, -1, 0
        self.status, self.error = "pending", ""

    @property
    def latency(self):
        """Seconds from arrival to answer (NaN while pending)."""
        return self.answered - self.arrival
