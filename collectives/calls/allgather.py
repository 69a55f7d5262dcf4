"""All-gather(-v): every rank's block, concatenated along axis 0 in rank order.

A call first exchanges a small int64 signature table (shape, dtype and call fingerprint of every
rank; one ``MPI_Iallreduce``), so that every rank checks the inputs agree and sizes the result
before any data moves, then moves the blocks with the ring or the MPI library. What a repeated call
of the same shape reuses -- its own table row, the table a call of equal shapes on every rank
produces, the block bounds and the ring's schedule -- is cached per call signature
(:class:`_Signature`), so an all-gather of equal shapes checks the whole table with one byte
comparison and pays no per-rank Python work, as MPI's ``MPI_Allgather`` pays none of
``MPI_Allgatherv``'s count handling. With ``out`` (the equal-shape form) there is no exchange at all;
with the library, a repeated call runs its signature's :class:`_EqualPlan`, which skips the argument
checks.
"""
import math

import numpy
from mpi4py import MPI

from collectives.schedules.registry import check_algorithm
from collectives.backend import COPY_DTYPES
from collectives.arguments import as_array, check_comm, check_out, check_timeout
from commlab.arrays import get_array_module
from collectives.errors import DtypeMismatch
from collectives.engine.buffers import adopt, raw
from collectives.engine.context import CallRecord, existing_context, get_context, refuse
from collectives.engine.executor import Run, run_schedule
from collectives.engine.fingerprint import block_code, checks_enabled, debug_enabled, key_code, settings_token
from collectives.library.call import call, finish_lean, lean_pair, mismatch, run_library
from collectives.schedules.ring import ring_allgather
from collectives.schedules.schedule import segmented
from collectives.shm import algorithms as shm

__all__ = ["allgather"]

_SIG = 10  # int64 words in an all-gather signature: ndim, dtype code, then up to 8 dims
_ROW = _SIG + 1  # a rank's row in the signature exchange: its signature, then its call fingerprint


