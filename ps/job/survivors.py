"""The report of a replicated run, gathered on a rank that survives any one server's death.

With replicated shards (:mod:`ps.replicas.chain_replication`) nothing the job reports may live only on a server.
Every server, when its loop ends, sends its FINAL report and its replica record (:data:`RECORD_FIELDS`)
to the first worker rank, the collector, which also receives the other workers' statistics. A server
that died sends nothing: the collector waits ``ps_timeout + 2`` seconds for the servers after its own
loop ended (they end with the last worker's DONE) and names the missing ones. Each shard's parameters
come from the replica that ended as its primary (not fenced off, highest epoch).

The records prove that no acknowledged update was lost: every worker's acknowledged clocks
(:attr:`ps.worker.client.Client.acked_clocks`: the clocks of its pushes a primary said were on every live
replica when it answered) and every surviving replica's (``acked_folded``) are compared with the
clocks folded into the shard the run reports; ``RunResult.lost_acknowledged`` counts the clocks
missing (0 when none was lost).
"""
import time

import numpy as np

from ps.job.reports import (STAT_FIELDS, RunResult, merge_reports, pack_report, receive_report, roles,
                            server_report, unpack_report, worker_stats)
from ps.replicas.chain_replication import REPLICA_COUNTERS, ReplicatedServer, chains
from ps.serving.consistency import DONE
from ps.wire.messages import Msg, PSError, PSTimeout, dead, header_tag, send, wait_all, waiting

__all__ = ["serve_replica", "collect", "RECORD_FIELDS"]

#: Scalars of a replica's record, before its counters (:data:`ps.replicas.chain_replication.REPLICA_COUNTERS`), its
#: per-worker acknowledged clocks and its per-worker folded clocks.
RECORD_FIELDS = ("rank", "shard", "position", "head", "deposed", "epoch", "took_over_s", "last_reply_s",
                 "first_update_time", "version", "pushes", "seq", "acked", "elapsed_s", "resumed_pushes",
                 "resumed_s", "upstream", "acked_version", "took_over_version")
_SERVER_GRACE = 2.0  # seconds beyond ps_timeout the collector waits for the servers' reports
_DEPOSED_WAIT = 600.0  # seconds a replica that is not the primary at the end waits for the collector


def serve_replica(pscomm, repcomm, opts, index, shard, total, make_optimizer, start):
    """Run one replica of shard ``index`` until the workers are done; send its report to the collector.

    Parameters
    ----------
    pscomm, repcomm : MPI.Comm
        The run's protocol and report communicators.
    opts : ps.job.settings.PSOptions
        ``replicas`` > 1.
    index : int
        The shard (this rank // ``opts.replicas``).
    shard : ndarray, shape (n_g,)
        The shard's initial values.
    total : int
        The flat vector's length.
    make_optimizer : callable
        As :func:`ps.job.runner.run`.
    start : float
        ``time.monotonic()`` of the common start.

    Returns
    -------
    None

    Raises
    ------
    PSError
        Under BSP when a worker was lost.
    """
    servers, workers = roles(pscomm, opts.servers)
    server = ReplicatedServer(pscomm, index, chains(servers, opts.replicas)[index], workers, shard, total, opts,
                              make_optimizer)
    server.serve(start)
    record = [pscomm.Get_rank(), index, server.pos, server.head, server.deposed, server.epoch, server.took_over,
              server.last_reply, server.first_update, server.version, server.pushes, server.seq, server.acked,
              server.elapsed(), server.resumed_pushes, server.resumed_seconds,
              -1 if server.upstream is None else server.upstream, server.acked_version, server.took_over_version]
    record += [server.counters[k] for k in REPLICA_COUNTERS] + server.acked_folded.tolist()
    record += server.table.folded.tolist()
    reqs = send(repcomm, workers[0], Msg.FINAL, 0, index, pack_report(server_report(server)))
    reqs += send(repcomm, workers[0], Msg.FINAL, 1, index, np.array(record, np.float64))
    try:  # a replica fenced off early waits while the others still train
        wait_all(reqs, time.monotonic() + opts.ps_timeout + (0 if server.head else _DEPOSED_WAIT), "final report")
    except PSTimeout:
        pass  # the collector never took it: the report counts this rank lost


