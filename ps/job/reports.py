"""What the parameter-server ranks report at the end of a run: the run's result, every worker's
statistics and every server's counters, packed into plain arrays for the report messages and merged
over the shards into the run's result; shared by :mod:`ps.job.runner` (one server per shard) and
:mod:`ps.job.survivors` (replicated shards).
"""
import time
from dataclasses import dataclass, field

import numpy as np

from ps.serving.consistency import DROPPED
from ps.serving.shard_server import COUNTERS, EVENT_ABORTED, EVENT_DIED
from ps.shards.key_ranges import join_shards
from ps.wire.messages import HEADER_LEN, Backoff, PSError, data_tag, header_tag, wait_all, waiting

__all__ = ["RunResult", "STAT_FIELDS", "ABORTED", "roles", "worker_stats", "server_report", "pack_report",
           "unpack_report", "receive_report", "merge_reports"]

#: Status code of an aborted worker in a server's report (beside LIVE, DONE, DROPPED).
ABORTED = 3  # status code of an aborted worker in a server's report (beside LIVE, DONE, DROPPED)
#: Fields of a worker's statistics vector (the STATS payload, float64 on the wire), in order; the
#: result dicts hold the counts as int, ``dropped`` as bool and the seconds and means as float.
STAT_FIELDS = ("worker", "clock", "pushes", "samples", "compute_s", "delay_s", "wait_s", "batch",
               "dropped", "mean_staleness", "max_staleness", "refused", "wasted_compute_s", "resends",
               "stale_replies", "failovers")
_INT_STATS = frozenset(("worker", "clock", "pushes", "samples", "batch", "max_staleness", "refused", "resends",
                        "stale_replies", "failovers"))  # counts


@dataclass
class RunResult:
    """What rank 0 knows at the end of a run (other ranks get ``None``, workers their stats)."""

    params: np.ndarray                   # final flat parameters, shape (n,)
    pushes: int                          # worker gradients folded in (server 0)
    wall: float                          # seconds from the start barrier to server 0's last message
    staleness_histogram: dict            # staleness (clocks) -> served shard pulls, all servers
    start_pushes: int = 0                # pushes already folded in when this job started (resume)
    start_wall: float = 0.0              # seconds of training before this job started (resume)
    snapshots: list = field(default_factory=list)   # (pushes, seconds, flat params)
    workers: list = field(default_factory=list)     # per worker: dict of STAT_FIELDS, or None
    status: list = field(default_factory=list)      # per worker: "done", "dropped" or "aborted"
    events: list = field(default_factory=list)      # (seconds, text), sorted by time
    versions: list = field(default_factory=list)    # per server: its shard's final version (updates applied)
    counts: dict = field(default_factory=dict)      # server counters (ps.serving.shard_server.COUNTERS), summed
    rejected: dict = field(default_factory=dict)    # REJECT reason code -> count, summed over servers
    replicas: list = field(default_factory=list)    # replicated runs: per server rank, its record (or None)
    servers_lost: list = field(default_factory=list)  # replicated runs: server ranks that sent no report
    lost_acknowledged: int = 0                      # replicated runs: acknowledged clocks not in the result


def roles(comm, servers):
    """Return ``(server_ranks, worker_ranks)`` for a communicator with ``servers`` server ranks.

    Parameters
    ----------
    comm : MPI.Comm
        The job's communicator: its first ``servers`` ranks serve, the others work.
    servers : int
        Server ranks S (with replicas, every replica counts).

    Returns
    -------
    (list of int, list of int)

    Examples
    --------
    >>> from mpi4py import MPI
    >>> roles(MPI.COMM_SELF, 0)
    ([], [0])
    """
    return list(range(servers)), list(range(servers, comm.Get_size()))


def worker_stats(vec):
    """Return a worker's STATS vector as a dict: counts as int, ``dropped`` as bool, times as float.

    The vector travels as float64 (one typed buffer); the counts in it are exact integers below 2**53.

    Parameters
    ----------
    vec : ndarray, shape (k,), float64
        The STATS payload: :data:`STAT_FIELDS` in order (a replicated run's acknowledged clocks may
        follow; they are not part of the dict).

    Returns
    -------
    dict
        :data:`STAT_FIELDS` -> int, bool or float.

    Examples
    --------
    >>> import numpy as np
    >>> stats = worker_stats(np.arange(len(STAT_FIELDS), dtype=np.float64))
    >>> stats["worker"], stats["compute_s"], stats["dropped"]
    (0, 4.0, True)
    """
    return {k: (int(v) if k in _INT_STATS else bool(v) if k == "dropped" else float(v))
            for k, v in zip(STAT_FIELDS, vec.tolist())}


