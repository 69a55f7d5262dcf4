"""Timeline of a run as Chrome trace events (``chrome://tracing``, https://ui.perfetto.dev).

One recorder per process. While it is off (the default) :func:`span` returns one shared no-op
context manager and :func:`complete` returns at once, so instrumented code costs a function call
and a global test. :func:`start` turns it on; events are then kept in memory as tuples
``(name, lane, t0, t1, args)`` (``time.perf_counter`` seconds) and turned into JSON only at the
end: :func:`gather` collects every rank's events on one rank with point-to-point messages (bytes
in ``uint8`` buffers, no pickle) and :func:`write` writes the merged file.

Format (Trace Event Format, "JSON Object Format"): ``{"traceEvents": [...], "displayTimeUnit": "ms"}``
with complete events ``{"ph": "X", "name", "cat", "ts", "dur", "pid", "tid", "args"}``, ``ts`` and
``dur`` in microseconds. ``pid`` is the MPI rank and ``tid`` the lane's index in :data:`LANES`;
metadata events (``"ph": "M"``) name each process ``rank R`` and each thread after its lane, so
the viewer shows one row per rank and lane. Events of one lane nest (a bucket's all-reduce inside
the gradient exchange) and never partly overlap.

Clocks: :func:`start` takes the barrier that aligns the ranks as an argument (the caller's own, with
its deadline and error, e.g. ``collectives.engine.waiting.wait_within(comm.Ibarrier(), ...)``);
every rank takes its time origin right after it, so the ranks' timelines are aligned to within the
barrier's exit skew (microseconds on one node, a network latency across nodes).

Imports: NumPy only; the communicator's methods are called on the object given, so mpi4py is never
imported here.
"""
import json
import time

import numpy

__all__ = ["LANES", "start", "stop", "enabled", "span", "complete", "events", "gather", "write",
           "chrome_events"]

#: Lanes (Chrome "threads") in display order.
LANES = ("step", "compute", "comm", "ps")

_TAG = 0x7ACE  # tag of the gather messages
_on = False
_origin = 0.0
_events = []
_lane_ids = {name: i for i, name in enumerate(LANES)}


class _Null:
    """The context manager :func:`span` returns while tracing is off: does nothing."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL = _Null()


class _Span:
    __slots__ = ("name", "lane", "args", "t0")

    def __init__(self, name, lane, args):
        self.name, self.lane, self.args = name, lane, args

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        _events.append((self.name, self.lane, self.t0, time.perf_counter(), self.args))
        return False


def start(align=None):
    """Turn the recorder on and drop earlier events; after ``align()`` when given.

    Parameters
    ----------
    align : callable, optional
        Called with no argument before the time origin is taken: a barrier over the ranks, so that
        their timelines line up (the caller's own, with its deadline: for example
        ``lambda: wait_within(comm.Ibarrier(), timeout, "barrier", "trace start")`` with
        ``collectives.engine.waiting.wait_within``); without one, the origin is now.

    Raises
    ------
    Exception
        Whatever ``align`` raises (a peer that never reached the barrier); the recorder stays off.

    Examples
    --------
    >>> start()
    >>> with span("forward", "compute"):
    ...     pass
    >>> stop()
    >>> [e[:2] for e in events()]
    [('forward', 'compute')]
    """
    global _on, _origin
    if align is not None:
        align()
    _origin = time.perf_counter()
    _events.clear()
    _on = True


def stop():
    """Turn the recorder off (the events recorded so far are kept for :func:`events`)."""
    global _on
    _on = False


def enabled():
    """Return True while the recorder is on."""
    return _on


def span(name, lane, args=None):
    """Return a context manager that records its body as one complete event.

    Parameters
    ----------
    name : str
        Event name ("forward", "allreduce", "push", ...).
    lane : str
        One of :data:`LANES`.
    args : dict, optional
        JSON-ready values shown with the event (bytes, bucket index, clock...).
    """
    if not _on:
        return _NULL
    return _Span(name, lane, args)


def complete(name, lane, t0, t1, args=None):
    """Record an event from ``t0`` to ``t1`` (``time.perf_counter`` seconds) when tracing is on."""
    if _on:
        _events.append((name, lane, t0, t1, args))


def events():
    """Return this process's recorded events as a list of ``(name, lane, t0, t1, args)`` tuples."""
    return list(_events)


