"""The timeline (``--trace``) and the wait/transfer split of communication time.

In one process: the recorder's no-op path, its events and their Chrome form. Under ``mpiexec`` on
3 ranks (a non-power of two): the trainer's trace file read back as Chrome's Trace Event Format
(JSON Object Format, complete and metadata events), with events from every rank, properly nested
lanes, each bucket's all-reduce inside its step and as many per step as
``training.dp.hooks.bucket_bounds`` makes buckets; a rank held back by a known delay, whose peers
report it as wait and not as transfer, in the step records and in the trace alike; a compressor's
compress and decompress inside the gradient exchange; and a
parameter-server run whose workers' push/pull and servers' updates reach the merged file.

Run as ``mpiexec -n 3 python -m tests.test_trace OUT`` for the multi-rank body.
"""
import json
import sys
import time

import pytest

from commlab import tracing
from tests.mpirun import run_mpi

_TINY = ["--data", "synthetic", "--samples", "240", "--features", "8", "--classes", "3", "--hidden", "8,8",
         "--batch-size", "24", "--epochs", "2", "--no-progress"]
_BUCKET = 40  # bytes: several buckets of the 8-8-8-3 MLP's gradient
_DELAY = 0.4  # seconds rank 1 sleeps before each step of the skew case (well above a loaded machine's jitter)


