"""Per-round timeline of hand-made collectives: where each round's time went, on every rank.

While a :func:`record` block is open, the executor (:mod:`.executor`) notes for every round of every
schedule it runs on this process: when the round started, when its messages were posted, when the
last of them completed (the wait) and when its receives had been applied (the reductions), with its
sends and receives (messages and elements). Outside such a block the executor pays one global test
per round.

:func:`gather` brings every rank's rounds to one rank (JSON text in ``uint8`` buffers, no pickle);
:func:`chrome` turns them into a Chrome/Perfetto trace (one process per rank, one slice per round
with its post, wait and reduce inside), and :func:`table` prints the rounds of the slowest rank,
each round's post, wait and reduce times (medians over the recorded calls) and its messages, so one
sees which rounds, and which part of them, an algorithm's time goes to.

Example (``mpiexec -n 4``)::

    with timeline.record() as rec:
        collectives.allreduce(x, algorithm="ring")
    rounds = timeline.gather(rec, comm)
    if comm.rank == 0:
        print(timeline.table(rounds))
        timeline.write("ring.json", rounds)
"""
import contextlib
import json
import statistics
import time

import numpy

__all__ = ["Recorder", "record", "active", "gather", "chrome", "table", "write", "FIELDS"]

#: The fields of one recorded round, in order (times in ``time.perf_counter`` seconds; ``posted`` is
#: None when the round ran as one blocking ``MPI_Sendrecv``, whose post and wait are one call).
FIELDS = ("call", "collective", "algorithm", "round", "phase", "start", "posted", "arrived", "done",
          "sends", "sent", "recvs", "received", "reductions")

_ACTIVE = [None]


class Recorder:
    """This process's recorded rounds (:data:`FIELDS` tuples in :attr:`rounds`), in the order they ran."""

    __slots__ = ("rounds", "calls", "origin")

    def __init__(self):
        self.rounds, self.calls, self.origin = [], 0, time.perf_counter()

    def new_call(self):
        """Return the number of the next recorded call."""
        self.calls += 1
        return self.calls - 1

    def add(self, call, collective, algorithm, index, rnd, start, posted, arrived, done):
        """Record round ``index`` (a :class:`~collectives.schedules.schedule.Round`) of call ``call``."""
        self.rounds.append((call, collective, algorithm, index, rnd.phase, start, posted, arrived, done,
                            len(rnd.sends), sum(b - a for _, a, b in rnd.sends), len(rnd.recvs),
                            sum(b - a for _, a, b, _ in rnd.recvs), sum(1 for r in rnd.recvs if r[3])))


def active():
    """Return the open :class:`Recorder`, or None (the executor's test, once per round)."""
    return _ACTIVE[0]


@contextlib.contextmanager
def record():
    """Record every round the executor runs on this process inside the block; yields the :class:`Recorder`.

    Examples
    --------
    >>> import numpy as np
    >>> import collectives
    >>> with record() as rec:
    ...     _ = collectives.allreduce(np.ones(4), algorithm="ring")
    >>> rec.rounds  # one rank runs no round
    []
    """
    rec, before = Recorder(), _ACTIVE[0]
    _ACTIVE[0] = rec
    try:
        yield rec
    finally:
        _ACTIVE[0] = before


def gather(recorder, comm, root=0):
    """Return every rank's rounds on ``root`` as ``[rounds of rank 0, rounds of rank 1, ...]`` (None elsewhere).

    Collective over ``comm``: each rank's rounds travel as JSON text in a ``uint8`` buffer
    (``MPI_Gather`` of the lengths, then ``MPI_Gatherv``). Times are made relative to the earliest
    round start over all ranks (after a barrier-free ``MPI_Allreduce`` of the clocks' offsets, so
    ranks of one node share the clock; across nodes they are each rank's own).
    """
    rows = [list(r) for r in recorder.rounds]
    data = numpy.frombuffer(json.dumps(rows).encode(), numpy.uint8)
    sizes = numpy.zeros(comm.Get_size(), numpy.int64) if comm.Get_rank() == root else None
    comm.Gather(numpy.array([data.size], numpy.int64), sizes, root=root)
    if comm.Get_rank() != root:
        comm.Gatherv(data, None, root=root)
        return None
    buf = numpy.empty(int(sizes.sum()), numpy.uint8)
    comm.Gatherv(data, (buf, sizes), root=root)
    out, at = [], 0
    for n in sizes:
        out.append([tuple(r) for r in json.loads(buf[at:at + n].tobytes().decode())] if n else [])
        at += int(n)
    return out


def _parts(r):
    """Return (post, wait, reduce) seconds of one recorded round."""
    start, posted, arrived, done = r[5], r[6], r[7], r[8]
    post = (posted - start) if posted is not None else 0.0
    return post, arrived - (posted if posted is not None else start), done - arrived


