"""Rank-side bodies of the parameter-server tests: ``python -m tests.mpi_ps CASE [ARGS] [+ CASE [ARGS] ...]``.

Cases joined by ``+`` run in turn in one launch, each ending with its own count line (``mpi_ps CASE:
N failures on P ranks``); ``fail`` comes last (its runs end with a worker dropped, or with every rank
stopped by the error).

Cases (each runs on every rank; the first ``S`` ranks serve):

``sum S K``          ps-lite's sum check: worker w pushes ``-(w + 1)`` (unit step) K times under BSP,
                     SSP(0), SSP(1) and ASP; the final parameters are exactly ``sum_w (w + 1) x
                     pushes_w`` under ASP (every push applied) and ``clocks x W (W + 1) / 2`` under
                     BSP and SSP (one update per complete clock); every BSP and SSP(0) pull at
                     clock c reads exactly ``c x W (W + 1) / 2``, every SSP(1) pull ``k`` whole
                     clocks' worth with ``c - 1 <= k <= c``; the workers' statistics hold
                     their counts as ints (clock == pushes).
``staleness S``      one-hot pushes reveal which pushes each pull folds in, so every worker measures
                     the staleness of its own pulls from the values; with a 4x straggler: BSP <= 0,
                     SSP(s) <= s for s in {1, 2, 4}, ASP exceeds 4; under BSP and ASP a worker
                     always sees its own pushes, under SSP(s) at least its clocks up to c - s - 1;
                     the servers' histogram equals the one measured from the values.
``oracle S``         BSP and SSP(0) with SGD-momentum on least squares (float64) against a
                     single-process NumPy run on the same global batches (relative tolerance
                     1e-12); and SSP(0) against BSP bitwise, with a 4x straggler and jitter
                     shuffling the arrival order: both serve the same reads and apply one step on
                     the same worker-ordered mean per clock.
``resume S DIR``     BSP for K1 clocks with a checkpoint, then a second job resumed from it to K2
                     clocks: equal to the NumPy oracle at K2 (relative tolerance 1e-12); a resume
                     under another run id is refused on every rank, naming the file.
``balance S``        BSP with a 4x straggler and balancing: the straggler ends with the smallest batch
                     (at most half the nominal one) and the batches sum to W x batch.
``fail S CONS...``   the last rank stops communicating at step 5: under ASP/SSP the run finishes
                     with it dropped; under BSP every other rank stops with the error naming it.
``finish``           the end-of-run check (:func:`training.ps_mode.finish.finish_together`), rank 2
                     the reporter: when it never answers, ranks 0 and 1 report it missing within
                     2 grace + slack seconds instead of waiting forever; when every rank takes part,
                     none is missing.

Checks go through the shared harness (:mod:`tests.mpicases`): rank 0 prints every failed check with
its rank and one count line, and every rank exits 1 when any check failed, else 0. An unexpected
exception aborts the whole job so that no rank hangs.
"""
import functools
import sys
import time
import traceback

import numpy as np
from mpi4py import MPI

from ps.job.settings import PSOptions
from ps.wire.messages import PSError
from ps.job.runner import run
from commlab.file_formats import CheckpointError
from tests.mpicases import FAILS, check, report
from training.model.optim import SGD

COMM = MPI.COMM_WORLD
PLAIN_SGD = functools.partial(SGD, momentum=0.0)  # the servers' update rule: w -= lr g
_HIST = 64  # bins of the measured staleness histogram


def _workers(S):
    return COMM.Get_size() - S


