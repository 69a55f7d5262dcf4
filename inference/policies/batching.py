"""Dynamic batching: a maximum batch size and a maximum wait, as production model servers offer.

NVIDIA Triton's dynamic batcher (``max_batch_size``, ``max_queue_delay_microseconds``) and Clipper's
batching (Crankshaw et al., "Clipper", NSDI 2017, section 4.3) hold requests briefly so that one
forward serves several of them. :class:`DynamicBatcher` releases a batch as soon as ``max_batch``
requests wait, or when the oldest waiting request has waited ``max_wait_s``; retried requests go to
the head of the queue so a failure does not send them to the back of the line. Batches form here,
at the front, not in the replicas' inboxes: the front takes a batch only when a replica has room for
it (:class:`inference.front.Front`), so under load requests wait in this queue and merge into full
batches, as in Triton, whose scheduler hands a batch to a model instance only when it is free.
"""
import collections

__all__ = ["DynamicBatcher"]


class DynamicBatcher:
    """FIFO of waiting requests cut into batches by size and age.

    Parameters
    ----------
    max_batch : int
        Largest batch (requests), >= 1.
    max_wait_s : float
        Longest time (seconds, >= 0) the oldest request waits for company; 0 releases whatever
        is waiting at once.

    Raises
    ------
    ValueError
        Naming the argument out of range.
    """

    __slots__ = ("max_batch", "max_wait_s", "size", "_queue")

    def __init__(self, max_batch, max_wait_s):
        if int(max_batch) < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch!r}")
        if not max_wait_s >= 0:
            raise ValueError(f"max_wait_s must be >= 0 seconds, got {max_wait_s!r}")
        self.max_batch, self.max_wait_s = int(max_batch), float(max_wait_s)
        self.size = self.max_batch  # the batch size in force (<= max_batch; a latency objective adapts it)
        self._queue = collections.deque()  # (enqueue time s, request)

    def __len__(self):
        return len(self._queue)

    def add(self, request, now, front=False):
        """Queue ``request`` at time ``now`` (seconds); ``front=True`` puts it first (a retry)."""
        if front:
            self._queue.appendleft((now, request))
        else:
            self._queue.append((now, request))

    def deadline(self):
        """Return when the oldest waiting request's wait ends (seconds), or None when empty."""
        return self._queue[0][0] + self.max_wait_s if self._queue else None

    def due(self, now, force=False):
        """Return whether :meth:`take` at ``now`` would return a batch."""
        q = self._queue
        return bool(q) and (force or len(q) >= self.size or now >= q[0][0] + self.max_wait_s)

    def take(self, now, force=False, limit=None):
        """Return the next batch (list of requests) if one is due at ``now``, else an empty list.

        A batch is due when :attr:`size` requests wait, when the oldest has waited ``max_wait_s``,
        or with ``force`` (draining at shutdown) whenever anything waits. The caller asks only when a
        replica can take the batch, so while every replica is busy requests keep merging here.
        ``limit`` caps the batch below :attr:`size` (filling a batch some requests left).
        """
        q = self._queue
        if not self.due(now, force):
            return []
        return [q.popleft()[1] for _ in range(min(self.size if limit is None else limit, len(q)))]

    def drain(self):
        """Remove and return every waiting request."""
        out = [r for _, r in self._queue]
        self._queue.clear()
        return out
