"""Run records of a parameter-server training run: snapshot evaluation, table, summary, files.

Called by :func:`training.ps_mode.worker.run_ps`. Rank 0 evaluates, after training, the shard snapshots
the servers kept (so evaluation never slows the servers down), which gives test accuracy against
wall time and pushes. Written into the run directory (rank 0 alone):

``summary.json``
    Final accuracies, wall time, updates (pushes) per second, time to the target accuracy, the
    staleness histogram, per-worker statistics, worker status and fault events.
``epochs.jsonl``
    One line per epoch of pushes (``W x clocks per epoch``), at the first parameter snapshot past the
    epoch's end (``epochs_done``: the epochs of pushes it holds): loss, train and test accuracy.
``metrics.jsonl``
    One line per snapshot: ``pushes``, ``clock`` (pushes / W), ``wall_s``, ``test_acc``, ``test_loss``.
``staleness.json``
    ``{"histogram": {staleness: served shard pulls}, "max": ..., "mean": ...}``.
``ps_model.npz``
    ``params``: the final flat parameters (no pickle).
"""
import os

import numpy
from mpi4py import MPI

from commlab.file_formats import write_npz
from commlab.file_formats import write_json
from commlab.run_files import MetricsWriter, run_info
from training.dp.data_parallel import evaluate

__all__ = ["evaluate_snapshots", "write_records", "time_to_accuracy", "staleness_stats", "TARGET_ACC"]

TARGET_ACC = 0.95  # test accuracy whose first crossing time the summary reports


