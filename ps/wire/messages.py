"""Wire protocol of the parameter server: typed messages on buffer-based point-to-point calls.

Every message is a header, an ``int64`` array ``[type, worker, clock, length, rid, version, shard,
dtype, epoch, seq, aux]`` (indices ``H_TYPE`` .. ``H_AUX``), sent with the tag of its type; when ``length > 0`` the
payload (``length`` elements of the dtype the header names: 1 float32, 2 float64, 3 int64) follows on the
type's data tag. Headers and payloads travel with ``Isend`` and are matched with ``Iprobe`` /
``Irecv``, so a receiver serves whatever has arrived, in any order. MPI's non-overtaking rule
(messages from one sender with one tag are received in sending order) pairs each header with its
payload. No pickle is used anywhere.

``rid`` is the request id: a worker numbers its PUSH and PULL requests 1, 2, ... and a resent request
keeps its id, so a server applies a push once and answers a repeated pull from the reply it kept
(ps-lite's resend and de-duplication; Li et al., OSDI 2014, section 4.3). ``version`` is a shard's
version, the count of updates applied to it: a PARAMS reply says which version it carries, a PUSH
which version its gradient was computed from. ``shard`` is the server index a PUSH is meant for.
``epoch``, ``seq`` and ``aux`` serve replicated shards (:mod:`ps.replicas.chain_replication`): ``epoch`` is the
position in its chain of the replica a worker takes for the shard's primary (requests and replies
of an older epoch are refused: fencing), ``seq`` numbers the updates a primary forwards down its
chain, ``aux`` carries a forwarded update's kind and staleness.

Header fields by message type (``worker`` is the worker index ``0 .. W - 1``, not the MPI rank):

========  ================  ==================================================================
type      direction         meaning of ``clock`` / payload
========  ================  ==================================================================
PUSH      worker -> server  clock of the gradient; payload: gradient shard (already weighted)
PULL      worker -> server  reader's clock (``-1``: join, returns the resume clock)
PARAMS    server -> worker  staleness of the served shard (join: resume clock); payload: shard
REFUSED   server -> worker  ``cas``: the reader's last push was refused (too stale); payload: shard
REJECT    server -> worker  the reader's request was malformed; ``clock``: the reason's code
STOP      server -> worker  the training budget is spent; the worker finishes
ERROR     server -> worker  BSP lost worker ``worker`` (dropped or aborted); every rank stops
DROPPED   server -> worker  the reader itself was dropped for silence; it finishes
DONE      worker -> server  the worker finished (normally, stopped, or dropped)
ABORT     worker -> server  the worker stops because of an error
SPEED     worker -> server  load balancing: payload ``[seconds per sample]`` at this clock
BATCH     server -> worker  load balancing: payload ``[batch of every worker]``
STATS     worker -> rank 0  payload: the worker's statistics vector (see ``ps.job.runner``)
FINAL     server -> rank 0  payload: final shard, then snapshots and staleness counts
FORWARD   replica -> next   a worker's PUSH, DONE or ABORT, or a drop, as the primary applied it
ACK       replica -> prev   every forwarded update up to ``seq`` is applied down the chain
FENCED    replica -> other  the sender took over at ``epoch``: the receiver's epoch is over
EPOCH     primary -> worker the sender is the shard's primary from ``epoch`` on
HEARTBEAT worker -> server   the worker is alive (it waits on another server: failover, stop)
========  ================  ==================================================================
"""
import enum
import os
import time

import numpy as np
from mpi4py import MPI

from collectives.engine.failures import failed_ranks, is_process_failure
from collectives.errors import Timeout
from commlab.error_root import CommlabError

__all__ = ["Msg", "PSError", "PSTimeout", "HEADER_LEN", "H_TYPE", "H_WORKER", "H_CLOCK", "H_LEN", "H_RID",
           "H_VERSION", "H_SHARD", "H_DTYPE", "H_EPOCH", "H_SEQ", "H_AUX", "REJECT_REASONS", "header_tag",
           "data_tag", "send", "probe", "receive", "wait_all", "Backoff", "STALL_S", "dead", "done", "waiting"]

HEADER_LEN = 11  # [type, worker, clock, length, rid, version, shard, dtype, epoch, seq, aux]
H_TYPE, H_WORKER, H_CLOCK, H_LEN, H_RID, H_VERSION, H_SHARD, H_DTYPE, H_EPOCH, H_SEQ, H_AUX = range(HEADER_LEN)
_DTYPES = {1: np.dtype(np.float32), 2: np.dtype(np.float64), 3: np.dtype(np.int64)}  # int64: row ids (ps.embedding)
_CODES = {v: k for k, v in _DTYPES.items()}
#: Codes of a REJECT reply (its ``clock`` field) and what they mean.
REJECT_REASONS = {1: "the gradient's length differs from the shard's", 2: "the gradient's dtype differs from the shard's",
                  3: "the push names another shard than this server's", 4: "the push's base version is from the future",
                  5: "the request id was used before with other data", 6: "a row id is outside the shard"}
