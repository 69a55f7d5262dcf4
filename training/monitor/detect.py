"""Straggler and stall rules: which rank is slow, which rank is late, from per-rank figures alone.

Pure NumPy, no MPI: the monitor (:mod:`training.monitor.sync`, :mod:`training.monitor.ps_reports`)
feeds these rules what it gathered and reports what they return.

Straggler. In synchronous training a slow rank waits least: its peers wait for it at the step's
collective, so their sync time grows and its own does not. The rule therefore looks at what the
slow rank itself spends more of: its compute time, which is also its arrival time at the step's
collective counted from the step's start. A rank is a straggler when that figure stays above
``k`` times the median over the ranks for ``n`` intervals in a row (every interval it is not, its
count starts again); it stops being one at the first interval below. With P = 2 the median is the
mean of the two ranks, so a rank f times slower than the other is above ``k`` x the median only when
``2 f / (1 + f) > k``: use ``k < 2`` there, or P >= 3.

Stall. A rank that has not reached the collective of the step the first rank reached ``t``
seconds ago is stalled once ``t`` passes the threshold (Horovod's stall check: the ranks that have
not submitted a tensor the others are waiting on are named after 60 s).
"""
import numpy

__all__ = ["StragglerRule", "stalled", "median"]


class StragglerRule:
    """Find the ranks whose time stays above ``factor`` x the median for ``intervals`` intervals.

    Parameters
    ----------
    size : int
        Number of ranks (or workers) observed.
    factor : float
        ``k`` of the rule, > 1.
    intervals : int
        ``n`` of the rule, >= 1: consecutive intervals a rank must stay above.

    Attributes
    ----------
    slow : ndarray, shape (size,), bool
        The ranks that are stragglers after the last :meth:`update`.
    runs : ndarray, shape (size,), int64
        Consecutive intervals each rank has been above the threshold.

    Raises
    ------
    ValueError
        Naming the argument out of range.

    Examples
    --------
    >>> rule = StragglerRule(3, factor=2.0, intervals=2)
    >>> rule.update([0.010, 0.011, 0.050])  # rank 2 above 2 x 0.011, once: not yet
    []
    >>> rule.update([0.010, 0.011, 0.048])  # the second interval in a row: named
    [2]
    >>> rule.update([0.010, 0.011, 0.049]), rule.slow.tolist()  # still slow, but already named
    ([], [False, False, True])
    >>> rule.update([0.010, 0.011, 0.012]), rule.slow.tolist()  # back in line
    ([], [False, False, False])
    """

    __slots__ = ("size", "factor", "intervals", "slow", "runs", "iteration")

    def __init__(self, size, factor=2.0, intervals=3):
        if not (isinstance(size, int) and size >= 1):
            raise ValueError(f"size must be an integer >= 1, got {size!r}")
        if not factor > 1:
            raise ValueError(f"factor must be > 1, got {factor!r}")
        if not (isinstance(intervals, int) and intervals >= 1):
            raise ValueError(f"intervals must be an integer >= 1, got {intervals!r}")
        self.size, self.factor, self.intervals = size, float(factor), intervals
        self.slow = numpy.zeros(size, bool)
        self.runs = numpy.zeros(size, numpy.int64)
        self.iteration = 0

    def update(self, times, live=None):
        """Feed one interval's figure per rank; return the ranks that have just become stragglers.

        Parameters
        ----------
        times : array_like, shape (size,), float
            Each rank's figure over the interval (seconds per step): compute, or arrival time.
        live : array_like, shape (size,), bool, optional
            The ranks that reported this interval (default: all); the others keep their count
            and state and do not enter the median.

        Returns
        -------
        list of int
            Ranks named this interval, in increasing order.
        """
        times = numpy.asarray(times, numpy.float64)
        if times.shape != (self.size,):
            raise ValueError(f"times must have shape ({self.size},), got {times.shape}")
        live = numpy.ones(self.size, bool) if live is None else numpy.asarray(live, bool)
        self.iteration += 1
        if live.sum() < 2:
            return []
        threshold = self.factor * median(times[live])
        above = live & (times > threshold)
        self.runs = numpy.where(above, self.runs + 1, numpy.where(live, 0, self.runs))
        now = self.runs >= self.intervals
        new = now & ~self.slow
        self.slow = numpy.where(live, now, self.slow)
        return numpy.flatnonzero(new).tolist()

    def state_dict(self):
        """Return the rule's counters (NumPy arrays)."""
        return {"slow": self.slow.copy(), "runs": self.runs.copy(), "iteration": numpy.int64(self.iteration)}

    def load_state_dict(self, d):
        """Restore the counters of :meth:`state_dict`."""
        self.slow, self.runs = numpy.asarray(d["slow"], bool).copy(), numpy.asarray(d["runs"], numpy.int64).copy()
        self.iteration = int(d["iteration"])


def stalled(steps, since, now, threshold):
    """Return the ranks that have not reached the newest step's collective ``threshold`` s after the first did.

    Parameters
    ----------
    steps : array_like, shape (P,), int
        The last step whose collective each rank has reached (its last heartbeat), -1 for none.
    since : float
        When (``time.monotonic()`` seconds) the first rank reached step ``max(steps)``'s collective.
    now : float
        The current ``time.monotonic()`` (seconds).
    threshold : float
        Seconds after which a rank behind is stalled.

    Returns
    -------
    list of int
        The ranks behind ``max(steps)`` when ``now - since > threshold``, else ``[]``.

    Examples
    --------
    >>> stalled([5, 5, 4], since=100.0, now=101.0, threshold=2.0)  # rank 2 late by 1 s: not yet
    []
    >>> stalled([5, 5, 4], since=100.0, now=102.5, threshold=2.0)
    [2]
    """
    steps = numpy.asarray(steps, numpy.int64)
    if steps.size == 0 or now - since <= threshold:
        return []
    return numpy.flatnonzero(steps < steps.max()).tolist()


def median(values):
    """Return the median of ``values`` (the mean of the two middle ones for an even count).

    The same as ``numpy.median``, without its first call's start-up (tens of milliseconds, which
    the monitor would count as its own time).

    Examples
    --------
    >>> median([3.0, 1.0, 2.0]), median([4.0, 1.0, 2.0, 3.0])
    (2.0, 2.5)
    """
    s = numpy.sort(numpy.asarray(values, numpy.float64))
    n = s.size
    return float(s[(n - 1) // 2] + s[n // 2]) / 2
