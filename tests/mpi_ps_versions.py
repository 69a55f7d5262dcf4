"""Rank-side bodies of the parameter-server version, conflict and retry tests: ``python -m tests.mpi_ps_versions CASE``
(or ``all``).

Cases (P = 4; oracles in brackets):

``retries``   2 servers, 2 workers. BSP on least squares with replies dropped (25 %) and late (15 %,
              0.25 s, beyond the 0.05 s retry wait) and 6 retries [the same run without faults:
              bitwise equal parameters]; ASP with the same faults on ps-lite's sum check [the
              parameters are exactly the sum of every push once: sum_w (w + 1) x pushes_w, and the
              servers' push counts equal the workers'], and the faults really happened (dropped,
              late, replayed, resent, duplicate pushes not applied, late originals dropped).
``cas``       2 servers, 2 workers, a 3x straggler. ASP and SSP(1) with ``conflict="cas"``, lag 0:
              pushes are refused, every refusal is recomputed and pushed again once [ASP: the sum
              check holds, one update per clock of each worker]; the workers' refusal counts equal
              the servers'; the versions equal the updates applied.
``badinput``  1 server, workers 1 and 2 train under BSP through :class:`ps.worker.client.Client`; worker 3
              pushes zeros at clock 0 and leaves, but first sends a push of the wrong length, of the
              wrong dtype, for another shard, from a future version, and after its good push one
              reusing its request id with other data: each gets a REJECT naming its reason [the
              server counts 1 of each] and the result is bitwise that of the same run without the
              bad requests.
"""
import functools
import sys
import time

import numpy as np
from mpi4py import MPI

from ps.worker.client import Client
from ps.job.settings import PSOptions
from ps.wire.messages import H_CLOCK, H_TYPE, Msg, probe, receive, send, wait_all
from ps.job.runner import run
from ps.serving.shard_server import Server
from tests.mpicases import check, report
from training.model.optim import SGD

COMM = MPI.COMM_WORLD
RANK = COMM.Get_rank()
PLAIN_SGD = functools.partial(SGD, momentum=0.0)
FAULTS = dict(drop_replies=0.25, late_replies=0.15, late_s=0.25, retries=6, retry_s=0.05)


def least_squares(S):
    """A deterministic gradient of worker ``rank - S`` at each clock (float64 least squares)."""
    def grad_fn(params, clock, batch):
        rng = np.random.default_rng(1000 * (RANK - S) + clock)
        x, y = rng.standard_normal((8, params.shape[0])), rng.standard_normal(8)
        return x.T @ (x @ params - y) / 8.0, batch
    return grad_fn


def sum_grad(S):
    """ps-lite's sum check: worker w pushes -(w + 1) at every clock (ASP steps by lr / W: use lr = W = 2)."""
    return lambda params, clock, batch: (np.full_like(params, -(RANK - S + 1.0)), batch)


def slow(grad_fn, seconds=0.001):
    """``grad_fn`` taking ``seconds`` of (sleeping) compute, so that the random delays, not the machine's
    load, decide the order in which the workers' pushes land."""
    def timed(params, clock, batch):
        time.sleep(seconds)
        return grad_fn(params, clock, batch)
    return timed


def case_retries():
    S = 2
    base = PSOptions(servers=S, consistency="bsp", budget=40, lr=0.05, ps_timeout=20.0)
    ref = run(COMM, base, np.zeros(11), least_squares(S), make_optimizer=PLAIN_SGD)
    got = run(COMM, PSOptions(**{**base.__dict__, **FAULTS}), np.zeros(11), least_squares(S),
              make_optimizer=PLAIN_SGD)
    if RANK == 0:
        check(np.array_equal(got.params, ref.params), "bsp with faults and retries: parameters differ from "
              f"the fault-free run by {np.abs(got.params - ref.params).max()}")
        c = got.counts
        check(c["dropped_replies"] > 0 and c["late_replies"] > 0 and c["replayed_replies"] > 0,
              f"bsp: the faults did not happen: {c}")
        check(sum(st["resends"] for st in got.workers) > 0, f"bsp: no resend: {got.workers}")
        check(got.versions == [20, 20] and ref.versions == [20, 20], f"bsp versions {got.versions}, {ref.versions}")
    asp = PSOptions(servers=S, consistency="asp", budget=60, lr=2.0, ps_timeout=20.0, **FAULTS)
    res = run(COMM, asp, np.zeros(5), sum_grad(S), make_optimizer=PLAIN_SGD)
    if RANK == 0:
        pushes = [int(st["pushes"]) for st in res.workers]
        want = sum((w + 1) * p for w, p in enumerate(pushes))
        check(np.array_equal(res.params, np.full(5, float(want))), f"asp: params {res.params}, every push once "
              f"gives {want} (pushes {pushes})")
        check(res.pushes == sum(pushes) and res.versions == [sum(pushes)] * S, f"asp: servers applied {res.pushes} "
              f"pushes (versions {res.versions}), the workers made {sum(pushes)}")
        c = res.counts
        check(c["pushes_received"] == S * sum(pushes), f"asp: pushes received {c}, pushes {pushes}")
        check(c["duplicate_pushes"] > 0 and c["replayed_replies"] > 0, f"asp: no resent push was seen: {c}")
        check(sum(st["stale_replies"] for st in res.workers) > 0, f"asp: no late original was dropped: {res.workers}")
    # load balancing beside retries: a late PARAMS arriving while a worker waits for its BATCH is stale
    bal = PSOptions(servers=S, consistency="asp", budget=120, lr=2.0, ps_timeout=20.0, balance=True, balance_every=1,
                    worker_batch=4, late_replies=0.4, late_s=0.1, retries=5, retry_s=0.01)
    res = run(COMM, bal, np.zeros(5), sum_grad(S), make_optimizer=PLAIN_SGD)
    if RANK == 0:
        pushes = sum(int(st["pushes"]) for st in res.workers)  # batches vary, so no sum check: counts
        check(res.status == ["done", "done"] and res.pushes == pushes and res.versions == [pushes] * S,
              f"asp with balancing and retries: status {res.status}, applied {res.pushes} ({res.versions}), "
              f"pushed {pushes}")


