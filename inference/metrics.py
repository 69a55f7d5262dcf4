"""Serving metrics: per-request records (JSONL) and the run's summary.

Per request, on the front's clock: ``latency`` = answer - arrival; ``batch_wait`` = first dispatch -
arrival (time in the dynamic batcher); on the replica: ``compute`` (forward without all-reduce) and
``comm`` (tensor-parallel all-reduce); ``queue`` = latency - batch_wait - busy, where busy is the
replica's whole time on the batch (compute, all-reduce, emulated service time, straggler delay), so
``queue`` holds the wait behind earlier batches at the replica, the messages both ways, and the
front loop's own delay. Percentiles use NumPy's default (linear interpolation).
"""
import json
import math

import numpy

__all__ = ["percentiles", "request_record", "summarize", "write_jsonl"]


def percentiles(values, qs=(50, 95, 99)):
    """Return ``{q: percentile}`` of ``values`` (NaN entries ignored; NaN when none are left)."""
    v = numpy.asarray([x for x in values if not math.isnan(x)], numpy.float64)
    return {q: (float(numpy.percentile(v, q)) if v.size else math.nan) for q in qs}


def _ms(s):
    return None if math.isnan(s) else round(s * 1e3, 4)


def request_record(req, t0, correct):
    """Return one request's JSONL record (times in ms from the run's start ``t0``).

    ``logits`` are written with Python's shortest round-trip float repr, so reading them back
    gives the float64 values bitwise.
    """
    queue = req.latency - req.batch_wait - req.busy_s if req.status == "ok" else math.nan
    return {"id": req.rid, "row": int(req.row), "status": req.status, "error": req.error,
            "arrival_ms": _ms(req.arrival - t0), "latency_ms": _ms(req.latency),
            "batch_wait_ms": _ms(req.batch_wait), "queue_ms": _ms(queue), "compute_ms": _ms(req.compute_s),
            "comm_ms": _ms(req.comm_s), "replica": req.replica, "batch_size": req.batch_size,
            "attempts": req.attempts, "correct": bool(correct),
            "prediction": int(numpy.argmax(req.logits)) if req.logits is not None else None,
            "logits": req.logits.tolist() if req.logits is not None else None}


def summarize(front, correct, t0, t_end, extra=None):
    """Return the run's summary from the front's requests.

    Parameters
    ----------
    front : inference.front.Front
    correct : sequence of bool
        Per request (same order as ``front.requests``): answer equal to the single-process prediction.
    t0, t_end : float
        Start of the load and the last answer (seconds, front clock).
    extra : dict, optional
        Entries added as they are (configuration, offered load).

    Returns
    -------
    dict
        ``requests``, ``answered`` (status ok), ``correct``, ``rejected`` (bad input), ``refused``
        (full queue or latency objective), ``failed``, ``retried``, latency percentiles (ms) of
        answered requests, their mean breakdown, ``throughput_rps`` (answered / (t_end - t0)), the
        batch-size histogram and mean, per-replica load, removals and lost links (the MPI library's error); under a latency objective
        also ``slo_ms``, ``goodput_rps`` (answers within it per second) and the final batch size.
    """
    reqs = front.requests
    ok = [r for r in reqs if r.status == "ok"]
    lat = percentiles([r.latency for r in ok])
    wall = max(t_end - t0, 1e-9)
    sizes = front.batch_sizes
    nb = int(sizes.sum())
    R = len(front.leaders)
    per = [{"replica": r, "batches": int(front.replica_batches[r]), "requests_sent": int(front.replica_sent[r]),
            "answered": int(sum(1 for q in ok if q.replica == r)),
            "removed_at_s": (round(front.removed[r] - t0, 4) if r in front.removed else None),
            "lost": front.lost.get(r)} for r in range(R)]

    def mean_ms(vals):
        v = [x for x in vals if not math.isnan(x)]
        return round(float(numpy.mean(v)) * 1e3, 4) if v else None

    n_ok = front.outcomes["ok"]
    out = {
        "requests": sum(front.outcomes.values()) + front.pending(), "answered": n_ok,
        "correct": int(sum(bool(c) for c in correct)), "rejected": front.outcomes["rejected"],
        "refused": front.outcomes["refused"], "failed": front.outcomes["failed"],
        "pending": front.pending(), "retried": sum(r.attempts > 1 for r in reqs),
        "latency_p50_ms": _ms(lat[50]), "latency_p95_ms": _ms(lat[95]), "latency_p99_ms": _ms(lat[99]),
        "latency_mean_ms": mean_ms([r.latency for r in ok]),
        "batch_wait_mean_ms": mean_ms([r.batch_wait for r in ok]),
        "queue_mean_ms": mean_ms([r.latency - r.batch_wait - r.busy_s for r in ok]),
        "compute_mean_ms": mean_ms([r.compute_s for r in ok]), "comm_mean_ms": mean_ms([r.comm_s for r in ok]),
        "throughput_rps": round(n_ok / wall, 3), "wall_s": round(wall, 4),
        "batch_size_histogram": [int(h) for h in sizes[1:]] if nb else [],
        "mean_batch_size": round(float(numpy.arange(sizes.size) @ sizes) / nb, 3) if nb else 0.0,
        "replicas": per, "late_replies_dropped": front.late_replies,
        "answer_events": front.answers, "duplicate_answers": front.duplicates,
    }
    slo = front.options.objective
    if slo is not None:  # answers within the objective per second
        out["slo_ms"] = slo.slo_s * 1e3
        out["goodput_rps"] = round(sum(r.latency <= slo.slo_s for r in ok) / wall, 3)
        out["batch_size_final"] = slo.size
    out.update(extra or {})
    return out


def write_jsonl(path, records):
    """Write ``records`` (dicts) to ``path``, one JSON object per line."""
    with open(path, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")
