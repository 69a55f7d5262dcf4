"""The schedule representation shared by every hand-made collective (run by :mod:`collectives.engine.executor`).

An algorithm is a pure function ``(rank, size, count, ...) -> Schedule``. A schedule is a list of
rounds. Regions are ``[start, stop)`` element ranges of one flat *work* buffer (the output, in the
accumulation dtype). Messages of zero elements are never scheduled: both sides derive the same sizes
from the same rule, so both skip them.

What a round means (the one definition; the executor in every mode and the simulator run the
compiled form of it, :meth:`Schedule.program`, so they cannot disagree):

1. every send carries the value its region holds at the start of the round;
2. once every message of the round has arrived, the receives are applied in the order they are
   listed: a copying receive (``reduce=False``) stores its message in its region, a reducing
   receive (``reduce=True``) combines its message into the region's current value with the op
   (the message first when the peer's rank is below this rank's, so both sides of an exchange
   compute bitwise the same value).

So several reducing receives into one region in one round all count, receives into overlapping
regions apply in their listed order, and a round may send a region one of its own receives writes
(the send carries the old value). A rank's i-th message to a peer matches that peer's i-th receive
from it (MPI's non-overtaking rule on one communicator and tag); matched messages must have the same
length. Regions outside the buffer and peers outside the communicator are refused when the schedule
is built (``ValueError`` naming the rank, round and region); whether a whole algorithm computes its
collective is checked symbolically by :func:`collectives.schedules.verify.verify`.

The same schedule drives blocking execution (:func:`collectives.engine.executor.execute`), the
non-blocking :class:`collectives.engine.request.Request`, byte and message accounting, and the
simulator (:func:`collectives.model.simulate.replay`) behind the cost model.
"""
import functools
from numbers import Integral

__all__ = ["Round", "Schedule", "chunk_bounds", "segmented", "apply_receive", "SEGMENT_ELEMENTS"]

#: Messages longer than this many elements (1 MiB of float32) are sent in segments of at most this
#: size, each reduced as soon as it arrives (see :func:`segmented`).
SEGMENT_ELEMENTS = 1 << 18


@functools.lru_cache(maxsize=1024)
def chunk_bounds(count, parts):
    """Return the ``parts + 1`` boundaries that split ``count`` elements as ``numpy.array_split`` does.

    The first ``count % parts`` chunks hold ``count // parts + 1`` elements, the rest
    ``count // parts``; for example 73 elements over 4 parts give chunks of 19, 18, 18, 18.

    Parameters
    ----------
    count : int
        Number of elements, >= 0.
    parts : int
        Number of chunks, >= 1.

    Returns
    -------
    tuple of int
        ``bounds`` with ``bounds[0] == 0`` and ``bounds[parts] == count``; chunk ``i`` is
        ``[bounds[i], bounds[i + 1])``.

    Examples
    --------
    >>> chunk_bounds(73, 4)
    (0, 19, 37, 55, 73)
    >>> chunk_bounds(2, 4)  # more parts than elements: empty chunks at the end
    (0, 1, 2, 2, 2)
    """
    q, r = divmod(count, parts)
    return tuple(i * q + min(i, r) for i in range(parts + 1))


class Round:
    """One round of a schedule: sends, receives and the reductions that follow them.

    Sends carry their regions' values at the start of the round; the receives are applied after
    every message has arrived, in the order listed (see the module's definition of a round).

    Parameters
    ----------
    sends : sequence of (int, int, int)
        ``(peer, start, stop)``: send ``work[start:stop]`` to ``peer``.
    recvs : sequence of (int, int, int, bool)
        ``(peer, start, stop, reduce)``: receive ``stop - start`` elements from ``peer``; with
        ``reduce`` combine them into ``work[start:stop]`` with the op, else store them there.
    phase : str
        Name of the algorithm phase ("reduce-scatter", "all-gather", ...), for traces and errors.

    Examples
    --------
    Empty regions are dropped, so both sides skip a zero-element message:

    >>> Round([(1, 0, 2)], [(1, 2, 4, True), (1, 4, 4, False)], "ring")
    Round(phase='ring', sends=((1, 0, 2),), recvs=((1, 2, 4, True),))
    """

    __slots__ = ("sends", "recvs", "phase")

    def __init__(self, sends=(), recvs=(), phase=""):
        self.sends = tuple((p, a, b) for p, a, b in sends if b > a)
        self.recvs = tuple((p, a, b, bool(red)) for p, a, b, red in recvs if b > a)
        self.phase = phase

    def __repr__(self):
        return f"Round(phase={self.phase!r}, sends={self.sends}, recvs={self.recvs})"