SPIN_SECONDS = float(os.environ.get("COMMLAB_PS_SPIN", "1e-4"))  # busy-poll window (seconds)
#: Seconds between two turns of a waiting loop beyond which its process itself did not run (stopped,
#: descheduled, busy): that time is nobody else's silence, so the clocks judging a peer's silence skip it.
STALL_S = 0.1
_HEADER_BASE = 700
_DATA_BASE = 800


class Msg(enum.IntEnum):
    """Message types; each has its own header tag and data tag."""

    PUSH = 1
    PULL = 2
    PARAMS = 3
    STOP = 4
    ERROR = 5
    DROPPED = 6
    DONE = 7
    ABORT = 8
    SPEED = 9
    BATCH = 10
    STATS = 11
    FINAL = 12
    REFUSED = 13
    REJECT = 14
    FORWARD = 15
    ACK = 16
    FENCED = 17
    EPOCH = 18
    HEARTBEAT = 19


class PSError(CommlabError, RuntimeError):
    """A parameter-server run cannot continue (lost worker under BSP, protocol violation)."""


class PSTimeout(PSError, Timeout):
    """A peer did not answer within the allowed time."""


def header_tag(mtype):
    """Return the MPI tag of the headers of message type ``mtype`` (int)."""
    return _HEADER_BASE + int(mtype)


def data_tag(mtype):
    """Return the MPI tag of the payloads of message type ``mtype`` (int)."""
    return _DATA_BASE + int(mtype)


class Backoff:
    """Poll without sleeping for ``spin`` seconds after progress, then sleep between polls with a
    delay doubling from ``start`` to ``cap`` seconds.

    Ranks oversubscribe the cores in tests and studies, so an idle rank must yield its core instead
    of spinning in ``MPI_Recv``; the short spin keeps the latency of a quick answer low.
    ``reset()`` after progress restarts the spin and brings the delay back down.

    Parameters
    ----------
    start : float
        First sleep (seconds).
    cap : float
        Largest sleep (seconds).
    spin : float
        Busy-polling window after each reset (seconds).
    """

    __slots__ = ("start", "cap", "spin", "delay", "_since")

    def __init__(self, start=2e-5, cap=2e-4, spin=SPIN_SECONDS):
        if not 0 < start <= cap or spin < 0:
            raise ValueError(f"need 0 < start <= cap and spin >= 0, got {start}, {cap}, {spin}")
        self.start, self.cap, self.spin = start, cap, spin
        self.reset()

    def reset(self):
        """Restart the spin window and return to the shortest delay."""
        self.delay = self.start
        self._since = time.perf_counter()

    def sleep(self):
        """Return at once inside the spin window; otherwise sleep the delay, then double it."""
        if time.perf_counter() - self._since < self.spin:
            return
        time.sleep(self.delay)
        self.delay = min(2 * self.delay, self.cap)


def send(comm, dest, mtype, worker=0, clock=0, data=None, *, rid=0, version=0, shard=0, epoch=0, seq=0, aux=0):
    """Post one message (header and optional payload) without blocking.

    Parameters
    ----------
    comm : MPI.Comm
        The parameter server's own (duplicated) communicator.
    dest : int
        Destination rank in ``comm``.
    mtype : Msg
        Message type.
    worker, clock : int
        Header fields (see the module table).
    data : ndarray, shape (length,), float32 or float64, optional
        Contiguous host payload; it must stay unchanged until the requests complete.
    rid, version, shard : int
        Request id, shard version and shard index (see the module docstring).
    epoch, seq, aux : int
        The fields of replicated shards (see the module docstring).

    Returns
    -------
    list of (MPI.Request, ndarray)
        The pending sends with the buffers they read; complete them with :func:`wait_all`.
    """
    length = 0 if data is None else int(data.shape[0])
    code = 0 if data is None else _CODES.get(data.dtype, 0)
    header = np.array([int(mtype), int(worker), int(clock), length, int(rid), int(version), int(shard), code,
                       int(epoch), int(seq), int(aux)], dtype=np.int64)
    if dest in dead(comm):
        return []  # nobody will read it: the failover code knows the rank is gone (dead)
    try:
        reqs = [(comm.Isend(header, dest=dest, tag=header_tag(mtype)), header)]
        if length:
            assert data.flags.c_contiguous and isinstance(data, np.ndarray) and code, "payload: host float32/float64/int64"
            reqs.append((comm.Isend(data, dest=dest, tag=data_tag(mtype)), data))
    except MPI.Exception as exc:  # the destination died (ULFM): dropped, as a send to it after its death
        _learn(comm, exc)
        return []
    return reqs


#: Ranks each communicator's calls here learned to be dead from the MPI library (ULFM), by its handle.
_DEAD = {}


def dead(comm):
    """Return the ranks of ``comm`` that this module's calls learned to be dead (a frozenset).

    Under ULFM (Open MPI's ``mpiexec --with-ft ulfm``) the MPI library reports a dead peer as an
    error of the call that meets it (``MPI_ERR_PROC_FAILED``): a wildcard probe once a process of
    the communicator died, a probe of, a send to or a receive from that process. The calls here
    acknowledge such a failure (``MPI_Comm_failure_ack``, after which wildcard probes work again)
    and record the dead ranks, so the failover code learns of a death at once instead of after
    ``--ps-timeout`` of silence. Without ULFM the set stays empty and silence is the only sign.
    """
    return frozenset(_DEAD.get(comm.py2f(), ()))


