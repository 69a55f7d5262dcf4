"""Symbolic verification: does an algorithm's schedule compute its collective, for every P and count?

Instead of numbers, every element carries the set of ranks whose input it holds (and how often) and
the position that input came from. The schedules of all P ranks are run on these symbols under the
definition of a round (:mod:`collectives.schedules.schedule`): a send carries its region's value at
the start of the round, the receives apply in their listed order once the round's messages have
arrived. A message moves only while both its sender and its receiver are in the rounds that post it
(as a rendezvous send of MPI would), so a schedule that passes cannot deadlock whatever the message
size. The checks, in order:

1. every schedule is a :class:`~collectives.schedules.schedule.Schedule` of its rank, P and count;
2. the i-th message from rank p to rank q (in round order) meets q's i-th receive from p, with the
   same length (``length``, ``unmatched receive``, ``unmatched send``);
3. no rank sends or reduces a region that neither its input nor a message wrote (``read before
   write``) and the rounds can all run (``deadlock``, naming the ranks that wait on each other);
4. the result: for the all-reduce, every element of every rank holds every rank's contribution
   exactly once, at its own position (``missing``, ``doubled``, ``misplaced``); for the
   reduce-scatter the same on rank r's chunk r (``chunk_bounds(count, P)``); for the all-gather,
   block j of every rank holds rank j's block; for the broadcast, every rank holds the root's
   vector; for the reduce, the root holds the reduction.

The first violation raises :class:`~collectives.errors.ScheduleViolation` naming the rank, round,
region and the contributions missing or doubled. This is the check of MSCCLang (Cowan et al.,
ASPLOS 2023, section 5), which verifies a program's final chunk contributions before it runs.

Imports: :mod:`collectives.schedules.schedule`, :mod:`collectives.errors`. No MPI.
"""
from bisect import bisect_right
import time

from collectives.errors import ScheduleViolation
from collectives.schedules.schedule import Schedule, chunk_bounds

__all__ = ["verify", "check", "COLLECTIVE_ARGUMENTS", "default_counts"]

#: What a builder of each collective is called with (``bounds`` is ``chunk_bounds(count, P)``).
COLLECTIVE_ARGUMENTS = {
    "allreduce": "(rank, size, count)",
    "reduce_scatter": "(rank, size, count)",
    "allgather": "(rank, size, bounds)",
    "broadcast": "(rank, size, count, root)",
    "reduce": "(rank, size, count, root)",
}


def default_counts(size):
    """Return the counts :func:`verify` checks at P = ``size``: 0, P - 1 (below P) and 2P + 1 (above P).

    Neither nonzero count is divisible by P (for P >= 3), so some chunks are empty or one element
    longer than others; at P = 1 and 2 the counts 1 and 2 stand in for P - 1.

    Examples
    --------
    >>> default_counts(4)
    (0, 3, 9)
    >>> default_counts(1)
    (0, 1, 3)
    """
    return tuple(sorted({0, max(size - 1, 1), 2 * size + 1}))


def _ranks(mask):
    """Return the ranks in a bit mask as text: ``0, 2, 5``."""
    out, r = [], 0
    while mask:
        if mask & 1:
            out.append(str(r))
        mask >>= 1
        r += 1
    return ", ".join(out)


class _Buffer:
    """One rank's symbolic buffer: sorted breakpoints and one value per segment between them.

    A value is None (nothing wrote it) or ``(seen, dup, shift)``: the bit masks of the ranks whose
    input it holds at least once and at least twice, and the offset of that input's position (the
    element at position x holds the inputs' element x + shift).
    """

    __slots__ = ("bp", "vals")

    def __init__(self, count, pieces):
        self.bp, self.vals = [0], []
        for a, b, v in pieces:
            if b > self.bp[-1]:
                if a > self.bp[-1]:
                    self.bp.append(a)
                    self.vals.append(None)
                self.bp.append(b)
                self.vals.append(v)
        if count > self.bp[-1]:
            self.bp.append(count)
            self.vals.append(None)

    def read(self, a, b):
        """Return the pieces ``(start, stop, value)`` covering ``[a, b)``."""
        bp, vals = self.bp, self.vals
        i = bisect_right(bp, a) - 1
        out = []
        while bp[i] < b:
            out.append((max(a, bp[i]), min(b, bp[i + 1]), vals[i]))
            i += 1
        return out

    def _split(self, x):
        i = bisect_right(self.bp, x) - 1
        if self.bp[i] != x:
            self.bp.insert(i + 1, x)
            self.vals.insert(i + 1, self.vals[i])
            return i + 1
        return i

    def write(self, a, b, pieces):
        """Replace ``[a, b)`` with ``pieces`` (which cover it exactly)."""
        i = self._split(a)
        j = self._split(b)
        self.bp[i:j] = [p[0] for p in pieces]
        self.vals[i:j] = [p[2] for p in pieces]


