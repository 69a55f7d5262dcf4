"""commlab's error classes: one root, :class:`CommlabError`, for every error the project raises on purpose.

* :class:`~commlab.error_root.CommlabError` (:mod:`commlab.error_root`): the root, which every class
  here derives from. The parameter server's (``ps.wire.messages.PSError``), checkpoints'
  (``commlab.file_formats.CheckpointError``), run directories' (``training.runtime.checkpoint.RunDirError``) and the
  simulator's (:class:`ScheduleDeadlock`) errors derive from it too.
* :class:`Timeout`: the base of every "a peer did not answer in time" error, the collectives'
  :class:`CollectiveTimeout` and the parameter server's ``ps.wire.messages.PSTimeout``.

The errors a collective raises at run time, after its arguments passed the local checks:

* :class:`CollectiveTimeout`: a peer did not answer within ``timeout`` (MPI's own analogue is a
  process failure, ``MPI_ERR_PROC_FAILED`` in ULFM; NCCL's is its watchdog timeout);
* :class:`PeerLost`: a :class:`CollectiveTimeout` that did not wait for its timeout: the MPI library
  failed a transfer of the call (a peer that died in the middle of a large message);
* :class:`CollectiveMismatch`: the ranks disagree about the call (collective, algorithm, count,
  dtype, op, root, grid, or the order of calls), detected by the call fingerprint
  (:mod:`collectives.engine.fingerprint`) or by a received message whose size differs from the schedule's;
* :class:`ProcessFailed`: a :class:`PeerLost` under User-Level Failure Mitigation (ULFM: Open MPI
  run with ``mpiexec --with-ft ulfm``): the MPI library reported a dead process
  (``MPI_ERR_PROC_FAILED``) or a communicator revoked by a rank that saw one (``MPI_ERR_REVOKED``);
  it names the dead ranks, and the communicator has been revoked so that every rank inside another
  call on it learns of the death too (:mod:`collectives.engine.failures`).

After either, the communicator's context is unusable (messages of the failed call may still be in
flight); the safe policy is to end the job, which :func:`collectives.engine.policy.abort_on_failure` does.
"""

from commlab.error_root import CommlabError

__all__ = ["Timeout", "CollectiveError", "CollectiveTimeout", "CollectiveMismatch", "DtypeMismatch",
           "PeerLost", "ProcessFailed", "ScheduleDeadlock", "ScheduleViolation"]


class Timeout(CommlabError):
    """A peer did not answer within the allowed time (collective or parameter-server request).

    Examples
    --------
    >>> from collectives.errors import CollectiveTimeout, Timeout
    >>> try:
    ...     raise CollectiveTimeout("broadcast", None, 1, 5.0)
    ... except Timeout as exc:  # a collective's or a parameter server's timeout
    ...     print(exc)
    broadcast timed out after 5 s in round 1: no answer from a peer (inside the MPI library)
    """


class ScheduleDeadlock(CommlabError, RuntimeError):
    """No rank of a replayed schedule can make progress but some still have rounds to run.

    Examples
    --------
    Rank 0 of a two-rank ring replayed alone waits for rank 1 forever:

    >>> from collectives.model.simulate import replay
    >>> from collectives.schedules.ring import ring_allreduce
    >>> replay([ring_allreduce(0, 2, 4)])
    Traceback (most recent call last):
    ...
    collectives.errors.ScheduleDeadlock: ranks [0] cannot progress; rank 0 waits in round 0: ...
    """


class ScheduleViolation(CommlabError, ValueError):
    """An algorithm's schedules do not compute their collective (:func:`collectives.schedules.verify.verify`).

    Attributes
    ----------
    kind : str
        ``"missing"``, ``"doubled"``, ``"misplaced"`` (a contribution at the wrong position),
        ``"length"`` (a receive matched by a send of another length), ``"unmatched receive"``,
        ``"unmatched send"``, ``"read before write"``, ``"deadlock"`` or ``"build"`` (the builder
        raised or returned something other than a schedule of this rank, P and count).
    rank, round : int or None
        The rank and its round (index into ``Schedule.rounds``) where the violation shows.
    region : (int, int) or None
        The ``[start, stop)`` element range concerned.
    case : str
        The collective, P, count (and root) of the failing case.

    Examples
    --------
    >>> err = ScheduleViolation("missing", "allreduce P=2 count=4", "contributions of rank 1 missing", 0, None, (0, 4))
    >>> print(err)
    allreduce P=2 count=4: rank 0 after its final round, region [0, 4): contributions of rank 1 missing
    >>> isinstance(err, ValueError), err.kind
    (True, 'missing')
    """

    def __init__(self, kind, case, detail, rank=None, round=None, region=None):
        if kind not in detail:
            detail = f"{kind}: {detail}"
        self.kind, self.case, self.detail, self.rank, self.round, self.region = kind, case, detail, rank, round, region
        where = []
        if rank is not None:
            where.append(f"rank {rank}" + (" after its final round" if round is None else f" round {round}"))
        if region is not None:
            where.append(f"region [{region[0]}, {region[1]})")
        super().__init__(f"{case}: {', '.join(where)}{': ' if where else ''}{detail}")


