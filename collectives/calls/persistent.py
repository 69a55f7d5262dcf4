"""Persistent all-reduce (MPI-4 style): plan once, then ``start()`` / ``wait()`` many times.

MPI-4 added persistent collectives (``MPI_Allreduce_init``, MPI 4.0 standard, section 6.13): the
arguments are checked and the library's schedule is built once, and each ``MPI_Start`` /
``MPI_Wait`` pair runs the collective again on the same buffers. :func:`allreduce_init` gives commlab
the same form::

    plan = collectives.allreduce_init(grad, comm, op="avg", algorithm="mpi")
    for step in range(steps):
        ...                      # write this step's values into grad
        plan.start()
        ...                      # overlap: work that does not touch grad or plan.out
        avg = plan.wait()        # plan.out, overwritten by every wait

A plan of the MPI library's all-reduce (``mpi``, given or chosen by ``auto``) is a
:class:`~collectives.library.plans.LibraryPlan`: a persistent ``MPI_Allreduce_init`` request on a private
buffer that carries the call fingerprint, checked at every wait. A plan of a hand-made algorithm
starts an :func:`~collectives.calls.allreduce.iallreduce` on its cached schedule at every start (the schedule and
buffers are reused; the point-to-point messages are posted anew).

As in MPI, every rank makes the same plans in the same order and starts them in the same order as
its other collectives on the communicator. Making a library plan compares its fingerprint across the
ranks (one 2-element all-reduce), so plans made in another order, or of another element type (whose
messages MPICH cannot match), raise :class:`~collectives.CollectiveMismatch` on every rank as they
are made. MPICH matches a persistent collective by the order in
which the ranks made it, so ranks that disagree about the order of the starts wait for each other; give ``wait`` a
``timeout`` to turn that into :class:`~collectives.CollectiveTimeout`. The fingerprint rides in the
data of every start, so plans that do meet but differ (op, count) raise
:class:`~collectives.CollectiveMismatch` on every rank.
"""
import numpy
from mpi4py import MPI

from collectives.calls.allreduce import begin_allreduce, iallreduce
from collectives.arguments import check_timeout
from collectives.engine.context import refuse
from collectives.engine.fingerprint import debug_enabled
from collectives.library.plans import LibraryPlan
from collectives.shm.algorithms import plan as shm_plan

__all__ = ["AllreducePlan", "allreduce_init"]


class AllreducePlan:
    """A persistent all-reduce made by :func:`allreduce_init`: ``start()`` then ``wait()``, many times.

    Attributes
    ----------
    x : ndarray
        The input the plan reads at every :meth:`start`.
    out : ndarray
        The result, written by every :meth:`wait` (``x``'s shape and dtype).
    algorithm : str
        The algorithm the plan runs (``auto`` resolved once, at plan time).
    record : CallRecord or None
        The last completed all-reduce's own record of what it sent
        (:class:`collectives.engine.context.CallRecord`); None before the first :meth:`wait`.

    Examples
    --------
    >>> import numpy as np
    >>> import collectives
    >>> x = np.zeros(3)
    >>> plan = collectives.allreduce_init(x, algorithm="ring")
    >>> x[:] = [1.0, 2.0, 3.0]  # the plan reads x at every start
    >>> plan.start()
    >>> plan.wait() is plan.out
    True
    >>> plan.out
    array([1., 2., 3.])
    >>> plan.record.algorithm, plan.record.bytes_sent  # one rank sends nothing
    ('ring', 0)
    """

    __slots__ = ("x", "out", "algorithm", "_core", "_args", "_request", "_timeout", "_freed", "record")

    def __init__(self, x, out, algorithm, core, args):
        self.x, self.out, self.algorithm, self._core, self._args = x, out, algorithm, core, args
        self._request, self._freed, self.record = None, False, None

    def _check_live(self, call):
        if self._freed:
            raise RuntimeError(f"plan.{call}() on a freed plan: make a new one with collectives.allreduce_init")

    def start(self):
        """Start one all-reduce of the current contents of :attr:`x`.

        Raises
        ------
        RuntimeError
            The previous start has not been waited for, the plan was freed, the communicator's
            context was freed (:func:`collectives.engine.context.free_context`), or the
            communicator is unusable after a failure.
        """
        core = self._core
        if self._freed:
            self._check_live("start")
        if self._request is not None:
            raise RuntimeError("plan.start() called twice without plan.wait() in between")
        if core is not None:
            if core.ctx.broken is not None:
                core.ctx.check_usable()
            if core.ctx.comm == MPI.COMM_NULL:  # (free_context freed the duplicate the plan runs on)
                raise RuntimeError("plan.start() after the communicator's context was freed (free_context): make "
                                   "a new plan with collectives.allreduce_init")
            core.start(self.x)
            self._request = core
        else:
            comm, op, grid, accumulate = self._args
            self._request = iallreduce(self.x, comm=comm, op=op, algorithm=self.algorithm, out=self.out, grid=grid, accumulate=accumulate)

    def test(self):
        """Advance the all-reduce without blocking; return True once :meth:`wait` would not block."""
        self._check_live("test")
        if self._request is None:
            raise RuntimeError("plan.test() before plan.start()")
        return self._request.test()

    def wait(self, timeout=None):
        """Complete the started all-reduce and return :attr:`out`.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait before :class:`~collectives.CollectiveTimeout` (the communicator is then
            unusable, as after any timeout).

        Raises
        ------
        RuntimeError
            ``wait()`` without ``start()``.
        CollectiveTimeout, CollectiveMismatch
            As for :func:`collectives.allreduce`.
        """
        if timeout is not None:
            timeout = check_timeout(timeout)
        if self._freed:
            self._check_live("wait")
        req, self._request = self._request, None
        if req is None:
            raise RuntimeError("plan.wait() before plan.start()")
        if req is self._core:
            out = self._core.wait(self.out, timeout)
            self.record = self._core.ctx.last  # the record this run just made (a library plan's own, made once)
            return out
        out = req.wait(timeout)
        self.record = req.record
        return out

    def free(self):
        """Release the plan's MPI requests; every later call on the plan raises ``RuntimeError``.

        Raises
        ------
        RuntimeError
            The plan was started and not waited for (wait first: its requests are in use).
        """
        if self._request is not None:
            raise RuntimeError("plan.free() while a start is pending: call plan.wait() first")
        self._freed = True
        if self._core is not None and not self._core.active:
            for r in self._core.reqs:
                r.Free()
            self._core = None
        self._args = None


