"""The end of a ``--mode ps`` run: every rank checks in with the reporter before ``MPI_Finalize``.

A parameter-server run can end with a rank gone: a dropped worker may have died instead of falling
silent, or (replicated shards, ``--ps-replicas``) a server died and its shard's backup took over.
``MPI_Finalize`` would then wait for the dead rank forever (MPICH), so every rank first checks in
with the reporter (:func:`reporter_rank`: rank 0, or the first worker rank with replicas), which
answers once all arrived. When a rank is missing that nobody knew was gone, the reporter ends the
job (``MPI_Abort``) naming it. When the ranks that are missing are exactly the servers the report
counted lost (their shards failed over), the survivors have written their records: they leave without
``MPI_Finalize`` and with status 0, under either launcher. MPICH's ``MPI_Finalize`` waits for the
dead rank forever, and Open MPI's (``--enable-recovery``) can wait forever in its closing fence when
the rank died shortly before it (the survivors' stacks then end in ``ompi_mpi_finalize``). Without
it ``mpiexec --enable-recovery`` still exits 0, while MPICH's ``mpiexec -disable-auto-cleanup`` exits
non-zero for the dead rank: success is read from the records.
"""
import os
import sys
import time

import numpy
from mpi4py import MPI

import collectives.engine.policy
from collectives.engine.failures import is_process_failure
from ps.wire.messages import dead, done

__all__ = ["reporter_rank", "finish_together", "finish_ps", "ROOT_SLACK_S"]

_END_TAG = 0x5E1D  # tag of the end-of-run messages of :func:`finish_together`
_FAILED = 2  # the reporter's answer when ranks are missing: it ends the job (MPI_Abort), the others end too
#: Seconds a rank waits for the reporter's answer beyond twice the grace (the reporter gathers the
#: run's report before it checks in, within its own deadlines).
ROOT_SLACK_S = 30.0


def reporter_rank(cfg):
    """Return the rank that gathers a ``--mode ps`` run's report and writes its records.

    Rank 0, a server; with ``--ps-replicas`` > 1 the first worker rank (``--servers``), so that the
    records survive any one server's death.

    Examples
    --------
    >>> from training.settings.config import Config
    >>> reporter_rank(Config(mode="ps", servers=2, ps_replicas=2)), reporter_rank(Config(mode="ps", servers=2))
    (2, 0)
    """
    return cfg.servers if cfg.ps_replicas > 1 else 0