class CollectiveError(CommlabError, RuntimeError):
    """Base class of the run-time errors of commlab's collectives.

    Examples
    --------
    >>> from collectives.errors import CollectiveError, CollectiveMismatch, CollectiveTimeout
    >>> issubclass(CollectiveTimeout, CollectiveError), issubclass(CollectiveMismatch, CollectiveError)
    (True, True)
    >>> issubclass(CollectiveError, RuntimeError)
    True
    """


class CollectiveTimeout(CollectiveError, Timeout):
    """A peer did not answer within the collective's ``timeout``.

    Attributes
    ----------
    collective : str
        The collective ("allreduce", "reduce_scatter", ...).
    peer : int or None
        Rank (in the caller's communicator) whose message never completed; None inside the MPI library.
    round : int
        Index of the schedule round that was waiting.
    timeout : float
        The limit, in seconds.
    pending : str
        What this rank found waiting from ``peer`` instead (a message of another call), or "".

    Examples
    --------
    >>> from collectives.errors import CollectiveTimeout
    >>> exc = CollectiveTimeout("allreduce", 3, 2, 0.5, phase="all-gather")
    >>> str(exc)
    'allreduce timed out after 0.5 s in round 2 (all-gather): no answer from rank 3'
    >>> exc.peer, exc.round
    (3, 2)
    """

    def __init__(self, collective, peer, round, timeout, phase="", pending=""):
        self.collective, self.peer, self.round, self.timeout, self.phase = collective, peer, round, timeout, phase
        self.pending = pending
        where = f"round {round}" + (f" ({phase})" if phase else "")
        who = f"rank {peer}" if peer is not None else "a peer (inside the MPI library)"
        text = f"{collective} timed out after {timeout:g} s in {where}: no answer from {who}"
        super().__init__(text + (f"; {pending}" if pending else ""))

    def __reduce__(self):
        return type(self), (self.collective, self.peer, self.round, self.timeout, self.phase, self.pending)


class PeerLost(CollectiveTimeout):
    """The MPI library failed a transfer of the call with a peer: the peer has most likely died.

    A peer that dies while a large message moves between it and this rank (MPICH's shared-memory copy
    of a process that is gone: ``process_vm_readv: no such process``) makes the library fail the
    transfer at once instead of leaving it pending until ``timeout``. The error is a
    :class:`CollectiveTimeout` (the peer will never answer), so whatever handles a silent peer handles
    this one too.

    Attributes
    ----------
    collective, peer, round, phase
        As for :class:`CollectiveTimeout`; ``peer`` is None when the transfer was inside the MPI
        library's own collective (``algorithm="mpi"``), whose peers commlab does not see.
    reason : str
        The MPI library's error text.

    Examples
    --------
    >>> from collectives.errors import CollectiveTimeout, PeerLost
    >>> exc = PeerLost("allreduce", 1, 0, "Other MPI error", phase="reduce-scatter")
    >>> print(exc)
    allreduce lost rank 1 in round 0 (reduce-scatter): the MPI library failed the transfer ('Other MPI error')
    >>> isinstance(exc, CollectiveTimeout), exc.peer
    (True, 1)
    """

    def __init__(self, collective, peer, round, reason, phase=""):
        self.collective, self.peer, self.round, self.timeout, self.phase = collective, peer, round, None, phase
        self.pending, self.reason = "", reason
        where = f"round {round}" + (f" ({phase})" if phase else "")
        who = f"rank {peer}" if peer is not None else "a peer (inside the MPI library)"
        CollectiveError.__init__(self, f"{collective} lost {who} in {where}: the MPI library failed the transfer "
                                       f"('{reason}')")

    def __reduce__(self):
        return type(self), (self.collective, self.peer, self.round, self.reason, self.phase)


