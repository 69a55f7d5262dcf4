"""Non-blocking collectives: a :class:`Request` advanced by ``test()`` and completed by ``wait()``."""
import time

from mpi4py import MPI

from collectives.backend import check_timeout
from collectives.errors import CollectiveError, CollectiveTimeout
from collectives.engine.executor import Run
from collectives.engine.fingerprint import pending
from collectives.engine.waiting import wait_all

__all__ = ["Request"]


class Request:
    """A non-blocking collective in progress, advanced by :meth:`test` and completed by :meth:`wait`.

    Progress happens only inside library calls (no background thread): ``test()`` completes whatever
    rounds have arrived and posts the next ones, so computation placed between calls overlaps with
    communication. While waiting -- in ``wait()`` or in a blocking collective on the same
    communicator -- every request in flight there is advanced, so requests may be completed in any
    order on different ranks without deadlock.

    Parameters
    ----------
    schedule, comm, work, scratch, ufunc, tag, op, transport
        As for :func:`execute`.
    finish : callable or None
        Called once with no arguments after the last round (final division for ``avg``, casting
        into the output); its return value becomes :attr:`result`.
    active : set or None
        The communicator's set of requests in flight (this request adds and removes itself).
    on_fail : callable or None
        Called with the error message when a wait times out (marks the communicator unusable).
    """

    __slots__ = ("_run", "_op", "_index", "_pending", "_finish", "_active", "_on_fail", "_failed", "result",
                 "done")

    def __init__(self, schedule, comm, work, scratch, ufunc, tag, op, transport=None, finish=None,
                 active=None, on_fail=None):
        self._run = Run(schedule, comm, work, scratch, ufunc, tag, op, transport)
        self._op = op
        self._index, self._pending, self._finish = 0, None, finish
        self._active, self._on_fail, self._failed = active, on_fail, None
        self.result, self.done = None, False
        if active is not None:
            active.add(self)
        self._advance()

    def _advance(self):
        if self.done or self._failed is not None:
            return
        run = self._run
        while self._index < len(run.prog):
            if self._pending is None:
                self._pending = (*run.post(self._index), None)
            reqs, _, landing, statuses = self._pending
            if statuses is None:  # not completed by wait(): test, filling fresh statuses
                statuses = run.status_list(len(reqs))
                if not MPI.Request.Testall(reqs, statuses):
                    return
            try:
                run.finish(self._index, landing, statuses)
            except CollectiveError as exc:
                self._fail(exc)
                raise
            self._pending = None
            self._index += 1
        self.done = True
        if self._active is not None:
            self._active.discard(self)
        self.result = self._finish() if self._finish is not None else run.work

    def _fail(self, exc):
        self._failed = str(exc)
        if self._active is not None:
            self._active.discard(self)
        if self._on_fail is not None:
            self._on_fail(f"{self._op}: {exc}")

    def _check(self):
        if self._failed is not None:
            raise RuntimeError(f"this request failed earlier ({self._failed}); its result is lost")

    def _progress_others(self):
        for other in list(self._active or ()):
            if other is not self:
                other._advance()

    def test(self):
        """Advance the collective without blocking; return True once it has completed.

        Raises
        ------
        RuntimeError
            An earlier ``wait`` timed out: the result is lost.
        """
        self._check()
        self._advance()
        if not self.done:
            self._progress_others()  # a peer may be waiting in another request before it gets to this one
        return self.done

    def wait(self, timeout=None):
        """Block until the collective completes and return its result.

        Parameters
        ----------
        timeout : float or None
            Seconds to wait for any one round before raising :class:`CollectiveTimeout`; the request
            (and its communicator) is unusable afterwards.

        Raises
        ------
        ValueError
            ``timeout`` is not None or a positive number.
        CollectiveTimeout, RuntimeError
            A round timed out now, or did earlier.
        """
        timeout = check_timeout(timeout)
        self._check()
        while not self.done:
            if self._pending is None:
                self._advance()
                continue
            reqs, peers, landing, _ = self._pending
            deadline = None if timeout is None else time.perf_counter() + timeout
            statuses = self._run.status_list(len(reqs))
            try:
                wait_all(reqs, peers, deadline, self._op, self._index,
                         self._run.schedule.rounds[self._index].phase, timeout,
                         self._progress_others if self._active else None, statuses)
            except CollectiveTimeout as exc:
                why = pending(self._run.comm, exc.peer, self._run.tag)
                if why:
                    exc = CollectiveTimeout(exc.op, exc.peer, exc.round, exc.timeout, exc.phase, why)
                self._fail(exc)
                raise exc from None
            self._pending = (reqs, peers, landing, statuses)  # completed: _advance must not test again
            self._advance()
        return self.result