def case_sum(S, K):
    W = _workers(S)
    total = W * (W + 1) // 2
    for cons, stale in (("bsp", 0), ("ssp", 0), ("ssp", 1), ("asp", 0)):
        name = f"{cons}({stale})" if cons == "ssp" else cons
        opts = PSOptions(servers=S, consistency=cons, staleness=stale, budget=K * W, lr=float(W),
                         ps_timeout=20.0)
        exact = cons == "bsp" or (cons == "ssp" and stale == 0)  # BSP and SSP(0) read whole clocks
        seen = []

        def grad_fn(params, clock, batch):
            w = COMM.Get_rank() - S
            if exact:
                seen.append(bool(np.all(params == clock * total)))
            elif cons == "ssp":  # whole clocks only (each server's own), at most `stale` of them missing
                k = params / total
                seen.append(bool(np.all((k == np.rint(k)) & (clock - stale <= k) & (k <= clock))))
            return np.full_like(params, -(w + 1.0)), batch

        res = run(COMM, opts, np.zeros(7), grad_fn, make_optimizer=PLAIN_SGD)
        if isinstance(res, dict) and cons != "asp":
            check(all(seen), f"{name}: a pull did not read whole clocks, at most {stale} stale, x {total}")
        if COMM.Get_rank() == 0:
            if cons == "asp":  # every push is its own update
                expect = sum((w + 1) * int(st["pushes"]) for w, st in enumerate(res.workers))
            else:  # one update per complete clock; pushes of unfinished clocks are not applied
                check(res.pushes % W == 0, f"{name}: {res.pushes} pushes folded, not whole clocks of {W}")
                expect = res.pushes // W * total
            check(np.all(res.params == expect), f"{name}: final {res.params} != exact sum {expect}")
            check(res.pushes >= K * W, f"{name}: {res.pushes} pushes < budget {K * W}")
            if exact:
                pushed = sum((w + 1) * int(st["pushes"]) for w, st in enumerate(res.workers))
                check(pushed == K * total == expect, f"{name}: workers pushed {pushed}, folded {expect} "
                                                     f"!= K x {total}")
            _check_stat_types(name, res.workers)


def _check_stat_types(cons, workers):
    """Counts in the worker statistics are ints (JSON ``0``, not ``0.0``), ``dropped`` a bool."""
    for w, st in enumerate(workers):
        ints = {k: st[k] for k in ("worker", "clock", "pushes", "samples", "batch", "max_staleness")}
        check(all(type(v) is int for v in ints.values()), f"{cons}: worker {w} counts not int: {ints}")
        check(st["worker"] == w and st["clock"] == st["pushes"],
              f"{cons}: worker {w} stats name worker {st['worker']}, clock {st['clock']} != pushes")
        check(st["dropped"] is False and type(st["wait_s"]) is float, f"{cons}: worker {w} stats {st}")


def _one_hot_run(S, cons, staleness, straggler=True, budget_clocks=30):
    """Run the one-hot workload; return (measured histogram, rank 0 result or None)."""
    W = _workers(S)
    n = S * W  # coordinate s*W + w counts worker w's pushes folded into shard s
    hist = np.zeros(_HIST, np.int64)
    opts = PSOptions(servers=S, consistency=cons, staleness=staleness, budget=budget_clocks * W,
                     lr=float(W), ps_timeout=20.0, straggler=f"{S}:4" if straggler else "")
    w = COMM.Get_rank() - S
    grad = np.zeros(n)
    grad[np.arange(S) * W + w] = -1.0

    def grad_fn(params, clock, batch):
        if clock > 0:  # clock 0 reads the join answer, which is not a served pull
            counts = np.rint(params).reshape(S, W)
            check(np.all(np.abs(params - counts.ravel()) < 1e-9), "pulled counts are not integers")
            low = clock - staleness if cons == "ssp" else clock  # SSP folds own pushes by clock
            check(np.all((counts[:, w] >= low) & (counts[:, w] <= clock)),
                  f"{cons}({staleness}): worker {w} at clock {clock} reads {counts[:, w]} of its own pushes, "
                  f"want {low} .. {clock}")
            for s in range(S):
                hist[min(_HIST - 1, int(clock - counts[s].min()))] += 1
        time.sleep(0.001)
        return grad, batch

    res = run(COMM, opts, np.zeros(n), grad_fn, make_optimizer=PLAIN_SGD)
    COMM.Allreduce(MPI.IN_PLACE, hist, op=MPI.SUM)
    return hist, res