def _check_chrome(doc):
    """Assert that ``doc`` is a Trace Event Format JSON object; return its complete events."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list), type(doc)
    assert doc.get("displayTimeUnit") in (None, "ms", "ns")
    complete = []
    for ev in doc["traceEvents"]:
        assert ev["ph"] in ("X", "M"), ev
        assert isinstance(ev["name"], str) and isinstance(ev["pid"], int) and isinstance(ev["tid"], int), ev
        if ev["ph"] == "M":
            assert ev["name"] in ("process_name", "process_sort_index", "thread_name"), ev
            assert isinstance(ev["args"], dict), ev
            continue
        assert isinstance(ev["ts"], (int, float)) and isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0, ev
        assert isinstance(ev.get("args", {}), dict), ev
        complete.append(ev)
    json.dumps(doc, allow_nan=False)  # strict JSON: no NaN or inf anywhere
    return complete


def _nested(events):
    """Assert that events of one (pid, tid) either nest or are disjoint (never overlap partly)."""
    lanes = {}
    for ev in events:
        lanes.setdefault((ev["pid"], ev["tid"]), []).append((ev["ts"], ev["ts"] + ev["dur"], ev["name"]))
    eps = 1e-3  # microseconds: rounding of ts and dur to 3 decimals
    for key, evs in lanes.items():
        evs.sort(key=lambda e: (e[0], -e[1]))
        open_ = []
        for lo, hi, name in evs:
            while open_ and open_[-1][1] <= lo + eps:
                open_.pop()
            assert not open_ or hi <= open_[-1][1] + eps, (key, name, (lo, hi), open_[-1])
            open_.append((lo, hi, name))


def _inside(ev, outer):
    return outer["ts"] - 1e-3 <= ev["ts"] and ev["ts"] + ev["dur"] <= outer["ts"] + outer["dur"] + 1e-3


def test_recorder_off_records_nothing_and_on_records_chrome_events():
    tracing.start()
    tracing.stop()  # on, then off: no events kept
    assert not tracing.enabled() and tracing.events() == []
    assert tracing.span("forward", "compute") is tracing.span("backward", "compute")  # the shared no-op
    with tracing.span("forward", "compute"):
        pass
    tracing.complete("step", "step", 0.0, 1.0)
    assert tracing.events() == []
    tracing.start()
    with tracing.span("step", "step", {"n": 1}):
        with tracing.span("forward", "compute"):
            time.sleep(0.002)
    tracing.complete("wait", "comm", 5.0, 4.0)  # t1 < t0: clamped to a zero duration
    tracing.stop()
    names = [e[0] for e in tracing.events()]
    assert names == ["forward", "step", "wait"], names
    chrome = tracing.chrome_events(7)
    events = _check_chrome({"traceEvents": chrome})
    assert {e["pid"] for e in chrome} == {7}
    fwd, step = (next(e for e in events if e["name"] == n) for n in ("forward", "step"))
    assert _inside(fwd, step) and fwd["dur"] >= 2000 and step["args"] == {"n": 1}  # microseconds
    assert {e["args"]["name"] for e in chrome if e["name"] == "thread_name"} == set(tracing.LANES)
    assert next(e for e in events if e["name"] == "wait")["dur"] == 0


def test_trace_file_of_a_data_parallel_run_and_wait_split(tmp_path):
    out = run_mpi(3, "tests.test_trace", str(tmp_path), timeout=120).stdout
    assert "case_skew: ok" in out, out
    doc = json.loads((tmp_path / "dp.json").read_text())
    events = _check_chrome(doc)
    assert {e["pid"] for e in events} == {0, 1, 2} and doc["otherData"]["missing_ranks"] == []
    _nested(events)
    from training.dp.hooks import bucket_bounds

    # the 8-8-8-3 MLP: parameters in flat order, float32; the oracle of the number of buckets
    sizes = [("W", 8 * 8), ("b", 8), ("W", 8 * 8), ("b", 8), ("W", 8 * 3), ("b", 3)]
    slices, off = [], 0
    for name, n in sizes:
        slices.append((name, off, n))
        off += n
    n_buckets = len(bucket_bounds(slices, 4, _BUCKET))
    assert n_buckets > 2
    steps_per_rank = 2 * (192 // 24)  # 2 epochs of 192 training samples, global batch 24
    for rank in range(3):
        mine = [e for e in events if e["pid"] == rank]
        steps = [e for e in mine if e["name"] == "step"]
        reduces = [e for e in mine if e["name"] == "allreduce"]
        assert len(steps) == steps_per_rank, (rank, len(steps))
        assert len(reduces) == n_buckets * steps_per_rank, (rank, len(reduces), n_buckets)
        for ev in reduces:
            assert any(_inside(ev, s) for s in steps), ev
            assert any(_inside(ev, x) for x in mine if x["name"] == "exchange"), ev
        for s in steps:  # forward, backward, wait, exchange, optimizer, in that order, inside the step
            parts = {e["name"]: e for e in mine if e["name"] in ("forward", "backward", "wait", "exchange",
                                                                 "optimizer") and _inside(e, s)}
            assert list(parts) and sorted(parts, key=lambda n: parts[n]["ts"]) == [
                "forward", "backward", "wait", "exchange", "optimizer"], (rank, sorted(parts))
        assert len([e for e in mine if e["name"] == "evaluate"]) == 2
    from training.predict import profile  # the per-layer events make a job profile (oracle: the MLP's sizes)

    assert profile.main(["--trace", str(tmp_path / "dp.json"), "--codec", "fp16", "--codec", "topk:ratio=0.01",
                         "--out", str(tmp_path / "profile.json")]) == 0
    prof = profile.load(str(tmp_path / "profile.json"))
    assert [(layer["kind"], layer["params"]) for layer in prof.layers] == [
        ("Linear", 72), ("ReLU", 0), ("Linear", 72), ("ReLU", 0), ("Linear", 27)]
    assert [s[1:] for s in prof.slices()] == [s[1:] for s in slices]
    assert all(layer["backward_s"] > 0 for layer in prof.layers)
    assert prof.codecs["fp16"]["payload_bytes"] == [off * 2] and prof.optimizer_s > 0
    summary = json.loads((tmp_path / "runs" / "dp" / "summary.json").read_text())
    assert summary["comm_s"] == pytest.approx(summary["wait_s"] + summary["transfer_s"], rel=1e-9)
    for rec in map(json.loads, (tmp_path / "runs" / "dp" / "epochs.jsonl").read_text().splitlines()):
        assert rec["comm_s"] == pytest.approx(rec["wait_s"] + rec["transfer_s"], rel=1e-9, abs=1e-12)


def test_trace_file_of_a_parameter_server_run(tmp_path):
    path = tmp_path / "ps.json"
    run_mpi(3, "training.train", "--mode", "ps", *_TINY, "--run-dir", str(tmp_path), "--trace", str(path),
            timeout=120)
    events = _check_chrome(json.loads(path.read_text()))
    _nested(events)
    by = {(e["pid"], e["name"]) for e in events}
    for worker in (1, 2):  # rank 0 serves, ranks 1 and 2 work
        assert {(worker, n) for n in ("forward", "backward", "push", "pull")} <= by, sorted(by)
    assert (0, "update") in by, sorted(by)
    pushes = [e for e in events if e["name"] == "push"]
    assert len(pushes) == 2 * 2 * (96 // 12), len(pushes)  # 2 workers x 2 epochs x 96 samples / 12 per push


def test_bad_trace_path_is_one_error_before_anything_runs(tmp_path):
    from training.train import main

    with pytest.raises(SystemExit) as e:
        main([*_TINY, "--run-dir", str(tmp_path), "--trace", str(tmp_path / "no" / "t.json")])
    assert e.value.code == 2
    assert not (tmp_path / "latest").exists()


def _mpi_main(out):
    """Multi-rank body: a traced data-parallel run, then a step with rank 1 held back by _DELAY."""
    from mpi4py import MPI

    from training.settings.config import Config
    from training.dp.data_parallel import train_step
    from training.driver.trainer import build_trainer
    from training.train import main

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    code = main([*_TINY, "--run-dir", f"{out}/runs", "--name", "dp", "--bucket-bytes", str(_BUCKET),
                 "--trace", f"{out}/dp.json"])
    assert code == 0
    cfg = Config.from_dict({"data": "synthetic", "samples": 240, "features": 8, "classes": 3, "hidden": [8],
                            "batch_size": 24, "progress": False})
    t = build_trainer(cfg, comm)
    x, y = t.ds.x_train[:8].astype(t.model.dtype), t.ds.y_train[:8]
    train_step(t.model, t.loss_fn, t.opt, t.hook, comm, x, y)  # warm-up
    tracing.start(comm.Barrier)
    recs = []
    for _ in range(2):
        if rank == 1:
            time.sleep(_DELAY)
        recs.append(train_step(t.model, t.loss_fn, t.opt, t.hook, comm, x, y))
    tracing.stop()
    waits = [e[3] - e[2] for e in tracing.events() if e[0] == "wait"]
    for r in recs:
        assert abs(r["comm_s"] - r["wait_s"] - r["transfer_s"]) < 1e-12, r
        if rank == 1:  # the late rank finds the others waiting
            assert r["wait_s"] < 0.5 * _DELAY, (rank, r)
        else:  # the others wait for it, and the gradient exchange after it is not slowed by the delay
            assert r["wait_s"] >= 0.75 * _DELAY and r["transfer_s"] < 0.5 * _DELAY, (rank, r)
    assert len(waits) == 2 and all(abs(w - r["wait_s"]) < 1e-9 for w, r in zip(waits, recs)), (waits, recs)
    # a compressor's compress and decompress: inside the exchange, in that order, with the measured durations
    tc = build_trainer(cfg.replace(compression="topk", compression_args={"ratio": 0.25}), comm)
    tracing.start(comm.Barrier)
    r = train_step(tc.model, tc.loss_fn, tc.opt, tc.hook, comm, x, y)
    tracing.stop()
    tc.hook.close()
    ev = {e[0]: e for e in tracing.events()}
    (_, _, x0, x1, _), (_, _, c0, c1, _), (_, _, d0, d1, _) = ev["exchange"], ev["compress"], ev["decompress"]
    assert x0 <= c0 <= c1 <= d0 <= d1 <= x1, ev
    assert abs((c1 - c0) - r["compress_s"]) < 1e-9 and abs((d1 - d0) - r["decompress_s"]) < 1e-9, (ev, r)
    comm.Barrier()
    if rank == 0:
        print("case_skew: ok", flush=True)


if __name__ == "__main__":
    try:
        _mpi_main(sys.argv[1])
    except BaseException:  # a failed check on one rank ends the job at once instead of leaving its peers waiting
        import traceback

        from mpi4py import MPI

        traceback.print_exc()
        sys.stdout.flush()
        MPI.COMM_WORLD.Abort(1)