def allreduce_init(x, *, op="sum", comm=None, algorithm="auto", out=None, grid=None, accumulate="float32"):
    """Plan an all-reduce of ``x`` that can be started many times (``MPI_Allreduce_init``'s form).

    Every argument is checked now, once; ``auto`` is resolved now. Each :meth:`AllreducePlan.start`
    reads the current contents of ``x``; each :meth:`AllreducePlan.wait` writes the result into
    ``out`` (a new array made now when ``out`` is None, the same one every time) and returns it.
    Every rank makes the same plans in the same order, and starts them in the same order as its other
    collectives on ``comm``. Source: MPI 4.0 standard, section 6.13 (persistent collective operations).

    Parameters
    ----------
    x : ndarray, any shape, float16/float32/float64/int32/int64 (NumPy)
        The input buffer, read at every start.
    comm, op, algorithm, grid, accumulate
        As for :func:`collectives.allreduce`.
    out : ndarray, optional
        Result buffer, ``x``'s shape and dtype; ``out=x`` reduces in place.

    Returns
    -------
    AllreducePlan

    Raises
    ------
    ValueError, TypeError
        As for :func:`collectives.allreduce` (on every rank, before any message), or ``x`` that is
        not a NumPy array.
    CollectiveMismatch
        Debug mode (``COMMLAB_DEBUG=detail``): the plan's fingerprint, compared as it is made,
        differs between the ranks, or another rank refused its arguments.

    Examples
    --------
    >>> import numpy as np
    >>> import collectives
    >>> x = np.array([1, 2, 3], dtype=np.int64)
    >>> plan = collectives.allreduce_init(x, op="sum", algorithm="mpi", out=x)  # in place
    >>> plan.start(); plan.wait()
    array([1, 2, 3])
    >>> plan.free()
    >>> collectives.allreduce_init([1.0, 2.0])
    Traceback (most recent call last):
    ...
    TypeError: allreduce_init takes a NumPy array, not list
    """
    if type(x) is not numpy.ndarray:
        raise refuse("allreduce", TypeError(f"allreduce_init takes a NumPy array, not {type(x).__name__}"), comm)
    call = begin_allreduce(x, op=op, comm=comm, algorithm=algorithm, out=out, timeout=None, grid=grid,
                           accumulate=accumulate)
    ctx, resolved, op, grid = call.ctx, call.algorithm, call.op, call.grid
    if debug_enabled():  # the plan's fingerprint is compared as it is made, so a rank that refused is heard of
        ctx.advance(call.key)
    if out is None:
        out = numpy.empty(x.shape, x.dtype)
    core = None
    if resolved == "mpi":
        key = ("allreduce", "mpi", x.size, x.dtype, op, None, None)
        core = LibraryPlan(ctx, key, x.shape, x.dtype, op, persistent=True)
    elif resolved == "shm":  # zero-copy when out is x and x lies in a shared buffer (collectives.shm.shared_empty)
        core = shm_plan(ctx, ("allreduce", "shm", x.size, x.dtype, op, None, None), x, out)
    return AllreducePlan(x, out, resolved, core, (comm, op, grid, accumulate))
