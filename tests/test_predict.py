"""The job predictor against step times computed by hand on small cases (oracle: the arithmetic in
each test's comment), its vectorized replay against the event replay, and its bad inputs."""
import doctest
import json

import pytest

import collectives.model.lockstep
from collectives.model.lockstep import lockstep_clocks
from collectives.model.network import Network, allreduce_time
from training.predict import files, grid_step, job_config, message_times, pipeline_replay, profile, step, topology
from training.predict.__main__ import main
from training.predict.profile import Profile
from training.predict.step import predict
from training.predict.scale import scale_table

MS = 1e-3


def _topo(nodes, racks=1, rpn=1):
    # 1 ms per message between nodes, 1 us per byte (8 Mbit/s), reductions free
    return topology.parse({"racks": racks, "nodes_per_rack": nodes, "ranks_per_node": rpn, "reduce_bps": 8e30,
                           "levels": {"inter-node": {"latency_us": 1000, "bandwidth_bps": 8e6},
                                      "inter-rack": {"latency_us": 1000, "bandwidth_bps": 8e6}}})


def _prof(layers, optimizer_s=5 * MS, rows=4):
    out, off = [], 0
    for params, f, b, width in layers:
        out.append({"kind": "Linear", "params": params, "offset": off, "n_in": width, "n_out": width,
                    "forward_s": f, "backward_s": b})
        off += params
    return Profile(rows=rows, itemsize=4, layers=out, optimizer_s=optimizer_s)


def test_single_bucket_step_by_hand():
    # 1000 float32 = 4000 bytes, P = 2 ring: 2 rounds of 2000 bytes = 2 (1 ms + 2 ms); the flag: 1 ms + 4 us
    prof = _prof([(1000, 10 * MS, 20 * MS, None)])
    r = predict(prof, _topo(2), job_config.parse({"algorithm": "ring"}))
    assert r["step_s"] == pytest.approx((10 + 20 + 1.004 + 6 + 5) * MS, rel=1e-9)
    assert r["breakdown"]["compute"] == pytest.approx(35 * MS) and r["breakdown"]["comm"] == pytest.approx(7.004 * MS)
    assert r["breakdown"]["wait"] == pytest.approx(0, abs=1e-12) and r["ranks"][0]["ranks"] == "0-1"


@pytest.mark.parametrize("progress", ["tests", "continuous"])
def test_two_buckets_with_overlap_by_hand(progress):
    # two layers of 1000 parameters, buckets of 4000 bytes: layer 1's bucket is ready at 20 + 20 ms and
    # takes 6 ms; layer 0's at 60 ms, 60-66 ms; then the optimizer: 71 ms. Without overlap: 60 + 1.004 + 12 + 5
    prof = _prof([(1000, 10 * MS, 20 * MS, None), (1000, 10 * MS, 20 * MS, None)])
    on = predict(prof, _topo(2), job_config.parse({"bucket_bytes": 4000, "overlap": True, "progress": progress}))
    off = predict(prof, _topo(2), job_config.parse({"bucket_bytes": 4000}))
    assert on["step_s"] == pytest.approx(71 * MS, rel=1e-9)
    assert off["step_s"] == pytest.approx(78.004 * MS, rel=1e-9)
    assert on["breakdown"]["comm"] == pytest.approx(6 * MS, rel=1e-9)


def test_overlap_advances_one_round_per_test_between_layers():
    # P = 4 ring: 6 rounds of 1000 bytes (2 ms each). Tests at 40 ms (bucket 0 starts) and 60 ms (its
    # round 1 done; bucket 1 starts); after the flag (2 x 1.004 ms) bucket 0's 5 rounds end at 70.008,
    # then bucket 1's 5 left at 80.008; + 5 ms optimizer. Continuous: bucket 0 40-52, bucket 1 60-72
    prof = _prof([(1000, 10 * MS, 20 * MS, None), (1000, 10 * MS, 20 * MS, None)])
    tests = predict(prof, _topo(4), job_config.parse({"bucket_bytes": 4000, "overlap": True}))
    cont = predict(prof, _topo(4), job_config.parse({"bucket_bytes": 4000, "overlap": True, "progress": "continuous"}))
    assert tests["step_s"] == pytest.approx(85.008 * MS, rel=1e-9)
    assert cont["step_s"] == pytest.approx((60 + 12 + 5) * MS, rel=1e-9)


