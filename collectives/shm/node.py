"""The node's shared memory: MPI-3 shared windows, the flags that order the ranks, and shared buffers.

One :class:`Node` per library context (:mod:`collectives.engine.context`) whose ranks share one
node, made by the first ``algorithm="shm"`` call on it and kept as an attribute of the context's
duplicated communicator (freed with it). It holds:

* a **control window**: one 64-byte line per rank (eight 64-bit words) in one segment. Word 0 is
  the rank's *flag*: the number of synchronisation points it has reached (high 32 bits) and the
  32-bit CRC of its call's fingerprint (low 32 bits, :func:`collectives.engine.fingerprint.key_code`),
  written in one aligned 8-byte store, so a reader never sees one without the other. Words 1-7 carry
  a few integers a call must publish (an all-gather's block length).
* a **data window**: one segment per rank, split in two halves; call number ``s`` stages in half
  ``s % 2``. It grows (freed and allocated again, collectively) when a call needs more, after every
  rank has shown through its flag that it makes the same call.

A synchronisation point (:meth:`Node.post`, :meth:`Node.wait`) is: ``MPI_Win_sync`` (the memory
barrier MPI prescribes between the data a rank wrote and the flag that announces it), the flag
store, then polling every rank's flag after ``MPI_Win_sync`` until each has reached the same point.
A flag at the same point with another CRC is a rank in another call: every rank raises
:class:`~collectives.errors.CollectiveMismatch` (each sees the other's flag). A rank that never
arrives is named by :class:`~collectives.errors.CollectiveTimeout` when the call has a ``timeout``.
No MPI message is sent; MPI is called only for the memory barrier. The pattern is the one MPI 4.0
gives for shared windows (section 12.7, "Memory Model", example 12.21's flag synchronisation).

:func:`shared_empty` allocates a caller's array in a window of its own (the trainer's flat gradient
buffer); an all-reduce in place on it reads and writes the peers' arrays directly, copying nothing
in or out (:mod:`collectives.shm.algorithms`).

Imports: mpi4py, :mod:`collectives.engine`, :mod:`collectives.schedules`, :mod:`collectives.backend`,
:mod:`collectives.errors`.
"""
import math
import os
import sys
import time
import zlib

import numpy
from mpi4py import MPI

from collectives.backend import COPY_DTYPES
from collectives.engine.context import get_context
from collectives.engine.fingerprint import describe, key_code
from collectives.engine.waiting import Where, deadline_of, wait_all
from collectives.errors import CollectiveMismatch, CollectiveTimeout

__all__ = ["Node", "node_of", "existing_node", "shared_empty", "free_shared", "shared_views", "refuse_nodes", "LINE_WORDS", "PAGE"]

#: 64-bit words of one rank's control line (64 bytes: one cache line, so ranks never share a line).
LINE_WORDS = 8
#: Window sizes and stage offsets are rounded up to this many bytes.
PAGE = 4096
_MASK = 0xFFFFFFFF
_SPINS = 20  # polls before each further poll yields the core (os.sched_yield)
_KEYVAL = [None]
_MAGIC = 0x73686D5F63616C6C  # "shm_call": the first call's check rows start with it


def refuse_nodes(ctx, collective):
    """Raise ``ValueError`` unless every rank of ``ctx`` is on one node (found alike on every rank).

    Raises
    ------
    ValueError
        The communicator spans several nodes (or nodes holding different numbers of ranks).
    """
    nodes, per = ctx.nodes()
    if nodes != 1:
        where = f"{nodes} nodes" if nodes else "several nodes holding different numbers of ranks"
        raise ValueError(f"{collective} with algorithm='shm' needs every rank of the communicator on one node "
                         f"(MPI_COMM_TYPE_SHARED); this communicator spans {where}: use a hand-made algorithm "
                         "or 'mpi'")


