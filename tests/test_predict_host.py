"""The predictor's host terms against hand computations: the round floor of an oversubscribed host
(and its fit on sweeps), a codec's payload added in its own dtype, an all-gather-v's count header."""
import doctest
import json

import pytest

import numpy

from training.predict import floor, job_config, profile, topology, validate
from training.predict.profile import Profile
from training.predict.step import predict

MS = 1e-3


def _topo(nodes, round_us=0.0, reduce_bps=8e30):
    # 1 ms per message between nodes, 1 us per byte (8 Mbit/s)
    return topology.parse({"racks": 1, "nodes_per_rack": nodes, "ranks_per_node": 1, "reduce_bps": reduce_bps,
                           "round_us": round_us,
                           "levels": {"inter-node": {"latency_us": 1000, "bandwidth_bps": 8e6}}})


def _prof(codecs=None, reduce_s_per_byte=0.0):
    layers = [{"kind": "Linear", "params": 1000, "offset": 0, "n_in": None, "n_out": None,
               "forward_s": 10 * MS, "backward_s": 20 * MS}]
    return Profile(rows=4, itemsize=4, layers=layers, optimizer_s=5 * MS, codecs=codecs or {},
                   reduce_s_per_byte=reduce_s_per_byte)


def test_round_floor_step_by_hand():
    # P = 4 ring of 4000 bytes: 6 rounds of 1 ms + 1000 us = 12 ms; the flag (recursive doubling):
    # 2 rounds of 1.004 ms. A 3 ms floor: the ring's 6 rounds last 18 ms, the flag's 2 rounds 6 ms.
    # Step: 10 + 20 + 6 + 18 + 5 = 59 ms (without the floor 10 + 20 + 2.008 + 12 + 5 = 49.008 ms)
    cfg = job_config.parse({"algorithm": "ring"})
    assert predict(_prof(), _topo(4), cfg)["step_s"] == pytest.approx(49.008 * MS, rel=1e-9)
    r = predict(_prof(), _topo(4, round_us=3000), cfg)
    assert r["step_s"] == pytest.approx(59 * MS, rel=1e-9)
    assert r["breakdown"]["comm"] == pytest.approx(24 * MS, rel=1e-9)
    # a floor below every round's own time changes nothing
    assert predict(_prof(), _topo(4, round_us=500), cfg)["step_s"] == pytest.approx(49.008 * MS, rel=1e-9)


def test_parameter_server_rounds_are_floored_per_rank():
    # P = 3, S = 1 (the hand case of test_predict_ps): replies 1.008 + 2 x 5 ms, pushes 9 ms. A 20 ms
    # floor: the server's replies (1 + 2 rounds) end at 60 ms, so both workers' replies too; compute 30;
    # the server's pushes (1 round) 20 ms: one latency (1 ms), then (20 - 1) / 2 = 9.5 ms per push one at
    # a time: 100.5, 110; the update 5: 115 ms
    r = predict(_prof(), _topo(3, round_us=20000), job_config.parse({"mode": "ps", "servers": 1}))
    assert r["step_s"] == pytest.approx(115 * MS, rel=1e-9)


def test_codec_payload_is_added_in_its_own_dtype_by_hand():
    # P = 2 ring of a 2000-byte payload: 2 rounds of 1 ms + 1000 us, and 1000 bytes added after the
    # first at the codec's 10 ns per byte (10 x the profile's float32 speed on the file's 1 ns): 4.01 ms.
    # The flag: 1.004 ms and its 4 bytes added at 1 ns (4 ns).
    # Step: 10 + 20 + flag 1.004004 + compress 1 + 4.01 + decompress 2 + 5 = 43.014004 ms
    codec = {"transport": "allreduce", "payload_bytes": [2000], "compress_s": 1 * MS, "decompress_s": 2 * MS,
             "reduce_s_per_byte": 1e-8}
    cfg = job_config.parse({"compression": "fp16"})
    r = predict(_prof({"fp16": codec}, 1e-9), _topo(2, reduce_bps=8e9), cfg)
    assert r["step_s"] == pytest.approx(43.014004 * MS, rel=1e-9)
    del codec["reduce_s_per_byte"]  # without the dtype's speed: the file's 1 ns per byte, 4.001 ms
    r = predict(_prof({"fp16": codec}, 1e-9), _topo(2, reduce_bps=8e9), cfg)
    assert r["step_s"] == pytest.approx(43.005004 * MS, rel=1e-9)


def test_allgatherv_sends_its_counts_first_by_hand():
    # P = 2: the counts (2 payloads x 8 bytes): 1 round, 1.016 ms; the payloads (2000 bytes): 1 round,
    # 3 ms; decompression of both ranks' payloads: 2 x 2 ms.
    # Step: 10 + 20 + 1.004 + 1 + 1.016 + 3 + 4 + 5 = 45.02 ms; an all-gather (fixed sizes): 44.004 ms
    codec = {"transport": "allgatherv", "payload_bytes": [1000, 1000], "compress_s": 1 * MS, "decompress_s": 2 * MS}
    cfg = job_config.parse({"compression": "topk"})
    assert predict(_prof({"topk": codec}), _topo(2), cfg)["step_s"] == pytest.approx(45.02 * MS, rel=1e-9)
    codec["transport"] = "allgather"
    assert predict(_prof({"topk": codec}), _topo(2), cfg)["step_s"] == pytest.approx(44.004 * MS, rel=1e-9)