def test_pipeline_of_two_stages_by_hand():
    # 1F1B, m = 2 of 2 rows: F = 5 ms, B = 10 ms per stage; activations 2 x 10 float32 = 80 bytes: 1.08 ms.
    # stage 0: F0 0-5, F1 5-10, B0 22.16-32.16, B1 37.16-47.16; stage 1: F0 6.08-11.08, B0 -21.08,
    # F1 -26.08, B1 -36.08; the optimizer's half each (2.5 ms): step 49.66 ms
    prof = _prof([(110, 10 * MS, 20 * MS, 10), (110, 10 * MS, 20 * MS, 10)])
    r = predict(prof, _topo(2), job_config.parse({"pipeline_parallel": 2, "micro_batches": 2}))
    assert r["step_s"] == pytest.approx(49.66 * MS, rel=1e-9)
    s0, s1 = r["ranks"]
    assert s0["bubble"] == pytest.approx(17.16 * MS) and s1["bubble"] == pytest.approx(6.08 * MS)
    assert s0["compute"] == pytest.approx(32.5 * MS) and s1["wait"] == pytest.approx(11.08 * MS)


@pytest.mark.parametrize("shape,alg,grid_", [((2, 2, 2), "torus", None), ((1, 3, 2), "2d", None),
                                             ((2, 2, 2), "ring", None), ((1, 4, 3), "torus", (3, 2, 2)),
                                             ((3, 1, 2), "2d", (2, 3))])
@pytest.mark.parametrize("duplex", [1.0, 0.8])
def test_lockstep_replay_equals_the_event_replay(shape, alg, grid_, duplex):
    racks, nodes, rpn = shape
    net = Network(racks=racks, nodes_per_rack=nodes, ranks_per_node=rpn, beta_rack=16 / 1e9, cpu=1e-9, cores=1,
                  duplex=duplex)
    for nbytes in (4 * net.size, 1001 * 4, 1 << 20):
        assert lockstep_clocks(alg, nbytes, net, grid_).max() == pytest.approx(
            allreduce_time(alg, nbytes, net, grid_), rel=1e-12)


def test_duplex_prices_only_links_busy_both_ways_by_hand():
    # two nodes of one rank, 1 ms and 8 ns a byte: a ring of 8000 bytes sends 4000 bytes each way in
    # each of its 2 rounds (both directions busy): 2 x (1 ms + 4000 x 8 ns / 0.8) = 2 x 1.04 ms; a send
    # of 4000 bytes from rank 1 to rank 0 goes one way only: 1 ms + 32 us whatever the duplex
    net = Network(racks=1, nodes_per_rack=2, ranks_per_node=1, alpha_node=1e-3, beta_node=8e-9, gamma=0.0,
                  duplex=0.8)
    assert allreduce_time("ring", 8000, net, itemsize=1) == pytest.approx(2 * 1.04e-3, rel=1e-12)
    assert max(message_times.send_clocks(net, [(1, 0)], 4000)) == pytest.approx(1.032e-3, rel=1e-12)
    # three nodes, 0 -> 1 and 1 -> 2 at once: node 1's link is busy both ways, so both flows (one ending
    # there, one starting there) take 1 ms + 40 us; alone, 0 -> 1 takes 1.032 ms
    three = Network(racks=1, nodes_per_rack=3, ranks_per_node=1, alpha_node=1e-3, beta_node=8e-9, duplex=0.8)
    assert list(message_times.send_clocks(three, [(0, 1), (1, 2)], 4000)) == pytest.approx([1.04e-3, 1.04e-3, 1.04e-3])
    # two racks of two one-rank nodes, 0 -> 2 and 3 -> 1: every node link carries one direction only and
    # each uplink both; the uplink (16 ns a byte) is the slower: 1 ms + 2 ms + 4000 x 16 ns / 0.8 = 3.08 ms
    racks = Network(racks=2, nodes_per_rack=2, ranks_per_node=1, alpha_node=1e-3, alpha_rack=2e-3, beta_node=8e-9,
                    beta_rack=16e-9, duplex=0.8)
    assert max(message_times.send_clocks(racks, [(0, 2), (3, 1)], 4000)) == pytest.approx(3.08e-3, rel=1e-12)
    racks_one_way = Network(**{**{k: getattr(racks, k) for k in racks.__dataclass_fields__}, "duplex": 1.0})
    assert max(message_times.send_clocks(racks_one_way, [(0, 2), (3, 1)], 4000)) == pytest.approx(3.064e-3, rel=1e-12)
    for bad in (0, -0.5, 1.5):
        with pytest.raises(ValueError, match=f"duplex={bad} must be in"):
            Network(duplex=bad)