def collect(repcomm, opts, dtype, own_stats, own_acked):
    """The first worker: gather the servers' reports and the workers' statistics; return the run's result.

    Parameters
    ----------
    repcomm : MPI.Comm
        The report communicator.
    opts : ps.job.settings.PSOptions
    dtype : numpy.dtype
        The parameters' dtype.
    own_stats : dict
        This worker's statistics.
    own_acked : ndarray, shape (shards,), int64
        This worker's acknowledged clocks per shard.

    Returns
    -------
    ps.job.reports.RunResult
        With ``replicas`` (every server rank's record, None for one that sent none), ``servers_lost``
        and ``lost_acknowledged`` filled in.

    Raises
    ------
    PSError
        When no replica of some shard reported.
    """
    servers, workers = roles(repcomm, opts.servers)
    W, n_rec = len(workers), len(RECORD_FIELDS) + len(REPLICA_COUNTERS)
    reports, records = {}, {}
    _poll(repcomm, servers, Msg.FINAL, time.monotonic() + opts.ps_timeout + _SERVER_GRACE,
          lambda r, d: (reports.setdefault(r, unpack_report(receive_report(repcomm, r, Msg.FINAL, d), W, dtype)),
                        records.setdefault(r, receive_report(repcomm, r, Msg.FINAL, d))))
    parsed = {r: dict(zip(RECORD_FIELDS + REPLICA_COUNTERS, v[:n_rec].tolist()),
                      acked_folded=v[n_rec:n_rec + W].astype(np.int64), folded=v[n_rec + W:].astype(np.int64))
              for r, v in records.items()}
    chosen = []
    for g in range(opts.shards):
        mine = [r for r in parsed if int(parsed[r]["shard"]) == g]
        if not mine:
            raise PSError(f"no replica of shard {g} reported at the end of the run (every one was lost)")
        chosen.append(max(mine, key=lambda r: (not parsed[r]["deposed"], parsed[r]["head"], parsed[r]["epoch"],
                                               parsed[r]["seq"])))
    codes = reports[chosen[0]]["status"]
    stats, acked = [own_stats] + [None] * (W - 1), {0: own_acked}
    expect = [r for w, r in enumerate(workers) if w and codes[w] == DONE]  # DONE workers send statistics
    _poll(repcomm, expect, Msg.STATS, time.monotonic() + opts.ps_timeout + _SERVER_GRACE,
          lambda r, d: _take_stats(receive_report(repcomm, r, Msg.STATS, d), workers.index(r), stats, acked))
    return _result(opts, reports, parsed, chosen, stats, acked)


def _take_stats(vec, w, stats, acked):
    stats[w] = worker_stats(vec)
    acked[w] = vec[len(STAT_FIELDS):].astype(np.int64)


def _poll(comm, sources, mtype, deadline, take):
    """Call ``take(rank, deadline)`` for each of ``sources`` whose ``mtype`` report arrives before ``deadline``."""
    pending = list(sources)
    while pending and time.monotonic() < deadline:
        pending = [r for r in pending if r not in dead(comm)]  # known dead (ULFM): no report will come
        for r in list(pending):
            if waiting(comm, r, header_tag(mtype)):
                take(r, deadline)
                pending.remove(r)
        time.sleep(1e-3)


def _result(opts, reports, parsed, chosen, stats, acked):
    """Assemble the RunResult of a replicated run from the chosen replicas' reports."""
    reps = [reports[r] for r in chosen]
    head = parsed[chosen[0]]
    codes = reps[0]["status"]
    servers, workers = list(range(opts.servers)), list(range(opts.servers, opts.servers + len(codes)))
    # each read is counted by the primary that served it: every replica's report counts its own
    merged = merge_reports(reps, workers, opts.ps_timeout, reads=list(reports.values()))
    lost_servers = [r for r in servers if r not in parsed]
    events = [(float(parsed[r]["took_over_s"]), f"server rank {r} took over shard {int(parsed[r]['shard'])} "
               f"(epoch {int(parsed[r]['epoch'])})") for r in parsed if parsed[r]["took_over_s"] >= 0]
    events += merged.pop("events")
    events += [(float(head["elapsed_s"]), f"server rank {r} lost (no report)") for r in lost_servers]
    lost = 0
    for g, r in enumerate(chosen):
        for w in range(len(codes)):
            claims = [int(parsed[q]["acked_folded"][w]) for q in parsed if int(parsed[q]["shard"]) == g]
            claims += [int(acked[w][g])] if w in acked and len(acked[w]) > g else []
            lost += max(0, max(claims) - int(parsed[r]["folded"][w]))
    return RunResult(pushes=int(head["pushes"]), wall=max(float(parsed[r]["elapsed_s"]) for r in chosen),
                     start_pushes=int(head["resumed_pushes"]), start_wall=float(head["resumed_s"]), workers=stats,
                     events=sorted(events), versions=[int(parsed[r]["version"]) for r in chosen], **merged,
                     replicas=[_public(parsed.get(r), _same_shard(r, parsed, reports, chosen)) for r in servers],
                     servers_lost=lost_servers,
                     lost_acknowledged=lost)


def _same_shard(r, parsed, reports, chosen):
    """1 when replica ``r`` ended holding its shard's reported values bit for bit, else 0 (None: no report)."""
    if r not in parsed:
        return None
    mine, reported = reports[r]["shard"], reports[chosen[int(parsed[r]["shard"])]]["shard"]
    return int(mine.dtype == reported.dtype and mine.tobytes() == reported.tobytes())


def _public(record, same_shard=None):
    """A replica's record as plain numbers (counts as int), or None for a rank that sent none.

    ``same_shard`` (1 or 0): whether the replica's shard at the end equals, bit for bit, the one the run
    reports for its shard (every replica of a chain that was not fenced off holds the same shard).
    """
    if record is None:
        return None
    out = {k: (float(v) if k.endswith("_s") or k.endswith("_time") else int(v)) for k, v in record.items()
           if k not in ("acked_folded", "folded")}
    out.update(acked_folded=record["acked_folded"].tolist(), folded=record["folded"].tolist(), same_shard=same_shard)
    return out