class Schedule:
    """A per-rank schedule: the rounds one rank executes for one collective.

    Parameters
    ----------
    algorithm : str
        Registry name of the algorithm that built it.
    rank, size : int
        This rank and the communicator size.
    count : int
        Elements in the flat work buffer.
    rounds : list of Round
        Empty rounds are dropped.

    Attributes
    ----------
    scratch : int
        Elements of scratch space needed (the largest total of the receives of one round that land
        in scratch: reducing receives, and copying receives whose region a send or another receive
        of the round touches).
    elements_sent, messages : int
        Totals over all rounds, for byte accounting (multiply by the item size for bytes).

    Raises
    ------
    ValueError
        A region lies outside ``[0, count)`` or a peer outside ``[0, size)``; the message names the
        rank, the round and the region.

    Examples
    --------
    >>> s = Schedule("demo", 0, 2, 4, [Round([(1, 0, 2)], [(1, 2, 4, True)]), Round()])
    >>> s  # the empty round is dropped
    Schedule('demo', rank=0, size=2, count=4, rounds=1, messages=1, elements_sent=2)
    >>> s.scratch, s.links()
    (2, {(0, 1): 2})
    """

    __slots__ = ("algorithm", "rank", "size", "count", "rounds", "_scratch", "elements_sent",
                 "messages", "_program")

    def __init__(self, algorithm, rank, size, count, rounds):
        self.algorithm = algorithm
        self.rank = rank
        self.size = size
        self.count = count
        self.rounds = [r for r in rounds if r.sends or r.recvs]
        for i, r in enumerate(self.rounds):
            for p, a, b in r.sends:
                if not (0 <= a and b <= count and (type(p) is int or isinstance(p, Integral)) and 0 <= p < size):
                    _refuse(rank, size, count, i, r.phase, "send", p, a, b)
            for p, a, b, _ in r.recvs:
                if not (0 <= a and b <= count and (type(p) is int or isinstance(p, Integral)) and 0 <= p < size):
                    _refuse(rank, size, count, i, r.phase, "receive", p, a, b)
        self._scratch = None  # computed when first asked for (the simulator at P = 4096 never asks)
        self.elements_sent = sum(b - a for r in self.rounds for _, a, b in r.sends)
        self.messages = sum(len(r.sends) for r in self.rounds)
        self._program = None

    @property
    def scratch(self):
        """Elements of scratch space the executor needs for this schedule (see the class's Attributes)."""
        if self._scratch is None:
            self._scratch = max([sum(b - a for (_, a, b, red), st in zip(r.recvs, _staged(r)) if red or st)
                                 for r in self.rounds] or [0])
        return self._scratch

    def links(self):
        """Return ``{(src, dst): elements}`` summed over this rank's sends."""
        out = {}
        for r in self.rounds:
            for p, a, b in r.sends:
                out[(self.rank, p)] = out.get((self.rank, p), 0) + b - a
        return out

    def program(self, from_input=False, needed=None):
        """Return the rounds compiled into slices (cached): the executor's input.

        Each round is ``(sends, recvs)`` with sends ``(peer, slice, from_input)`` and receives
        ``(peer, slice, scratch slice or None, from_input, low, reduce)``, applied in order by
        :func:`apply_receive`. A receive with no scratch slice lands in its region directly (a copy
        nothing else in its round touches); the others land in scratch. ``low`` (the peer's rank is
        below this rank's) puts the received operand first, so both sides of an exchange combine in
        the same order: ``min``/``max`` of +0.0 and -0.0 (and of two NaN payloads) then agree bitwise.

        Parameters
        ----------
        from_input : bool
            Compile for a separate, read-only *input* buffer: a region the schedule has not written
            yet is sent straight from the input, and its first reduction reads the input
            (``ufunc(input, received, out=work)``), so the input never has to be copied into the work
            buffer first. A region counts as written from the receive that writes it on, in the
            round's order, so a second reducing receive into a region reads the first one's result.
            Regions still unwritten at the end are copied over (``final`` below).
        needed : (int, int), optional
            With ``from_input``: only this element range of the result is wanted (default all).

        Returns
        -------
        list, or (list, list of slice) with ``from_input``
            The rounds; with ``from_input`` also the ``final`` slices to copy from the input, or None
            when some region is partly written before it is read (use a copied input instead).
        """
        key = (from_input, needed)
        if self._program is None:
            self._program = {}
        if key not in self._program:
            self._program[key] = self._compile(from_input, needed)
        return self._program[key]

    def _compile(self, from_input, needed):
        written = []  # disjoint [a, b) intervals of the work buffer that hold schedule results

        def state(a, b):  # 0: untouched, 1: written, None: partly written
            if not from_input:
                return 1
            cover = sum(max(0, min(b, wb) - max(a, wa)) for wa, wb in written)
            return 0 if cover == 0 else (1 if cover == b - a else None)

        def mark(a, b):  # add [a, b) to the disjoint, sorted intervals in ``written``
            if not from_input:
                return
            keep = [(wa, wb) for wa, wb in written if wb < a or wa > b]
            for wa, wb in written:
                if not (wb < a or wa > b):
                    a, b = min(a, wa), max(b, wb)
            written[:] = sorted(keep + [(a, b)])

        prog = []
        for r in self.rounds:
            sends = []
            for p, a, b in r.sends:
                st = state(a, b)
                if st is None:
                    return None
                sends.append((p, slice(a, b), st == 0))
            recvs, off = [], 0
            for (p, a, b, red), staged in zip(r.recvs, _staged(r)):
                scr, first = None, False
                if red or staged:
                    scr = slice(off, off + b - a)
                    off += b - a
                if red:
                    st = state(a, b)
                    if st is None:
                        return None
                    first = st == 0
                recvs.append((p, slice(a, b), scr, first, p < self.rank, red))
                mark(a, b)  # applied in order: the next receive into this region reads this one's result
            prog.append((tuple(sends), tuple(recvs)))
        if not from_input:
            return prog
        lo, hi = needed if needed is not None else (0, self.count)
        final, pos = [], lo
        for wa, wb in sorted(written) + [(hi, hi)]:
            if wa > pos:
                final.append(slice(pos, min(wa, hi)))
            pos = max(pos, wb)
            if pos >= hi:
                break
        return prog, [f for f in final if f.stop > f.start]

    def __repr__(self):
        return (f"Schedule({self.algorithm!r}, rank={self.rank}, size={self.size}, count={self.count}, "
                f"rounds={len(self.rounds)}, messages={self.messages}, elements_sent={self.elements_sent})")