def allgather(x, *, comm=None, algorithm="ring", out=None, timeout=None):
    """Concatenate every rank's ``x`` along axis 0, in rank order (all-gather-v, or all-gather with ``out``).

    Without ``out`` (``MPI_Allgatherv``'s form: blocks may differ in length), a first exchange of a
    small int64 signature (shape, dtype and the call fingerprint; one ``MPI_Iallreduce``) lets every
    rank check the inputs agree and size the result before any data moves. With ``out``
    (``MPI_Allgather``'s form: every rank's block has ``x``'s shape) there is no such exchange: the
    blocks move at once, and the call fingerprint (which holds the count, dtype, block shape and
    algorithm) rides in the message tags (``ring``) or in a 2-element all-reduce posted alongside
    the data (``mpi``), so ranks whose shapes or calls differ raise instead of exchanging. Steps (ring): P - 1 rounds,
    in round s rank r forwards block (r - s) mod P to r + 1. Cost: ``(P-1) alpha + (P-1)/P n beta``.
    Source: Thakur, Rabenseifner and Gropp 2005, section 4.

    Parameters
    ----------
    x : ndarray, shape (n_r, ...), supported dtype
        This rank's block; ``n_r`` may differ between ranks, other dimensions and dtype must agree.
    comm : mpi4py.MPI.Intracomm, optional
    algorithm : {"ring", "shm", "mpi", "auto"}
        ``shm``: through shared memory among the ranks of one node (:mod:`collectives.shm`).
        ``auto``: ``mpi`` for host arrays (through commlab, the library's all-gather measured faster
        than the ring up to 8 MiB and within 6 % above, at P = 2 and 4; README "Benchmarks"), and
        ``ring`` for device arrays.
    timeout : float, optional
    out : ndarray or DLPack tensor, optional
        Result buffer of shape (P * n, ...) for blocks of shape (n, ...) on every rank, ``x``'s
        dtype, C-contiguous and writable: the equal-shape all-gather, written and returned. The
        block's shape is part of the call fingerprint, so ranks whose blocks differ in shape (even
        at equal element counts) raise, as they do without ``out``.

    Returns
    -------
    ndarray, shape (sum of n_r, ...), x.dtype
        ``out`` when given.

    Raises
    ------
    ValueError
        ``x`` is 0-d or has more than 8 dimensions, another rank's ``x`` is invalid, or the ranks'
        trailing dimensions differ. These checks ride on the signature exchange, so they are raised
        on every rank even when only one rank's ``x`` is at fault (in debug mode the other ranks
        raise :class:`~collectives.errors.CollectiveMismatch` naming that rank and its error).
    TypeError
        Unsupported dtype, or the ranks' dtypes differ.

    Examples
    --------
    >>> import numpy as np
    >>> import collectives
    >>> collectives.allgather(np.array([[1, 2], [3, 4]]))  # one rank: its own block
    array([[1, 2],
           [3, 4]])
    >>> out = np.empty(2)
    >>> collectives.allgather(np.array([5.0, 6.0]), algorithm="mpi", out=out) is out
    True
    >>> collectives.allgather(np.ones(2), algorithm="tree")
    Traceback (most recent call last):
    ...
    ValueError: unknown allgather algorithm 'tree': expected one of ring, shm, mpi, auto
    """
    if type(x) is numpy.ndarray and type(out) is numpy.ndarray:
        got = _repeated_equal(x, comm, algorithm, timeout, out)  # a repeated equal-shape call: its plan
        if got is not None:
            return got
    if type(x) is not numpy.ndarray or (out is not None and type(out) is not numpy.ndarray):
        x, out, wrap = adopt(x, out)
        if wrap is not None:
            return wrap(allgather(x, comm=comm, algorithm=algorithm, timeout=timeout, out=out))
    given = algorithm
    try:
        if algorithm == "auto":  # (decided without looking at x's validity, so every rank decides alike)
            algorithm = "ring" if hasattr(x, "__cuda_array_interface__") else "mpi"
        else:
            check_algorithm(algorithm, "allgather")
        timeout = check_timeout(timeout)
        x, local_error = _gatherable(x)
        if local_error is not None and ((out is not None and algorithm != "shm") or debug_enabled()):
            raise local_error  # (else the signature's exchange or the shm flags tell the others)
        if algorithm == "shm":
            _check_shm_out(x, comm, None if local_error is not None else out)
        elif out is not None:
            _check_equal_out(x, comm, out)
    except (ValueError, TypeError) as exc:  # a rank refused alone: the others hear of it (debug mode)
        raise refuse("allgather", exc, comm, timeout) from None
    if algorithm == "shm":
        return _gather_shm(x, local_error, comm, timeout, out)
    if out is not None:
        return _gather_equal(x, comm, algorithm, timeout, out, given)
    ctx = get_context(comm, timeout)
    ctx.check_usable()
    if local_error is not None:
        invalid = _Signature(ctx, None, algorithm)
        invalid.exchange(ctx, timeout)
        invalid.rows(ctx)  # a differing call fingerprint is named first
        raise local_error
    sig = ("allgather", algorithm, x.dtype, x.shape, checks_enabled())
    plan = ctx.fast.get(sig)
    if plan is None:
        plan = ctx.keep(sig, _Signature(ctx, x, algorithm))
    if plan.exchange(ctx, timeout):  # every rank passed this shape and dtype
        return _gather_blocks(ctx, x, plan.firsts, plan.bounds, algorithm, timeout)
    rows = plan.rows(ctx)
    _check_signatures(rows, ctx.rank)
    firsts = [row[2] for row in rows]
    return _gather_blocks(ctx, x, firsts, _bounds(firsts, x), algorithm, timeout)


