"""The worker side of the parameter server: push gradient shards, pull parameter shards.

A worker at clock ``c`` pushes gradient ``c`` (each server gets its shard) and pulls the parameters
for clock ``c + 1``; each server answers the pull once its consistency model allows
(:mod:`ps.server`). Every wait polls with a deadline, so a vanished server shows up as
:class:`ps.protocol.PSTimeout` instead of a hang.
"""
import time

import numpy as np

from collectives.engine import trace
from ps.protocol import Backoff, Msg, PSError, PSTimeout, probe, receive, send, wait_all
from ps.sharding import shard_offsets

__all__ = ["Client"]


class Client:
    """Push/pull endpoint of one worker.

    Parameters
    ----------
    comm : MPI.Comm
        The run's duplicated communicator.
    worker : int
        This worker's index ``0 .. W - 1``.
    server_ranks, worker_ranks : sequence of int
        Ranks of the servers (in shard order) and of the workers (in worker-index order).
    n_params : int
        Length of the flat parameter vector (elements).
    dtype : numpy.dtype
        Parameter dtype on the wire (float32 or float64).
    reply_timeout : float
        Longest wait for a server's answer (seconds).

    Raises
    ------
    ValueError
        When ``worker`` is out of range or ``reply_timeout`` is not positive.
    """

    def __init__(self, comm, worker, server_ranks, worker_ranks, n_params, dtype, reply_timeout):
        if not 0 <= worker < len(worker_ranks):
            raise ValueError(f"worker must be in [0, {len(worker_ranks)}), got {worker}")
        if not reply_timeout > 0:
            raise ValueError(f"reply_timeout must be > 0 seconds, got {reply_timeout}")
        self.comm, self.worker = comm, int(worker)
        self.server_ranks, self.worker_ranks = list(server_ranks), list(worker_ranks)
        self.dtype, self.reply_timeout = np.dtype(dtype), float(reply_timeout)
        self.offsets = shard_offsets(int(n_params), len(self.server_ranks))
        self.wait_seconds = 0.0      # time spent waiting for pull answers (seconds)
        self.last_staleness = []     # staleness reported by each server for the last pull (clocks)
        self._pushes = []

    def join(self):
        """Fetch the current parameters and the clock to start (or resume) from.

        Returns
        -------
        params : ndarray, shape (n_params,)
            Host copy of the parameters.
        clock : int
            Smallest resume clock reported by the servers (0 on a fresh start).
        stopped : bool
            True when a server reports the budget already spent (a finished run resumed).
        """
        params = np.empty(int(self.offsets[-1]), dtype=self.dtype)
        replies = self._request(Msg.PULL, -1, params)
        stopped = any(h[0] == Msg.STOP for h, _ in replies.values())
        return params, min(int(h[2]) for h, _ in replies.values()), stopped

    def push(self, clock, grad):
        """Send gradient ``clock`` to the servers, each its shard (non-blocking).

        Parameters
        ----------
        clock : int
            The worker's clock of this gradient.
        grad : ndarray, shape (n_params,)
            Host gradient, already weighted; it must stay unchanged until the next :meth:`pull`.

        Raises
        ------
        TypeError
            When ``grad`` has another dtype than the parameters.
        ValueError
            When ``grad`` is not a 1-D array of ``n_params`` elements.
        """
        if grad.dtype != self.dtype:
            raise TypeError(f"grad must have dtype {self.dtype}, got {grad.dtype}")
        if grad.shape != (int(self.offsets[-1]),):
            raise ValueError(f"grad must have shape ({int(self.offsets[-1])},), got {grad.shape}")
        grad = np.ascontiguousarray(grad)
        with trace.span("push", "ps", {"clock": int(clock)}):
            for s, rank in enumerate(self.server_ranks):
                self._pushes += send(self.comm, rank, Msg.PUSH, self.worker, clock,
                                     grad[self.offsets[s]:self.offsets[s + 1]])

    def pull(self, clock, out):
        """Pull the parameters for ``clock`` into ``out``.

        Parameters
        ----------
        clock : int
            The reader's clock (gradients it has pushed so far).
        out : ndarray, shape (n_params,)
            Host buffer receiving the parameters.

        Returns
        -------
        str
            ``"params"`` (``out`` is filled), ``"stop"`` (budget spent) or ``"dropped"`` (this
            worker was dropped for silence).

        Raises
        ------
        PSError
            When a server reports the BSP error state; ABORT has been sent to every server.
        PSTimeout
            When a server does not answer within ``reply_timeout``.
        """
        with trace.span("pull", "ps", {"clock": int(clock)}):  # the wait for the servers' answers included
            replies = self._request(Msg.PULL, clock, out)
            wait_all(self._pushes, time.monotonic() + self.reply_timeout, "push sends")
        self._pushes = []
        kinds = {Msg(int(h[0])) for h, _ in replies.values()}
        if Msg.ERROR in kinds:
            lost = next(int(h[1]) for h, _ in replies.values() if h[0] == Msg.ERROR)
            self.finish(Msg.ABORT)
            raise PSError(f"BSP cannot continue: worker rank {self.worker_ranks[lost]} stopped answering "
                          f"(dropped after --ps-timeout or aborted); every rank stops")
        self.last_staleness = [int(h[2]) for h, _ in replies.values() if h[0] == Msg.PARAMS]
        if Msg.DROPPED in kinds:
            return "dropped"
        if Msg.STOP in kinds:
            return "stop"
        return "params"

    def report_speed(self, clock, seconds_per_sample):
        """Report this worker's measured speed to server 0 and receive every worker's new batch.

        Parameters
        ----------
        clock : int
            Current clock.
        seconds_per_sample : float
            Measured step time per sample, delays included (seconds).

        Returns
        -------
        ndarray, shape (W,), int64
            Batch (samples) of every worker; this worker's is ``batches[worker]``.
        """
        data = np.array([seconds_per_sample], dtype=self.dtype)
        req = send(self.comm, self.server_ranks[0], Msg.SPEED, self.worker, clock, data)
        header, batches = self._await({self.server_ranks[0]}, None)[self.server_ranks[0]]
        wait_all(req, time.monotonic() + self.reply_timeout, "speed report")
        if header[0] != Msg.BATCH:
            raise PSError(f"expected BATCH from server 0, got {Msg(int(header[0])).name}")
        return np.rint(batches).astype(np.int64)

    def finish(self, mtype=Msg.DONE):
        """Tell every server that this worker leaves (DONE, or ABORT after an error)."""
        reqs = []
        for rank in self.server_ranks:
            reqs += send(self.comm, rank, mtype, self.worker, 0)
        wait_all(reqs + self._pushes, time.monotonic() + self.reply_timeout, f"{mtype.name} sends")
        self._pushes = []

    # ------------------------------------------------------------------------------------------
    def _request(self, mtype, clock, out):
        reqs = []
        for rank in self.server_ranks:
            reqs += send(self.comm, rank, mtype, self.worker, clock)
        t0 = time.monotonic()
        replies = self._await(set(self.server_ranks), out)
        self.wait_seconds += time.monotonic() - t0
        wait_all(reqs, time.monotonic() + self.reply_timeout, f"{mtype.name} sends")
        return replies

    def _await(self, sources, out):
        """Receive one reply from each rank in ``sources``; PARAMS payloads land in ``out``."""
        replies, backoff = {}, Backoff()
        deadline = time.monotonic() + self.reply_timeout
        while len(replies) < len(sources):
            msg = probe(self.comm)
            if msg is None:
                if time.monotonic() > deadline:
                    missing = sorted(sources - set(replies))
                    raise PSTimeout(f"worker {self.worker}: no answer from server rank(s) {missing} "
                                    f"within {self.reply_timeout:g} s")
                backoff.sleep()
                continue
            source, mtype = msg
            if source not in sources or source in replies:
                raise PSError(f"worker {self.worker}: unexpected {mtype.name} from rank {source}")
            header, data = receive(self.comm, source, mtype, self.dtype, deadline)
            if mtype == Msg.PARAMS:
                s = self.server_ranks.index(source)
                out[self.offsets[s]:self.offsets[s + 1]] = data if data is not None else 0
            replies[source] = (header, data)
            backoff.reset()
        return replies