def chrome(per_rank):
    """Return a Chrome trace dict (``chrome://tracing``, https://ui.perfetto.dev) of :func:`gather`'s rounds.

    One process per rank; a slice per round named ``PHASE round I`` (its messages and elements in its
    arguments) holding ``post``, ``wait`` and ``reduce`` slices; times in microseconds from the
    earliest recorded round.
    """
    t0 = min((r[5] for rounds in per_rank for r in rounds), default=0.0)
    events = []
    for rank, rounds in enumerate(per_rank):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        for r in rounds:
            us = lambda t: (t - t0) * 1e6  # noqa: E731
            args = dict(zip(FIELDS[:5], r[:5]), **dict(zip(FIELDS[9:], r[9:])))
            events.append({"ph": "X", "name": f"{r[4] or r[1]} round {r[3]}", "cat": r[2], "pid": rank, "tid": 0,
                           "ts": us(r[5]), "dur": us(r[8]) - us(r[5]), "args": args})
            marks = ([("post", r[5], r[6])] if r[6] is not None else []) + [
                ("wait", r[6] if r[6] is not None else r[5], r[7]), ("reduce", r[7], r[8])]
            for name, a, b in marks:
                events.append({"ph": "X", "name": name, "cat": r[2], "pid": rank, "tid": 0, "ts": us(a),
                               "dur": us(b) - us(a)})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"source": "commlab rounds"}}


def write(path, per_rank):
    """Write :func:`chrome`'s trace of ``per_rank`` rounds to ``path`` (JSON)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(chrome(per_rank), f)
        f.write("\n")


def table(per_rank, itemsize=None):
    """Return the rounds of the slowest rank as a printed table (medians over the recorded calls).

    The slowest rank is the one whose recorded rounds took longest in total. Per round: its phase,
    the messages it sent and received (elements, and bytes with ``itemsize``), reductions, and the
    median over calls of its post, wait and reduce times in microseconds, with the round's share of
    the rank's time. The last line names where that rank's time went (post, wait, reduce totals).

    Examples
    --------
    >>> rounds = [[(0, "allreduce", "ring", 0, "reduce-scatter", 0.0, 1e-6, 5e-6, 6e-6, 1, 2, 1, 2, 1)],
    ...           [(0, "allreduce", "ring", 0, "reduce-scatter", 0.0, 1e-6, 9e-6, 1e-5, 1, 2, 1, 2, 1)]]
    >>> print(table(rounds))
    slowest rank 1 of 2: 1 call(s), 10.0 us per call
     round  phase              sends  elements  recvs  elements  reduce  post_us  wait_us  reduce_us  share
         0  reduce-scatter         1         2      1         2       1      1.0      8.0        1.0   100%
    time went to: post 10%, wait 80%, reduce 10%
    """
    if not any(per_rank):
        return "no rounds recorded (an algorithm=\"mpi\" call, or P = 1, runs none)"
    totals = [sum(r[8] - r[5] for r in rounds) for rounds in per_rank]
    slow = max(range(len(per_rank)), key=lambda k: totals[k])
    rounds = per_rank[slow]
    calls = len({r[0] for r in rounds})
    by_round = {}
    for r in rounds:
        by_round.setdefault((r[3], r[4]), []).append(r)
    unit = "bytes" if itemsize else "elements"
    lines = [f"slowest rank {slow} of {len(per_rank)}: {calls} call(s), {totals[slow] / calls * 1e6:.1f} us per call",
             f" round  {'phase':<17}  sends  {unit:>8}  recvs  {unit:>8}  reduce  post_us  wait_us  reduce_us  share"]
    sums = [0.0, 0.0, 0.0]
    per_call = totals[slow] / calls
    for (index, phase), rs in sorted(by_round.items()):
        parts = [_parts(r) for r in rs]
        med = [statistics.median(p[k] for p in parts) for k in range(3)]
        for k in range(3):
            sums[k] += sum(p[k] for p in parts)
        r = rs[0]
        scale = itemsize or 1
        share = sum(map(sum, parts)) / len(parts) / per_call if per_call > 0 else 0.0  # mean round / mean call
        lines.append(f"{index:>6}  {phase[:17]:<17}  {r[9]:>5}  {r[10] * scale:>8}  {r[11]:>5}  {r[12] * scale:>8}  "
                     f"{r[13]:>6}  {med[0] * 1e6:>7.1f}  {med[1] * 1e6:>7.1f}  {med[2] * 1e6:>9.1f}  {share:>5.0%}")
    total = sum(sums) or 1.0
    lines.append(f"time went to: post {sums[0] / total:.0%}, wait {sums[1] / total:.0%}, reduce {sums[2] / total:.0%}")
    return "\n".join(lines)
