"""Call fingerprints: mismatched calls never match each other, and the debug mode names the difference.

Every collective call is described by a *key*: ``(collective, algorithm, count, dtype, op, root,
grid)``, with ``algorithm`` resolved (never ``auto``) and ``count`` in elements. Two checks use it:

* **Default, free of extra messages.** The key's 32-bit CRC is carried in the high bits of every
  message tag of the call, the call's sequence number on the communicator in the low bits
  (:class:`TagSpace`). Messages of calls that differ in any field, or that are not the same call
  in the ranks' order, cannot match each other: with a ``timeout`` the waiting rank raises
  :class:`~collectives.errors.CollectiveTimeout` saying what is pending from the silent peer
  instead (``MPI_Iprobe``: "rank 0 sent a message of its call #2, this rank is at call #1"); without
  one it waits, as MPI itself would. Every receive's size is also checked against the schedule
  (``MPI_Get_count``), so no result holds bytes that no message wrote. The library path (``mpi``)
  carries the fingerprint inside the reduction itself (see :mod:`collectives.library.call`).
* **Debug mode** (``COMMLAB_DEBUG=detail`` on every rank, or :func:`set_debug`): before each call
  the ranks all-gather the full fingerprint (sequence number and every key field) and every rank
  raises the same :class:`~collectives.errors.CollectiveMismatch` naming the first differing field
  and which ranks hold which value, as PyTorch's ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` does. It costs
  one small all-gather per call. ``COMMLAB_DEBUG=strict`` adds the call site (file and line of the
  caller's code), which catches what no field can tell apart -- one rank makes an extra call of the
  same shape -- for programs whose ranks reach each collective from the same line.
* **A call refused on some ranks only.** A rank whose own argument checks fail (an ``out`` of the
  wrong shape, an unknown ``op``, a bad ``root``) raises its ``ValueError`` or ``TypeError`` without
  sending any data. In debug mode it first joins the call's fingerprint exchange, marked as refused
  with its one-line reason (:func:`collectives.engine.context.refuse`); every rank whose call passed
  its checks then raises :class:`~collectives.errors.CollectiveMismatch` naming the refusing ranks
  and their reasons (field ``arguments``), and when every rank refused, each raises its own error.
  Outside debug mode a bad call sends nothing, and the others wait for the refusing rank as for any
  silent peer: with ``timeout=`` they raise :class:`~collectives.errors.CollectiveTimeout` naming
  the peer each waited for (the refusing rank, a rank waiting for it, or none inside the MPI
  library), without one they wait.

Limits: a call that agrees with its partner in every field and is made from the same line cannot
be told apart from it (a rank that calls ``allreduce`` once more in a loop); the key CRC is 32 bits
but the tag keeps only the bits MPI's ``MPI_TAG_UB`` allows (17 with MPICH, 8 with the minimum the
standard guarantees), so distinct keys collide with probability 2**-17; the received-size check
still catches a collision whose messages differ in size.
"""
import os
import sys
import time
import zlib

import numpy
from mpi4py import MPI

from collectives.backend import COPY_DTYPES, OPS
from collectives.schedules.registry import COLLECTIVES, REGISTRY
from collectives.errors import CollectiveMismatch
from collectives.engine.waiting import Where, wait_all

__all__ = ["FIELDS", "TagSpace", "key_code", "counts_code", "describe", "set_debug", "debug_enabled", "set_checks", "checks_enabled", "settings_token",
           "exchange", "pending"]

#: Fields of the debug-mode fingerprint, in the order they are compared.
FIELDS = ("collective", "sequence", "algorithm", "count", "dtype", "op", "root", "grid", "call site")

_KINDS = COLLECTIVES + ("allgather-signature",)  # the signature exchange of allgather-v
_ALGS = tuple(REGISTRY)  # the built-in ones; a registered algorithm's code is 1000 + the CRC of its name
_OPS = tuple(OPS)
_CODES = {}  # key -> CRC (cached: the per-call cost is one dict lookup)
_BY_TAG = {}  # (tag bits of the CRC) -> key, for naming a peer's pending call in errors
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the collectives package
_CHECKS = [True]  # the default checks; off only to measure what they cost (set_checks)
_SETTINGS = [object()]  # replaced whenever the checks or the debug mode change (settings_token)
_MODES = ("off", "detail", "strict")
_DEBUG = [os.environ.get("COMMLAB_DEBUG", "").strip().lower() or "off"]