def evaluate_snapshots(result, model, loss_fn, data, eval_batch, pushes_per_epoch):
    """Evaluate every snapshot (test set) and every epoch boundary (train and test sets).

    The final parameters are the last point of the curve (and close the last epoch) unless a
    snapshot was taken at the final push count.

    Parameters
    ----------
    result : ps.job.reports.RunResult
        Rank 0's result.
    model : training.model.nn.Sequential
        A host model whose flat ``params`` are overwritten with each snapshot.
    loss_fn : training.model.nn.SoftmaxCrossEntropy
    data : tuple of ndarray
        ``(x_train, y_train, x_test, y_test)`` on the host, features in the model dtype.
    eval_batch : int
        Samples per forward pass.
    pushes_per_epoch : int
        Pushes that make one epoch (``W x clocks per epoch``).

    Returns
    -------
    dict
        ``curve`` (list of dicts), ``epochs`` (list of dicts), ``final`` (dict of accuracies and losses).
    """
    x_tr, y_tr, x_te, y_te = data
    W = max(1, len(result.status))

    def acc_loss(params, x, y):
        model.params[...] = params
        return evaluate(model, loss_fn, x, y, MPI.COMM_SELF, eval_batch)

    train_acc, train_loss = acc_loss(result.params, x_tr, y_tr)
    test_acc, test_loss = acc_loss(result.params, x_te, y_te)
    final = {"train_acc": train_acc, "train_loss": train_loss, "test_acc": test_acc, "test_loss": test_loss}
    points = list(result.snapshots)
    if result.pushes > (points[-1][0] if points else result.start_pushes):
        points.append((result.pushes, result.wall, None))  # the final parameters close the record
    curve, epochs, prev = [], [], result.start_pushes
    for pushes, wall, params in points:
        test_acc, test_loss = acc_loss(params, x_te, y_te) if params is not None else (
            final["test_acc"], final["test_loss"])
        curve.append({"pushes": int(pushes), "clock": pushes / W, "wall_s": float(wall),
                      "test_acc": test_acc, "test_loss": test_loss})
        if pushes // pushes_per_epoch > prev // pushes_per_epoch:
            train_acc, loss = acc_loss(params, x_tr, y_tr) if params is not None else (
                final["train_acc"], final["train_loss"])
            epochs.append({"epoch": int(pushes // pushes_per_epoch), "epochs_done": pushes / pushes_per_epoch,
                           "pushes": int(pushes),
                           "wall_s": float(wall), "loss": loss, "train_acc": train_acc,
                           "test_acc": test_acc})
        prev = pushes
    return {"curve": curve, "epochs": epochs, "final": final}


def time_to_accuracy(curve, target=TARGET_ACC):
    """Return the first ``wall_s`` at which ``test_acc >= target`` in ``curve`` (None if never)."""
    for point in curve:
        if point["test_acc"] >= target:
            return point["wall_s"]
    return None


def staleness_stats(hist):
    """Return ``(max, mean)`` of a staleness histogram ``{clocks: count}`` ((0, 0.0) if empty)."""
    total = sum(hist.values())
    if not total:
        return 0, 0.0
    return max(hist), sum(k * v for k, v in hist.items()) / total


def _table(epochs):
    # one row at the first parameter snapshot past each epoch boundary: the epochs (and pushes, counted
    # from the start) at which it was taken
    cols = (("epochs", 6), ("pushes so far", 13), ("wall s", 8), ("loss", 7), ("train acc", 9), ("test acc", 8))
    lines = ["  ".join(h.rjust(w) for h, w in cols)]
    for r in epochs:
        cells = (f"{r.get('epochs_done', r['epoch']):.2f}", f"{r['pushes']:d}", f"{r['wall_s']:.2f}", f"{r['loss']:.4f}",
                 f"{r['train_acc']:.2%}", f"{r['test_acc']:.2%}")
        lines.append("  ".join(c.rjust(w) for c, (_, w) in zip(cells, cols)))
    return "\n".join(lines)


def write_records(cfg, comm, run_dir, result, evals, opts, n_params, per_epoch):
    """Rank 0: print the epoch table and summary line, write the run files, return the summary.

    Parameters
    ----------
    cfg : training.settings.config.Config
    comm : MPI.Comm
        The job's communicator (for P).
    run_dir : str
    result : ps.job.reports.RunResult
    evals : dict
        From :func:`evaluate_snapshots`; its ``monitor`` entry, when present, is the live monitor's
        findings (:func:`training.monitor.setup.close_monitor`), added to the summary.
    opts : ps.job.settings.PSOptions
    n_params : int
        Model size (parameters).
    per_epoch : int
        Clocks per epoch of one worker.

    Returns
    -------
    dict
        The summary written to ``summary.json``.
    """
    W = len(result.status)
    hist = {int(k): int(v) for k, v in result.staleness_histogram.items()}
    s_max, s_mean = staleness_stats(hist)
    done = [s for s in result.workers if s is not None]
    samples = sum(s["samples"] for s in done)
    job_s = result.wall - result.start_wall  # seconds of this job (a resumed job counts its own)
    summary = {
        "mode": "ps", "consistency": cfg.consistency, "staleness_bound": cfg.staleness,
        "servers": cfg.servers, "workers": W, "P": comm.Get_size(), "parameters": n_params,
        "final_test_acc": evals["final"]["test_acc"], "final_train_acc": evals["final"]["train_acc"],
        "epochs": result.pushes / (W * per_epoch), "pushes": result.pushes, "wall_s": result.wall,
        "updates_per_s": (result.pushes - result.start_pushes) / job_s if job_s else 0.0,
        "samples_per_s": samples / job_s if job_s else 0.0,
        "resumed_at_pushes": result.start_pushes,
        "target_acc": TARGET_ACC, "time_to_target_s": time_to_accuracy(evals["curve"]),
        "staleness_histogram": hist, "staleness_max": s_max, "staleness_mean": s_mean,
        "worker_status": result.status, "worker_stats": result.workers,
        "events": [{"wall_s": t, "event": e} for t, e in result.events],
        "straggler": cfg.straggler, "jitter": cfg.jitter, "fail_worker": cfg.fail_worker,
        "delay_prob": opts.delay_prob, "delay_s": opts.delay_s, "balance": opts.balance,
        "conflict": opts.conflict, "conflict_lag": opts.conflict_lag, "retries": opts.retries,
        "versions": result.versions, "server_counts": result.counts, "rejected": result.rejected,
        "replicas": opts.replicas, "servers_lost": result.servers_lost,
        "lost_acknowledged": result.lost_acknowledged, "replica_records": result.replicas,
        "failovers": sum(s.get("failovers", 0) for s in done),
        "refused_per_push": sum(s["refused"] for s in done) / max(1, sum(s["pushes"] for s in done)),
        "wasted_compute_s": sum(s["wasted_compute_s"] for s in done),
        "resends": sum(s["resends"] for s in done),
        "curve": [{k: p[k] for k in ("pushes", "wall_s", "test_acc")} for p in evals["curve"]],
        "run": run_info(comm), "run_dir": run_dir, **evals.get("monitor", {}),
    }
    writer = MetricsWriter(run_dir, True)
    for point in evals["curve"]:
        writer.step(point)
    for row in evals["epochs"]:
        writer.epoch(row)
    writer.close()
    write_json(os.path.join(run_dir, "staleness.json"),
               {"histogram": hist, "max": s_max, "mean": s_mean, "consistency": cfg.consistency,
                "bound": cfg.staleness if cfg.consistency == "ssp" else (0 if cfg.consistency == "bsp" else None)})
    write_npz(os.path.join(run_dir, "ps_model.npz"), {"params": numpy.asarray(result.params)})
    write_json(os.path.join(run_dir, "summary.json"), summary)
    print(_table(evals["epochs"]), flush=True)
    for t, e in result.events:
        print(f"  at {t:.2f} s: {e}", flush=True)
    print("staleness (clocks: served shard pulls): "
          + ", ".join(f"{k}: {v}" for k, v in sorted(hist.items())), flush=True)
    ttt = summary["time_to_target_s"]
    print(f"test accuracy {summary['final_test_acc']:.2%} after {summary['epochs']:.2f} epochs | wall "
          f"{result.wall:.1f} s | {summary['updates_per_s']:.1f} updates/s | time to {TARGET_ACC:.0%} "
          f"{'never' if ttt is None else f'{ttt:.1f} s'} | staleness max {s_max} mean {s_mean:.2f} | "
          f"{run_dir}", flush=True)
    return summary