def test_allgather_lockstep_equals_its_schedules():
    net = Network(racks=2, nodes_per_rack=2, ranks_per_node=2)
    exact = message_times.allgather_clocks(1000, net)
    fast = lockstep_clocks("ring", 8 * 1000, net, itemsize=1, allgather_only=True)
    assert fast.max() == pytest.approx(exact.max(), rel=1e-12)


def test_profile_from_a_trace(tmp_path):
    ev = [{"ph": "X", "name": "step", "pid": 0, "ts": t0, "dur": 900} for t0 in (0, 1000, 2000)]
    for t0 in (0, 1000, 2000):
        ev += [{"ph": "X", "name": "forward", "pid": 0, "ts": t0, "dur": 300},
               {"ph": "X", "name": "layer", "pid": 0, "ts": t0 + 1, "dur": 200,
                "args": {"layer": 0, "direction": "forward", "kind": "Linear", "rows": 8, "params": 12,
                         "offset": 0, "itemsize": 4, "n_in": 3, "n_out": 3}},
               {"ph": "X", "name": "layer", "pid": 0, "ts": t0 + 400, "dur": 400,
                "args": {"layer": 0, "direction": "backward", "kind": "Linear", "rows": 8, "params": 12,
                         "offset": 0, "itemsize": 4, "n_in": 3, "n_out": 3}},
               {"ph": "X", "name": "optimizer", "pid": 0, "ts": t0 + 850, "dur": 50}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    p = profile.from_trace(str(path), skip=1)
    assert p.rows == 8 and p.elements == 12 and p.slices() == [("0.W", 0, 9), ("0.b", 9, 3)]
    assert p.layers[0]["forward_s"] == pytest.approx(200e-6) and p.layers[0]["backward_s"] == pytest.approx(400e-6)
    assert p.extra_forward_s == pytest.approx(100e-6) and p.optimizer_s == pytest.approx(50e-6)
    path.write_text(json.dumps({"traceEvents": ev[:3]}))
    with pytest.raises(ValueError, match="no 'layer' events"):
        profile.from_trace(str(path))


@pytest.mark.parametrize("doc,field", [
    ({"nodes_per_rack": 2}, "'ranks_per_node' is missing"),
    ({"nodes_per_rack": 2, "ranks_per_node": 1.5}, "'ranks_per_node' must be an integer"),
    ({"nodes_per_rack": 2, "ranks_per_node": 1, "levels": {"inter-node": {"bandwidth_bps": 0}}},
     "'levels.inter-node.bandwidth_bps' must be > 0"),
    ({"nodes_per_rack": 2, "ranks_per_node": 1, "levels": {"inter-pod": {}}}, "'levels.inter-pod' is unknown"),
    ({"nodes_per_rack": 2, "ranks_per_node": 1, "link": "1gbit"}, "'link' is unknown"),
    ({"nodes_per_rack": 2, "ranks_per_node": 1, "reduce_bps": "fast"}, "'reduce_bps' must be a finite number"),
    ({"nodes_per_rack": 2, "ranks_per_node": 1, "duplex": 1.5}, "'duplex' must be <= 1"),
    ({"nodes_per_rack": 2, "ranks_per_node": 1, "duplex": 0}, "'duplex' must be > 0"),
])
def test_bad_topology_is_one_line_naming_the_field(doc, field):
    with pytest.raises(ValueError, match=field):
        topology.parse(doc)


def test_topology_from_a_calibration_takes_its_duplex():
    levels = {"inter-node": {"latency_us": 20.0, "bandwidth_bps": 96e6}}
    with_bibw = topology.from_calibration({"summary": {"levels": levels, "duplex": 0.96}}, 1, 2, 2, cores=2)
    assert topology.parse(with_bibw).net.duplex == 0.96
    assert topology.parse(topology.from_calibration({"summary": {"levels": levels}}, 1, 2, 2, cores=2)).net.duplex == 1


@pytest.mark.parametrize("doc,field", [
    ({"algorithm": "mpi"}, "'algorithm' must be one of"), ({"buckets": 4}, "'buckets' is unknown"),
    ({"overlap": "yes"}, "'overlap' must be true or false"), ({"grid": [2, 0]}, "'grid' must be a list"),
    ({"mode": "ps", "tensor_parallel": 2}, "'mode'"), ({"servers": 0}, "'servers' must be an integer >= 1"),
])
def test_bad_configuration_is_one_line_naming_the_field(doc, field):
    with pytest.raises(ValueError, match=field):
        job_config.parse(doc)


def test_configurations_that_do_not_fit_the_topology():
    prof = _prof([(110, MS, MS, 10), (110, MS, MS, 10)])
    with pytest.raises(ValueError, match="'tensor_parallel'"):
        predict(prof, _topo(3), job_config.parse({"tensor_parallel": 2}))
    with pytest.raises(ValueError, match="'pipeline_parallel'"):
        predict(prof, _topo(4), job_config.parse({"pipeline_parallel": 4}))
    with pytest.raises(ValueError, match="'grid'"):
        predict(prof, _topo(4), job_config.parse({"algorithm": "torus", "grid": [3, 2]}))
    with pytest.raises(ValueError, match="'compression'"):
        predict(prof, _topo(4), job_config.parse({"compression": "topk"}))


def test_command_line_bad_files_and_a_prediction(tmp_path, capsys):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(_prof([(1000, 10 * MS, 20 * MS, None)]).to_dict()))
    topo = tmp_path / "t.json"
    topo.write_text(json.dumps({"nodes_per_rack": 2, "ranks_per_node": 1, "reduce_bps": 8e30,
                                "levels": {"inter-node": {"latency_us": 1000, "bandwidth_bps": 8e6}}}))
    assert main(["--profile", str(prof), "--topology", str(topo), "--config", "algorithm=ring",
                 "--json", str(tmp_path / "o.json")]) == 0
    assert json.loads((tmp_path / "o.json").read_text())["predictions"][0]["step_s"] == pytest.approx(42.004 * MS)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"nodes_per_rack": 2, "ranks_per_node": -1}))
    capsys.readouterr()
    assert main(["--profile", str(prof), "--topology", str(bad), "--config", "algorithm=ring"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {bad}: topology field 'ranks_per_node' must be > 0, got -1"]
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps([{"algorithm": "ring"}, {"bucket_bytes": "big"}]))
    assert main(["--profile", str(prof), "--topology", str(topo), "--config", str(cfg)]) == 2
    assert "c.json[1]: config field 'bucket_bytes'" in capsys.readouterr().err


@pytest.mark.parametrize("module", [collectives.model.lockstep, files, grid_step, job_config, message_times, pipeline_replay, profile, step, topology])
def test_docstring_examples(module):
    res = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert res.failed == 0


def test_scale_study_on_small_p_and_its_figure(tmp_path):
    from training.predict import scale
    from plots.predict import draw

    m = scale.EXAMPLE_MODEL
    prof = scale.synthetic_codecs(profile.synthetic(m["sizes"], m["rows"], m["flops_per_s"]), m["flops_per_s"])
    rows, best = scale.run(prof, [64, 256], ("25GbE",), say=lambda *_: None)
    assert len(best) == 2 and all(b["best_s"] <= b["second_s"] for b in best)
    assert {r["config"] for r in rows} >= {"torus", "ring b=25MiB overlap", "torus fp16", "ps S=8", "ring b=25MiB T8xQ1m1"}
    # oracle: the fastest and second-fastest rows of each P, sorted independently
    for b in best:
        times = sorted(r["step_s"] for r in rows if r["P"] == b["P"])
        assert (b["best_s"], b["second_s"]) == (times[0], times[1])
    draw({"best": best}, str(tmp_path / "scale.png"))
    assert (tmp_path / "scale.png").stat().st_size > 0
    assert "| 25GbE | 64 |" in scale_table(best)


def test_validation_harness_on_a_tiny_plan(capsys):
    from training.settings.cli import build_parser
    from training.predict import validate

    entries = validate.plan()
    assert len(entries) >= 24
    cfgs = [e["config"] for e in entries]
    assert {c.get("algorithm") for c in cfgs} >= {"ring", "2d", "torus", "rabenseifner"}
    assert {c.get("compression") for c in cfgs} >= {"fp16", "topk", "powersgd"}
    assert {c.get("servers") for c in cfgs if c.get("mode") == "ps"} == {1, 2}
    assert any(c.get("tensor_parallel") for c in cfgs) and any(c.get("pipeline_parallel") for c in cfgs)
    assert {e["layout"]["racks"] for e in entries} == {1, 2} and {e["layout"]["link"] for e in entries} == {"1gbit", "100mbit"}
    assert {c.get("bucket_bytes", 0) > 0 for c in cfgs} == {True, False} and any(c.get("overlap") for c in cfgs)
    cmds = validate.commands("out/v", 3, entries)
    parser = build_parser()
    for e, r in zip(entries, cmds["runs"]):  # every run's flags are the trainer's own
        parser.parse_args(r["command"][r["command"].index("training.train") + 1:])
        job_config.parse(e["config"])
    assert validate.main(["--dry-run", "--only", "0,25", "--repeats", "1", "--out", "out/v"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 2 + 2 and "--calibrate" in lines[1] and "training.emulator.emulate" in lines[-1]
    runs = validate.commands("out/v", 3, entries[:2], repeats=2)["runs"]  # in turns, each in its own directory
    assert [r["entry"] for r in runs] == [0, 1, 0, 1] and len({r["run_dir"] for r in runs}) == 4
    rows = [{"name": "a", "measured": [1.0, 1.02], "predicted_s": 1.1, "comm_s": 0.9},
            {"name": "b", "measured": [3.0, 3.1], "predicted_s": 2.0, "comm_s": 0.1},
            {"name": "c", "measured": [1.01, 1.03], "predicted_s": 3.0, "comm_s": 0.1}]
    got = validate.compare(rows)
    # a within 15 % (and heavy), b -33 %, c +191 %; pairs a-b and b-c qualify (a-c within range):
    # a-b concordant, b-c discordant -> tau 0
    assert got["within15_comm_heavy"] == 1.0 and got["within25_all"] == pytest.approx(1 / 3)
    assert got["pairs"] == 2 and got["kendall_tau"] == 0.0 and got["misses"] == ["b", "c"]
    once = validate.compare(rows + [{"name": "d", "measured": [9.0], "predicted_s": 9.0, "comm_s": 0.1}])
    assert once["pairs"] == 2 and rows[0]["range_s"] > 0  # measured once: no range, in no pair
