"""Rank-side bodies of the replicated-shard tests: ``python -m tests.mpi_ps_replicas CASE [DIR]``, or
``python -m tests.mpi_ps_replicas chain fence`` (the fault-free cases in turn, one launch, each with its
own count line). ``stall`` runs in a launch of its own, last: a fenced primary's last messages are never
received, and a later run of the same processes could be handed them on a communicator that reuses the
freed one's context.

The workload: least squares on fixed per-worker data, SGD with momentum 0.9 on the servers (so the
optimizer state must survive a failover too), float64, BSP, ``--ps-timeout`` 1 s. The oracle of every
case is the fault-free run of the same workers with unreplicated shards (``replicas = 1``): under BSP
each clock's update is the worker-ordered mean, so the final parameters must be equal bit for bit.

``chain``   no fault. R = 2, 3 and 4, each on S = R (one chain): bitwise equal to the oracle, and every
            replica ends with the reported shard bit for bit (``same_shard``); every replica applied
            the primary's forwards in chain order (each backup's upstream is its predecessor, every
            one applied as many as the primary forwarded, the tail sends no ACK down and receives
            none), the primary held replies until acknowledged, and no acknowledged update was lost.
``fence``   the primary stalls for 3 s (three times the timeout) in the middle of the run: the workers
            fail over to the backup, which takes over; the old primary, resuming, finds itself fenced
            off and serves nothing more. Every version it acknowledged was on the new primary when
            that took over, the run ends bitwise equal to the oracle, nothing acknowledged is lost.
``stall``   a server stopped by ``SIGSTOP`` (a helper process sends ``SIGCONT`` later) while the workers'
            messages queue up unread: 1.3 s (past ``--ps-timeout`` 1 s, short of the failover's 1.5 s)
            for server 0 of two unreplicated shards and for the primary of a chain of two, and 2.5 s
            for that primary (the workers fail over). Each run ends bitwise equal to the oracle with
            every worker done (none dropped for a silence that was the server's own stop).
``all``     (crash) both replicas of the only shard exit (``experiments.faults.dead.vanish``): every
            worker writes its error and its time to ``DIR/worker-R.json`` (the pytest side checks
            the message and the delay).
``deaths``  (crash; 6 ranks) two runs, their communicators made first: R = 4 on S = 4 whose second
            replica (rank 1) exits at its 40th message, then R = 3 on ranks 0, 2 and 3 (workers 4, 5)
            whose primary (rank 0) and then middle (rank 2) exit at their 60th messages. Each run
            must end bitwise equal to its unreplicated oracle, every surviving replica holding the
            reported shard bit for bit, nothing acknowledged lost; the collector (rank 4) writes
            both verdicts to ``DIR/deaths.json``.
``head``    (crash, checkpoints; 6 ranks) the crash run uses ranks 0-4 for 30 clocks with server
            checkpoints every 10 clocks in ``DIR/ckpt``; the primary (rank 0) exits at its 60th
            message, the workers fail over to the backup (rank 1), which writes the later
            checkpoints. Then ranks 1 and 5 serve (a chain of two, rank 5 a fresh replica) and ranks
            2-4 work again, resumed from those checkpoints to 60 clocks (both communicators are made
            before the crash). The resumed run must end bitwise equal to the uninterrupted oracle; the
            collector writes both runs' records and the checkpoint's to ``DIR/result.json``.

A crash case cannot end with a collective (a rank is dead): every survivor writes its records,
then leaves without ``MPI_Finalize`` (``os._exit(0)``); the pytest side reads the records.
"""
import functools
import json
import os
import subprocess
import sys
import time

import numpy as np
from mpi4py import MPI

from experiments.faults.dead import vanish
from ps.job.settings import PSOptions
from ps.wire.messages import PSError
from ps.job.runner import run
from ps.serving.shard_server import Server
from ps.checkpoints.shard_files import server_checkpoint_path
from commlab.file_formats import read_npz
from tests.mpicases import FAILS, check, report
from training.model.optim import SGD

COMM = MPI.COMM_WORLD
MOMENTUM = functools.partial(SGD, momentum=0.9)
N, ROWS, CLOCKS, TIMEOUT = 12, 8, 60, 1.0


def _run(S, R, clocks=CLOCKS, comm=COMM, **settings):
    """Run the workload on ``comm`` (``settings``: more PSOptions fields, e.g. checkpoints); return the
    RunResult on the rank that collects it, else None."""
    W = comm.Get_size() - S
    opts = PSOptions(servers=S, replicas=R, consistency="bsp", budget=clocks * W, lr=0.05, ps_timeout=TIMEOUT,
                     **settings)
    rng = np.random.default_rng(7)
    A, b = rng.normal(size=(W, ROWS, N)), rng.normal(size=(W, ROWS))

    def grad_fn(params, clock, batch):
        w = comm.Get_rank() - S
        time.sleep(0.003)
        return A[w].T @ (A[w] @ params - b[w]) / ROWS, batch

    res = run(comm, opts, np.zeros(N), grad_fn, make_optimizer=MOMENTUM)
    return res if hasattr(res, "params") else None