def _overlay(xs, ys):
    """Yield ``(start, stop, x value, y value)`` over the common refinement of two piece lists of one range."""
    i = j = 0
    while i < len(xs) and j < len(ys):
        a = max(xs[i][0], ys[j][0])
        b = min(xs[i][1], ys[j][1])
        if b > a:
            yield a, b, xs[i][2], ys[j][2]
        if xs[i][1] <= ys[j][1]:
            i += 1
        else:
            j += 1


class _Case:
    """One collective at one (P, count, root): inputs, expected results and the text naming it."""

    def __init__(self, collective, size, count, root, bounds):
        self.collective, self.size, self.count, self.root, self.bounds = collective, size, count, root, bounds
        self.all = (1 << size) - 1
        self.text = f"{collective} P={size} count={count}" + (f" root={root}" if root is not None else "")

    def initial(self, rank):
        """Return rank ``rank``'s input pieces."""
        if self.collective == "allgather":
            b = self.bounds
            return [(b[rank], b[rank + 1], (1 << rank, 0, 0))]
        if self.collective == "broadcast" and rank != self.root:
            return []
        return [(0, self.count, (1 << rank, 0, 0))]

    def expected(self, rank):
        """Return ``[(start, stop, ranks mask)]``: the result regions of ``rank`` and whose inputs they hold."""
        n, b = self.count, self.bounds
        if self.collective == "allreduce":
            return [(0, n, self.all)]
        if self.collective == "reduce_scatter":
            return [(b[rank], b[rank + 1], self.all)]
        if self.collective == "allgather":
            return [(b[j], b[j + 1], 1 << j) for j in range(self.size)]
        if self.collective == "broadcast":
            return [(0, n, 1 << self.root)]
        return [(0, n, self.all)] if rank == self.root else []


def _build(builder, case):
    """Call ``builder`` for every rank of ``case``; return the schedules or raise a ``build`` violation."""
    out = []
    for r in range(case.size):
        if case.collective == "allgather":
            args = (r, case.size, case.bounds)
        elif case.collective in ("broadcast", "reduce"):
            args = (r, case.size, case.count, case.root)
        else:
            args = (r, case.size, case.count)
        try:
            s = builder(*args)
        except ScheduleViolation:
            raise
        except Exception as exc:  # the builder's own error, reported with the case that raised it
            raise ScheduleViolation("build", case.text, f"the builder raised {type(exc).__name__}: {exc}", r) from exc
        if not isinstance(s, Schedule) or (s.rank, s.size, s.count) != (r, case.size, case.count):
            got = (f"Schedule(rank={s.rank}, size={s.size}, count={s.count})" if isinstance(s, Schedule)
                   else type(s).__name__)
            raise ScheduleViolation("build", case.text, f"the builder returned {got}, expected the Schedule of "
                                    f"rank {r}, size {case.size}, count {case.count}", r)
        out.append(s)
    return out


