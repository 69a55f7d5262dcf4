"""Non-blocking collectives: a :class:`Request` advanced by ``test()`` and completed by ``wait()``."""

from collectives.arguments import check_timeout
from collectives.errors import CollectiveError, CollectiveTimeout
from collectives.engine.executor import Timed, explain, testing

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
    run : collectives.engine.executor.Run
        The schedule, communicator, buffers, reduction and tag of this call.
    finish : callable or None
        Called once with no arguments after the final round (final division for ``avg``, casting
        into the output); its return value becomes :attr:`result`.
    active : set or None
        The communicator's set of requests in flight (this request adds and removes itself).
    on_fail : callable or None
        Called with the error message when a wait times out (marks the communicator unusable).
    record : CallRecord or None
        The call's own record of what it sends (:class:`collectives.engine.context.CallRecord`).

    Attributes
    ----------
    record : CallRecord or None
        As given: the collective, algorithm, count and the bytes this rank sends.

    Examples
    --------
    The non-blocking collectives make requests (:func:`collectives.iallreduce`):

    >>> import numpy as np
    >>> import collectives
    >>> req = collectives.iallreduce(np.ones(3), algorithm="tree")
    >>> isinstance(req, collectives.Request)
    True
    >>> req.wait(timeout=5.0)
    array([1., 1., 1.])
    >>> req.done, req.test(), req.record.bytes_sent  # one rank sends nothing
    (True, True, 0)
    >>> req.wait(timeout=-1.0)
    Traceback (most recent call last):
    ...
    ValueError: timeout=-1.0 must be None or a positive number of seconds
    """

    __slots__ = ("_run", "_finish", "_active", "_on_fail", "_failed", "result", "done", "record")

    def __init__(self, run, *, finish=None, active=None, on_fail=None, record=None):
        self._run, self._finish, self.record = run, finish, record
        self._active, self._on_fail, self._failed = active, on_fail, None
        self.result, self.done = None, False
        if active is not None:
            active.add(self)
        self._advance()

    def _advance(self, complete=testing):
        """Run the rounds that ``complete`` finishes (by default those already arrived: the non-blocking form)."""
        if self.done or self._failed is not None:
            return
        try:
            finished = self._run.advance(complete)
        except CollectiveTimeout as exc:
            exc = explain(exc, self._run.comm, self._run.tag)
            self._fail(exc)
            raise exc from None
        except CollectiveError as exc:
            self._fail(exc)
            raise
        if finished:
            self.done = True
            if self._active is not None:
                self._active.discard(self)
            self.result = self._finish() if self._finish is not None else self._run.work

    def _fail(self, exc):
        self._failed = str(exc)
        if self._active is not None:
            self._active.discard(self)
        if self._on_fail is not None:
            self._on_fail(f"{self._run.name}: {exc}")

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
        self._advance(Timed(timeout, self._progress_others if self._active else None))
        return self.result
