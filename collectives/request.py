"""Non-blocking collectives: a :class:`Request` advanced by ``test()`` and completed by ``wait()``."""
import time

from mpi4py import MPI

from .executor import CollectiveTimeout, _finish_round, _post_round, _wait

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

    __slots__ = ("_schedule", "_prog", "_comm", "_work", "_scratch", "_ufunc", "_tag", "_op",
                 "_transport", "_staged", "_index", "_pending", "_finish", "_active", "_on_fail",
                 "_failed", "result", "done")

    def __init__(self, schedule, comm, work, scratch, ufunc, tag, op, transport=None, finish=None,
                 active=None, on_fail=None):
        self._schedule, self._prog = schedule, schedule.program()
        self._comm, self._work, self._scratch, self._ufunc = comm, work, scratch, ufunc
        self._tag, self._op, self._transport = tag, op, transport
        self._staged = transport is not None and not transport.direct
        self._index, self._pending, self._finish = 0, None, finish
        self._active, self._on_fail, self._failed = active, on_fail, None
        self.result, self.done = None, False
        if active is not None:
            active.add(self)
        self._advance()

    def _advance(self):
        if self.done or self._failed is not None:
            return
        while self._index < len(self._prog):
            if self._pending is None:
                self._pending = _post_round(self._prog, self._index, self._comm, self._work,
                                            self._scratch, self._tag, self._transport, self._staged)
            reqs, _, landing = self._pending
            if not MPI.Request.Testall(reqs):
                return
            _finish_round(self._prog, self._index, self._work, self._ufunc, landing,
                          self._transport, self._staged)
            self._pending = None
            self._index += 1
        self.done = True
        if self._active is not None:
            self._active.discard(self)
        self.result = self._finish() if self._finish is not None else self._work

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
        from .backend import check_timeout  # late import: backend does not depend on schedules

        timeout = check_timeout(timeout)
        self._check()
        while not self.done:
            if self._pending is None:
                self._advance()
                continue
            reqs, peers, _ = self._pending
            deadline = None if timeout is None else time.perf_counter() + timeout
            try:
                _wait(reqs, peers, deadline, self._op, self._index, self._schedule.rounds[self._index].phase,
                      timeout, self._progress_others if self._active else None)
            except CollectiveTimeout as exc:
                self._failed = str(exc)
                if self._active is not None:
                    self._active.discard(self)
                if self._on_fail is not None:
                    self._on_fail(f"{self._op}: {exc}")
                raise
            self._advance()
        return self.result
