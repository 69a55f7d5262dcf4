"""Per-step heartbeats on a communicator of their own, and rank 0's stall check over them.

Every rank sends rank 0 one 8-byte message (the step's number) as it arrives at the step's first
collective (:meth:`Heartbeat.beat`; non-blocking, eager). On rank 0 a watchdog thread receives them
and, every ``poll`` seconds, applies :func:`training.monitor.detect.stalled`: a rank that has not
reached the collective of the newest step ``threshold`` seconds after the first rank did is named,
once per step, through ``on_stall(rank, step, late_s)`` -- while the others still wait for it, and
so before the collective's deadline (``--timeout``) ends the job, as Horovod's stall check and
NCCL's watchdog name the rank a collective waits on. ``on_clear(rank)`` is called when a named
rank's next heartbeat arrives.

A watchdog that finds a gap of ``threshold`` seconds since its own last poll was itself not running
(stopped, swapped out), and restarts its silence clocks rather than blame the ranks it could not
hear meanwhile.

A rank that stops *inside* a collective (a process stopped, swapped out or hung after its
heartbeat) leaves every rank at the same step, waiting on it, and no step count tells it apart.
So every other rank also sends a *tick* every ``poll`` seconds from a thread of its own, which runs
while the rank waits in a collective and stops only when the whole process does; rank 0 names a
rank whose ticks stopped ``threshold`` seconds ago (once, until its ticks come back: then
``on_clear``), and does not name it again as behind meanwhile. The ranks merely waiting on it keep
ticking and are not named.

Rank 0 cannot name itself: when its process stops, its watchdog stops with it. So rank 0's
watchdog also ticks to rank 1, its *deputy*, whose thread names rank 0 through the same
``on_stall(0, step, late_s, True)`` when those ticks stop ``threshold`` seconds (``step``: the
deputy's own last heartbeat), and calls ``on_clear(0)`` when they come back.

The thread makes MPI calls beside the training loop's: the library must give
``MPI_THREAD_MULTIPLE`` (mpi4py asks for it; MPICH and Open MPI give it). Where it does not, the
check runs at rank 0's own heartbeats instead, which names a late rank only once rank 0 is itself
between steps.
"""
import threading
import time

import numpy
from mpi4py import MPI

from collectives.engine.waiting import wait_within
from training.monitor.detect import stalled

__all__ = ["Heartbeat"]

_TAG = 0x4EA7  # tag of the heartbeat messages
_TICK = 0x4EA8  # tag of the ticks: "this process runs"