def case_staleness(S):
    for cons, s in (("bsp", 0), ("ssp", 1), ("ssp", 2), ("ssp", 4), ("asp", None)):
        hist, res = _one_hot_run(S, cons, s or 0)
        measured = int(np.flatnonzero(hist).max()) if hist.any() else 0
        name = f"{cons}({s})" if cons == "ssp" else cons
        if s is not None:
            check(measured <= s, f"{name}: measured staleness {measured} exceeds the bound {s}")
        else:
            check(measured > 4, f"asp: measured staleness {measured}; a 4x straggler should exceed 4")
        if COMM.Get_rank() == 0:
            server = np.zeros(_HIST, np.int64)
            for k, v in res.staleness_histogram.items():
                server[min(_HIST - 1, k)] += v
            check(np.array_equal(server, hist), f"{name}: server histogram {res.staleness_histogram} != measured "
                                                f"{dict((int(k), int(hist[k])) for k in np.flatnonzero(hist))}")
            if cons == "ssp" and s >= 2:
                check(measured > 0, f"{name}: no stale pull at all with a 4x straggler")


def _lsq(w, clock, d, b=8):
    """Worker ``w``'s least-squares batch at ``clock``: (X (b, d), y (b,)), float64."""
    rng = np.random.default_rng([w, clock, 12345])
    return rng.standard_normal((b, d)), rng.standard_normal(b)


def _lsq_grad(p, w, clock):
    X, y = _lsq(w, clock, p.shape[0])
    return X.T @ (X @ p - y) / X.shape[0]


def _oracle(W, d, clocks, lr, mu):
    p, v = np.linspace(-1, 1, d), np.zeros(d)
    for c in range(clocks):
        g = _lsq_grad(p, 0, c)
        for w in range(1, W):
            g += _lsq_grad(p, w, c)
        g /= W
        v *= mu
        v += g
        p -= lr * v
    return p


def _lsq_run(S, clocks, ckpt="", resume="", d=11, lr=0.05, mu=0.9, consistency="bsp", straggler="", run_id=""):
    opts = PSOptions(servers=S, consistency=consistency, staleness=0, budget=clocks * _workers(S), lr=lr,
                     ps_timeout=20.0, checkpoint_dir=ckpt, resume_dir=resume, straggler=straggler,
                     jitter=0.002 if straggler else 0.0, run_id=run_id)
    w = COMM.Get_rank() - S
    return run(COMM, opts, np.linspace(-1, 1, d), lambda p, c, b: (_lsq_grad(p, w, c), b),
               make_optimizer=functools.partial(SGD, momentum=mu))


def _close(a, b):
    return np.allclose(a, b, rtol=1e-12, atol=1e-12)


def case_oracle(S):
    bsp = _lsq_run(S, 25)
    ssp0 = _lsq_run(S, 25, consistency="ssp", straggler=f"{COMM.Get_size() - 1}:4")
    if COMM.Get_rank() == 0:
        want = _oracle(_workers(S), 11, 25, 0.05, 0.9)
        check(_close(bsp.params, want), f"BSP != NumPy SGD: max diff {np.abs(bsp.params - want).max():.3g}")
        check(_close(ssp0.params, want), f"SSP(0) != NumPy SGD: max diff {np.abs(ssp0.params - want).max():.3g}")
        check(np.array_equal(ssp0.params, bsp.params),
              f"SSP(0) != BSP bitwise: max diff {np.abs(ssp0.params - bsp.params).max():.3g}")
        check(ssp0.pushes == bsp.pushes == 25 * _workers(S) and ssp0.staleness_histogram.keys() <= {0},
              f"SSP(0) folded {ssp0.pushes} pushes (BSP {bsp.pushes}), staleness {ssp0.staleness_histogram}")


def case_resume(S, directory):
    first = _lsq_run(S, 10, ckpt=directory, run_id="aa")
    COMM.Barrier()  # as a new job would: the servers write their files after the workers have returned
    try:  # a run of another id refuses the shards on every rank, before any message, naming the file
        _lsq_run(S, 25, ckpt=directory, resume=directory, run_id="bb")
        said = "no error"
    except CheckpointError as e:
        said = str(e)
    check("ps_server0.npz was written by run aa, not by run bb" in said, f"resume by another run: {said}")
    second = _lsq_run(S, 25, ckpt=directory, resume=directory, run_id="aa")
    if COMM.Get_rank() == 0:
        W = _workers(S)
        check(_close(first.params, _oracle(W, 11, 10, 0.05, 0.9)), "first run != oracle at 10 clocks")
        want = _oracle(W, 11, 25, 0.05, 0.9)
        check(second.pushes == 25 * W, f"resumed run folded {second.pushes} pushes, want {25 * W}")
        check(_close(second.params, want), f"resumed run != oracle at 25 clocks: max diff "
                                           f"{np.abs(second.params - want).max():.3g}")


