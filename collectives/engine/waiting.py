"""Waiting on MPI requests under a deadline: the one wait loop of every collective.

Used by the executor's rounds, the non-blocking :class:`~collectives.engine.request.Request`, the MPI
library path (:mod:`collectives.library.call`) and the debug-mode fingerprint exchange.
"""
import os
from collections import namedtuple
import time

from mpi4py import MPI

from collectives.errors import CollectiveTimeout

__all__ = ["Where", "wait_all", "wait_within", "deadline_of", "library_failure"]

#: Seconds a wait spins on ``MPI_Testall`` (yielding the core every 64 tests, as MPICH's own waits
#: yield after a number of polls) before it sleeps 50 us between tests. Sleeping after 200 tests, as
#: before, added up to 50 us to every wait (a few per cent of a 4 MiB all-reduce). On the loaded
#: 2-core machine the 4 MiB timeout= figure was 1.32x [0.85-1.67] with yields (and the older round
#: loop) and 1.83x [1.21-1.89] without them (and the newer one): one confounded, noisy comparison.
_SPIN_SECONDS = 0.01


def _oversubscribed():
    """Return True when the launcher placed more ranks on this node than this process may use cores.

    Read from the launcher's environment (MPICH's Hydra: ``MPI_LOCALNRANKS``; Open MPI:
    ``OMPI_COMM_WORLD_LOCAL_SIZE``), so that no message is needed.
    """
    local = os.environ.get("MPI_LOCALNRANKS") or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") or "1"
    try:
        return int(local) > len(os.sched_getaffinity(0))
    except (ValueError, AttributeError):
        return False


#: A waiting rank whose peers share its cores gives the core away at every test, not every 64th:
#: spinning would keep the peer it waits for from running.
_YIELD_EVERY_TEST = _oversubscribed()


#: MPI error classes that say the ranks' calls differ (a message longer than its receive, ...): any
#: other error of a transfer between matching calls is the transport's, a peer that is gone.
_CALLS_DIFFER = (MPI.ERR_TRUNCATE, MPI.ERR_COUNT, MPI.ERR_TYPE, MPI.ERR_OP, MPI.ERR_BUFFER, MPI.ERR_ROOT)


def library_failure(exc, statuses=()):
    """Read an ``MPI.Exception`` of a transfer: return ``(text, index, calls_differ)``.

    ``text`` is the MPI library's error text (one line), ``index`` the position in ``statuses`` of
    the request that failed (``MPI_ERR_IN_STATUS``; None when the exception names no request), and
    ``calls_differ`` True when the error says the ranks' calls differ (a truncated message: a count,
    dtype or algorithm mismatch), False when the transfer itself failed (a peer that died).

    Examples
    --------
    >>> from mpi4py import MPI
    >>> library_failure(MPI.Exception(MPI.ERR_TRUNCATE))[1:]
    (None, True)
    >>> library_failure(MPI.Exception(MPI.ERR_OTHER))[1:]
    (None, False)
    """
    code, index = exc.Get_error_code(), None
    if exc.Get_error_class() == MPI.ERR_IN_STATUS:
        for i, st in enumerate(statuses):
            if st.Get_error() not in (MPI.SUCCESS, MPI.ERR_PENDING):
                code, index = st.Get_error(), i
                break
    lines = [line.strip() for line in MPI.Get_error_string(code).splitlines() if line.strip()]
    differ = MPI.Get_error_class(code) in _CALLS_DIFFER or any("truncat" in line.lower() for line in lines)
    if not lines:
        return f"MPI error {code}", index, differ
    text = lines[0].rstrip(":").removesuffix(", error stack")  # MPICH: the class, then the stack, innermost last
    return (f"{text}: {lines[-1]}" if len(lines) > 1 else text), index, differ


def deadline_of(timeout):
    """Return the ``time.perf_counter()`` deadline of ``timeout`` seconds from now (None for None)."""
    return None if timeout is None else time.perf_counter() + timeout


def wait_within(req, timeout, op, phase):
    """Wait for one non-blocking collective ``req`` at most ``timeout`` seconds (None: no limit).

    For set-up exchanges outside commlab's own collectives (a communicator duplicate, a broadcast
    or all-gather posted directly on MPI): the wait of :func:`wait_all` with the request inside the
    MPI library, so a timeout names no peer, only ``op`` and ``phase``.

    Raises
    ------
    CollectiveTimeout
        When ``req`` has not completed after ``timeout`` seconds.
    """
    wait_all([req], [None], deadline_of(timeout), Where(op, 0, phase, timeout))


#: Where a wait happens, for its timeout's error: the collective's name, the round index, the
#: phase's name and the limit in seconds.
Where = namedtuple("Where", "name index phase timeout")


def wait_all(reqs, peers, deadline, where, *, progress=None, statuses=None, each=False):
    """Wait for ``reqs`` until ``deadline`` (seconds, perf_counter); raise CollectiveTimeout then.

    Parameters
    ----------
    reqs : list of mpi4py.MPI.Request
    peers : list of int or None
        ``peers[i]`` is the peer of ``reqs[i]``; a negative peer ``-1 - p`` marks a send to ``p``;
        None a request inside the MPI library.
    deadline : float or None
        ``time.perf_counter()`` value; None waits forever.
    where : Where
        For the error: the collective's name, round index, phase name and the limit in seconds.
    progress : callable, optional
        Called while waiting, to advance other non-blocking collectives.
    statuses : list of mpi4py.MPI.Status, optional
        Filled with the requests' statuses when they complete (for received-size checks).
    each : bool
        Test the requests one by one (``MPI_Test``) instead of with ``MPI_Testall``: MPICH 5.0's
        ``MPI_Testall`` reports ``MPI_ERR_PENDING`` for a persistent collective still in progress.

    Raises
    ------
    CollectiveTimeout
        Naming the first receive still pending (else the first send); pending receives are
        cancelled so their buffers are released.
    """
    spins, slow = 0, None
    if len(reqs) == 1:  # MPI_Test: a third of what MPI_Testall of a one-request list costs through mpi4py
        req, status = reqs[0], None if statuses is None else statuses[0]

        def done():
            return req.Test(status)
    elif each:
        def done():
            return all([r.Test() for r in reqs])
    elif statuses is not None:
        def done():
            return MPI.Request.Testall(reqs, statuses)
    else:
        def done():
            return MPI.Request.Testall(reqs)
    while not done():
        if progress is not None:
            progress()
        spins += 1
        if spins & 63:
            if _YIELD_EVERY_TEST:
                os.sched_yield()
            continue  # the clock is read every 64 tests only: a short wait costs what MPI_Waitall costs
        now = time.perf_counter()
        if deadline is not None and now > deadline:
            pending = [(p, r) for p, r in zip(peers, reqs) if not r.Test()]
            recvs = [p for p, r in pending if p is not None and p >= 0]
            sends = [-1 - p for p, r in pending if p is not None and p < 0]
            peer = (recvs or sends or [None])[0]
            for p, r in pending:
                if p is not None and p >= 0:
                    r.Cancel()
            raise CollectiveTimeout(where.name, peer, where.index, where.timeout, where.phase)
        if slow is None:
            slow = now + _SPIN_SECONDS
        elif now > slow:
            time.sleep(5e-5)  # a long wait (a late peer) gives the core away instead of spinning
        else:
            os.sched_yield()  # as MPICH's polls-before-yield: a rank sharing the core with its peer lets it run