def _collector(S, R):
    return S if R > 1 else 0


def _oracle(S, comm=COMM):
    """The fault-free unreplicated run's parameters, on every rank of ``comm``."""
    res = _run(S, 1, comm=comm)
    return comm.bcast(None if res is None else res.params, root=0)


def _inject(rank, at, action):
    """Make ``rank`` call ``action()`` before its ``at``-th handled message (``Server._handle``)."""
    real, count = Server._handle, [0]

    def wrapped(self, *args):
        if COMM.Get_rank() == rank:
            count[0] += 1
            if count[0] == at:
                action()
        return real(self, *args)

    Server._handle = wrapped
    return lambda: setattr(Server, "_handle", real)


def _gather_result(S, R):
    res = _run(S, R)
    return COMM.bcast(res, root=_collector(S, R))


def case_chain():
    for S, R in ((2, 2), (3, 3), (4, 4)):
        want = _oracle(S)
        res = _gather_result(S, R)
        name = f"S={S} R={R}"
        check(np.array_equal(res.params, want), f"{name}: final parameters differ from the unreplicated run's")
        recs = res.replicas
        check(all(r is not None for r in recs) and res.servers_lost == [], f"{name}: a replica sent no record")
        check(res.lost_acknowledged == 0, f"{name}: {res.lost_acknowledged} acknowledged clocks lost")
        head = recs[0]
        check(head["head"] == 1 and head["forwarded"] > 0 and head["held_replies"] > 0,
              f"{name}: the primary forwarded {head['forwarded']}, held {head['held_replies']} replies")
        for pos in range(1, R):
            rec = recs[pos]
            check(rec["upstream"] == pos - 1 and rec["applied_forwards"] == head["forwarded"],
                  f"{name}: replica {pos} applied {rec['applied_forwards']} of {head['forwarded']} forwards "
                  f"from rank {rec['upstream']}, want all from rank {pos - 1}")
            check(rec["version"] == head["version"] and rec["seq"] == head["seq"],
                  f"{name}: replica {pos} at version {rec['version']}, seq {rec['seq']}; primary "
                  f"{head['version']}, {head['seq']}")
            check((rec["acks"] > 0) == (pos < R - 1), f"{name}: replica {pos} received {rec['acks']} ACKs")
        check(head["acks"] > 0 and all(r["took_over_s"] < 0 for r in recs), f"{name}: {recs}")
        check([r["same_shard"] for r in recs] == [1] * R,
              f"{name}: replicas holding the reported shard bit for bit: {[r['same_shard'] for r in recs]}")


def case_fence():
    want = _oracle(2)
    undo = _inject(0, 80, lambda: time.sleep(3 * TIMEOUT))
    res = _gather_result(2, 2)
    undo()
    check(np.array_equal(res.params, want), "fence: final parameters differ from the fault-free run's")
    old, new = res.replicas
    check(old["deposed"] == 1 and new["head"] == 1 and new["took_over_s"] > 0, f"fence: records {old} {new}")
    check(old["acked_version"] <= new["took_over_version"],
          f"fence: the old primary acknowledged version {old['acked_version']}, the new one took over at "
          f"version {new['took_over_version']}")
    check(res.lost_acknowledged == 0 and res.servers_lost == [], f"fence: lost {res.lost_acknowledged}")
    fails = sum(st["failovers"] for st in res.workers)
    check(fails == COMM.Get_size() - 2, f"fence: {fails} failovers, want one per worker")


def _stop_for(seconds):
    """Have a helper process stop this rank (``SIGSTOP``) now and continue it ``seconds`` later."""
    pid = os.getpid()
    subprocess.Popen(["sh", "-c", f"kill -STOP {pid}; sleep {seconds}; kill -CONT {pid}"])
    time.sleep(0.05)  # stopped in here, or just after


def case_stall():
    want = _oracle(2)
    for R, seconds in ((1, 1.3), (2, 1.3), (2, 2.5)):
        undo = _inject(0, 80, functools.partial(_stop_for, seconds))
        res = _gather_result(2, R)
        undo()
        name = f"R={R} stopped {seconds} s"
        check(np.array_equal(res.params, want), f"{name}: final parameters differ from the fault-free run's")
        check(res.status == ["done"] * (COMM.Get_size() - 2), f"{name}: workers {res.status}, events {res.events}")
        fails = sum(st["failovers"] for st in res.workers if st)
        check(fails == (COMM.Get_size() - 2 if seconds > TIMEOUT + 0.5 else 0), f"{name}: {fails} failovers")