def _match(schedules, case):
    """Pair every send with its receive; return ``(needs, out, into)`` or raise a violation.

    ``needs[r][i]`` lists ``(peer, peer's round)`` that rank r's round i waits for; ``out[r][i]`` and
    ``into[r][i]`` list its round's sends and receives (in the round's order) with the number of the
    message on its link and, for a receive, the matching send's round and region.
    """
    sends, recvs = {}, {}  # (src, dst) -> [(round, a, b)] / [(round, a, b, reduce, position in round)]
    for r, s in enumerate(schedules):
        for i, rd in enumerate(s.rounds):
            for p, a, b in rd.sends:
                lst = sends.get((r, p))
                if lst is None:
                    lst = sends[(r, p)] = []
                lst.append((i, a, b))
            for pos, (p, a, b, red) in enumerate(rd.recvs):
                lst = recvs.get((p, r))
                if lst is None:
                    lst = recvs[(p, r)] = []
                lst.append((i, a, b, red, pos))
    if len(sends) != len(recvs) or any(
            len(sends.get(key, ())) != len(got) or any(sb - sa != g[2] - g[1] for (_, sa, sb), g in zip(sends[key], got))
            for key, got in recvs.items()):
        _mismatch(sends, recvs, case)
    needs = [[[] for _ in s.rounds] for s in schedules]
    out = [[[] for _ in s.rounds] for s in schedules]
    into = [[[None] * len(rd.recvs) for rd in s.rounds] for s in schedules]
    for (src, dst), got in recvs.items():
        for k, ((i, sa, sb), (j, a, b, red, pos)) in enumerate(zip(sends[(src, dst)], got)):
            needs[src][i].append((dst, j))
            needs[dst][j].append((src, i))
            out[src][i].append((dst, k, sa, sb))
            into[dst][j][pos] = (src, k, a, b, red, i, sa, sb)
    return needs, out, into


def _mismatch(sends, recvs, case):
    """Raise the first ``length``, ``unmatched receive`` or ``unmatched send`` violation (by receiver, round, sender)."""
    for (src, dst), got in sorted(recvs.items(), key=lambda kv: (kv[0][1], kv[1][0][0], kv[0][0])):
        sent = sends.get((src, dst), [])
        for k, (i, a, b, _, _) in enumerate(got):
            if k >= len(sent):
                raise ScheduleViolation("unmatched receive", case.text, f"receive from rank {src} is its receive "
                                        f"number {k + 1} from that rank, which sends only {len(sent)} message(s) "
                                        f"to rank {dst}", dst, i, (a, b))
            j, sa, sb = sent[k]
            if sb - sa != b - a:
                raise ScheduleViolation("length", case.text, f"receives {b - a} elements from rank {src}, whose "
                                        f"matching send (its round {j}, region [{sa}, {sb})) has {sb - sa}",
                                        dst, i, (a, b))
    for (src, dst), sent in sorted(sends.items()):
        n = len(recvs.get((src, dst), []))
        if len(sent) > n:
            i, a, b = sent[n]
            raise ScheduleViolation("unmatched send", case.text, f"send to rank {dst} is its message number "
                                    f"{n + 1} to that rank, which receives only {n} from rank {src}", src, i, (a, b))
    raise AssertionError("_mismatch found no mismatch")


def _read_send(bufs, r, i, p, a, b, case):
    """Return rank r's message to p (sent in its round i from ``[a, b)``) as pieces; refuse unwritten data."""
    pieces = bufs[r].read(a, b)
    for pa, pb, v in pieces:
        if v is None:
            raise ScheduleViolation("read before write", case.text, f"sends [{pa}, {pb}) to rank {p}, which "
                                    "neither its input nor a message wrote", r, i, (a, b))
    return a, pieces


def _deadlock(schedules, pos, needs, case):
    """Raise the ``deadlock`` violation: follow who waits on whom from the first waiting rank."""
    r = next(r for r in range(len(schedules)) if pos[r] < len(schedules[r].rounds))
    chain, seen = [], set()
    while r not in seen:
        seen.add(r)
        peer, at = next((p, j) for p, j in needs[r][pos[r]] if pos[p] != j)
        chain.append(f"rank {r} in its round {pos[r]} waits for rank {peer} to reach its round {at}"
                     + (" (it has finished)" if pos[peer] >= len(schedules[peer].rounds)
                        else f" (it is in round {pos[peer]})"))
        if pos[peer] >= len(schedules[peer].rounds):
            break
        r = peer
    first = next(r for r in range(len(schedules)) if pos[r] < len(schedules[r].rounds))
    raise ScheduleViolation("deadlock", case.text, "; ".join(chain), first, pos[first])