class _Signature:
    """One rank's row of the signature exchange for one call signature, and the table equal shapes give.

    ``x`` None stands for an invalid input: the row then says so (``-2``), and every rank raises.
    """

    __slots__ = ("key", "code", "row", "table", "equal", "firsts", "bounds")

    def __init__(self, ctx, x, algorithm):
        size = ctx.size
        self.key = ("allgather-signature", algorithm, size * _ROW, numpy.dtype(numpy.int64), "sum", None, None)
        self.code = key_code(self.key) if checks_enabled() else 0
        row = numpy.full(_ROW, -1, numpy.int64)
        if x is None:
            row[:2] = -2, -2  # "this rank's x is invalid"
        else:
            row[:2] = x.ndim, COPY_DTYPES.index(x.dtype)
            row[2:2 + x.ndim] = x.shape
        row[_SIG] = self.code
        self.row = row
        self.table = numpy.zeros(size * _ROW, numpy.int64)
        self.equal = numpy.tile(row, size).tobytes()
        self.firsts = None if x is None else [x.shape[0]] * size
        self.bounds = None if x is None else _bounds(self.firsts, x)

    def exchange(self, ctx, timeout):
        """Run the exchange (one ``MPI_Iallreduce``, sum); return True when every row equals this rank's.

        Raises
        ------
        CollectiveMismatch
            (via :meth:`rows`) a rank's call fingerprint differs, when the rows are not all equal.
        """
        table, rank = self.table, ctx.rank
        table.fill(0)
        table[rank * _ROW:(rank + 1) * _ROW] = self.row
        ctx.advance(self.key, timeout)
        call(ctx, self.key, "Iallreduce", (MPI.IN_PLACE, table, MPI.SUM), timeout, check=False)
        return table.tobytes() == self.equal

    def rows(self, ctx):
        """Return every rank's ``(ndim, dtype index, *shape)`` row after :meth:`exchange`.

        Raises
        ------
        CollectiveMismatch
            A rank's call fingerprint differs (another collective, algorithm or call order).
        """
        rows = self.table.reshape(ctx.size, _ROW).tolist()  # tiny: plain Python is faster than NumPy here
        if any(r[_SIG] != self.code for r in rows):
            err = mismatch(self.key)
            ctx.fail(f"allgather: {err}")
            raise err
        return [r[:_SIG] for r in rows]


def _gatherable(x):
    """Return ``(x as an array, None)``, or ``(empty array, the error)`` when ``x`` cannot be gathered.

    Checks of ``x`` itself travel in the signature exchange, so a bad array on one rank raises on
    every rank instead of leaving the others waiting for its data.
    """
    try:
        x = as_array(x)
    except TypeError as exc:
        return numpy.zeros(0, numpy.uint8), exc
    if x.dtype not in COPY_DTYPES:
        names_ = ", ".join(d.name for d in COPY_DTYPES)
        return x, TypeError(f"x has unsupported dtype {x.dtype.name}: expected one of {names_}")
    if x.ndim == 0 or x.ndim > _SIG - 2:
        return x, ValueError(f"x must have 1 to {_SIG - 2} dimensions to be gathered along axis 0, not {x.ndim}")
    return x, None


def _check_signatures(rows, rank):
    """Raise on every rank alike when a rank's ``x`` was invalid or the dtypes or trailing shapes differ."""
    bad = [i for i, row in enumerate(rows) if row[0] == -2]
    if bad:
        raise ValueError(f"allgather: rank(s) {', '.join(map(str, bad))} passed an invalid array "
                         "(unsupported dtype or dimensions); see the error on those ranks")
    mine = rows[rank]
    if any(row[1] != mine[1] for row in rows):
        raise DtypeMismatch("allgather", "; ".join(f"rank {i}: dtype={COPY_DTYPES[row[1]].name}"
                                                   for i, row in enumerate(rows)))
    if any(row[0] != mine[0] or row[3:] != mine[3:] for row in rows):
        raise ValueError("allgather: ranks' arrays differ beyond the first dimension: "
                         + "; ".join(f"rank {i} {tuple(row[2:2 + row[0]])}" for i, row in enumerate(rows)))


def _check_equal_out(x, comm, out):
    """Check ``out`` of the equal-shape all-gather (:func:`_gather_equal`), no message."""
    comm = check_comm(comm)
    size = comm.Get_size()
    check_out(out, x, (size * x.shape[0],) + x.shape[1:])
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous: the blocks are gathered into its memory")
    if get_array_module(out) is not get_array_module(x):
        raise TypeError("out and x must be arrays of the same kind (both host or both device)")


def _check_shm_out(x, comm, out):
    """Check ``comm`` and ``out`` of the ``shm`` all-gather (as the equal-shape form's), no message."""
    comm = check_comm(comm)
    if out is not None:
        check_out(out, x, (comm.Get_size() * x.shape[0],) + x.shape[1:])
        if not out.flags.c_contiguous:
            raise ValueError("out must be C-contiguous: the blocks are gathered into its memory")


