"""The MPI library path (``algorithm="mpi"``): post the library's non-blocking collective, wait under the
deadline, and check that the ranks made the same call.

MPI itself does not check that ranks agree on a collective's count, datatype or op: a mismatch is
"erroneous" and MPICH returns whatever its algorithm produced. commlab's rule is that mismatched calls
fail, so every library call carries the call fingerprint (:mod:`collectives.fingerprint`) through
the library itself:

* a small all-reduce with ``sum``/``avg``/``min``/``max`` (at most :data:`PIGGYBACK_MAX` elements)
  appends 8 check elements to its own buffer: the fingerprint's 24-bit CRC as four 6-bit digits
  ``a = d + 1``, each with a partner ``b`` (``a**2`` for sums, ``-a`` for min/max). After the
  reduction every rank checks ``sum a = P a`` and ``sum b = P a**2`` (equality in Cauchy-Schwarz:
  every rank's digit equals its own), or ``max a = a`` and ``max b = -a`` (every digit equal), under
  its own op. No extra message, 32-64 more bytes;
* every other library call posts, alongside the data, a 2-element ``MPI_Iallreduce`` with ``MPI_MAX``
  of ``(crc, -crc)``: one small extra message, negligible beside a large transfer.

A rank whose check fails raises :class:`~collectives.errors.CollectiveMismatch`; an error the MPI
library reports (a truncated message when counts differ) becomes one too.
"""
import numpy
from mpi4py import MPI

from .errors import CollectiveMismatch, CollectiveTimeout
from .fingerprint import checks_enabled, describe, key_code
from .waiting import deadline_of, wait_all

__all__ = ["PIGGYBACK_MAX", "CHECK_ELEMENTS", "piggyback", "encode_check", "verify_check", "mismatch", "call",
           "run_library", "key_code"]

#: Largest all-reduce (elements) whose fingerprint rides in the data buffer itself.
PIGGYBACK_MAX = 2048
#: Check elements appended to a piggybacked buffer.
CHECK_ELEMENTS = 8


def piggyback(op, count):
    """Return True when an ``mpi`` all-reduce of ``count`` elements with ``op`` carries its check inline."""
    return count <= PIGGYBACK_MAX and op in ("sum", "avg", "min", "max") and checks_enabled()


_TAILS = {}  # (key, P) -> (check elements to send, their reduced values), both float64


def _tail(key, size):
    got = _TAILS.get((key, size))
    if got is None:
        code, op = key_code(key) & 0xFFFFFF, key[4]
        digits = [((code >> (6 * j)) & 63) + 1 for j in range(4)]
        summed = op in ("sum", "avg")
        send = numpy.array([v for a in digits for v in (a, a * a if summed else -a)], numpy.float64)
        want = numpy.array([v for a in digits for v in ((size * a, size * a * a) if summed else (a, -a))],
                           numpy.float64)
        if len(_TAILS) > 4096:
            _TAILS.clear()
        got = _TAILS[(key, size)] = (send, want)
    return got


def encode_check(tail, key, size):
    """Write the 8 check elements of ``key`` (op ``key[4]``) into ``tail`` (shape (8,), the buffer's end)."""
    tail[...] = _tail(key, size)[0]


def verify_check(tail, key, size):
    """Raise :class:`CollectiveMismatch` unless the reduced check elements show every rank's key equal."""
    if not (tail == _tail(key, size)[1]).all():
        raise mismatch(key)


def mismatch(key):
    """Return the :class:`CollectiveMismatch` of a failed fingerprint check of ``key``."""
    return CollectiveMismatch(key[0], "fingerprint", f"this rank called {describe(key)} and another rank made a "
                              "different call (count, dtype, op, root, algorithm or call order); rerun with "
                              "COMMLAB_DEBUG=detail to name the field and the ranks")


def call(ctx, key, method, args, timeout, check=True, extra=()):
    """Run the MPI library's non-blocking collective ``method`` on the library's communicator.

    Parameters
    ----------
    ctx : Context
    key : tuple
        The call key (:mod:`collectives.fingerprint`).
    method : str
        mpi4py method of the non-blocking collective: ``"Iallreduce"``, ``"Ibcast"``, ...
    args : tuple
        Its arguments.
    timeout : float or None
        Seconds to wait before :class:`CollectiveTimeout`.
    check : bool
        Post the 2-element fingerprint all-reduce alongside (False when the check rides in the data).
    extra : sequence of (str, tuple)
        More non-blocking library calls posted after the data call (a NaN mask), waited together.

    The non-blocking form is always used -- MPI never matches a blocking collective with a
    non-blocking one, and whether a rank passes a timeout or has requests in flight is its own
    business.

    Raises
    ------
    CollectiveTimeout
        A rank did not join within ``timeout``; the context is marked unusable.
    CollectiveMismatch
        The fingerprint check failed, or the library reported an error (such as truncation).
    """
    name = key[0]
    reqs, fp, statuses = [], None, []
    try:
        if check and checks_enabled():
            code = key_code(key)
            fp = numpy.array([code, -code], numpy.int64)
            reqs.append(ctx.comm.Iallreduce(MPI.IN_PLACE, fp, MPI.MAX))
        reqs.append(getattr(ctx.comm, method)(*args))
        reqs += [getattr(ctx.comm, m)(*a) for m, a in extra]
        statuses = [MPI.Status() for _ in reqs]
        if timeout is None and not ctx.active:
            MPI.Request.Waitall(reqs, statuses)
        else:
            wait_all(reqs, [None] * len(reqs), deadline_of(timeout), name, 0, f"MPI_{method[1:]}", timeout,
                     ctx.progress if ctx.active else None, statuses)
    except CollectiveTimeout as exc:
        ctx.fail(f"{name}: {exc}")
        raise
    except MPI.Exception as exc:
        ctx.fail(f"{name}: {exc}")
        raise CollectiveMismatch(name, "count", f"the MPI library reported '{_reason(exc, statuses)}' in this "
                                 f"rank's {describe(key)}: the ranks' calls differ") from None
    if fp is not None and (int(fp[0]) != key_code(key) or int(fp[1]) != -key_code(key)):
        err = mismatch(key)
        ctx.fail(f"{name}: {err}")
        raise err


def _reason(exc, statuses):
    """Return the MPI error text of ``exc``, looking into the statuses for ``MPI_ERR_IN_STATUS``."""
    if exc.Get_error_class() == MPI.ERR_IN_STATUS:
        codes = [st.Get_error() for st in statuses if st.Get_error() not in (MPI.SUCCESS, MPI.ERR_PENDING)]
        if codes:
            return MPI.Get_error_string(codes[0]).strip()
    return exc.Get_error_string().strip()


def run_library(ctx, key, xp, method, args, timeout, extra=(), check=True):
    """Begin the call ``key`` on ``ctx`` and run the MPI library's collective ``method`` (see :func:`call`).

    Device buffers (``xp`` CuPy): the stream is synchronized first; without CUDA-aware MPI the call
    is refused with ``ValueError``, before any message.
    """
    transport = ctx.transport(xp)
    if transport is not None:
        transport.sync()
        if not transport.direct:
            raise ValueError("algorithm='mpi' on device arrays needs a CUDA-aware MPI; use a hand-made "
                             "algorithm, which stages through host memory")
    ctx.begin(key, timeout)
    call(ctx, key, method, args, timeout, check=check, extra=extra)