def check(schedules, collective="allreduce", root=None, bounds=None):
    """Check one set of schedules (``schedules[r]`` is rank r's) symbolically; raise the first violation.

    Parameters
    ----------
    schedules : list of Schedule
        One per rank, all of one collective, P and count.
    collective : str
        One of ``allreduce``, ``reduce_scatter``, ``allgather``, ``broadcast``, ``reduce``.
    root : int, optional
        The root of a broadcast or reduce.
    bounds : sequence of int, optional
        The all-gather's block boundaries (default ``chunk_bounds(count, P)``; the reduce-scatter's
        chunks are always those).

    Raises
    ------
    ScheduleViolation
        The first violation, as the module describes.

    Examples
    --------
    Ring all-reduce passes; a ring whose rank 1 forgets its first reduce-scatter round does not:

    >>> from collectives.schedules.ring import ring_allreduce
    >>> check([ring_allreduce(r, 3, 7) for r in range(3)])
    >>> s = [ring_allreduce(r, 3, 7) for r in range(3)]
    >>> (peer, a, b, _), = s[1].rounds[0].recvs
    >>> s[1].rounds[0].recvs = ((peer, a, b, False),)  # a copy where a reduction belongs
    >>> check(s)
    Traceback (most recent call last):
    ...
    collectives.errors.ScheduleViolation: allreduce P=3 count=7: rank 0 after its final round, region [5, 7): contributions of rank(s) 1 missing
    """
    size = len(schedules)
    count = schedules[0].count if schedules else 0
    if bounds is None:
        bounds = chunk_bounds(count, max(size, 1))
    case = _Case(collective, size, count, root, tuple(bounds))
    _run(schedules, case)


def _run(schedules, case):
    for r, s in enumerate(schedules):
        if (s.rank, s.size, s.count) != (r, case.size, case.count):
            raise ScheduleViolation("build", case.text, f"schedule {r} is {s!r}, expected rank {r}, size "
                                    f"{case.size}, count {case.count}", r)
    needs, out, into = _match(schedules, case)
    bufs = [_Buffer(case.count, case.initial(r)) for r in range(case.size)]
    pos = [0] * case.size
    live = [r for r in range(case.size) if schedules[r].rounds]
    msgs = {}  # (src, dst, k) -> (sender's start, pieces): read while the sender is in the round posting it
    while live:
        ready = [r for r in live if all(pos[p] == j for p, j in needs[r][pos[r]])]
        if not ready:
            _deadlock(schedules, pos, needs, case)
        for r in ready:  # every message of a ready round is read before any ready rank applies its receives
            i = pos[r]
            for p, k, a, b in out[r][i]:
                if (r, p, k) not in msgs:
                    msgs[(r, p, k)] = _read_send(bufs, r, i, p, a, b, case)
            for p, k, _, _, _, j, sa, sb in into[r][i]:
                if (p, r, k) not in msgs:
                    msgs[(p, r, k)] = _read_send(bufs, p, j, r, sa, sb, case)
        for r in ready:
            for p, k, a, b, red, _, _, _ in into[r][pos[r]]:
                sa, pieces = msgs.pop((p, r, k))
                moved = [(pa - sa + a, pb - sa + a, (v[0], v[1], v[2] + sa - a)) for pa, pb, v in pieces]
                buf = bufs[r]
                if len(moved) == 1:  # the common case: one value arriving over one whole segment
                    i = bisect_right(buf.bp, a) - 1
                    if buf.bp[i] == a and buf.bp[i + 1] == b:
                        mine, theirs = buf.vals[i], moved[0][2]
                        if not red:
                            buf.vals[i] = theirs
                            continue
                        if mine is not None and mine[2] == theirs[2]:
                            buf.vals[i] = (mine[0] | theirs[0], mine[1] | theirs[1] | (mine[0] & theirs[0]), mine[2])
                            continue
                if not red:
                    buf.write(a, b, moved)
                    continue
                merged = []
                for pa, pb, mine, theirs in _overlay(buf.read(a, b), moved):
                    if mine is None:
                        raise ScheduleViolation("read before write", case.text, f"reduces into [{pa}, {pb}), which "
                                                "neither its input nor a message wrote", r, pos[r], (a, b))
                    if mine[2] != theirs[2]:
                        raise ScheduleViolation("misplaced", case.text, f"reduces inputs' elements from position "
                                                f"x + {theirs[2]} into [{pa}, {pb}), which holds those of x + "
                                                f"{mine[2]}", r, pos[r], (a, b))
                    merged.append((pa, pb, (mine[0] | theirs[0], mine[1] | theirs[1] | (mine[0] & theirs[0]),
                                            mine[2])))
                buf.write(a, b, merged)
        for r in ready:
            pos[r] += 1
        live = [r for r in live if pos[r] < len(schedules[r].rounds)]
    for r in range(case.size):
        for a, b, want in case.expected(r):
            if b <= a:
                continue
            for pa, pb, v in bufs[r].read(a, b):
                if v is None:
                    raise ScheduleViolation("missing", case.text, f"no message wrote [{pa}, {pb}); it should hold "
                                            f"the contributions of ranks {_ranks(want)}", r, None, (pa, pb))
                seen, dup, shift = v
                if want & ~seen:
                    raise ScheduleViolation("missing", case.text, f"contributions of rank(s) {_ranks(want & ~seen)} "
                                            "missing", r, None, (pa, pb))
                if dup or seen & ~want:
                    extra = dup | (seen & ~want)
                    raise ScheduleViolation("doubled", case.text, f"contributions of rank(s) {_ranks(extra)} "
                                            + ("counted more than once" if dup else "that do not belong here"),
                                            r, None, (pa, pb))
                if shift:
                    raise ScheduleViolation("misplaced", case.text, f"holds the inputs' elements x + {shift}, not x",
                                            r, None, (pa, pb))