def _gather_equal(x, comm, algorithm, timeout, out, given):
    """The equal-shape all-gather into checked ``out`` (:func:`_check_equal_out`): the blocks move at once
    (host arrays with the library: through the signature's :class:`_EqualPlan`, made here the first time)."""
    comm = check_comm(comm)
    ctx = get_context(comm, timeout)
    ctx.check_usable()
    plan = _EqualPlan(ctx, x, algorithm)
    if algorithm == "mpi" and type(x) is numpy.ndarray and x.size:  # later calls skip the checks above
        ctx.keep(("allgather-out", given, x.dtype, x.shape, checks_enabled()), plan)
    return plan.run(ctx, x, out, timeout)


def _gather_shm(x, local_error, comm, timeout, out):
    """The ``shm`` all-gather (:func:`collectives.shm.algorithms.allgather`), ``out`` checked as the equal-shape form's.

    A rank whose ``x`` cannot be gathered raises its error; the others raise
    :class:`~collectives.errors.CollectiveMismatch` at the call's first synchronisation point.
    """
    comm = check_comm(comm)
    ctx = get_context(comm, timeout)
    ctx.check_usable()
    if local_error is not None:
        shm.refuse(ctx, timeout)
        raise local_error
    return shm.allgather(ctx, x, out, timeout)


def _repeated_equal(x, comm, algorithm, timeout, out):
    """Run the cached :class:`_EqualPlan` of this call's signature; None when there is none or ``out``
    is not a writable C-contiguous array of the result's shape and ``x``'s dtype (the full path runs)."""
    ctx = existing_context(comm)
    if ctx is None:
        return None
    plan = ctx.fast.get(("allgather-out", algorithm, x.dtype, x.shape, checks_enabled()))
    if plan is None or out.shape != plan.shape or out.dtype != x.dtype:
        return None
    flags = out.flags
    if not (flags.c_contiguous and flags.writeable):
        return None
    return plan.run(ctx, x, out, None if timeout is None else check_timeout(timeout))


class _EqualPlan:
    """The equal-shape all-gather of one call signature: the result's shape and the block bounds.

    Every equal-shape call runs through one; the library's (``MPI_Allgather``) on host arrays is
    cached, so a repeated call skips the argument checks and goes straight to :func:`_gather_blocks`,
    which posts the 2-element fingerprint all-reduce and then the blocks. The fingerprint does not ride in the
    blocks: a rank carrying it and one that does not (an all-gather without ``out``, or a
    reduce-scatter, on another rank) would post different library collectives, which MPICH can pair
    with each other, returning values on some ranks.
    """

    __slots__ = ("shape", "firsts", "bounds", "algorithm", "key", "block", "lean")

    def __init__(self, ctx, x, algorithm="mpi"):
        size = ctx.size
        self.shape = (size * x.shape[0],) + x.shape[1:]
        self.firsts, self.bounds = [x.shape[0]] * size, [r * x.size for r in range(size + 1)]
        self.algorithm = algorithm
        # the library's host call, repeated: its key and this rank's block, worked out once
        self.key = ("allgather", "mpi", size * x.size, x.dtype, None, None, block_code(x.shape))
        self.block = (self.bounds[ctx.rank], self.bounds[ctx.rank + 1], x.shape, numpy.dtype(f"u{x.dtype.itemsize}"))
        # a repeated host call without a deadline, under the checks settings in force now: the
        # fingerprint pair (its own, written once: MAX in place leaves it as it is when the ranks
        # agree), both calls' MPI datatypes and the statistics, worked out once (:meth:`_run_lean`)
        self.lean = None
        if algorithm == "mpi" and checks_enabled() and not debug_enabled():
            fp, want, fp_spec = lean_pair(self.key)
            nbytes = x.size * (size - 1) * x.dtype.itemsize
            self.lean = (settings_token(), (fp, want), fp_spec, MPI.Datatype.fromcode(self.block[3].char),
                         CallRecord("allgather", "mpi", size * x.size, x.dtype, nbytes, None, None, True))

    def run(self, ctx, x, out, timeout):
        """Gather ``x`` (the plan's shape and dtype) from every rank into ``out``; return ``out``.

        Raises
        ------
        CollectiveMismatch
            A rank's fingerprint differs (another count, shape, dtype, collective or algorithm), or
            the library reported an error.
        CollectiveTimeout
            A rank did not join within ``timeout``.
        """
        if ctx.broken is not None:
            ctx.check_usable()
        if self.algorithm != "mpi" or type(x) is not numpy.ndarray or not x.size:
            return _gather_blocks(ctx, x, self.firsts, self.bounds, self.algorithm, timeout, out=out)
        flat = out.reshape(-1)  # the host library call of _gather_blocks, with what it works out kept
        lo, hi, shape, bits = self.block
        flat[lo:hi].reshape(shape)[...] = x
        lean = self.lean
        if lean is not None and timeout is None and not ctx.active and lean[0] is settings_token():
            return self._run_lean(ctx, flat.view(bits), out, lean)
        ctx.advance(self.key, timeout)
        call(ctx, self.key, "Iallgather", (MPI.IN_PLACE, flat.view(bits)), timeout)  # (raw(flat): copy-only)
        ctx.record("allgather", "mpi", flat.size, x.dtype, elements=x.size * (ctx.size - 1), estimated=True)
        return out

    def _run_lean(self, ctx, flat, out, lean):
        """The library calls of a repeated host call without a deadline, as :func:`call` posts them:
        the 2-element fingerprint all-reduce and ``MPI_Iallgather`` in place, waited together, with
        the buffers' MPI datatypes given (mpi4py reads no array format) and the statistics made once."""
        _, pair, fp_spec, kind, record = lean
        ctx._seq += 1  # (Context.advance: no exchange outside debug mode for an all-gather)
        comm = ctx.comm
        reqs = [comm.Iallreduce(MPI.IN_PLACE, fp_spec, MPI.MAX), comm.Iallgather(MPI.IN_PLACE, [flat, kind])]
        finish_lean(ctx, self.key, reqs, pair, record, "MPI_Allgather")
        return out