class Heartbeat:
    """Send this rank's heartbeats; on rank 0, watch everyone's.

    Collective over ``comm`` (duplicated here, so heartbeats never meet other messages).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
    threshold : float
        Seconds after which a rank behind is named; 0 sends no heartbeat at all.
    on_stall : callable
        Rank 0 (and rank 1 for rank 0, as its deputy): ``on_stall(rank, step, late_s, stopped)``,
        from the watchdog thread: ``stopped``
        False for a rank that has not reached the collective of ``step`` ``late_s`` seconds after
        the first rank did, True for one whose ticks stopped ``late_s`` seconds ago, its last
        heartbeat at ``step`` (stopped or hung, in a collective or not).
    on_clear : callable, optional
        Rank 0: ``on_clear(rank)`` when a named rank's heartbeat arrives (rank 1: ``on_clear(0)`` when
        rank 0's ticks come back).
    poll : float
        Seconds between two checks of the watchdog.
    """

    def __init__(self, comm, threshold, on_stall, on_clear=None, poll=0.05):
        self.comm = comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.threshold, self.poll = float(threshold), float(poll)
        self.on_stall, self.on_clear = on_stall, on_clear
        self.on = self.threshold > 0 and self.size > 1
        self.steps = numpy.full(self.size, -1, numpy.int64)  # rank 0: last heartbeat of each rank
        self.since = time.monotonic()                        # when max(steps) was first reached
        self.named = {}                                      # rank -> step it was named stalled at
        self._buf, self._req, self._recv = numpy.zeros(1, numpy.int64), None, numpy.zeros(1, numpy.int64)
        self._stop, self._thread, self._lock = threading.Event(), None, threading.Lock()
        self.ticked = numpy.full(self.size, time.monotonic())  # rank 0: when each rank's last tick came
        self.silent = set()                                      # rank 0: ranks named for their ticks
        self._tick_buf, self._tick_req = numpy.zeros(1, numpy.int64), None
        self.step = -1                     # this rank's last heartbeat
        self.root_ticked = time.monotonic()  # rank 1 (the deputy): when rank 0's last tick came
        self.root_silent = False             # rank 1: rank 0 named for its ticks
        self._root_buf = numpy.zeros(1, numpy.int64)
        if self.on and MPI.Query_thread() == MPI.THREAD_MULTIPLE:
            target = self._watch if self.rank == 0 else self._tick
            self._thread = threading.Thread(target=target, name="commlab-heartbeat", daemon=True)
            self._thread.start()

    def beat(self, step):
        """Say that this rank has reached the collective of ``step`` (int)."""
        if not self.on:
            return
        self.step = step
        if self.rank == 0:
            with self._lock:
                self._record(0, step)
                if self._thread is None:
                    self._drain()
                    self._check()
            return
        if self._req is not None:
            self._req.Wait()  # 8 bytes go eagerly: the previous send completed long ago
        self._buf[0] = step
        self._req = self.comm.Isend(self._buf, dest=0, tag=_TAG)

    def _record(self, rank, step):
        if step > self.steps.max():
            self.since = time.monotonic()
        self.steps[rank] = max(self.steps[rank], step)
        if rank in self.named and self.steps[rank] >= self.named[rank]:
            del self.named[rank]
            if self.on_clear is not None:
                self.on_clear(rank)

    def _drain(self):
        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
            src, tag = status.Get_source(), status.Get_tag()
            self.comm.Recv(self._recv, source=src, tag=tag)
            if tag == _TAG:
                self._record(src, int(self._recv[0]))
            else:
                self.ticked[src] = time.monotonic()
                if src in self.silent:  # its process runs again
                    self.silent.discard(src)
                    if self.on_clear is not None and src not in self.named:
                        self.on_clear(src)

    def _check(self):
        top = int(self.steps.max())
        now = time.monotonic()
        late = now - self.since
        if self._thread is not None:  # ticks need a thread of their own on every rank
            for r in range(1, self.size):
                quiet = now - self.ticked[r]
                if quiet > self.threshold and r not in self.silent:
                    self.silent.add(r)
                    if self.named.get(r) != top:  # (not named already as behind at this step)
                        self.named[r] = top
                        self.on_stall(r, int(self.steps[r]), quiet, True)
        for r in stalled(self.steps, self.since, now, self.threshold):
            if self.named.get(r) != top and r not in self.silent:
                self.named[r] = top
                self.on_stall(r, top, late, False)

    def _watch(self):
        last = time.monotonic()
        while not self._stop.wait(self.poll):
            with self._lock:
                last, resumed = self._resumed(last)
                self._drain()
                if resumed:  # this process did not run: its clock says nothing of the others' silence
                    self.ticked[:] = self.since = time.monotonic()
                self._check()
                self._send_tick(1)  # to the deputy, which names rank 0 when these stop

    def _resumed(self, last):
        """Return ``(now, stalled)``: whether ``threshold`` seconds passed since this thread's last poll.

        Such a gap means this process itself did not run (stopped, swapped out): the silence clocks
        it kept meanwhile measure its own stop, not the peers', so the caller restarts them.
        """
        now = time.monotonic()
        return now, now - last > self.threshold

    def _send_tick(self, dest):
        """Send ``dest`` this process's next tick, unless the last one is still on its way."""
        if self._tick_req is not None and not self._tick_req.Test():
            return
        self._tick_buf[0] += 1
        self._tick_req = self.comm.Isend(self._tick_buf, dest=dest, tag=_TICK)

    def _tick(self):
        """A rank other than 0: tell rank 0 every ``poll`` seconds that this process runs (rank 1: watch rank 0's)."""
        last = time.monotonic()
        while not self._stop.wait(self.poll):
            last, resumed = self._resumed(last)
            self._send_tick(0)
            if self.rank == 1:
                if resumed:  # rank 0's silence is timed from now: this process did not run
                    self._drain_root()
                    self.root_ticked = time.monotonic()
                self._watch_root()

    def _drain_root(self):
        """The deputy: receive rank 0's ticks; return True when one came."""
        came = False
        while self.comm.Iprobe(source=0, tag=_TICK):
            self.comm.Recv(self._root_buf, source=0, tag=_TICK)
            came = True
        return came

    def _watch_root(self):
        """The deputy: name rank 0 once its ticks stopped ``threshold`` seconds ago; clear it when they come back."""
        now = time.monotonic()
        if self._drain_root():
            self.root_ticked = now
            if self.root_silent:
                self.root_silent = False
                if self.on_clear is not None:
                    self.on_clear(0)
        quiet = now - self.root_ticked
        if quiet > self.threshold and not self.root_silent:
            self.root_silent = True
            self.on_stall(0, int(self.step), quiet, True)

    def close(self, timeout=None):
        """Stop the watchdog, receive what is left and free the communicator (collective).

        Parameters
        ----------
        timeout : float, optional
            Seconds the closing barrier may wait for a peer (None: no limit).

        Raises
        ------
        collectives.CollectiveTimeout
            When a peer does not reach the closing barrier within ``timeout``.
        """
        if self._thread is not None and self.rank != 0:
            self._stop.set()
            self._thread.join()
            if self._tick_req is not None:
                self._tick_req.Wait()
        if self._req is not None:
            self._req.Wait()
        wait_within(self.comm.Ibarrier(), timeout, "heartbeat", "close")
        if self._thread is not None:  # rank 0's watchdog ran (and ticked) through the barrier
            if self.rank == 0:
                self._stop.set()
                self._thread.join()
                if self._tick_req is not None:
                    self._tick_req.Wait()
            # once rank 0 sent its last tick: the deputy receives every one (none is left unmatched)
            wait_within(self.comm.Ibarrier(), timeout, "heartbeat", "close")
            if self.rank == 1:
                self._drain_root()
        if self.on and self.rank == 0:
            self._drain()
        self.comm.Free()