def _refuse(rank, size, count, index, phase, what, peer, a, b):
    """Raise the ``ValueError`` naming rank, round and region of a message outside the buffer or the communicator."""
    if not 0 <= a < b <= count:
        raise ValueError(f"rank {rank} round {index} ({phase}): {what} region [{a}, {b}) lies outside the "
                         f"buffer of {count} elements")
    if not isinstance(peer, Integral) or not 0 <= peer < size:
        raise ValueError(f"rank {rank} round {index} ({phase}): {what} region [{a}, {b}) names peer {peer!r}, "
                         f"not a rank of 0..{size - 1}")


def _staged(rnd):
    """Return, per receive of ``rnd``, whether a copying receive must land in scratch.

    A copying receive lands in its region directly unless a send or another receive of the round
    touches that region: the send must carry the old value, and overlapping receives must apply in
    their listed order, which messages landing in place would not guarantee.
    """
    recvs = rnd.recvs
    if len(recvs) == 1:  # the common round: one receive, touched at most by the sends
        _, a, b, red = recvs[0]
        return [not red and any(sa < b and a < sb for _, sa, sb in rnd.sends)]
    out = []
    for i, (_, a, b, red) in enumerate(recvs):
        if red:
            out.append(False)
            continue
        touched = any(sa < b and a < sb for _, sa, sb in rnd.sends) or any(
            j != i and ra < b and a < rb for j, (_, ra, rb, _) in enumerate(rnd.recvs))
        out.append(touched)
    return out