def _bounds(firsts, x):
    """Return the element offsets of the blocks of ``firsts[r]`` rows of ``x``'s trailing shape."""
    inner = math.prod(x.shape[1:])
    bounds = [0]
    for f in firsts:
        bounds.append(bounds[-1] + f * inner)
    return bounds


def _gather_blocks(ctx, x, firsts, bounds, algorithm, timeout, out=None):
    """Move the blocks (``firsts[r]`` rows, elements ``bounds[r]:bounds[r + 1]``, from rank ``r``) into
    ``out``, in rank order: a new array after a signature exchange, or the caller's ``out`` of the
    equal-shape form, whose call key then holds the block's shape and whose fingerprint travels beside
    the data (there was no exchange to check it)."""
    xp = numpy if type(x) is numpy.ndarray else get_array_module(x)
    size, rank = ctx.size, ctx.rank
    exchanged = out is None
    if exchanged:
        out = xp.empty((sum(firsts),) + x.shape[1:], dtype=x.dtype)
    flat = out.reshape(-1)
    if x.size:
        flat[bounds[rank]:bounds[rank + 1]].reshape(x.shape)[...] = x
    key = ("allgather", algorithm, flat.size, x.dtype, None, None, None if exchanged else block_code(x.shape))
    if algorithm == "mpi":
        counts = [bounds[i + 1] - bounds[i] for i in range(size)]
        # (after a signature exchange no second fingerprint: it just checked that every rank makes this call)
        if len(set(counts)) == 1:  # MPI_Allgather: MPICH runs it several times faster than Allgatherv
            run_library(ctx, key, xp, "Iallgather", (MPI.IN_PLACE, raw(flat)), timeout, check=not exchanged)
        else:
            run_library(ctx, key, xp, "Iallgatherv", (MPI.IN_PLACE, [raw(flat), counts]), timeout, check=False)
        ctx.record("allgather", "mpi", flat.size, x.dtype, elements=x.size * (size - 1), estimated=True)
        return out
    sched = ctx.schedule(("allgather", algorithm, tuple(bounds)), lambda: segmented(ring_allgather(rank, size, bounds)))
    run_schedule(ctx, key, Run(sched, ctx.comm, raw(flat), name="allgather"), timeout=timeout, xp=xp)
    ctx.record("allgather", algorithm, flat.size, x.dtype, sched)
    return out
