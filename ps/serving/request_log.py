"""A server's record of its workers' requests: what makes a resent request count once, and the faults
injected into its replies.

:class:`RequestLog` keeps, per worker, the ids of its last pushes with a CRC-32 of their data (a
resend is told from an id reused with other data) and its last replies (a resent pull is answered
with the reply it was given). Bounded memory: :data:`KEEP_PUSH_IDS` ids and :data:`KEEP_REPLIES`
replies (one shard copy each) per worker, whatever the run's length. :class:`ReplyFaults` drops or
delays a chosen fraction of first replies, deterministically per request, for the tests and studies
of retries (ps-lite's resend and de-duplication; Li et al., OSDI 2014, section 4.3).
"""
import collections
import time
import zlib

__all__ = ["KEEP_REPLIES", "KEEP_PUSH_IDS", "RequestLog", "ReplyFaults"]

#: Replies a server keeps per worker to answer a repeated pull (its last ones).
KEEP_REPLIES = 2
#: Push request ids a server remembers per worker, with a CRC-32 of each push's data.
KEEP_PUSH_IDS = 8


class RequestLog:
    """Push ids and kept replies of every worker of one server.

    Parameters
    ----------
    n_workers : int

    Examples
    --------
    >>> import numpy as np
    >>> log = RequestLog(1)
    >>> log.push(0, 1, np.ones(2))
    'new'
    >>> log.remember(0, 1, np.ones(2))  # applied
    >>> log.push(0, 1, np.ones(2)), log.push(0, 1, np.zeros(2))
    ('repeat', 'reused')
    >>> log.keep(0, 2, "reply"); log.kept(0, 2), log.kept(0, 3)
    ('reply', None)
    """

    def __init__(self, n_workers):
        self._ids = [collections.OrderedDict() for _ in range(n_workers)]      # rid -> CRC-32
        self._replies = [collections.OrderedDict() for _ in range(n_workers)]  # rid -> reply

    def push(self, w, rid, data):
        """Classify push ``rid`` of worker ``w``: ``"new"``, ``"repeat"`` (a resend, or an id older than
        every one kept) or ``"reused"`` (a kept id with other data). Ids of 0 are never remembered."""
        seen = self._ids[w]
        crc = zlib.crc32(data.tobytes()) if data is not None else 0
        if rid and rid in seen:
            return "repeat" if seen[rid] == crc else "reused"
        if rid and seen and rid < next(iter(seen)):
            return "repeat"
        return "new"

    def remember(self, w, rid, data):
        """Remember applied push ``rid`` of worker ``w`` (the oldest id goes past :data:`KEEP_PUSH_IDS`)."""
        if rid:
            seen = self._ids[w]
            seen[rid] = zlib.crc32(data.tobytes()) if data is not None else 0
            while len(seen) > KEEP_PUSH_IDS:
                seen.popitem(last=False)

    def keep(self, w, rid, reply):
        """Keep ``reply`` to pull ``rid`` of worker ``w`` (the oldest goes past :data:`KEEP_REPLIES`)."""
        if rid:
            kept = self._replies[w]
            kept[rid] = reply
            while len(kept) > KEEP_REPLIES:
                kept.popitem(last=False)

    def kept(self, w, rid):
        """Return the reply kept for pull ``rid`` of worker ``w``, or None."""
        return self._replies[w].get(rid) if rid else None


class ReplyFaults:
    """Drop or delay a fraction of a server's first replies (fault injection), and hold the late ones.

    Parameters
    ----------
    drop, late : float
        Fractions of first replies dropped and sent ``late_s`` seconds late.
    late_s : float
    salt : int
        Mixed into the per-request draw (the server's index and the run's seed).

    Examples
    --------
    >>> f = ReplyFaults(0.5, 0.0, 0.0, 0)
    >>> sorted({f.draw(0, rid) for rid in range(1, 50)}, key=str)
    [None, 'drop']
    """

    def __init__(self, drop, late, late_s, salt):
        self.drop, self.late, self.late_s, self.salt = drop, late, late_s, salt
        self.held = []  # (due time, worker, reply)

    def draw(self, w, rid):
        """The fault of the first reply to request ``rid`` of ``w``: ``"drop"``, ``"late"`` or None."""
        if not (self.drop or self.late):
            return None
        u = ((w + 1) * 1_000_003 + rid * 7_919 + self.salt) % 10_007 / 10_007
        return "drop" if u < self.drop else "late" if u < self.drop + self.late else None

    def hold(self, w, reply):
        """Hold ``reply`` to worker ``w`` for ``late_s`` seconds."""
        self.held.append((time.monotonic() + self.late_s, w, reply))

    def waiting(self):
        """Return the workers a held reply is for."""
        return {w for _, w, _ in self.held}

    def due(self, now, only=None):
        """Return and forget the held ``(worker, reply)`` pairs due at ``now``, or every one of ``only``."""
        out, keep = [], []
        for due, w, reply in self.held:
            if (only is not None and w == only) or (only is None and due <= now):
                out.append((w, reply))
            else:
                keep.append((due, w, reply))
        self.held = keep
        return out