def _learn(comm, exc):
    """Record and acknowledge the dead ranks that ``exc`` reported; re-raise any other error."""
    if not is_process_failure(exc):
        raise exc
    ranks = failed_ranks(comm)
    comm.Ack_failed()
    _DEAD.setdefault(comm.py2f(), set()).update(ranks)


def done(comm, req):
    """Return True when ``req`` completed, or failed because its peer died (ULFM: learned, see :func:`dead`)."""
    try:
        return req.Test()
    except MPI.Exception as exc:
        _learn(comm, exc)
        return True


def waiting(comm, source, tag=MPI.ANY_TAG, status=None):
    """Return True when a message from ``source`` (or ``MPI.ANY_SOURCE``) waits unread, its envelope in ``status``.

    False for a rank known dead, and when the probe met a death (learned here, see :func:`dead`).
    """
    if source in dead(comm):
        return False
    try:
        return comm.Iprobe(source=source, tag=tag, status=status)
    except MPI.Exception as exc:
        _learn(comm, exc)
        return False


def probe(comm, source=MPI.ANY_SOURCE):
    """Return ``(source, Msg)`` of the next waiting header, or ``None`` when nothing waits.

    Parameters
    ----------
    comm : MPI.Comm
        Communicator to probe.
    source : int
        Rank to probe, or ``MPI.ANY_SOURCE``.

    Raises
    ------
    PSError
        When a payload arrives without its header (a protocol violation).
    """
    status = MPI.Status()
    for _ in range(comm.Get_size()):  # each failure acknowledged lets the next probe through (ULFM)
        try:
            found = comm.Iprobe(source=source, tag=MPI.ANY_TAG, status=status)
            break
        except MPI.Exception as exc:  # a process died: acknowledged, a wildcard probe works again
            _learn(comm, exc)
            if source != MPI.ANY_SOURCE:
                return None
    else:
        return None
    if not found:
        return None
    tag = status.Get_tag()
    if not _HEADER_BASE < tag <= _HEADER_BASE + len(Msg):
        raise PSError(f"unexpected message with tag {tag} from rank {status.Get_source()}")
    return status.Get_source(), Msg(tag - _HEADER_BASE)


def receive(comm, source, mtype, deadline):
    """Receive a header of type ``mtype`` from ``source`` (already probed) and its payload.

    Parameters
    ----------
    comm : MPI.Comm
        Communicator.
    source : int
        Sender's rank.
    mtype : Msg
        Message type (selects the tags).
    deadline : float
        ``time.monotonic()`` value after which a missing payload raises.

    Returns
    -------
    header : ndarray, shape (HEADER_LEN,), int64
    data : ndarray, shape (length,), or None
        In the dtype the header names; ``None`` when the header's length is 0.

    Raises
    ------
    PSError
        When the header names no known payload dtype.
    PSTimeout
        When the payload does not arrive before ``deadline``.
    """
    header = np.empty(HEADER_LEN, dtype=np.int64)
    try:
        comm.Recv(header, source=source, tag=header_tag(mtype))
    except MPI.Exception as exc:  # the sender died meanwhile (ULFM): as a payload that never comes
        _learn(comm, exc)
        raise PSTimeout(f"rank {source} died before its {mtype.name} arrived") from None
    if header[H_LEN] == 0:
        return header, None
    dtype = _DTYPES.get(int(header[H_DTYPE]))
    if dtype is None:
        raise PSError(f"{mtype.name} from rank {source} names payload dtype code {int(header[H_DTYPE])}")
    data = np.empty(int(header[H_LEN]), dtype=dtype)
    req = comm.Irecv(data, source=source, tag=data_tag(mtype))
    wait_all([(req, data)], deadline, f"payload of {mtype.name} from rank {source}")
    return header, data


def wait_all(requests, deadline, what):
    """Complete the pending requests, polling with :class:`Backoff` until ``deadline``.

    Parameters
    ----------
    requests : list of (MPI.Request, ndarray)
        As returned by :func:`send`, or receives paired with their buffers.
    deadline : float
        ``time.monotonic()`` value (seconds) after which waiting stops.
    what : str
        Description used in the timeout message.

    Raises
    ------
    PSTimeout
        When some request is still pending at ``deadline``, or the MPI library failed it because
        the peer died during the transfer (MPICH's shared-memory copy of a large message from a
        process that is gone): either way the peer is lost, and the callers' failover handles both.
    """
    pending = [r for r, _ in requests]
    backoff = Backoff()
    while pending:
        try:
            pending = [r for r in pending if not r.Test()]
        except MPI.Exception as exc:
            raise PSTimeout(f"the peer died while waiting for {what} (the MPI library failed the transfer: "
                            f"{MPI.Get_error_string(exc.Get_error_class()).strip()})") from None
        if not pending:
            return
        if time.monotonic() > deadline:
            raise PSTimeout(f"timed out waiting for {what}")
        backoff.sleep()