def _sweep(P, cores, rows):
    return {"P": P, "cpus": cores, "provenance": {"cores": cores},
            "rows": [{"collective": "allreduce", "algorithm": a, "bytes": n, "time_median_us": t} for a, n, t in rows]}


def test_floor_fit_on_sweeps_by_hand(tmp_path):
    # a one-node host whose copies cost nothing: every replayed round is ~0, so the floor is the
    # geometric mean of the measured time per round: ring at P = 2 has 2 rounds, 200 us and 800 us
    # measured -> 100 and 400 us a round -> 200 us; at P = 4 (2 ranks per core) 6 rounds of 600 us
    cal = {"summary": {"levels": {"intra-node": {"latency_us": 1e-6, "bandwidth_bps": 1e18}}}}
    (tmp_path / "calib_1gbit.json").write_text(json.dumps(cal))
    (tmp_path / "shm_2.json").write_text(json.dumps(_sweep(2, 2, [("ring", 64, 200.0), ("ring", 128, 800.0)])))
    (tmp_path / "shm_4.json").write_text(json.dumps(_sweep(4, 2, [("ring", 64, 3600.0), ("mpi", 64, 1.0)])))
    table = floor.floors(str(tmp_path), gamma=0.0)
    assert sorted(table) == [1.0, 2.0]
    assert table[1.0] == pytest.approx(200e-6, rel=0.02) and table[2.0] == pytest.approx(600e-6, rel=0.02)
    assert floor.round_s(table, 1.5) == pytest.approx((table[1.0] + table[2.0]) / 2)
    assert floor.round_s(table, 8.0) == table[2.0]  # beyond the sweeps: the nearest
    with pytest.raises(ValueError, match="no all-reduce sweeps"):
        floor.floors(str(tmp_path / "none"))


def test_published_sweeps_give_a_floor_that_grows_with_ranks_per_core():
    table = floor.floors()
    assert sorted(table) == [1.0, 2.0, 4.0]
    assert table[1.0] <= table[2.0] < table[4.0]


def test_validation_keeps_its_profile_with_codec_times(tmp_path):
    ev = []
    for t0 in (0, 1000, 2000):
        ev += [{"ph": "X", "name": "step", "pid": 0, "ts": t0, "dur": 900},
               {"ph": "X", "name": "forward", "pid": 0, "ts": t0, "dur": 300}]
        for d, ts, dur in (("forward", 1, 200), ("backward", 400, 400)):
            ev.append({"ph": "X", "name": "layer", "pid": 0, "ts": t0 + ts, "dur": dur,
                       "args": {"layer": 0, "direction": d, "kind": "Linear", "rows": 8, "params": 12,
                                "offset": 0, "itemsize": 4, "n_in": 3, "n_out": 3}})
    (tmp_path / "profile.trace.json").write_text(json.dumps({"traceEvents": ev}))
    prof = validate._profile(str(tmp_path), reuse=False)
    fp16, topk = prof.codecs["fp16"], prof.codecs["topk"]
    assert fp16["reduce_s_per_byte"] > 0 and "reduce_s_per_byte" not in topk and prof.reduce_s_per_byte > 0
    doc = json.loads((tmp_path / "profile.json").read_text())
    doc["codecs"]["fp16"]["compress_s"] = 123.0  # a reused profile is read, not measured again
    (tmp_path / "profile.json").write_text(json.dumps(doc))
    assert validate._profile(str(tmp_path), reuse=True).codecs["fp16"]["compress_s"] == 123.0


def test_gradient_rms_from_adams_second_moment_by_hand(tmp_path):
    # beta2 = 0.9 after t = 2 steps: v / (1 - 0.81); v = 0.19 x [0, 1, 4] -> RMS [0, 1, 2]
    cfg = numpy.frombuffer(json.dumps({"beta2": 0.9}).encode(), numpy.uint8)
    numpy.savez(tmp_path / "ckpt-epoch0001.npz", **{"optim/v": numpy.array([0.0, 0.19, 0.76], numpy.float32),
                                                    "optim/steps": numpy.int64(2), "meta/config": cfg})
    assert profile.gradient_rms(str(tmp_path / "ckpt-epoch0001.npz")) == pytest.approx([0.0, 1.0, 2.0], rel=1e-6)
    numpy.savez(tmp_path / "sgd.npz", **{"model/params": numpy.zeros(3, numpy.float32)})
    with pytest.raises(ValueError, match="no Adam second moment"):
        profile.gradient_rms(str(tmp_path / "sgd.npz"))
    prof = profile.measure_codecs(_prof(), [("fp16", {})], repeats=1, scale=numpy.full(1000, 1e-6, numpy.float32))
    assert prof.codecs["fp16"]["input"] == "gradient scale" and prof.codecs["fp16"]["reduce_s_per_byte"] > 0


def test_bad_round_floor_is_named():
    with pytest.raises(ValueError, match="'round_us' must be >= 0"):
        topology.parse({"nodes_per_rack": 2, "ranks_per_node": 1, "round_us": -1})


def test_floor_docstring_examples():
    from training.predict import message_times
    for module in (floor, message_times):
        assert doctest.testmod(module, optionflags=doctest.ELLIPSIS).failed == 0
