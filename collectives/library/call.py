"""The MPI library path (``algorithm="mpi"``): post the library's non-blocking collective, wait under the
deadline, and check that the ranks made the same call.

MPI itself does not check that ranks agree on a collective's count, datatype or op: a mismatch is
"erroneous" and MPICH returns whatever its algorithm produced. commlab's rule is that mismatched calls
fail, so every library call carries the call fingerprint (:mod:`collectives.engine.fingerprint`) through
the library itself:

* a small all-reduce (at most :data:`PIGGYBACK_MAX` elements) appends 16 check elements to its own
  buffer, under the call's own op:

  - ``sum``/``avg``/``min``/``max``: the fingerprint's 32-bit CRC as eight 4-bit digits ``a = d + 1``,
    each with a partner ``b`` (``a**2`` for sums, ``-a`` for min/max). After the reduction every rank
    checks ``sum a = P a`` and ``sum b = P a**2`` (equality in Cauchy-Schwarz: every rank's digit
    equals its own), or ``max a = a`` and ``max b = -a`` (every digit equal);
  - ``prod``: sixteen bits of the CRC, each as one element, 2 for a one and 1 for a zero. A product
    of powers of two is exact (or wraps, for integers, to a value that is never 1), so a rank whose
    bit is 0 sees 1 only if no rank sent 2, and one whose bit is 1 sees ``2**P`` (in the buffer's
    arithmetic) only if every rank did; up to P = 32 no smaller power of two wraps to that value
    (int32 is the narrowest accumulation type). Above 32 ranks, eight bits, each as a pair ``(2, 1)``
    or ``(1, 2)``: every rank then has an element that stays 1 only where all agree.

  No extra message, 64-128 more bytes; the layout is the same for every op, so ranks whose ops
  differ still make one library call each, and the check fails;
* every other library call posts, alongside the data, a 2-element ``MPI_Iallreduce`` with ``MPI_MAX``
  of ``(crc, -crc)``: one small extra message, negligible beside a large transfer.

A rank whose check fails raises :class:`~collectives.errors.CollectiveMismatch`; an error the MPI
library reports becomes one too when it says the calls differ (a truncated message when counts
differ), and :class:`~collectives.errors.PeerLost` when the transfer itself failed (a peer that died).

The check follows the call: MPI sees the library call of every rank before any rank knows that they
differ, as long as their data are of the same element type. A message of another element type
(``float32`` on one rank, ``float64`` on another) can end inside an element of the receiver's type,
and MPICH then aborts the job (an assertion in its datatype engine) before any check is read. So a
rank posts its data beside the check only in the element type of the communicator's last checked
call (:func:`settle`; the context's ``agreed``): a call in another type is first checked alone, a
2-element fingerprint all-reduce (or, where the check rides in the data, the 16 check elements alone
in the agreed type), and posts its data only once every rank made the same call. Ranks that agree
pay this extra round trip once per change of element type; a rank whose type differs posts no data,
so every rank raises :class:`~collectives.errors.CollectiveMismatch`. Ranks that post their data
beside the check wait for the check first, so a rank never waits for data another rank did not
post. Only the debug mode (``COMMLAB_DEBUG=detail``)
compares the fingerprints before the library call, at the cost of one all-gather per call: an
exchange before every call would double the cost of the small all-reduce, and one made only on a
rank's first call of a signature would make ranks whose caches differ post different library calls.
"""
import numpy
from mpi4py import MPI

from collectives.backend import accumulation_dtype
from collectives.errors import CollectiveMismatch, CollectiveTimeout, PeerLost
from collectives.engine.failures import is_process_failure, process_failed
from collectives.engine.fingerprint import checks_enabled, describe, key_code
from collectives.engine.waiting import Where, deadline_of, library_failure, wait_all

__all__ = ["PIGGYBACK_MAX", "CHECK_ELEMENTS", "piggyback", "check_values", "encode_check", "verify_check", "mismatch",
           "library_error", "call", "run_library", "lean_pair", "finish_lean", "post_failed", "settle"]

#: Largest all-reduce (elements) whose fingerprint rides in the data buffer itself.
PIGGYBACK_MAX = 2048
#: Check elements appended to a piggybacked buffer.
CHECK_ELEMENTS = 16


def piggyback(count):
    """Return True when an ``mpi`` all-reduce of ``count`` elements carries its check inline (any op)."""
    return count <= PIGGYBACK_MAX and checks_enabled()


_TAILS = {}  # (key, P, dtype) -> (check elements to send, their reduced values), in that dtype


