"""Persistent library plans of the ``mpi`` all-reduce: the cached fast path of repeated small calls.

A :class:`LibraryPlan` is the MPI library's all-reduce, either ``MPI_Iallreduce`` posted again at every
start or a persistent ``MPI_Allreduce_init`` request (MPI 4.0 standard, section 6.13), from a private
flat send buffer into a private receive buffer, both in the accumulation dtype, with the call
fingerprint's check elements after the data (:mod:`collectives.library.call`), plus, for messages above
:data:`~collectives.library.call.PIGGYBACK_MAX` elements, one on the 2-element fingerprint, and for float
``min``/``max`` one on the NaN mask. ``start(x)`` copies ``x`` into the send buffer,
whose check elements are written once (the reduction does not overwrite them, as it would in place);
``wait(out)`` verifies the received ones, restores NaN, divides for ``avg`` and copies into ``out``.

The blocking :func:`~collectives.allreduce` keeps one such plan (non-blocking form) per call
signature (shape, dtype, op, algorithm as given) for messages of at most
:data:`~collectives.library.call.PIGGYBACK_MAX` elements, so a repeated small call costs a dictionary
look-up, two small copies, ``MPI_Iallreduce`` and ``MPI_Wait`` (:mod:`collectives.library.mpi_allreduce`). The
consistency rules hold on this path too: the sequence number advances, the fingerprint rides in the
reduction and is checked, a timeout or an MPI error marks the communicator unusable exactly as on
the other paths.

Persistent requests (``MPI_Allreduce_init``, :func:`collectives.allreduce_init`) are matched by the
order in which the ranks made them, not by the order of the calls, so the blocking path does not use
them: a rank whose call misses the cache (a new count, another op) would wait forever for ranks that
start an older plan, where the non-blocking form matches by call order and the fingerprint check
raises on every rank.
"""
from functools import partial

import numpy
from mpi4py import MPI

from collectives.engine.buffers import ACC, MPI_OPS
from collectives.engine.context import CallRecord
from collectives.errors import CollectiveTimeout
from collectives.engine.fingerprint import checks_enabled, debug_enabled, key_code
from collectives.library.call import CHECK_ELEMENTS, PIGGYBACK_MAX, check_values, library_error, mismatch, settle
from collectives.engine.waiting import Where, deadline_of, wait_all

__all__ = ["LibraryPlan", "library_plan"]



