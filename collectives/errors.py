"""The errors a collective raises at run time, after its arguments passed the local checks.

* :class:`CollectiveTimeout`: a peer did not answer within ``timeout`` (MPI's own analogue is a
  process failure, ``MPI_ERR_PROC_FAILED`` in ULFM; NCCL's is its watchdog timeout).
* :class:`CollectiveMismatch`: the ranks disagree about the call (collective, algorithm, count,
  dtype, op, root, grid, or the order of calls), detected by the call fingerprint
  (:mod:`collectives.fingerprint`) or by a received message whose size differs from the schedule's.

After either, the communicator's context is unusable (messages of the failed call may still be in
flight); the safe policy is to end the job, which :func:`collectives.abort_on_failure` does.
"""

__all__ = ["CollectiveError", "CollectiveTimeout", "CollectiveMismatch"]


class CollectiveError(RuntimeError):
    """Base class of the run-time errors of commlab's collectives."""


class CollectiveTimeout(CollectiveError):
    """A peer did not answer within the collective's ``timeout``.

    Attributes
    ----------
    op : str
        The collective ("allreduce", "reduce_scatter", ...).
    peer : int or None
        Rank (in the caller's communicator) whose message never completed; None inside the MPI library.
    round : int
        Index of the schedule round that was waiting.
    timeout : float
        The limit, in seconds.
    pending : str
        What this rank found waiting from ``peer`` instead (a message of another call), or "".
    """

    def __init__(self, op, peer, round, timeout, phase="", pending=""):
        self.op, self.peer, self.round, self.timeout, self.phase = op, peer, round, timeout, phase
        self.pending = pending
        where = f"round {round}" + (f" ({phase})" if phase else "")
        who = f"rank {peer}" if peer is not None else "a peer (inside the MPI library)"
        text = f"{op} timed out after {timeout:g} s in {where}: no answer from {who}"
        super().__init__(text + (f"; {pending}" if pending else ""))

    def __reduce__(self):
        return type(self), (self.op, self.peer, self.round, self.timeout, self.phase, self.pending)


class CollectiveMismatch(CollectiveError):
    """The ranks called a collective differently (a field of the call, or the order of calls).

    Attributes
    ----------
    op : str
        The collective this rank called.
    field : str
        The first differing field: ``collective``, ``algorithm``, ``count``, ``dtype``, ``op``,
        ``root``, ``grid``, ``sequence`` (call order), ``call site``, or ``message size``.
    detail : str
        The differing values and the ranks that hold them.
    """

    def __init__(self, op, field, detail):
        self.op, self.field, self.detail = op, field, detail
        super().__init__(f"{op}: the ranks disagree about the call's {field}: {detail}")

    def __reduce__(self):
        return type(self), (self.op, self.field, self.detail)