def check_values(key, size, dtype):
    """Return ``(sent, wanted)``: the check elements of call ``key`` (op ``key[4]``) on ``size`` ranks,
    and what the reduction makes of them when every rank sent the same, both of ``dtype`` (cached)."""
    got = _TAILS.get((key, size, dtype))
    if got is None:
        code, op = key_code(key), key[4]
        dtype = numpy.dtype(dtype)
        if op == "prod":
            power = numpy.full(size, 2, dtype).prod(dtype=dtype)  # 2**P as the library computes it
            if size <= 32:
                bits = [(code >> j) & 1 for j in range(CHECK_ELEMENTS)]
                send = numpy.array([2 if b else 1 for b in bits], dtype)
                want = numpy.array([power if b else 1 for b in bits], dtype)
            else:
                bits = [(code >> j) & 1 for j in range(CHECK_ELEMENTS // 2)]
                send = numpy.array([v for b in bits for v in ((2, 1) if b else (1, 2))], dtype)
                want = numpy.array([v for b in bits for v in ((power, 1) if b else (1, power))], dtype)
        else:
            digits = [((code >> (4 * j)) & 15) + 1 for j in range(CHECK_ELEMENTS // 2)]
            summed = op in ("sum", "avg")
            send = numpy.array([v for a in digits for v in (a, a * a if summed else -a)], dtype)
            want = numpy.array([v for a in digits for v in ((size * a, size * a * a) if summed else (a, -a))], dtype)
        if len(_TAILS) > 4096:
            _TAILS.clear()
        got = _TAILS[(key, size, dtype)] = (send, want)
    return got


def encode_check(tail, key, size):
    """Write the check elements of ``key`` (op ``key[4]``) into ``tail`` (shape (CHECK_ELEMENTS,), the buffer's end)."""
    tail[...] = check_values(key, size, tail.dtype)[0]


def verify_check(tail, key, size):
    """Raise :class:`CollectiveMismatch` unless the reduced check elements show every rank's key equal."""
    if tail.tobytes() != check_values(key, size, tail.dtype)[1].tobytes():
        raise mismatch(key)


def mismatch(key):
    """Return the :class:`CollectiveMismatch` of a failed fingerprint check of ``key``."""
    return CollectiveMismatch(key[0], "fingerprint", f"this rank called {describe(key)} and another rank made a "
                              "different call (count, dtype, op, root, algorithm or call order); rerun with "
                              "COMMLAB_DEBUG=detail to name the field and the ranks")


def settle(ctx, key, dtype, timeout, inline=False, always=False):
    """Check call ``key`` alone, before its data, unless its element type is the communicator's agreed one.

    The data of a library call travel beside (or inside) its check only in the element type of the
    last call every rank was seen to make alike (``ctx.agreed``, None before the first); a call in
    another type posts only its check first -- the 2-element fingerprint all-reduce, or with
    ``inline`` the call's count of zeros and its 16 check elements in the agreed type (float64 before
    any), the library call a rank posting its small all-reduce makes, of the same count and type --
    and becomes the agreed type
    once the check passed on every rank. A rank whose element type differs from the others' thus
    never hands MPI a message of a type the receiver does not expect.

    Parameters
    ----------
    ctx : Context
    key : tuple
        The call key; ``key[4]`` is the op of an inline check.
    dtype : numpy.dtype
        Element type of the data the library call carries (the accumulation dtype).
    timeout : float or None
        Seconds the check may wait.
    inline : bool
        The call carries its check in the data (a small all-reduce, :func:`piggyback`).
    always : bool
        Check even in the agreed type (every rank passes it alike: a persistent plan's creation).

    Raises
    ------
    CollectiveMismatch
        Another rank made another call (in another element type, say); the context is failed.
    CollectiveTimeout
        A rank did not join within ``timeout``; the context is failed.
    """
    if ctx.agreed == dtype and not always:
        return
    if ctx.size == 1 or not checks_enabled():  # (no peer, or the checks measured off: nothing to compare)
        ctx.agreed = numpy.dtype(dtype)
        return
    comm = ctx.comm
    deadline = None if timeout is None else deadline_of(timeout)
    try:
        if inline:  # the call's own count, its data zero, in the type the others may be posting
            probe = numpy.dtype(numpy.float64) if ctx.agreed is None else ctx.agreed
            tail, want = check_values(key, ctx.size, probe)
            send = numpy.zeros(key[2] + CHECK_ELEMENTS, probe)
            send[key[2]:] = tail
            got = numpy.empty_like(send)
            reqs = [comm.Iallreduce(send, got, _MPI_OP[key[4]])]
        else:
            code = key_code(key)
            fp = numpy.array([code, -code], numpy.int64)
            reqs = [comm.Iallreduce(MPI.IN_PLACE, fp, MPI.MAX)]
    except MPI.Exception as exc:
        raise post_failed(ctx, key, exc, "MPI_Iallreduce") from None
    _wait(ctx, key, reqs, timeout, deadline, "Iallreduce")
    if inline:
        if got[key[2]:].tobytes() != want.tobytes():
            err = mismatch(key)
            ctx.fail(f"{key[0]}: {err}")
            raise err
    else:
        _check_pair(ctx, key, fp, code)
    ctx.agreed = numpy.dtype(dtype)


_MPI_OP = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}


def call(ctx, key, method, args, timeout, check=True, extra=(), verify=None):
    """Run the MPI library's non-blocking collective ``method`` on the library's communicator.

    Parameters
    ----------
    ctx : Context
    key : tuple
        The call key (:mod:`collectives.engine.fingerprint`).
    method : str
        mpi4py method of the non-blocking collective: ``"Iallreduce"``, ``"Ibcast"``, ...
    args : tuple
        Its arguments.
    timeout : float or None
        Seconds to wait before :class:`CollectiveTimeout`.
    check : bool
        Post the 2-element fingerprint all-reduce alongside (False when the check rides in the data).
    extra : sequence of (str, tuple)
        More non-blocking library calls (a NaN mask), posted once the fingerprint and the data call are
        done and the fingerprint (or ``verify``) matched: a rank whose call differs posts none, so no
        rank waits for a call another never posts.
    verify : callable, optional
        The check that rides in the data (``check=False``), run before ``extra`` is posted; it raises
        :class:`CollectiveMismatch`, and the context is failed.

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
    reqs, fp, code = [], None, 0
    comm = ctx.comm
    deadline = None if timeout is None else deadline_of(timeout)
    if check and checks_enabled():
        code = key_code(key)
        fp = ctx.fp  # the context's pair: the call is blocking, so one is in use at a time
        fp[0], fp[1] = code, -code
    try:
        if fp is not None:
            reqs.append(comm.Iallreduce(MPI.IN_PLACE, fp, MPI.MAX))
        reqs.append(getattr(comm, method)(*args))
        if fp is not None:  # the check first: a rank whose call differs may never post the data
            _wait(ctx, key, reqs[:1], timeout, deadline, method)
            _check_pair(ctx, key, fp, code)
            reqs = reqs[1:]
        if extra and (fp is not None or verify is not None):  # a rank whose call differs posts no more
            _wait(ctx, key, reqs, timeout, deadline, method)
            if fp is None:
                _verified(ctx, key, verify)
            reqs = []
        reqs.extend(getattr(comm, m)(*a) for m, a in extra)
    except MPI.Exception as exc:  # the library refused a call as it was posted
        raise post_failed(ctx, key, exc, f"MPI_{method[1:]}") from None
    _wait(ctx, key, reqs, timeout, deadline, method)


def _wait(ctx, key, reqs, timeout, deadline, method):
    """Wait for ``reqs`` of :func:`call` (until ``deadline`` when a timeout is given); fail the context on an error."""
    statuses = _STATUSES if len(reqs) <= len(_STATUSES) else [MPI.Status() for _ in reqs]
    try:
        if timeout is None and not ctx.active:
            if len(reqs) == 1:  # (MPI_Wait: a third of MPI_Waitall's cost through mpi4py on one request)
                reqs[0].Wait(statuses[0])
            else:
                MPI.Request.Waitall(reqs, statuses)
        else:
            wait_all(reqs, [None] * len(reqs), deadline, Where(key[0], 0, f"MPI_{method[1:]}", timeout),
                     progress=ctx.progress if ctx.active else None, statuses=statuses)
    except CollectiveTimeout as exc:
        ctx.fail(f"{key[0]}: {exc}")
        raise
    except MPI.Exception as exc:
        err = library_error(key, exc, statuses[:len(reqs)], f"MPI_{method[1:]}", ctx.comm)
        ctx.fail(f"{key[0]}: {err}")
        raise err from None


def post_failed(ctx, key, exc, phase):
    """Fail ``ctx`` after the library refused to post a call of ``key`` (``exc``); return the error to raise."""
    err = library_error(key, exc, (), phase, ctx.comm)
    ctx.fail(f"{key[0]}: {err}")
    return err


def _verified(ctx, key, verify):
    """Run the in-data check ``verify``; on a mismatch fail the context and raise it."""
    try:
        verify()
    except CollectiveMismatch as exc:
        ctx.fail(f"{key[0]}: {exc}")
        raise


def _check_pair(ctx, key, fp, code):
    """Raise the mismatch of ``key`` (the context failed) unless the reduced pair ``fp`` is ``(code, -code)``."""
    if int(fp[0]) != code or int(fp[1]) != -code:
        err = mismatch(key)
        ctx.fail(f"{key[0]}: {err}")
        raise err


_STATUSES = [MPI.Status() for _ in range(4)]  # reused by every call (statuses matter only when one fails)


def lean_pair(key):
    """Return a repeated call's own fingerprint pair: ``(pair, its bytes, its mpi4py message)``.

    Written once: ``MPI_MAX`` in place leaves the pair as it is when every rank's code is the same, so
    only a mismatch (which fails the communicator) changes it; the message gives mpi4py the buffer,
    count and datatype, so it reads no array format at each call.

    Examples
    --------
    >>> pair, want, message = lean_pair(("allgather", "mpi", 8, numpy.dtype("float32"), None, None, None))
    >>> int(pair[0]) == -int(pair[1]), pair.tobytes() == want, message[1]
    (True, True, 2)
    """
    code = key_code(key)
    pair = numpy.array([code, -code], numpy.int64)
    return pair, pair.tobytes(), [MPI.buffer(pair), 2, MPI.INT64_T]


def finish_lean(ctx, key, reqs, pair, record, phase):
    """Wait for a repeated call's fingerprint all-reduce and data call ``reqs``, check the pair, count ``record``.

    Parameters
    ----------
    ctx : Context
    key : tuple
        The call key; ``key[0]`` names the collective in errors.
    reqs : list of MPI.Request
    pair : (ndarray, bytes)
        The call's fingerprint pair (:func:`lean_pair`) and the bytes it must still hold.
    record : CallRecord
        The call's record, made once by its plan (:class:`collectives.engine.context.CallRecord`).
    phase : str
        The library call named when the library reports an error (``"MPI_Allgather"``).

    Raises
    ------
    CollectiveMismatch
        The ranks' fingerprints differ, or the library reported an error; the context is failed.
    """
    fp, want = pair
    try:
        reqs[0].Wait(_STATUSES[0])  # the check first: a rank whose call differs may never post the data
        if fp.tobytes() == want:
            reqs[1].Wait(_STATUSES[1])
    except MPI.Exception as exc:
        err = library_error(key, exc, _STATUSES, phase, ctx.comm)
        ctx.fail(f"{key[0]}: {err}")
        raise err from None
    if fp.tobytes() != want:
        fp[:] = numpy.frombuffer(want, numpy.int64)  # (the communicator has failed: for form's sake)
        err = mismatch(key)
        ctx.fail(f"{key[0]}: {err}")
        raise err
    ctx.count(record)


def library_error(key, exc, statuses=(), phase="", comm=None):
    """Return the error to raise after the MPI library failed call ``key`` with ``exc`` (an ``MPI.Exception``).

    A :class:`CollectiveMismatch` when the library's error says the ranks' calls differ (a truncated
    message), else :class:`PeerLost`: the transfer failed, and the library's peers are not commlab's
    to name (:func:`collectives.engine.waiting.library_failure`). Under ULFM, a dead process or a
    revoked communicator gives :class:`~collectives.errors.ProcessFailed` naming the dead ranks, after
    ``comm`` (the call's communicator) is revoked (:func:`collectives.engine.failures.process_failed`).

    Examples
    --------
    >>> import numpy
    >>> from mpi4py import MPI
    >>> key = ("allreduce", "mpi", 4, numpy.dtype("float32"), "sum", None, None)
    >>> type(library_error(key, MPI.Exception(MPI.ERR_TRUNCATE))).__name__
    'CollectiveMismatch'
    >>> str(library_error(key, MPI.Exception(MPI.ERR_OTHER))).startswith("allreduce lost a peer (inside the MPI")
    True
    """
    if comm is not None and is_process_failure(exc, statuses, comm):
        return process_failed(exc, comm, key[0], statuses, 0, phase)
    text, _, differ = library_failure(exc, statuses)
    if differ:
        return CollectiveMismatch(key[0], "count", f"the MPI library reported '{text}' in this rank's {describe(key)}: "
                                  "the ranks' calls differ")
    return PeerLost(key[0], None, 0, text, phase)


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
    ctx.advance(key, timeout)
    if check and key[0] not in ("broadcast", "reduce"):  # (a rooted call's fingerprint was exchanged already)
        settle(ctx, key, accumulation_dtype(key[3]), timeout)
    call(ctx, key, method, args, timeout, check=check, extra=extra)