def verify(builder, collective="allreduce", *, sizes=range(1, 65), counts=None, roots=None):
    """Check ``builder`` symbolically for every P in ``sizes`` and every count; raise the first violation.

    Parameters
    ----------
    builder : callable
        The algorithm: called as :data:`COLLECTIVE_ARGUMENTS` says for ``collective`` and returning
        that rank's :class:`~collectives.schedules.schedule.Schedule`.
    collective : str
        One of ``allreduce``, ``reduce_scatter``, ``allgather``, ``broadcast``, ``reduce``.
    sizes : iterable of int
        The rank counts P (default 1 to 64).
    counts : iterable of int or callable, optional
        The element counts, or ``counts(P) -> counts``; default :func:`default_counts` (0, P - 1,
        2P + 1: zero, below P, and not divisible by P).
    roots : iterable of int or callable, optional
        Roots of a broadcast or reduce (default ``0`` and ``P - 1``).

    Returns
    -------
    dict
        ``cases`` (schedules sets checked) and ``seconds`` (time taken).

    Raises
    ------
    ScheduleViolation
        The first violation (rank, round, region, the contributions missing or doubled).
    ValueError
        ``collective`` is unknown.

    Examples
    --------
    >>> from collectives.schedules.ring import ring_allreduce, ring_reduce_scatter
    >>> verify(ring_allreduce, sizes=range(1, 9))["cases"]  # counts 0, P - 1 and 2P + 1 at each P
    24
    >>> verify(ring_reduce_scatter, "allreduce", sizes=[3], counts=[6])
    Traceback (most recent call last):
    ...
    collectives.errors.ScheduleViolation: allreduce P=3 count=6: rank 0 after its final round, region [2, 4): contributions of rank(s) 1 missing
    """
    if collective not in COLLECTIVE_ARGUMENTS:
        raise ValueError(f"unknown collective {collective!r}: expected one of {', '.join(COLLECTIVE_ARGUMENTS)}")
    t0, cases = time.perf_counter(), 0
    for size in sizes:
        cs = counts(size) if callable(counts) else (default_counts(size) if counts is None else counts)
        rs = [None]
        if collective in ("broadcast", "reduce"):
            rs = roots(size) if callable(roots) else (sorted({0, size - 1}) if roots is None else roots)
        for count in cs:
            for root in rs:
                case = _Case(collective, size, count, root, chunk_bounds(count, size))
                _run(_build(builder, case), case)
                cases += 1
    return {"cases": cases, "seconds": time.perf_counter() - t0}