def set_debug(mode):
    """Set the debug mode of this process: ``"off"``, ``"detail"`` or ``"strict"``.

    ``detail`` all-gathers and compares every field of each call's fingerprint before the call;
    ``strict`` compares the call site (file and line of the caller's code) too, which also catches a
    rank that makes an extra call of the same shape, but refuses programs whose ranks reach one
    collective from different lines (``if rank == 0: broadcast(x) else: broadcast(y)``). Every rank
    must use the same mode (the exchange is a collective); ``COMMLAB_DEBUG=detail`` or ``strict`` in
    the environment of ``mpiexec`` sets it on every rank at start.

    Raises
    ------
    ValueError
        ``mode`` is not one of the three.
    """
    if mode not in _MODES:
        raise ValueError(f"debug mode must be one of {', '.join(_MODES)}, not {mode!r}")
    _DEBUG[0] = mode
    _SETTINGS[0] = object()


def set_checks(on):
    """Turn the default checks (fingerprint in tags and library calls, received sizes) on or off.

    Off exists only so that a benchmark can measure what the checks cost against the same code
    without them, in one run (``experiments/bench/checks.py``); with the checks off, mismatched calls
    may again return wrong values. Every rank must use the same setting.
    """
    _CHECKS[0] = bool(on)
    _SETTINGS[0] = object()


def settings_token():
    """Return an object replaced whenever :func:`set_checks` or :func:`set_debug` runs.

    A repeated call cached under one checks setting and debug mode stays valid while this object is
    the same one: one identity comparison instead of asking for both settings at every call.

    Examples
    --------
    >>> before = settings_token()
    >>> settings_token() is before
    True
    >>> set_checks(True)  # any change of the settings, even to the same value, makes a new token
    >>> settings_token() is before
    False
    """
    return _SETTINGS[0]


def checks_enabled():
    """Return True unless :func:`set_checks` turned the default checks off."""
    return _CHECKS[0]


def debug_enabled():
    """Return True when the debug-mode fingerprint exchange is on (``detail`` or ``strict``).

    Raises
    ------
    ValueError
        ``COMMLAB_DEBUG`` holds something else (raised before any message of the call).
    """
    mode = _DEBUG[0]
    if mode == "off":
        return False
    if mode in _MODES:
        return True
    raise ValueError(f"COMMLAB_DEBUG={mode!r}: expected one of {', '.join(_MODES)}")


def _ints(key):
    """Return the key as int64 fields: collective, algorithm, count, dtype, op, root, grid rows, cols."""
    coll, alg, count, dtype, op, root, grid = key
    dt = numpy.dtype(dtype)
    dcode = COPY_DTYPES.index(dt) if dt in COPY_DTYPES else 1000 + dt.itemsize
    if isinstance(grid, tuple) and len(grid) != 2:  # a torus of other than 2 dimensions: its rank and a CRC
        rows, cols = -len(grid), zlib.crc32("x".join(map(str, grid)).encode())
    else:
        rows, cols = grid if isinstance(grid, tuple) else (0, 0)
    return (_KINDS.index(coll), _ALGS.index(alg) if alg in _ALGS else 1000 + zlib.crc32(alg.encode()), int(count), dcode, _OPS.index(op) if op is not None else -1,
            -1 if root is None else int(root), int(rows), int(cols))


def key_code(key):
    """Return the 32-bit CRC of a call key (cached)."""
    code = _CODES.get(key)
    if code is None:
        if len(_CODES) > 65536:
            _CODES.clear()
        code = _CODES[key] = zlib.crc32(numpy.array(_ints(key), numpy.int64).tobytes())
    return code


def describe(key):
    """Return a readable form of a call key: ``allreduce(count=8, dtype=float32, op=sum, algorithm=ring)``."""
    coll, alg, count, dtype, op, root, grid = key
    parts = [f"count={count}", f"dtype={numpy.dtype(dtype).name}"]
    if op is not None:
        parts.append(f"op={op}")
    if root is not None:
        parts.append(f"root={root}")
    parts.append(f"algorithm={alg}")
    if coll == "reduce_scatter" and isinstance(grid, tuple):
        parts.append(f"counts=<{grid[0]} values, code {-2 - grid[1]}>")
    elif isinstance(grid, tuple):
        parts.append(f"block={block_text(grid)}" if coll == "allgather" else f"grid={'x'.join(map(str, grid))}")
    return f"{coll}({', '.join(parts)})"


def block_code(shape):
    """Return the ``grid`` slot of an equal-shape all-gather's key: ``(rows, cols)`` of the block ``shape``.

    ``cols`` is -1 for a 1-D block, the second dimension for a 2-D one, and a negative CRC of the
    trailing dimensions (below -1) for more, so that blocks of equal element count but other shapes
    ((2, 3) and (3, 2)) make different keys.
    """
    if len(shape) == 1:
        return (int(shape[0]), -1)
    if len(shape) == 2:
        return (int(shape[0]), int(shape[1]))
    return (int(shape[0]), -2 - zlib.crc32(numpy.array(shape[1:], numpy.int64).tobytes()))