def case_all(directory):
    """Both replicas of the only shard exit at their 40th message; each worker writes its error."""
    for rank in (0, 1):
        _inject(rank, 40, functools.partial(vanish, rank))
    try:
        _run(2, 2)
    except PSError as e:  # every replica of the shard is gone: each worker says so
        _write(directory, f"worker-{COMM.Get_rank()}.json", {"error": str(e), "time": time.time()})
    _leave()


def case_deaths(directory):
    """Deaths in chains of four and three: every survivor holds the fault-free shard (6 ranks)."""
    rank = COMM.Get_rank()
    order = [0, 2, 3, 4, 5]  # the chain of three: servers 0, 2, 3; workers 4, 5
    second = COMM.Split(0 if rank in order else MPI.UNDEFINED, order.index(rank) if rank in order else 0)
    want4 = _oracle(4)
    want3 = _oracle(3, second) if second != MPI.COMM_NULL else None
    verdicts = {}
    undo = _inject(1, 40, functools.partial(vanish, 1))
    res = _run(4, 4)
    undo()
    if res is not None:
        verdicts["R=4"] = _verdict(res, want4, [1])
    for r in (0, 2):
        _inject(r, 60, functools.partial(vanish, r))
    res = _run(3, 3, comm=second)
    if res is not None:
        verdicts["R=3"] = _verdict(res, want3, [0, 1])  # the second run's ranks: 0 and 1 are world ranks 0, 2
        _write(directory, "deaths.json", verdicts)
    _leave()


def _verdict(res, want, lost):
    """What a crash run must show: the oracle's parameters, every survivor on the reported shard, nothing lost."""
    same = [r and r["same_shard"] for r in res.replicas]
    return {"equal": bool(np.array_equal(res.params, want)),
            "max_diff": float(np.max(np.abs(res.params - want))), "same_shard": same,
            "servers_lost": res.servers_lost, "want_lost": lost, "lost_acknowledged": res.lost_acknowledged,
            "status": res.status}


def case_head(directory):
    """The primary's crash in a run that writes checkpoints, then a run resumed from them (6 ranks)."""
    rank, W, ckpt = COMM.Get_rank(), 3, os.path.join(directory, "ckpt")
    first = COMM.Split(0 if rank < 5 else MPI.UNDEFINED, rank)  # ranks 0-4: oracle and crash run
    order = [1, 5, 2, 3, 4]  # the resumed run: servers 1 and 5, the same workers in the same order
    second = COMM.Split(0 if rank in order else MPI.UNDEFINED, order.index(rank) if rank in order else 0)
    crashed = want = None
    if first != MPI.COMM_NULL:
        want = _oracle(2, first)
        _inject(0, 60, functools.partial(vanish, 0))
        crashed = _run(2, 2, CLOCKS // 2, first, checkpoint_dir=ckpt, checkpoint_every_pushes=10 * W)
    if second == MPI.COMM_NULL:
        _leave()  # rank 0 lived through its 60th message: the pytest side finds no crash
    done = second.Ibarrier()  # every rank left the crash run: its checkpoints are written
    while not done.Test():
        time.sleep(0.01)
    saved = read_npz(server_checkpoint_path(ckpt, 0)) if crashed is not None else None
    resumed = _run(2, 2, CLOCKS, second, resume_dir=ckpt)
    if resumed is not None:  # the collector of both runs (rank 2)
        _write(directory, "result.json", {
            "equal": bool(np.array_equal(resumed.params, want)), "workers": W,
            "crash": _records(crashed), "resumed": _records(resumed),
            "checkpoint": {"pushes": int(saved["pushes"]), "elapsed_s": float(saved["elapsed"])}})
    _leave()


def _records(res):
    return {"lost_acknowledged": res.lost_acknowledged, "servers_lost": res.servers_lost, "replicas": res.replicas,
            "status": res.status, "failovers": [st and st["failovers"] for st in res.workers], "pushes": res.pushes,
            "start_pushes": res.start_pushes}


def _write(directory, name, obj):
    tmp = os.path.join(directory, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, os.path.join(directory, name))


def _leave():
    sys.stdout.flush()
    os._exit(0)  # a peer is dead: MPI_Finalize would wait for it


def main():
    case = sys.argv[1]
    if case in ("chain", "fence", "stall"):  # fault-free cases: any of them, in turn, each with its own count line
        failed = 0
        for name in sys.argv[1:]:
            globals()[f"case_{name}"]()
            failed |= report(COMM, f"mpi_ps_replicas {name}")
            FAILS.clear()
        return failed
    {"all": case_all, "head": case_head, "deaths": case_deaths}[case](sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