def case_cas():
    S = 2
    for cons in ("asp", "ssp"):
        # ASP: a 3x straggler; SSP(1): workers of one speed with random delays, since a steady straggler
        # never conflicts there (the fast worker reads only once the slow one's clock is folded)
        speed = dict(straggler="3:3") if cons == "asp" else dict(jitter=0.003)
        opts = PSOptions(servers=S, consistency=cons, staleness=1, budget=60, lr=2.0, ps_timeout=20.0,
                         conflict="cas", conflict_lag=0, **speed)
        res = run(COMM, opts, np.zeros(5), sum_grad(S) if cons == "asp" else slow(sum_grad(S)),
                  make_optimizer=PLAIN_SGD)
        if RANK != 0:
            continue
        pushes = [int(st["pushes"]) for st in res.workers]
        refused = sum(int(st["refused"]) for st in res.workers)
        check(refused > 0 and res.counts["refused"] == refused, f"{cons} cas: workers saw {refused} refusals, "
              f"servers made {res.counts['refused']}")
        check(res.counts["pushes_received"] == S * sum(pushes) + refused, f"{cons} cas: {res.counts}, {pushes}")
        check(sum(st["wasted_compute_s"] for st in res.workers) > 0, f"{cons} cas: no wasted compute counted")
        if cons == "asp":
            want = sum((w + 1) * p for w, p in enumerate(pushes))
            check(np.array_equal(res.params, np.full(5, float(want))) and res.versions == [sum(pushes)] * S,
                  f"asp cas: params {res.params} versions {res.versions}, want {want} and {sum(pushes)}")


def _good_worker(comm, w, clocks):
    client = Client(comm, w, [0], [1, 2, 3], 6, np.float64, 20.0)
    params, clock, _ = client.join()
    while clock < clocks:
        rng = np.random.default_rng(100 * w + clock)
        client.push(clock, params - rng.standard_normal(6))
        clock += 1
        if client.pull(clock, params) != "params":
            break
    client.finish()


def _bad_worker(comm, bad):
    """Join, push zeros at clock 0 (request id 105), and leave; with ``bad``, first each malformed push
    (awaiting its REJECT), then the same id again with other data."""
    client = Client(comm, 2, [0], [1, 2, 3], 6, np.float64, 20.0)
    client.join()
    malformed = [(np.ones(4), (101, 0, 0)), (np.ones(6, np.float32), (102, 0, 0)), (np.ones(6), (103, 0, 5)),
                 (np.ones(6), (104, 10 ** 9, 0))]  # (rid, version, shard)
    sends = (malformed if bad else []) + [(np.zeros(6), (105, 0, 0))] + ([(np.ones(6), (105, 0, 0))] if bad else [])
    codes = []
    for data, meta in sends:
        rid, version, shard = meta
        wait_all(send(comm, 0, Msg.PUSH, 2, 0, data, rid=rid, version=version, shard=shard), time.monotonic() + 20,
                 "push")
        if meta[0] == 105 and data[0] == 0:
            continue  # the good push: no answer
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = probe(comm)
            if got is not None:
                header, _ = receive(comm, got[0], got[1], deadline)
                codes.append(int(header[H_CLOCK]) if header[H_TYPE] == Msg.REJECT else -int(header[H_TYPE]))
                break
            time.sleep(0.001)
    client.finish()
    check(codes == ([1, 2, 3, 4, 5] if bad else []), f"bad worker: REJECT codes {codes}, want [1, 2, 3, 4, 5]")


def case_badinput():
    results = []
    for bad in (False, True):
        comm = COMM.Dup()
        opts = PSOptions(servers=1, consistency="bsp", budget=10 ** 6, lr=0.1, ps_timeout=20.0)
        if RANK == 0:
            server = Server(comm, 0, [1, 2, 3], np.zeros(6), 6, opts, PLAIN_SGD)
            server.serve()
            results.append((server.params.copy(), dict(server.rejected), dict(server.counts)))
        elif RANK == 3:
            _bad_worker(comm, bad)
        else:
            _good_worker(comm, RANK - 1, 12)
        comm.Barrier()
        comm.Free()
    if RANK == 0:
        (ref, rej0, _), (got, rej1, counts) = results
        check(rej0 == {} and rej1 == {1: 1, 2: 1, 3: 1, 4: 1, 5: 1} and counts["rejected"] == 5,
              f"rejections counted {rej0}, {rej1}, {counts}")
        check(np.array_equal(got, ref), "the good workers' result changed with a bad worker beside them")


CASES = {"retries": case_retries, "cas": case_cas, "badinput": case_badinput}

if __name__ == "__main__":
    for name in (CASES if sys.argv[1] == "all" else [sys.argv[1]]):  # "all": every case in one launch
        CASES[name]()
    sys.exit(report(COMM, f"mpi_ps_versions {sys.argv[1]}"))