def chrome_events(rank, recorded=None):
    """Return this process's events as Chrome trace event dicts (metadata events first).

    Parameters
    ----------
    rank : int
        The process id (``pid``) of the events: the MPI rank.
    recorded : list of tuple, optional
        Events as :func:`events` returns them (default: this process's).

    Returns
    -------
    list of dict
        ``process_name``/``process_sort_index`` and ``thread_name`` metadata, then ``"X"``
        events with ``ts``/``dur`` in microseconds since :func:`start`.
    """
    recorded = _events if recorded is None else recorded
    out = [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
           {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}}]
    out += [{"ph": "M", "name": "thread_name", "pid": rank, "tid": i, "args": {"name": lane}}
            for i, lane in enumerate(LANES)]
    for name, lane, t0, t1, args in recorded:
        ev = {"ph": "X", "name": name, "cat": lane, "ts": round((t0 - _origin) * 1e6, 3),
              "dur": round(max(t1 - t0, 0.0) * 1e6, 3), "pid": rank, "tid": _lane_ids[lane]}
        if args:
            ev["args"] = args
        out.append(ev)
    return out


def gather(comm, root=0, timeout=None):
    """Collect every rank's events on ``root``; point-to-point, so a dead rank cannot hang it.

    Every rank but ``root`` sends its events (JSON text as a ``uint8`` buffer, preceded by its
    length as one int64) to ``root``; ``root`` receives from each with a deadline, and a sender
    gives up after the same time (a root that failed). Call it on every rank of ``comm`` once the
    run's other messages on ``comm`` are over.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
    root : int
        Rank that merges.
    timeout : float, optional
        Seconds ``root`` waits for the other ranks (None: no limit); a rank silent that long is
        left out and named in the result.

    Returns
    -------
    tuple of (list of dict, list of int)
        On ``root``: all ranks' Chrome events (:func:`chrome_events`), sorted by rank, and the
        ranks whose events did not arrive. Elsewhere: ``([], [])``.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    mine = chrome_events(rank)
    if rank != root:
        data = numpy.frombuffer(json.dumps(mine).encode(), numpy.uint8)
        n = numpy.array([data.size], numpy.int64)
        deadline = None if timeout is None else time.monotonic() + timeout
        if _wait(comm.Isend(n, dest=root, tag=_TAG), deadline) and data.size:
            _wait(comm.Isend(data, dest=root, tag=_TAG), deadline)
        return [], []
    merged, missing = {root: mine}, []
    deadline = None if timeout is None else time.monotonic() + timeout
    for r in range(size):
        if r == root:
            continue
        n = numpy.zeros(1, numpy.int64)
        if not _wait(comm.Irecv(n, source=r, tag=_TAG), deadline):
            missing.append(r)
            continue
        buf = numpy.empty(int(n[0]), numpy.uint8)
        if buf.size and not _wait(comm.Irecv(buf, source=r, tag=_TAG), deadline):
            missing.append(r)
            continue
        merged[r] = json.loads(buf.tobytes().decode()) if buf.size else []
    return [ev for r in sorted(merged) for ev in merged[r]], missing


def _wait(req, deadline):
    """Wait for ``req`` until ``deadline`` (monotonic seconds, None: forever); cancel it then."""
    if deadline is None:
        req.Wait()
        return True
    while not req.Test():
        if time.monotonic() > deadline:
            req.Cancel()
            req.Free()
            return False
        time.sleep(0.001)
    return True


def write(path, chrome, missing=()):
    """Write merged Chrome events to ``path`` as a JSON Object Format trace file.

    Parameters
    ----------
    path : str
    chrome : list of dict
        Events from :func:`gather` (or :func:`chrome_events`).
    missing : sequence of int
        Ranks whose events are missing; recorded under ``"otherData"``.
    """
    doc = {"traceEvents": chrome, "displayTimeUnit": "ms",
           "otherData": {"source": "commlab", "missing_ranks": list(missing)}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
        f.write("\n")
