"""Collectives that report a death (run under ``mpiexec --with-ft ulfm -n 6``, Open MPI with ULFM).

Each case kills one rank with SIGKILL (before the call, or inside it: after posting its first
round) and checks that every survivor's call raises :class:`collectives.ProcessFailed` naming that
rank -- the ranks that never exchange a message with the dead one included, which learn of it from
the revoked communicator -- and never hangs. No survivor returns a value when the rank died before
the call; when it died inside it, having posted its sends, a survivor that had all it needed may
return, and then must hold MPI's own value over every rank, the dead one's contribution included
(ULFM reports a failure only to the operations it touches). The survivors then shrink the
communicator (:func:`collectives.engine.failures.shrink`), check that it holds exactly them and
that an all-reduce on it equals MPI's own, and go on to the next case with one rank fewer. One
case per form: hand-made blocking (ring), the library's blocking (``mpi``), non-blocking (ring and
``mpi``), persistent. Prints ``case NAME: ok`` per case from the lowest survivor; status 0 when
every case passed on every survivor.
"""
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import collectives
from collectives.engine.failures import shrink, ulfm_enabled


def _die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _blocking(algorithm):
    def call(x, comm, victim, inside):
        if comm.rank == victim:
            if inside:
                collectives.iallreduce(x, comm=comm, algorithm=algorithm).test()  # its first round posted
            _die()
        return collectives.allreduce(x, comm=comm, algorithm=algorithm)
    return call


def _nonblocking(algorithm):
    def call(x, comm, victim, inside):
        req = collectives.iallreduce(x, comm=comm, algorithm=algorithm)
        if comm.rank == victim:
            req.test()
            _die()
        return req.wait()
    return call


def _persistent(x, comm, victim, inside):
    plan = collectives.allreduce_init(x, comm=comm, algorithm="ring")
    plan.start()
    plan.wait()  # one complete use, then the death during the second
    if comm.rank == victim:
        plan.start()
        _die()
    plan.start()
    return plan.wait()


CASES = [("ring_blocking_before", _blocking("ring"), False), ("ring_blocking_inside", _blocking("ring"), True),
         ("mpi_blocking", _blocking("mpi"), False), ("ring_nonblocking_inside", _nonblocking("ring"), True),
         ("mpi_nonblocking", _nonblocking("mpi"), False)]
#: the cases where a survivor may complete: the dying rank posted its sends first, which may be all
#: that a survivor needed (the one round of a two-rank ring; some round of the library's algorithm)
MAY_COMPLETE = {"ring_blocking_inside", "ring_nonblocking_inside", "mpi_nonblocking", "persistent"}


def main():
    if not ulfm_enabled():
        print("ulfm: not enabled (run under Open MPI's mpiexec --with-ft ulfm)", flush=True)
        return 1
    comm, world, bad = MPI.COMM_WORLD.Dup(), MPI.COMM_WORLD.rank, 0
    collectives.allreduce(np.ones(1), comm=comm)  # the context (its duplicate) made while everyone lives
    cases = CASES + [("persistent", _persistent, False)]
    for name, call, inside in cases[:comm.size - 1]:
        victim = comm.size - 1 if name.endswith("before") else comm.size // 2  # a middle rank and the last
        x = np.arange(20000, dtype=np.float64) + comm.rank  # large enough for several rounds of messages
        fails = []
        whole = np.arange(20000, dtype=np.float64) * comm.size + comm.size * (comm.size - 1) / 2  # every rank's x
        try:
            value = call(x, comm, victim, inside)
            if name not in MAY_COMPLETE:
                fails.append(f"returned a value ({value[:2]}) instead of raising")
            elif not np.array_equal(value, whole):
                fails.append(f"returned {value[:2]}, not MPI's own value over every rank {whole[:2]}")
        except collectives.ProcessFailed as exc:
            if exc.failed != (victim,):
                fails.append(f"named {exc.failed}, not ({victim},): {exc}")
        old = comm
        comm, lost = shrink(old)
        if lost != (victim,) or comm.size != old.size - 1:
            fails.append(f"shrink left out {lost}, size {comm.size}")
        y = np.full(3, float(world))
        want = y.copy()
        comm.Allreduce(MPI.IN_PLACE, want)
        got = collectives.allreduce(y, comm=comm, algorithm="ring")
        if not np.array_equal(got, want):
            fails.append(f"after the shrink: {got} != {want}")
        for f in fails:
            print(f"world rank {world}: case {name}: FAIL {f}", flush=True)
        flag = np.array([len(fails)], np.int32)
        comm.Allreduce(MPI.IN_PLACE, flag)
        bad += int(flag[0] > 0)
        if comm.rank == 0:
            print(f"case {name}: {'ok' if not flag[0] else 'FAILED'}", flush=True)
    return int(bad > 0)


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    os._exit(status)  # the dead ranks' parent communicators: no MPI_Finalize that could wait for them