def case_balance(S):
    W, B = _workers(S), 16
    opts = PSOptions(servers=S, consistency="bsp", budget=60 * W, lr=1.0, worker_batch=B,
                     balance=True, balance_every=5, straggler=f"{S}:4", ps_timeout=20.0)

    def grad_fn(params, clock, batch):
        time.sleep(1e-4 * batch)  # compute time proportional to the batch
        return np.zeros_like(params), batch

    res = run(COMM, opts, np.zeros(5), grad_fn, make_optimizer=PLAIN_SGD)
    if COMM.Get_rank() == 0:
        batches = [int(st["batch"]) for st in res.workers]
        check(sum(batches) == W * B, f"batches {batches} do not sum to W x batch = {W * B}")
        check(batches[0] == min(batches) and batches[0] <= B // 2,
              f"straggler (worker 0) batch {batches[0]} is not the smallest of {batches}")


def case_fail(S, *models):
    failed = COMM.Get_size() - 1
    for cons in models:
        opts = PSOptions(servers=S, consistency=cons, staleness=1, budget=40 * _workers(S), lr=1.0,
                         ps_timeout=1.0, fail_worker=f"{failed}:5")
        grad_fn = lambda p, c, b: (time.sleep(0.002), (np.ones_like(p), b))[1]  # noqa: E731
        try:
            res = run(COMM, opts, np.zeros(6), grad_fn, make_optimizer=PLAIN_SGD)
        except PSError as e:
            check(cons == "bsp", f"{cons}: unexpected error {e}")
            check(f"rank {failed}" in str(e), f"bsp: error does not name rank {failed}: {e}")
            continue
        if COMM.Get_rank() == failed:
            check(res is None, f"{cons}: the failed worker returned {res}")
            continue
        check(cons != "bsp", "bsp: a live rank finished without the error")
        if COMM.Get_rank() == 0 and res is not None:
            want = ["done"] * (_workers(S) - 1) + ["dropped"]
            check(res.status == want, f"{cons}: worker status {res.status}, want {want}")
            check(any(f"rank {failed}" in e for _, e in res.events), f"{cons}: no drop event {res.events}")
            check(res.pushes >= opts.budget, f"{cons}: {res.pushes} pushes < budget {opts.budget}")


def case_finish():
    from training.ps_mode.finish import finish_together

    rank, token = COMM.Get_rank(), np.zeros(1, np.int8)
    start = time.monotonic()
    if rank != 2:  # the reporter (rank 2) is busy elsewhere and never answers
        missing, gone = finish_together(COMM, 0.1, root=2, slack=0.3)
        check(missing == [2] and not gone, f"rank {rank}: unanswered check gave {missing}, {gone}")
        check(time.monotonic() - start < 5.0, f"rank {rank}: waited {time.monotonic() - start:.1f} s")
    else:
        time.sleep(1.0)
        for source in (0, 1):  # the two check-ins that were never answered
            COMM.Recv(token, source=source, tag=0x5E1D)
    COMM.Barrier()
    missing, gone = finish_together(COMM, 5.0, root=2, slack=0.3)
    check(missing == [] and not gone, f"rank {rank}: all present, got {missing}, {gone}")


CASES = {"sum": case_sum, "staleness": case_staleness, "oracle": case_oracle, "resume": case_resume,
         "balance": case_balance, "fail": case_fail, "finish": case_finish}


def main(argv):
    """Run the cases of ``argv`` (``CASE ARGS [+ CASE ARGS ...]``) in turn; each reports its own count line."""
    failed, groups = 0, [[]]
    for word in argv:
        groups.append([]) if word == "+" else groups[-1].append(word)
    for name, *words in groups:
        args = [int(a) if a.isdigit() else a for a in words]
        try:
            CASES[name](*args)
        except Exception:  # noqa: BLE001 - report, then abort every rank so nothing hangs
            traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            COMM.Abort(2)
        failed |= report(COMM, f"mpi_ps {name}")
        FAILS.clear()
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