def apply_receive(recv, message, work, inp, ufunc):
    """Apply one compiled receive of :meth:`Schedule.program` whose message has arrived.

    The one place a round's receives take effect, for the executor and the simulator alike.

    Parameters
    ----------
    recv : tuple
        ``(peer, slice, scratch slice or None, from_input, low, reduce)`` from :meth:`Schedule.program`.
    message : ndarray
        The received elements (the scratch slice's view; unused when the receive landed in place).
    work : ndarray
        The work buffer.
    inp : ndarray or None
        The separate input (``from_input`` programs), read by a first reduction.
    ufunc : ufunc or None
        The reduction.

    Examples
    --------
    >>> import numpy as np
    >>> s = Schedule("demo", 1, 3, 2, [Round([], [(0, 0, 2, True), (2, 0, 2, True)])])
    >>> work, scratch = np.array([1, 1]), np.array([10, 10, 100, 100])
    >>> for rv in s.program()[0][1]:
    ...     apply_receive(rv, scratch[rv[2]], work, None, np.add)
    >>> work  # both reducing receives count
    array([111, 111])
    """
    _, rsl, scr, first, low, red = recv
    if scr is None:
        return
    target = work[rsl]
    if not red:
        target[...] = message
        return
    mine = inp[rsl] if first else target
    if low:
        ufunc(message, mine, out=target)
    else:
        ufunc(mine, message, out=target)


def segmented(schedule, elements=SEGMENT_ELEMENTS):
    """Return ``schedule`` with each long message of its one-send, one-receive rounds cut into segments.

    A round that sends one region and receives one becomes ``k`` consecutive rounds: in round ``j``
    the ``j``-th segment of the send and of the receive move, and a reducing receive's segment is
    combined at once, while it is still in the cache, instead of after the whole block has landed
    (the chunked rings of NCCL; pipelined all-reduce, Patarasuk and Yuan 2009, section 4). Each
    message is cut by its own length alone (``ceil(length / elements)`` pieces, split as
    :func:`chunk_bounds` does), so the sender and the receiver of a message cut it alike; a send and
    a receive of different lengths may get different numbers of pieces, and the extra rounds then
    carry only the longer one. Rounds with several sends or receives are kept whole. Nothing is
    reordered within a message, so results are bitwise those of the unsegmented schedule.

    Measured on one 2-core machine, P = 2 and 4, float32 (``ring`` and ``rabenseifner``, segments
    interleaved with the whole-block schedule): 0.87-0.95x the time from 8 MiB up with 1 MiB
    segments, no change at 1-4 MiB, and 1.2x slower with 64 KiB segments (per-message cost).

    Parameters
    ----------
    schedule : Schedule
    elements : int
        Longest segment (elements), >= 1.

    Returns
    -------
    Schedule
        ``schedule`` itself when no message is longer than ``elements``.

    Examples
    --------
    >>> from collectives.schedules.ring import ring_allreduce
    >>> s = ring_allreduce(0, 2, 10)  # two rounds of 5-element messages
    >>> len(s.rounds), len(segmented(s, elements=2).rounds)  # each cut into 2 + 2 + 1
    (2, 6)
    >>> segmented(s) is s  # nothing longer than SEGMENT_ELEMENTS
    True
    """
    if not any(len(r.sends) == 1 and len(r.recvs) == 1 and max(r.sends[0][2] - r.sends[0][1],
                                                                r.recvs[0][2] - r.recvs[0][1]) > elements
               for r in schedule.rounds):
        return schedule
    rounds = []
    for r in schedule.rounds:
        if len(r.sends) != 1 or len(r.recvs) != 1:
            rounds.append(r)
            continue
        (dst, sa, sb), (src, ra, rb, red) = r.sends[0], r.recvs[0]
        ks, kr = -(-(sb - sa) // elements), -(-(rb - ra) // elements)
        bs, br = chunk_bounds(sb - sa, ks), chunk_bounds(rb - ra, kr)
        for j in range(max(ks, kr)):
            send = [(dst, sa + bs[j], sa + bs[j + 1])] if j < ks else []
            recv = [(src, ra + br[j], ra + br[j + 1], red)] if j < kr else []
            rounds.append(Round(send, recv, r.phase))
    return Schedule(schedule.algorithm, schedule.rank, schedule.size, schedule.count, rounds)