def server_report(server):
    """Return this server's final report: shard, snapshots, staleness counts, worker status, events.

    Parameters
    ----------
    server : ps.serving.shard_server.Server
        A server whose loop has ended (a replica too).

    Returns
    -------
    dict
        ``shard`` (its parameters), ``snaps`` (pushes, seconds, shard), ``hist`` (pulls served per
        staleness), ``pushes``, ``status`` (per worker: LIVE, DONE, DROPPED or :data:`ABORTED`),
        ``events`` (shape (k, 3): seconds, worker, code) and ``counts`` (the server's counters, its
        version, the REJECTs by reason), ready for :func:`pack_report`.

    Examples
    --------
    A whole report needs a served run: ``tests/mpi_ps.py`` checks the result assembled from these.
    """
    hist = np.zeros(max(server.staleness_histogram, default=-1) + 1)
    for k, v in server.staleness_histogram.items():
        hist[k] = v
    status = server.table.status.astype(np.float64)
    status[sorted(server.aborted)] = ABORTED
    events = np.array(server.events, dtype=np.float64).reshape(-1, 3)  # (time, worker, code)
    counts = np.array([server.counts[k] for k in COUNTERS] + [server.version]
                      + [server.rejected.get(c, 0) for c in range(1, 6)], np.float64)
    return dict(shard=server.params, snaps=list(server.snapshots), hist=hist, pushes=server.pushes,
                status=status, events=events, counts=counts)


def pack_report(rep):
    """Flatten a report into one float64 vector (counts first) for the FINAL message.

    Parameters
    ----------
    rep : dict
        As :func:`server_report` returns it.

    Returns
    -------
    ndarray, shape (k,), float64
        Read back by :func:`unpack_report`.

    Examples
    --------
    >>> import numpy as np
    >>> from ps.serving.shard_server import COUNTERS
    >>> rep = dict(shard=np.ones(3, np.float32), snaps=[(4, 0.5, np.zeros(3, np.float32))], hist=np.array([2.0]),
    ...            pushes=8, status=np.zeros(2), events=np.zeros((0, 3)), counts=np.zeros(len(COUNTERS) + 6))
    >>> back = unpack_report(pack_report(rep), 2, np.float32)
    >>> back["shard"], back["snaps"][0][:2], back["pushes"]
    (array([1., 1., 1.], dtype=float32), (4, 0.5), 8)
    """
    snaps = rep["snaps"]
    counts = [rep["shard"].shape[0], len(snaps), rep["hist"].shape[0], rep["pushes"], rep["events"].shape[0]]
    parts = [np.array(counts, np.float64), rep["shard"].astype(np.float64),
             np.array([p for p, _, _ in snaps], np.float64), np.array([t for _, t, _ in snaps], np.float64)]
    parts += [x.astype(np.float64) for _, _, x in snaps]
    return np.concatenate(parts + [rep["hist"], rep["status"], rep["events"].ravel(), rep["counts"]])


def unpack_report(vec, n_workers, dtype):
    """Invert :func:`pack_report` (shards back in the model dtype).

    Parameters
    ----------
    vec : ndarray, shape (k,), float64
        A FINAL payload.
    n_workers : int
        The run's workers (the length of ``status``).
    dtype : numpy.dtype
        The parameters' dtype.

    Returns
    -------
    dict
        The keys of :func:`server_report`.

    Examples
    --------
    See :func:`pack_report`.
    """
    n, n_snap, n_hist, pushes, n_ev = (int(v) for v in vec[:5])
    sizes = [n, n_snap, n_snap] + [n] * n_snap + [n_hist, n_workers, 3 * n_ev, len(COUNTERS) + 6]
    parts = np.split(vec[5:5 + sum(sizes)], np.cumsum(sizes)[:-1])
    snaps = [(int(p), float(t), x.astype(dtype)) for p, t, x in zip(parts[1], parts[2], parts[3:3 + n_snap])]
    return dict(shard=parts[0].astype(dtype), snaps=snaps, hist=parts[-4], pushes=pushes,
                status=parts[-3], events=parts[-2].reshape(-1, 3), counts=parts[-1])