class ProcessFailed(PeerLost):
    """A process of the communicator died: the MPI library's ULFM error, on every surviving rank of the call.

    Raised only under User-Level Failure Mitigation (Bland et al., "Post-failure recovery of MPI
    communication capability", IJHPCA 27(3), 2013; Open MPI's ``mpiexec --with-ft ulfm``), when a
    transfer of the call fails with ``MPI_ERR_PROC_FAILED`` or ``MPI_ERR_PROC_FAILED_PENDING``, or
    with ``MPI_ERR_REVOKED`` because another rank saw a death first and revoked the communicator
    (:func:`collectives.engine.failures.process_failed`, which revokes it). The communicator is
    unusable afterwards; the survivors agree on who is left and shrink it
    (:func:`collectives.engine.failures.shrink`). It is a :class:`PeerLost` and so a
    :class:`CollectiveTimeout`: whatever handles a silent or lost peer handles a dead one too.

    Attributes
    ----------
    collective, round, phase
        As for :class:`PeerLost`.
    failed : tuple of int
        The dead ranks (in the caller's communicator) this rank knows of, ascending; empty only
        when the library had not yet said which one died.
    peer : int or None
        ``failed[0]``, or None.
    reason : str
        The MPI library's error text.

    Examples
    --------
    >>> from collectives.errors import CollectiveTimeout, PeerLost, ProcessFailed
    >>> exc = ProcessFailed("allreduce", (2, 3), "MPI_ERR_PROC_FAILED: Process Failure", round=1)
    >>> print(exc)
    allreduce: ranks 2, 3 died (round 1; 'MPI_ERR_PROC_FAILED: Process Failure'); the communicator is revoked
    >>> exc.failed, isinstance(exc, PeerLost), isinstance(exc, CollectiveTimeout)
    ((2, 3), True, True)
    """

    def __init__(self, collective, failed, reason, round=0, phase=""):
        self.failed = tuple(sorted(int(r) for r in failed))
        self.collective, self.peer, self.round, self.timeout, self.phase = \
            collective, (self.failed[0] if self.failed else None), round, None, phase
        self.pending, self.reason = "", reason
        who = (f"rank{'s' if len(self.failed) > 1 else ''} {', '.join(map(str, self.failed))} died" if self.failed
               else "a rank died")
        where = f"round {round}" + (f" ({phase})" if phase else "")
        CollectiveError.__init__(self, f"{collective}: {who} ({where}; '{reason}'); the communicator is revoked")

    def __reduce__(self):
        return type(self), (self.collective, self.failed, self.reason, self.round, self.phase)


class CollectiveMismatch(CollectiveError):
    """The ranks called a collective differently (a field of the call, or the order of calls).

    Attributes
    ----------
    collective : str
        The collective this rank called.
    field : str
        The first differing field: ``collective``, ``algorithm``, ``count``, ``dtype``, ``op``,
        ``root``, ``grid``, ``sequence`` (call order), ``call site``, ``message size``, or
        ``arguments`` (some ranks refused their call: the detail names them and their reasons).
    detail : str
        The differing values and the ranks that hold them.

    Examples
    --------
    >>> from collectives.errors import CollectiveMismatch
    >>> exc = CollectiveMismatch("allreduce", "count", "rank 0: 4, rank 1: 5")
    >>> print(exc)
    allreduce: the ranks disagree about the call's count: rank 0: 4, rank 1: 5
    >>> exc.field
    'count'
    """

    def __init__(self, collective, field, detail):
        self.collective, self.field, self.detail = collective, field, detail
        super().__init__(f"{collective}: the ranks disagree about the call's {field}: {detail}")

    def __reduce__(self):
        return type(self), (self.collective, self.field, self.detail)


class DtypeMismatch(CollectiveMismatch, TypeError):
    """The ranks passed arrays of different dtypes: a :class:`CollectiveMismatch` of the ``dtype``
    field that is also a ``TypeError`` (a wrong type of argument, seen only across the ranks).

    Examples
    --------
    >>> from collectives.errors import DtypeMismatch
    >>> exc = DtypeMismatch("allgather", "rank 0: dtype=float32; rank 1: dtype=float64")
    >>> isinstance(exc, TypeError), exc.field
    (True, 'dtype')
    """

    def __init__(self, collective, detail):
        super().__init__(collective, "dtype", detail)

    def __reduce__(self):
        return type(self), (self.collective, self.detail)