def counts_code(counts):
    """Return the ``grid`` slot of a reduce-scatter-v's key: ``(len(counts), -2 - CRC of the counts)``.

    Ranks whose count vectors differ make different keys, so the fingerprint check tells them apart;
    a vector that is not a sequence of ints gets length -1 and the CRC of its text.

    Examples
    --------
    >>> counts_code([3, 0, 2]) == counts_code((3, 0, 2)), counts_code([3, 0, 2]) == counts_code([2, 0, 3])
    (True, False)
    """
    try:
        data, n = numpy.array([int(c) for c in counts], numpy.int64).tobytes(), len(counts)
    except (TypeError, ValueError, OverflowError):
        data, n = repr(counts).encode(), -1
    return (n, -2 - zlib.crc32(data))


def block_text(grid):
    """Return an all-gather block's shape as text from its :func:`block_code`: ``(2, 3)``, ``(4,)``, ``(2, ...)``."""
    rows, cols = grid
    return f"({rows},)" if cols == -1 else f"({rows}, {cols})" if cols >= 0 else f"({rows}, ...)"


class TagSpace:
    """Split of the MPI tag range between the call fingerprint (high bits) and the sequence number.

    Parameters
    ----------
    tag_ub : int
        The communicator's ``MPI_TAG_UB`` (536,870,911 with MPICH: 29 bits; 32,767 at least).

    Attributes
    ----------
    seq_bits, code_bits : int
        Bits of the call sequence number (at most 12: the tags of one key repeat every 4,096 calls)
        and of the fingerprint.
    """

    __slots__ = ("seq_bits", "code_bits", "_seq_mask", "_code_mask")

    def __init__(self, tag_ub):
        total = max(int(tag_ub), 32767).bit_length()
        self.seq_bits = min(12, total // 2)
        self.code_bits = total - self.seq_bits
        self._seq_mask, self._code_mask = (1 << self.seq_bits) - 1, (1 << self.code_bits) - 1

    def tag(self, key, seq):
        """Return the tag of call number ``seq`` described by ``key``."""
        bits = key_code(key) & self._code_mask if _CHECKS[0] else 0
        if bits not in _BY_TAG:
            _BY_TAG[bits] = key
        return (bits << self.seq_bits) | (seq & self._seq_mask)

    def split(self, tag):
        """Return (fingerprint bits, sequence number modulo 2**seq_bits) of a tag."""
        return tag >> self.seq_bits, tag & self._seq_mask


def _call_site():
    """Return ``file:line`` of the innermost frame outside this package (the caller's code)."""
    frame = sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)).startswith(_HERE):
        frame = frame.f_back
    return "?" if frame is None else f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def exchange(comm, key, seq, timeout=None, progress=None, refused=None):
    """All-gather the full fingerprint of this call and raise on every rank when the ranks disagree.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        The library's duplicate communicator.
    key : tuple
        This rank's call key (see the module docstring).
    seq : int
        This rank's call number on ``comm`` (1 for the first call).
    timeout : float, optional
        Seconds to wait for the exchange.
    progress : callable, optional
        Advances non-blocking collectives in flight while waiting.
    refused : str, optional
        This rank's call failed its argument checks: the one-line reason. Only ``key[0]`` (the
        collective) is read; the row carries the reason's length, and the reasons of every refusing
        rank follow in a second all-gather (``MPI_Iallgatherv``), made only when a rank refused.

    Raises
    ------
    CollectiveMismatch
        A rank refused its call, while this one did not or another rank did not (field
        ``arguments``: every refusing rank with its reason); else the first differing field of
        :data:`FIELDS` and the ranks holding each value. Returns quietly when every rank refused
        (each then raises its own error).
    CollectiveTimeout
        A rank did not join within ``timeout`` (it is in no collective, or in a blocking one).
    """
    site = _call_site() if _DEBUG[0] == "strict" else "?"
    note = b"" if refused is None else (refused or "refused").encode()
    ints = _ints(key) if refused is None else (_KINDS.index(key[0]), -1, -1, -1, -1, -1, -1, -1)
    mine = numpy.array([ints[0], seq, *ints[1:], zlib.crc32(site.encode()), len(note)], numpy.int64)
    size = comm.Get_size()
    table = numpy.empty((size, mine.size), numpy.int64)
    req = comm.Iallgather(mine, table)
    deadline = None if timeout is None else time.perf_counter() + timeout
    wait_all([req], [None], deadline, Where(key[0], 0, "fingerprint exchange", timeout), progress=progress)
    if table[:, -1].any():  # a rank refused its call: every rank takes the reasons, then raises
        _refusals(comm, key[0], table[:, -1], note, deadline, timeout, progress)
        return  # (every rank refused: no field to compare)
    cols = {"collective": [0], "sequence": [1], "algorithm": [2], "count": [3], "dtype": [4], "op": [5],
            "root": [6], "grid": [7, 8], "call site": [9]}
    for field in FIELDS:
        vals = [tuple(row[c] for c in cols[field]) for row in table.tolist()]
        if len(set(vals)) > 1:
            if field == "grid" and key[0] == "allgather":
                field = "block shape"
            raise CollectiveMismatch(key[0], field, _groups(field, vals, comm.Get_rank(), site))