def finish_together(comm, grace, short=(), root=0, gone=(), slack=ROOT_SLACK_S):
    """Check that every rank reached the end of the run; return the ranks that did not (on ``root``).

    Every rank other than ``root`` sends it a one-byte message once its part of the run is over and
    waits for the answer; ``root`` waits up to ``grace`` seconds for all of them (not for ``gone``)
    and answers each only when all arrived. The caller of ``root`` ends the job (``MPI_Abort``) when
    ranks are missing. The other ranks wait for the answer up to ``2 grace + slack`` seconds: ``root`` answers or ends the job, but Open MPI's
    ``--enable-recovery`` launcher lets the others run on after a rank's ``MPI_Abort``, and ``root``
    may itself have died; a rank that hears nothing then reports ``root`` missing.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Communicator of all ranks of the run (point-to-point messages only, never a collective,
        so a dead rank cannot block it).
    grace : float
        Seconds ``root`` waits for the others (they finish before it: it collects their reports).
    short : sequence of int
        Ranks ``root`` waits for one second at most (workers the servers dropped for silence). Under
        ULFM, one of them that the MPI library reports dead counts as ``gone``; any other rank
        reported dead is missing.
    root : int
        The rank that checks (the reporter).
    gone : sequence of int
        Ranks known dead (servers whose shard failed over): not waited for; the answer then tells
        every rank that a peer is gone.
    slack : float
        Seconds the other ranks wait for ``root``'s answer beyond ``2 grace`` (default
        :data:`ROOT_SLACK_S`).

    Returns
    -------
    missing : list of int
        On ``root``, the ranks that did not arrive within ``grace`` (empty when all did); elsewhere
        ``[root]`` when its answer did not come in time or said that ranks are missing, else ``[]``.
    peer_gone : bool or None
        True when ``gone`` was not empty on ``root`` (every rank learns it from the answer); None
        elsewhere when ``root`` answered that ranks are missing (it names them and ends the job).
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    token = numpy.zeros(1, numpy.int8)
    if rank != root:
        if not _send(comm, token, root):  # one byte: sent eagerly, even to a dead root (ULFM: refused)
            return [root], False
        answer, deadline = comm.Irecv(token, source=root, tag=_END_TAG), time.monotonic() + 2 * grace + slack
        while not answer.Test():
            if time.monotonic() > deadline:
                answer.Cancel()  # no stale receive left to take a later answer
                answer.Wait()
                return [root], False  # root died, or ended the job and the launcher left this rank running
            time.sleep(0.01)
        if token[0] == _FAILED:
            return [root], None
        return [], bool(token[0])
    others = [r for r in range(size) if r != root and r not in set(gone)]
    bufs = {r: numpy.zeros(1, numpy.int8) for r in others}
    reqs = {r: comm.Irecv(bufs[r], source=r, tag=_END_TAG) for r in bufs}
    start, pending = time.monotonic(), set(reqs)
    deadline = {r: start + (min(grace, 1.0) if r in short else grace) for r in reqs}
    while pending:
        pending = {r for r in pending if not done(comm, reqs[r])}  # (a death the library reports ends it too)
        now = time.monotonic()
        if all(now > deadline[r] for r in pending):
            break
        time.sleep(0.01)
    died = set(reqs) & dead(comm)  # ranks the MPI library reported dead (ULFM) while they were waited for
    unknown = sorted(died - set(short))  # dead, and not a worker the servers had dropped
    if pending or unknown:
        token[0] = _FAILED  # the ranks that did check in end now, without waiting for the abort to reach them
        for r in others:
            if r not in pending and r not in died:
                _send(comm, token, r)
        return sorted(pending | set(unknown)), bool(gone)
    gone = list(gone) + sorted(died)  # dropped workers that died: gone, as a lost server is
    token[0] = 1 if gone else 0
    for r in others:
        if r not in died:
            _send(comm, token, r)
    if os.environ.get("PRTE_LAUNCHED") != "1":  # MPICH: one of them may still run (its report came late)
        for r in gone:
            comm.Isend(token, dest=r, tag=_END_TAG)  # never waited for
    return [], bool(gone)


def _send(comm, token, dest):
    """Send the end message to ``dest``; False when the MPI library reports ``dest`` dead (ULFM)."""
    try:
        comm.Send(token, dest=dest, tag=_END_TAG)
    except MPI.Exception as exc:
        if not is_process_failure(exc):
            raise
        return False
    return True


def finish_ps(world, cfg, summary=None):
    """End a parameter-server run: return when every rank got here, else abort naming the missing.

    Workers that the servers dropped (``summary["worker_status"]``, known on the reporter) are given
    one second at most instead of ``--ps-timeout``: they were silent that long already. Servers the
    report counted lost (``summary["servers_lost"]``) are not waited for; the survivors then leave
    without ``MPI_Finalize`` (see the module docstring).

    Parameters
    ----------
    world : mpi4py.MPI.Comm
        Every rank of the job.
    cfg : training.settings.config.Config
    summary : dict, optional
        :func:`training.ps_mode.worker.run_ps`'s summary (used on the reporter).
    """
    root = reporter_rank(cfg)
    mine = (summary or {}) if world.rank == root else {}
    dropped = [cfg.servers + w for w, st in enumerate(mine.get("worker_status") or []) if st == "dropped"]
    missing, peer_gone = finish_together(world, cfg.ps_timeout, short=dropped, root=root,
                                         gone=mine.get("servers_lost") or [])
    if missing == [root] and world.rank != root and peer_gone is None:  # the reporter names the missing
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # and ends the job; under ULFM its MPI_Abort may leave this rank running for long
    if missing == [root] and world.rank != root:
        collectives.engine.policy.abort(f"the reporting rank {root} did not answer at the end of the run (it died, "
                                        f"ended the job, or gave no answer within {2 * cfg.ps_timeout + ROOT_SLACK_S:g}"
                                        " s: its own output says why); ending this rank")
    if missing:
        collectives.engine.policy.abort(f"rank(s) {', '.join(map(str, missing))} did not reach the end of the run "
                                        f"within --ps-timeout {cfg.ps_timeout:g} s, or 1 s for a dropped worker (a "
                                        f"lost peer may have died); "
                                        "ending the job so that no rank waits for them in MPI_Finalize")
    if peer_gone:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # a dead peer: MPI_Finalize may wait for it forever (see the module docstring)