class Node:
    """The shared windows of one context's node and the state of its synchronisation points.

    Parameters
    ----------
    ctx : Context
        A library context whose ranks all share one node.

    Attributes
    ----------
    comm : mpi4py.MPI.Intracomm
        The node communicator (``Split_type(COMM_TYPE_SHARED)`` of the context's duplicate; the same
        ranks in the same order).
    rank, size : int
    calls : int
        Shared-memory calls begun here (their parity picks the stage half).
    pending : list
        Non-blocking calls started and not yet completed, oldest first: each has ``complete(timeout)``,
        called before a new call begins.
    generation : int
        Allocations of the data window so far (a plan keeping stage views compares it).
    buffers : list of (int, int, int, list, mpi4py.MPI.Win)
        Shared buffers: (serial, first address, bytes, every rank's uint8 view, window).
    released : list
        Buffers :func:`free_shared` released whose memory an array still views on some rank, as in
        ``buffers``: kept mapped until :meth:`reclaim` finds no array viewing them on any rank.
    """

    __slots__ = ("comm", "rank", "size", "_cwin", "ctrl", "_flags", "_dwin", "capacity", "views", "counter",
                 "calls", "pending", "buffers", "released", "_serial", "_tmp", "generation")

    def __init__(self, ctx):
        self.comm = ctx.comm.Split_type(MPI.COMM_TYPE_SHARED, key=ctx.rank)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        assert self.size == ctx.size and self.rank == ctx.rank, "one node holds every rank (checked before)"
        self._cwin = MPI.Win.Allocate_shared(self.size * LINE_WORDS * 8 if self.rank == 0 else 0, 8, comm=self.comm)
        buf, _ = self._cwin.Shared_query(0)
        self.ctrl = numpy.frombuffer(buf, numpy.uint64, count=self.size * LINE_WORDS).reshape(self.size, LINE_WORDS)
        self._flags = self.ctrl[:, 0]
        self._cwin.Lock_all(MPI.MODE_NOCHECK)  # one passive epoch for the window's life: Win_sync is legal
        if self.rank == 0:
            self.ctrl[...] = 0  # (shared memory comes uninitialised)
        self._cwin.Sync()
        self.comm.Barrier()
        self._cwin.Sync()
        self._dwin, self.capacity, self.views = None, 0, []
        self.generation = 0  # counts the data window's allocations (views of an older one are stale)
        self.counter = self.calls = 0
        self.pending, self.buffers, self.released, self._serial = [], [], [], 0
        self._tmp = {}

    # ---------------------------------------------------------------- synchronisation points
    def post(self, code, extra=()):
        """Reach the next synchronisation point: publish ``extra`` (up to 7 integers), then the flag.

        Returns the flag word the other ranks must show to have reached the same point.
        """
        self.counter = (self.counter + 1) & _MASK
        word = (self.counter << 32) | code
        if extra:
            self.ctrl[self.rank, 1:1 + len(extra)] = extra
        self._cwin.Sync()  # the data and extras before the flag
        self._flags[self.rank] = word
        return word

    def missing(self, word, key, ctx):
        """Return the first rank that has not reached the point of flag ``word``, or -1 when all have.

        Raises :class:`CollectiveMismatch` (the context failed) when a rank at this point made another call.
        """
        self._cwin.Sync()  # the flags, then (after this returns -1) the peers' data
        flags = self._flags.tolist()
        if flags.count(word) == self.size:
            return -1
        point = word >> 32
        for peer, w in enumerate(flags):
            if w == word:
                continue
            ahead = ((w >> 32) - point) & _MASK
            if ahead == 0:
                err = CollectiveMismatch(key[0], "fingerprint", f"this rank called {describe(key)} and rank {peer} "
                                         "made a different call (count, dtype, op, root, the shared buffer, or call "
                                         "order) at the same point; rerun with COMMLAB_DEBUG=detail to name the field")
                ctx.fail(f"{key[0]}: {err}")
                raise err
            if ahead != 1:  # behind (ahead is 1 for a rank that has passed this point already)
                return peer
        return -1

    def wait(self, word, key, ctx, deadline, timeout, step, phase):
        """Poll until every rank reached flag ``word``'s point (see :meth:`missing`).

        Raises
        ------
        CollectiveTimeout
            ``deadline`` (a ``time.perf_counter`` value) passed: names the first rank missing.
        CollectiveMismatch
            A rank is in another call.
        """
        peer = self.missing(word, key, ctx)
        spins = 0
        while peer >= 0:
            spins += 1
            if spins > _SPINS:
                os.sched_yield()  # (ranks may outnumber the cores: let the late one run)
                # and drive the MPI library's progress: a message this rank sent before the call (a
                # user's MPI_Allreduce that returned here) may still wait for this rank to move it
                self.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
            if ctx.active:
                ctx.progress()
            if deadline is not None and time.perf_counter() > deadline:
                theirs = (int(self._flags[peer]) >> 32) & _MASK
                err = CollectiveTimeout(key[0], peer, step, timeout, phase=phase,
                                        pending=f"rank {peer} is at shared-memory point #{theirs}, this rank waits at "
                                                f"#{word >> 32} (it is in no shm call, or in another collective)")
                ctx.fail(f"{key[0]}: {err}")
                raise err
            peer = self.missing(word, key, ctx)

    def extras(self, count):
        """Return every rank's first ``count`` published integers (after :meth:`wait`), shape (P, count)."""
        return self.ctrl[:, 1:1 + count].astype(numpy.int64)

    # ---------------------------------------------------------------- staging memory
    def fits(self, nbytes):
        """Return True when a stage of ``nbytes`` per half fits the data window as it is."""
        return 2 * max(-(-nbytes // PAGE) * PAGE, PAGE) <= self.capacity

    def stage(self, nbytes):
        """Return every rank's uint8 view of this call's stage half (``nbytes`` each), growing the window if needed.

        Growing is collective on the node: callers reach it only at a point every rank has shown to be
        the same call (after a synchronisation point where :meth:`fits` said no, on every rank alike).
        """
        if not self.fits(nbytes):
            half = -(-max(nbytes, 1) // PAGE) * PAGE
            self._grow(max(2 * half, min(2 * self.capacity, 1 << 30)))
        off = (self.calls & 1) * (self.capacity // 2)
        return [v[off:off + nbytes] for v in self.views]

    def _grow(self, capacity):
        """Free the data window and allocate one of ``capacity`` bytes per rank (collective on the node)."""
        if self._dwin is not None:
            self.views = []
            self._dwin.Unlock_all()
            self._dwin.Free()
        self._dwin = MPI.Win.Allocate_shared(capacity, 1, comm=self.comm)
        self._dwin.Lock_all(MPI.MODE_NOCHECK)
        self.views = [numpy.frombuffer(self._dwin.Shared_query(p)[0], numpy.uint8, count=capacity)
                      for p in range(self.size)]
        self.capacity = capacity
        self.generation += 1

    def scratch(self, dtype, n):
        """Return this rank's private scratch of ``n`` elements of ``dtype`` (a reduction's chunk)."""
        dtype = numpy.dtype(dtype)
        buf = self._tmp.get(dtype)
        if buf is None or buf.size < n:
            buf = self._tmp[dtype] = numpy.empty(max(n, 1), dtype)
        return buf[:n]

    def find(self, a):
        """Return ``(serial, offset, every rank's uint8 view)`` of the shared buffer holding ``a``, else None."""
        if not self.buffers or type(a) is not numpy.ndarray or not a.flags.c_contiguous:
            return None
        addr = a.__array_interface__["data"][0]
        for serial, base, nbytes, views, _ in self.buffers:
            if base <= addr and addr + a.nbytes <= base + nbytes:
                return serial, addr - base, views
        return None

    def allocate(self, nbytes):
        """Allocate a shared buffer of ``nbytes`` on every rank (collective on the node); return this rank's view."""
        size = max(-(-nbytes // PAGE) * PAGE, PAGE)
        win = MPI.Win.Allocate_shared(size, 1, comm=self.comm)
        views = [numpy.frombuffer(win.Shared_query(p)[0], numpy.uint8, count=size) for p in range(self.size)]
        base = views[self.rank].__array_interface__["data"][0]
        self._serial += 1
        self.buffers.append((self._serial, base, size, views, win))
        return views[self.rank]

    def serial_of(self, a):
        """Return the serial of the live shared buffer that starts at ``a``'s first byte, or -1 if none does."""
        addr = a.__array_interface__["data"][0] if type(a) is numpy.ndarray else None
        for serial, base, _, _, _ in self.buffers:
            if base == addr:
                return serial
        return -1

    def release(self, a):
        """Take the shared buffer that starts at ``a``'s first byte out of use; False if none does.

        Its memory stays mapped: ``a`` and any view of it stay valid, ordinary arrays (no
        shared-memory call treats them as shared any more). :meth:`reclaim` frees it once no array
        views it on any rank.
        """
        addr = a.__array_interface__["data"][0] if type(a) is numpy.ndarray else None
        for i, entry in enumerate(self.buffers):
            if entry[1] == addr:
                self.released.append(self.buffers.pop(i))
                return True
        return False

    def reclaim(self, entries=None):
        """Free the windows of ``entries`` (default :attr:`released`) that no array views on any rank.

        Collective on the node, with the same ``entries`` on every rank (they follow from collective
        calls alike everywhere): one ``MPI_Allreduce`` of a flag per entry (1 where this rank holds
        no array into it beyond the node's own views) decides, so the collective ``MPI_Win_free`` is
        entered for the same windows everywhere. A window some rank still views stays mapped, so no
        array ever points at unmapped memory. Returns the entries left mapped.
        """
        entries = self.released if entries is None else entries
        if not entries:
            return []
        free = numpy.array([_unviewed(e[3]) for e in entries], numpy.uint8)
        self.comm.Allreduce(MPI.IN_PLACE, free, op=MPI.BAND)
        kept = [e for e, f in zip(entries, free) if not f]
        for entry, f in zip(entries, free):
            if f:
                entry[4].Free()
        if entries is self.released:
            self.released = kept
        return kept

    def free(self):
        """Free every window (collective on the node: called when the context's communicator is freed).

        A shared buffer that an array still views on some rank (:meth:`reclaim`) is left mapped to the
        end of the job, as is a window the MPI library refuses to free (a peer has died: ULFM's
        ``MPI_ERR_PROC_FAILED``), rather than raising inside the communicator's delete callback.
        """
        locked = ([self._dwin] if self._dwin is not None else []) + [self._cwin]  # (in a Lock_all epoch)
        entries, self.buffers, self.released = self.buffers + self.released, [], []
        try:
            self.reclaim(entries)
        except MPI.Exception:
            pass
        self._dwin, self.views = None, []
        for win in locked:
            try:
                win.Unlock_all()
                win.Free()
            except MPI.Exception:
                pass
        try:
            self.comm.Free()
        except MPI.Exception:
            pass


def _unviewed(views):
    """True when nothing but ``views`` (the node's list) holds any of its arrays (so no array views that memory).

    Every array into a shared buffer holds one of the node's uint8 views as its ``base`` (NumPy points
    a view's base at the array that first took the memory), so a count of references to each view
    beyond the list's own says whether any array, memoryview or plan still reads it.
    """
    probe = [numpy.empty(0, numpy.uint8)]
    alone = sys.getrefcount(probe[0])  # the list's reference and the call's own, counted the same way
    return all(sys.getrefcount(views[p]) <= alone for p in range(len(views)))


def _on_free(comm, keyval, node):
    """Free a node's windows when the context's duplicate communicator is freed (attribute delete callback)."""
    if node is not None:
        node.free()
    return MPI.SUCCESS


def _keyval():
    if _KEYVAL[0] is None:
        _KEYVAL[0] = MPI.Comm.Create_keyval(delete_fn=_on_free)
    return _KEYVAL[0]


def existing_node(ctx):
    """Return the :class:`Node` of ``ctx`` when a shared-memory call or :func:`shared_empty` made it, else None (no message)."""
    return ctx.comm.Get_attr(_keyval())


def node_of(ctx, key, timeout, collective):
    """Return the :class:`Node` of ``ctx``, making it on the first shared-memory call.

    The windows are allocated collectively (``MPI_Win_allocate_shared`` has no non-blocking form):
    first an ``MPI_Iallgather`` of a 4-element row (a constant, the call's fingerprint and its
    negation, P), waited under ``timeout``, shows that every rank makes this very call (each row is
    compared exactly, so another rank's library call of another kind never passes for it), and
    none is left in an allocation another never joins.

    Raises
    ------
    ValueError
        The communicator spans more than one node (:func:`refuse_nodes`).
    CollectiveMismatch, CollectiveTimeout
        The first call's fingerprint differs, or a rank did not join within ``timeout``.
    """
    refuse_nodes(ctx, collective)
    node = ctx.comm.Get_attr(_keyval())
    if node is None:
        code = key_code(key)
        mine = numpy.array([_MAGIC, code, -code, ctx.size], numpy.int64)
        rows = numpy.zeros((ctx.size, mine.size), numpy.int64)
        try:
            req = ctx.comm.Iallgather(mine, rows)
            wait_all([req], [None], deadline_of(timeout), Where(collective, 0, "first shm call's check", timeout))
        except CollectiveTimeout as exc:
            ctx.fail(f"{collective}: {exc}")
            raise
        except MPI.Exception as exc:  # another rank's library call of another size met this one
            err = CollectiveMismatch(collective, "fingerprint", f"this rank called {describe(key)} and another rank "
                                     f"made a different call (the MPI library reported: {exc.Get_error_string()})")
            ctx.fail(f"{collective}: {err}")
            raise err from None
        if not (rows == mine).all():  # every rank's row, exactly: a call of another kind never passes
            err = CollectiveMismatch(collective, "fingerprint", f"this rank called {describe(key)} and another rank "
                                     "made a different call; rerun with COMMLAB_DEBUG=detail to name the field")
            ctx.fail(f"{collective}: {err}")
            raise err
        node = Node(ctx)
        ctx.comm.Set_attr(_keyval(), node)
    return node


def shared_empty(shape, dtype=numpy.float32, *, comm=None):
    """Return a new array in shared memory that ``algorithm="shm"`` reduces in place without copies.

    Collective over ``comm``: every rank calls it with the same shape and dtype, in the same order
    as its other calls of it. The array lives in an MPI-3 shared window (``MPI_Win_allocate_shared``)
    of the ranks' node; an all-reduce in place on it (``collectives.allreduce(a, out=a,
    algorithm="shm")`` or a plan of :func:`collectives.allreduce_init` with ``out=a``) reads every
    rank's array where it lies and writes each reduced slice straight into every rank's array. Any
    C-contiguous view of it works too, at the same offset on every rank. The memory lives until
    :func:`free_shared` or the communicator's library context is freed
    (:func:`collectives.engine.context.free_context`) and no array views it on any rank, or until
    the job ends. Contents are undefined, as for ``numpy.empty``.

    Parameters
    ----------
    shape : int or tuple of int
    dtype : dtype, optional
        One of :data:`collectives.backend.COPY_DTYPES` (default float32).
    comm : mpi4py.MPI.Intracomm, optional
        Default ``COMM_WORLD``; every rank must share one node.

    Returns
    -------
    ndarray
        Of ``shape`` and ``dtype``, C-contiguous, page-aligned.

    Raises
    ------
    ValueError
        A negative dimension, or ``comm`` spans several nodes.
    TypeError
        An unsupported dtype.
    CollectiveMismatch
        The ranks asked for different shapes or dtypes (raised on every rank).

    Examples
    --------
    >>> import numpy as np
    >>> import collectives
    >>> from collectives.shm import shared_empty
    >>> grad = shared_empty(4, np.float32)
    >>> grad[:] = [1, 2, 3, 4]
    >>> collectives.allreduce(grad, out=grad, op="avg", algorithm="shm") is grad  # zero-copy, in place
    True
    >>> grad
    array([1., 2., 3., 4.], dtype=float32)
    """
    shape = (int(shape),) if numpy.ndim(shape) == 0 else tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"shape {shape} has a negative dimension")
    dtype = numpy.dtype(dtype)
    if dtype not in COPY_DTYPES:
        raise TypeError(f"dtype {dtype.name} is not one of {', '.join(d.name for d in COPY_DTYPES)}")
    ctx = get_context(comm)
    ctx.check_usable()
    count = math.prod(shape)
    key = ("allgather", "shm", count, dtype, None, None,
           (len(shape), zlib.crc32(numpy.array(shape, numpy.int64).tobytes()) & 0x7FFFFFFF))
    node = node_of(ctx, key, None, "shared_empty")
    try:
        node.wait(node.post(key_code(key)), key, ctx, None, None, 0, "shared buffer allocation")
    except CollectiveMismatch:
        raise CollectiveMismatch("shared_empty", "shape or dtype", f"this rank asked for shape {shape} of "
                                 f"{dtype.name} and another rank for something else") from None
    node.reclaim()  # released buffers no array views any more, before the new one is mapped
    raw = node.allocate(count * dtype.itemsize)
    return raw[:count * dtype.itemsize].view(dtype).reshape(shape)


def free_shared(a, *, comm=None):
    """Free the memory of an array made by :func:`shared_empty` (collective over ``comm``).

    Every rank calls it for its own array of the same :func:`shared_empty` call, in the same order
    as its other calls of these two functions. The ranks first meet at a synchronisation point whose
    flag names the buffer (its allocation's serial), so nothing is released unless every rank frees
    the same buffer. From then on ``a`` is no shared buffer: a shared-memory call copies it in and
    out as any array, and a plan made on it before copies too. ``a`` and its views stay valid
    arrays holding their values; the memory goes back to the system (the collective
    ``MPI_Win_free``) at the first :func:`shared_empty`, :func:`free_shared` or context free at
    which no array views it on any rank, so a use after the free never reads unmapped memory (one
    still viewed when the context is freed stays mapped to the end of the job).

    Raises
    ------
    ValueError
        ``a`` is not an array returned by :func:`shared_empty` on ``comm`` (the other ranks, when they
        free a buffer meanwhile, raise ``CollectiveMismatch``; nothing is freed).
    CollectiveMismatch
        On every rank, when the ranks free different buffers (nothing is freed).

    Examples
    --------
    >>> from collectives.shm import free_shared, shared_empty
    >>> a = shared_empty(3)
    >>> a[:] = 7
    >>> free_shared(a)
    >>> int(a.sum())  # still a valid array: its memory is returned once no array views it
    21
    >>> free_shared(a)
    Traceback (most recent call last):
    ...
    ValueError: free_shared: this array was not made by shared_empty on this communicator (or was freed)
    """
    ctx = get_context(comm)
    node = ctx.comm.Get_attr(_keyval())
    problem = "free_shared: this array was not made by shared_empty on this communicator (or was freed)"
    if node is None:  # no shared_empty ever ran here on this rank (it is collective: nor on the others)
        raise ValueError(problem)
    ctx.check_usable()
    while node.pending:  # earlier calls complete first: their points come before this one
        node.pending[0].complete(None)
    serial = node.serial_of(a)
    # the count field names the buffer (below -2: no collective's count, nor all-gather's refusal's -1); a
    # rank without such a buffer posts -2, a flag no freeing rank posts, so the others all raise
    key = ("allgather", "shm", -3 - serial, numpy.dtype(numpy.uint8), None, None, None)
    try:
        node.wait(node.post(key_code(key)), key, ctx, None, None, 0, "shared buffer release")
    except CollectiveMismatch:
        if serial < 0:
            raise ValueError(problem) from None
        raise CollectiveMismatch("free_shared", "buffer", "this rank frees another shared buffer than another rank "
                                 "(every rank frees the same shared_empty's array, in the same order)") from None
    if serial < 0:
        raise ValueError(problem)
    node.release(a)
    node.reclaim()  # earlier released buffers whose arrays are gone on every rank (not this one: a views it)


def shared_views(node, a):
    """Return ``(serial, offset, views)`` of every rank's same region as ``a`` in its shared buffer, or None.

    ``views[p]`` is rank ``p``'s array of ``a``'s dtype and size (flat) at the same offset.
    """
    found = node.find(a)
    if found is None:
        return None
    serial, offset, raw = found
    return serial, offset, [v[offset:offset + a.nbytes].view(a.dtype) for v in raw]