class LibraryPlan:
    """The library's all-reduce on a private buffer, with the fingerprint check, ready to run again.

    Parameters
    ----------
    ctx : Context
        The communicator's library context.
    key : tuple
        The call key (:mod:`collectives.engine.fingerprint`), algorithm ``"mpi"``.
    shape : tuple of int
        Shape of the input.
    dtype : numpy.dtype
        dtype of the input; the buffer uses its accumulation dtype.
    op : str
        ``sum``, ``avg``, ``prod``, ``min`` or ``max``.
    persistent : bool
        True: persistent requests (``MPI_Allreduce_init``), made now and started by every
        :meth:`start` (a plan of :func:`collectives.allreduce_init`). False: every :meth:`start`
        posts ``MPI_Iallreduce`` on the same buffers (the blocking path's cache). MPICH matches a
        persistent collective by the order in which the ranks *made* it, so a rank that makes a
        new plan while the others start an old one waits forever; the blocking path, whose ranks
        may take the cache or not, therefore keeps the non-blocking form, which matches by call
        order like every other commlab call, and a mismatch there still raises.
    """

    __slots__ = ("ctx", "key", "n", "work", "data", "shaped", "recv", "result", "shaped_result", "tail", "want",
                 "reqs", "fp", "code", "mask", "isnan", "avg", "size", "nbytes", "active", "persistent",
                 "calls", "checked", "lean", "mpi_op", "run", "dtype", "mask_call", "record")

    def __init__(self, ctx, key, shape, dtype, op, persistent=False, checked=True):
        self.ctx, self.key, self.size, self.dtype = ctx, key, ctx.size, numpy.dtype(dtype)
        n = self.n = int(numpy.prod(shape, dtype=numpy.int64))
        acc = ACC[numpy.dtype(dtype)]
        self.checked = checked  # False only while collectives.engine.fingerprint.set_checks(False) measures their cost
        inline = checked and n <= PIGGYBACK_MAX
        self.work = numpy.zeros(n + (CHECK_ELEMENTS if inline else 0), acc)  # sent: data, then checks
        self.recv = numpy.zeros_like(self.work)  # received: the reduced data and checks
        self.data, self.result = self.work[:n], self.recv[:n]
        self.shaped, self.shaped_result = self.data.reshape(shape), self.result.reshape(shape)
        calls = [(self.work, self.recv, MPI_OPS[op])]  # (send, receive, op) of each all-reduce
        self.tail = self.want = self.fp = None
        if inline:
            send, want = check_values(key, ctx.size, acc)
            self.work[n:] = send  # written once: an out-of-place reduction leaves it as it is
            self.tail, self.want = self.recv[n:], want.tobytes()
        elif checked:
            self.code = key_code(key)
            self.fp = numpy.array([self.code, -self.code], numpy.int64)  # MAX in place leaves it so when equal
            calls.insert(0, (MPI.IN_PLACE, self.fp, MPI.MAX))
        self.mask = self.isnan = None
        if op in ("min", "max") and acc.kind == "f":  # NaN propagates (collectives.engine.buffers.nan_mask)
            self.mask = numpy.zeros(n, numpy.uint8)
            self.isnan = self.mask.view(bool)
            calls.append((MPI.IN_PLACE, self.mask, MPI.MAX))
        # started with the data when persistent (a persistent plan's requests are made once); otherwise
        # posted by wait() once the check passed, so a rank whose call differs posts no mask to wait for
        self.mask_call = calls.pop() if self.mask is not None and not persistent else None
        self.avg = None if op != "avg" or ctx.size == 1 else (numpy.true_divide if acc.kind == "f"
                                                              else numpy.floor_divide)
        p = ctx.size
        self.nbytes = (2 * (p - 1) * n // p) * acc.itemsize
        self.record = CallRecord("allreduce", "mpi", n, acc, self.nbytes, None, None, True)  # every run's own record
        self.active, self.persistent, self.calls = False, persistent, calls
        # run(x, out): start and wait without a deadline, the blocking path's repeated call; lean when
        # one MPI_Iallreduce carries its own check
        self.lean, self.mpi_op = not persistent and self.tail is not None and self.mask is None, MPI_OPS[op]
        self.run = self._lean_run() if self.lean else self._general_run
        if persistent and checked:  # its requests are matched once, here: the element type is checked before
            settle(ctx, key, acc, None, always=True)
        self.reqs = [ctx.comm.Allreduce_init(s, r, o) for s, r, o in calls] if persistent else []

    def start(self, x, timeout=None):
        """Copy ``x`` (the plan's shape) into the send buffer and start the requests.

        A call in another element type than the communicator's last checked one is first checked
        alone (:func:`~collectives.library.call.settle`, under ``timeout`` seconds)."""
        ctx = self.ctx
        if not self.persistent and self.checked and ctx.agreed != self.work.dtype:
            settle(ctx, self.key, self.work.dtype, timeout, inline=self.tail is not None)
        ctx._seq += 1  # the call sequence stays in step with every other path
        self.shaped[...] = x  # (setitem casts as copyto(casting="unsafe") does, at a fifth of the cost)
        if self.isnan is not None:
            numpy.isnan(self.data, out=self.isnan)
        reqs = self.reqs
        if not self.persistent:
            comm = ctx.comm
            self.reqs = [comm.Iallreduce(s, r, o) for s, r, o in self.calls]
        elif len(reqs) == 1:
            reqs[0].Start()
        else:
            MPI.Prequest.Startall(reqs)
        self.active = True

    def test(self):
        """Return True once the started requests have completed (without blocking)."""
        if self.persistent:  # not Testall: see collectives.engine.waiting.wait_all
            return all([r.Test() for r in self.reqs])
        return MPI.Request.Testall(self.reqs)

    def wait(self, out, timeout=None):
        """Wait (under ``timeout`` seconds), check the fingerprint and write the result into ``out``."""
        ctx, reqs = self.ctx, self.reqs
        deadline = None if timeout is None else deadline_of(timeout)
        # the fingerprint beside the data first: a rank whose call differs may never post the data
        parts = [reqs[:1], reqs[1:]] if self.fp is not None and not self.persistent else [reqs]
        for part in parts:
            try:
                if timeout is None and not ctx.active:
                    if len(part) == 1:
                        part[0].Wait()
                    else:
                        MPI.Request.Waitall(part)
                else:
                    wait_all(part, [None] * len(part), deadline, Where("allreduce", 0, "MPI_Allreduce", timeout),
                             progress=ctx.progress if ctx.active else None, each=self.persistent)
            except CollectiveTimeout as exc:
                self._failed(str(exc))
                raise
            except MPI.Exception as exc:
                raise self._library_error(exc) from None
            if self.fp is not None and (int(self.fp[0]) != self.code or int(self.fp[1]) != -self.code):
                self._failed(str(mismatch(self.key)))
                raise mismatch(self.key)
        self.active = False
        if self.tail is not None:
            if self.tail.tobytes() != self.want:
                self._failed(str(mismatch(self.key)))
                raise mismatch(self.key)
        if self.mask_call is not None:
            self._reduce_mask(timeout)
        if self.isnan is not None and self.mask.any():
            self.result[self.isnan] = numpy.nan
        if self.avg is not None:
            self.avg(self.result, self.size, out=self.result)
        out[...] = self.shaped_result
        ctx.count(self.record)
        return out

    def allreduce(self, x, out=None, timeout=None):
        """Run the plan on ``x`` (its shape and dtype) and return ``out`` (or a new array): the cached call.

        Without a deadline, :attr:`run` (the lean form where it applies); with one, :meth:`start` and
        :meth:`wait` under ``timeout`` seconds.

        Examples
        --------
        >>> import numpy as np
        >>> import collectives
        >>> from collectives.calls.signatures import cached_plan
        >>> x = np.ones(3, np.float32)
        >>> _ = collectives.allreduce(x, algorithm="mpi")  # the first call makes the plan
        >>> cached_plan(x, algorithm="mpi").allreduce(x, timeout=5.0)
        array([1., 1., 1.], dtype=float32)
        """
        if timeout is None:
            return self.run(x, out)
        self.start(x, timeout)
        return self.wait(numpy.empty(x.shape, x.dtype) if out is None else out, timeout)

    def _general_run(self, x, out):
        """:meth:`start` then :meth:`wait` without a deadline (the form of :attr:`run` for plans that are not lean)."""
        self.start(x)
        return self.wait(numpy.empty(x.shape, x.dtype) if out is None else out)

    def _lean_run(self):
        """Return :attr:`run` of a lean plan: one ``MPI_Iallreduce`` that carries its own check.

        The same steps as :meth:`start` then :meth:`wait`, with what they read bound once in the
        closure (a repeated small call is mostly the Python around the library call): the sequence
        number advances, ``x`` is copied in front of the check elements, ``MPI_Iallreduce`` is posted
        and waited, the reduced check elements are compared, ``avg`` divides and the result is copied
        out. A communicator with non-blocking requests in flight, whose progress a wait must drive,
        takes :meth:`start` and :meth:`wait`.
        """
        ctx, shaped, result, shaped_result, tail, want = self.ctx, self.shaped, self.result, self.shaped_result, \
            self.tail, self.want
        # the buffers as mpi4py message specifications made once ([buffer, count, datatype]): mpi4py
        # then skips reading each array's buffer protocol and format string at every call
        kind = MPI.Datatype.fromcode(self.work.dtype.char)  # the type mpi4py would read from the array
        args = ([MPI.buffer(self.work), self.work.size, kind], [MPI.buffer(self.recv), self.recv.size, kind], self.mpi_op)
        iallreduce, avg, size, record, nbytes = ctx.comm.Iallreduce, self.avg, self.size, self.record, self.nbytes
        general, acc = self._general_run, self.work.dtype
        # a new result array in the input's dtype (float16 and bfloat16 accumulate in float32): a bound
        # method made once, so the call pays no argument parsing
        fresh = shaped_result.copy if self.dtype == result.dtype else partial(shaped_result.astype, self.dtype)

        def run(x, out):
            if ctx.active or ctx.agreed is not acc:  # (another element type: checked alone first, in start)
                return general(x, out)
            ctx._seq += 1
            shaped[...] = x
            self.active = True
            try:
                iallreduce(*args).Wait()
            except MPI.Exception as exc:
                raise self._library_error(exc) from None
            self.active = False
            if tail.tobytes() != want:
                self._failed(str(mismatch(self.key)))
                raise mismatch(self.key)
            if avg is not None:
                avg(result, size, out=result)
            if out is None:
                out = fresh()
            else:
                out[...] = shaped_result
            ctx.last = record  # (Context.count, in this frame)
            ctx.calls += 1
            ctx.bytes_sent += nbytes
            return out

        return run

    def _reduce_mask(self, timeout):
        """All-reduce the NaN mask (``MPI_MAX``) after the check passed, under ``timeout`` seconds."""
        ctx = self.ctx
        try:
            req = ctx.comm.Iallreduce(*self.mask_call)
            if timeout is None and not ctx.active:
                req.Wait()
            else:
                wait_all([req], [None], deadline_of(timeout), Where("allreduce", 0, "MPI_Allreduce", timeout),
                         progress=ctx.progress if ctx.active else None)
        except CollectiveTimeout as exc:
            self._failed(str(exc))
            raise
        except MPI.Exception as exc:
            raise self._library_error(exc) from None

    def _library_error(self, exc):
        """Mark the plan failed after the MPI library reported ``exc``; return the error to raise
        (:func:`~collectives.library.call.library_error`)."""
        err = library_error(self.key, exc, (), "MPI_Allreduce", self.ctx.comm)
        self._failed(str(err))
        return err

    def _failed(self, message):
        self.ctx.fail(f"allreduce: {message}")
        self.ctx.plans.pop((self.key, self.shaped.shape, self.checked), None)


def library_plan(ctx, key, shape, dtype, op):
    """Return the cached library plan of ``key`` on ``ctx`` (made the first time), or None if not cacheable.

    Plans are cached for messages of at most :data:`~collectives.library.call.PIGGYBACK_MAX` elements, outside
    debug mode, separately for the default checks on and off (off only to measure them); at most 256
    per communicator (the cache is emptied beyond that).
    """
    checked = checks_enabled()
    plan = ctx.plans.get((key, shape, checked))
    if plan is None:
        if key[2] > PIGGYBACK_MAX or debug_enabled():
            return None
        if len(ctx.plans) >= 256:
            ctx.plans.clear()
            ctx.fast.clear()  # the call signatures point only at plans still in ctx.plans
        plan = ctx.plans[(key, shape, checked)] = LibraryPlan(ctx, key, shape, dtype, op, checked=checked)
    return plan