def receive_report(comm, source, mtype, deadline):
    """Receive one report (header and float64 payload) from ``source`` on the report communicator.

    Parameters
    ----------
    comm : MPI.Comm
        The run's report communicator.
    source : int
        The sender's rank.
    mtype : ps.wire.messages.Msg
        FINAL or STATS.
    deadline : float
        ``time.monotonic()`` value (seconds) after which waiting stops.

    Returns
    -------
    ndarray, shape (length,), float64

    Raises
    ------
    PSError
        When no report header arrives before ``deadline``.
    PSTimeout
        When its payload does not.

    Examples
    --------
    Reports travel between ranks: ``tests/mpi_ps.py`` and ``tests/mpi_ps_replicas.py`` run them.
    """
    backoff = Backoff()
    while not waiting(comm, source, header_tag(mtype)):
        if time.monotonic() > deadline:
            raise PSError(f"rank 0: no {mtype.name} report from rank {source}")
        backoff.sleep()
    header = np.empty(HEADER_LEN, np.int64)
    comm.Recv(header, source=source, tag=header_tag(mtype))
    data = np.empty(int(header[3]), np.float64)
    req = comm.Irecv(data, source=source, tag=data_tag(mtype))
    wait_all([(req, data)], deadline, f"{mtype.name} payload from rank {source}")
    return data


def merge_reports(reps, worker_ranks, ps_timeout, *, reads=None):
    """Merge the reports of a run's shards (one per shard, in shard order) into the fields of its result.

    Parameters
    ----------
    reps : list of dict
        One report per shard (:func:`server_report` or :func:`unpack_report`), in shard order; the first
        one's worker status is the run's.
    worker_ranks : list of int
        The workers' ranks, in worker-index order (named in the events).
    ps_timeout : float
        The servers' silence timeout (seconds), named in a drop's event.
    reads : list of dict, optional
        The reports whose staleness counts are summed (default ``reps``; a replicated run passes every
        replica's, as each read is counted by the primary that served it).

    Returns
    -------
    dict
        :class:`RunResult`'s ``params``, ``snapshots``, ``staleness_histogram``, ``status``, ``events``
        (each worker's first drop or abort, by time), ``counts`` and ``rejected`` (the REJECT reasons
        met).

    Examples
    --------
    >>> import numpy as np
    >>> def rep(x, hist):
    ...     return dict(shard=np.full(2, x), snaps=[(4, x, np.full(2, x))], hist=np.array(hist), pushes=4,
    ...                 status=np.array([0.0, DROPPED]), events=np.array([[1.5, 1, 1]]),
    ...                 counts=np.ones(len(COUNTERS) + 6))
    >>> merged = merge_reports([rep(1.0, [2, 1]), rep(2.0, [3])], [2, 3], 5.0)
    >>> merged["params"], merged["staleness_histogram"], merged["status"]
    (array([1., 1., 2., 2.]), {0: 5, 1: 1}, ['done', 'dropped'])
    >>> merged["events"], merged["snapshots"][0][:2], merged["rejected"]
    ([(1.5, 'worker rank 3 dropped (silent for more than 5 s)')], (4, 2.0), {1: 2, 2: 2, 3: 2, 4: 2, 5: 2})
    """
    n_snap = min(len(rep["snaps"]) for rep in reps)
    snapshots = [(reps[0]["snaps"][k][0], max(rep["snaps"][k][1] for rep in reps),
                  join_shards([rep["snaps"][k][2] for rep in reps])) for k in range(n_snap)]
    hist = {}
    for rep in reps if reads is None else reads:
        for k, v in enumerate(rep["hist"]):
            if v:
                hist[k] = hist.get(k, 0) + int(v)
    codes = reps[0]["status"]
    status = ["aborted" if c == ABORTED else "dropped" if c == DROPPED else "done" for c in codes]
    events, seen = [], set()
    for t, w, c in sorted(tuple(e) for rep in reps for e in rep["events"].tolist()):
        if (w, c) not in seen:
            seen.add((w, c))
            what = ("aborted" if c == EVENT_ABORTED else "dropped (the MPI library reported it dead)"
                    if c == EVENT_DIED else f"dropped (silent for more than {ps_timeout:g} s)")
            events.append((t, f"worker rank {worker_ranks[int(w)]} {what}"))
    k = len(COUNTERS)
    counts = {name: int(sum(rep["counts"][i] for rep in reps)) for i, name in enumerate(COUNTERS)}
    rejected = {c: int(sum(rep["counts"][k + c] for rep in reps)) for c in range(1, 6)}
    return dict(params=join_shards([rep["shard"] for rep in reps]), snapshots=snapshots,
                staleness_histogram=dict(sorted(hist.items())), status=status, events=events, counts=counts,
                rejected={c: n for c, n in rejected.items() if n})