def _refusals(comm, collective, lengths, note, deadline, timeout, progress):
    """All-gather the reasons of the refusing ranks (``lengths[r]`` bytes from rank ``r``) and raise
    :class:`CollectiveMismatch` naming them, unless every rank refused (then return)."""
    counts = [int(n) for n in lengths]
    text = numpy.zeros(sum(counts), numpy.uint8)
    mine = numpy.frombuffer(note, numpy.uint8) if note else numpy.zeros(0, numpy.uint8)
    req = comm.Iallgatherv(mine, [text, counts])
    wait_all([req], [None], deadline, Where(collective, 0, "refusal reasons", timeout), progress=progress)
    if all(counts):
        return
    data, at, parts = text.tobytes(), 0, []
    for r, n in enumerate(counts):
        if n:
            parts.append(f"rank {r} refused its call before any data moved ({data[at:at + n].decode(errors='replace')})")
        at += n
    raise CollectiveMismatch(collective, "arguments", "; ".join(parts))


def _name(field, val):
    v = val[0]
    if field == "collective":
        return _KINDS[v] if 0 <= v < len(_KINDS) else str(v)
    if field == "algorithm":
        return _ALGS[v] if 0 <= v < len(_ALGS) else str(v)
    if field == "dtype":
        return COPY_DTYPES[v].name if 0 <= v < len(COPY_DTYPES) else f"{v - 1000}-byte type"
    if field == "op":
        return _OPS[v] if 0 <= v < len(_OPS) else "none"
    if field == "root":
        return "none" if v < 0 else str(v)
    if field == "grid":
        if val[0] < 0:
            return f"a {-val[0]}-dimensional grid (CRC {val[1]})"
        return "none" if val == (0, 0) else f"{val[0]}x{val[1]}"
    if field == "block shape":
        return block_text(val)
    if field == "sequence":
        return f"call #{v}"
    return str(v)


def _groups(field, vals, rank, site):
    """Return "rank 0: count=10; ranks 1-3: count=8" for the differing values."""
    by = {}
    for r, v in enumerate(vals):
        by.setdefault(v, []).append(r)
    parts = []
    for v, ranks in by.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranges(ranks)}"
        text = f"this rank calls from {site}" if field == "call site" and rank in ranks else (
            "another line" if field == "call site" else _name(field, v))
        parts.append(f"{who}: {field}={text}" if field != "call site" else f"{who}: {text}")
    return "; ".join(parts)


def _ranges(ranks):
    out, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None]):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ",".join(out)


def pending(comm, peer, tag):
    """Return what ``peer`` has sent this rank instead of this call's message ("" when nothing).

    Called after a timeout: ``MPI_Iprobe`` for any message from ``peer`` on the library's
    communicator; a message with another tag belongs to another call, whose sequence number and, when
    this process has seen its fingerprint, fields are named.
    """
    if peer is None:
        return ""
    space = TagSpace(comm.Get_attr(MPI.TAG_UB) or 32767)
    status = MPI.Status()
    try:
        found = comm.Iprobe(source=peer, tag=MPI.ANY_TAG, status=status)
    except MPI.Exception:
        return ""
    if not found or status.Get_tag() == tag:
        return ""
    bits, their_seq = space.split(status.Get_tag())
    mine_bits, my_seq = space.split(tag)
    key = _BY_TAG.get(mine_bits)
    this = describe(key) if key is not None else "another call"
    nbytes = status.Get_count(MPI.BYTE)
    if bits == mine_bits and their_seq != my_seq:
        return (f"rank {peer} sent a message ({nbytes} bytes) of its call #{their_seq} (mod {1 << space.seq_bits}) "
                f"while this rank is at call #{my_seq}: the ranks call collectives in a different order, "
                f"or one of them skipped or added a call")
    theirs = _BY_TAG.get(bits)
    if theirs is not None:
        return (f"rank {peer} sent a message ({nbytes} bytes) of {describe(theirs)}, its call #{their_seq}; "
                f"this rank's call #{my_seq} is {this}")
    return (f"rank {peer} sent a message ({nbytes} bytes) of a different call (its call #{their_seq}); this rank's "
            f"call #{my_seq} is {this}: rerun with COMMLAB_DEBUG=detail to name the differing field")
