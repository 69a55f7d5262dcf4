"""The job predictor's inputs are checked, and every codec setting is predicted from its own payloads.

Oracle for the checks: one ``error:`` line naming the profile field, exit status 2, no traceback, for
each bad field of a profile written by the predictor itself (a synthetic MLP's, made valid first).
Oracle for the codecs: the payload sizes that the compressors themselves report (``payload_nbytes``),
measured per setting: top-k at ratio 0.5 carries 50 times the bytes of ratio 0.01, and its
predicted communication is longer by what the topology charges for them.
"""
import json

import pytest

from training.predict import job_config, profile, topology
from training.predict.__main__ import main
from training.predict.step import predict


def _valid():
    return profile.synthetic([16, 32, 10], rows=8, flops_per_s=1e9).to_dict()


def _topology(tmp_path, ranks=2, nodes=2):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"nodes_per_rack": nodes, "ranks_per_node": ranks // nodes, "reduce_bps": 8e10,
                                "levels": {"inter-node": {"latency_us": 10, "bandwidth_bps": 1e9}}}))
    return path


def _set(doc, where, value):
    """``doc`` with the field at dotted path ``where`` (``layers.1.params``) set to ``value`` (deleted when ...)."""
    keys = [int(k) if k.isdigit() else k for k in where.split(".")]
    target = doc
    for k in keys[:-1]:
        target = target[k]
    if value is Ellipsis:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return doc


@pytest.mark.parametrize("where, value, named", [
    ("layers", [], "layers"),
    ("layers.0.forward_s", -1.0, "layers[0].forward_s"),
    ("layers.1.backward_s", "fast", "layers[1].backward_s"),
    ("layers.1.params", 17, "layers[1].params"),
    ("layers.1.offset", 0, "layers[1].offset"),
    ("layers.0.params", ..., "layers[0].params"),
    ("layers.0", "Linear", "layers[0]"),
    ("rows", 0, "rows"),
    ("rows", 2.5, "rows"),
    ("itemsize", 0, "itemsize"),
    ("itemsize", 3, "itemsize"),
    ("optimizer_s", float("nan"), "optimizer_s"),
    ("optimizer_s", 1e300, "optimizer_s"),
    ("extra_forward_s", "0.1", "extra_forward_s"),
    ("reduce_s_per_byte", -1e-9, "reduce_s_per_byte"),
    ("codecs", [], "codecs"),
    ("codecs", {"topk": {"args": {}, "transport": "pigeon", "payload_bytes": [8], "compress_s": 0, "decompress_s": 0}},
     "codecs.topk.transport"),
    ("codecs", {"topk": {"args": {}, "transport": "allgather", "payload_bytes": [], "compress_s": 0,
                         "decompress_s": 0}}, "codecs.topk.payload_bytes"),
    ("codecs", {"topk": {"args": {}, "transport": "allgather", "payload_bytes": [8], "compress_s": -1,
                         "decompress_s": 0}}, "codecs.topk.compress_s"),
    ("source", 5, "source"),
    ("bogus", 1, "'bogus'"),
])
def test_every_profile_field_is_checked_with_one_line_naming_it(tmp_path, capsys, where, value, named):
    doc = _set(_valid(), where, value)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    code = main(["--profile", str(path), "--topology", str(_topology(tmp_path)), "--config", "algorithm=ring"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: {path}: profile field {named}"), lines[0]


def test_the_valid_profile_predicts(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_valid()))
    assert main(["--profile", str(path), "--topology", str(_topology(tmp_path)), "--config", "algorithm=ring"]) == 0


@pytest.mark.parametrize("content, said", [
    ("", "not JSON"), ("{}", "no trace events"), ('{"traceEvents": []}', "no trace events"),
    ('{"traceEvents": [{"ph": "X", "name": "layer", "pid": 0, "ts": 0, "dur": 1}]}', "no step after the first 1"),
    ('{"traceEvents": [{"ph": "X", "name": "step", "pid": 0, "ts": 0, "dur": 9}, {"ph": "X", "name": "step", "pid": 0, '
     '"ts": 20, "dur": 9}, {"ph": "X", "name": "layer", "pid": 0, "ts": 21, "dur": 1}]}', "not a trace of training.train"),
    ('{"traceEvents": [{"ph": "X", "name": "step", "pid": "0", "ts": 0, "dur": 1}]}', "lacks its name, pid, ts or dur"),
])
def test_a_bad_trace_is_one_line(tmp_path, capsys, content, said):
    trace = tmp_path / "run.trace.json"
    trace.write_text(content)
    code = main(["--trace", str(trace), "--topology", str(_topology(tmp_path)), "--config", "algorithm=ring"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and said in err and "Traceback" not in err, err


def test_an_empty_configuration_list_and_a_billion_ranks_are_one_line(tmp_path, capsys):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(_valid()))
    cfgs = tmp_path / "c.json"
    cfgs.write_text("[]")
    assert main(["--profile", str(prof), "--topology", str(_topology(tmp_path)), "--config", str(cfgs)]) == 2
    assert "empty list of configurations" in capsys.readouterr().err
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"racks": 1000, "nodes_per_rack": 1000, "ranks_per_node": 1000}))
    assert main(["--profile", str(prof), "--topology", str(big), "--config", "algorithm=ring"]) == 2
    err = capsys.readouterr().err
    assert "1,000,000,000 ranks" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_each_codec_setting_is_predicted_from_its_own_payloads(tmp_path):
    """Top-k at ratio 0.5 and 0.01 measured into one profile (two entries, neither overwritten) and
    predicted apart: the payload ratio is the compressors' own, and the longer payload costs more."""
    prof = profile.check(profile.synthetic([64, 128, 10], rows=8, flops_per_s=1e9))
    profile.measure_codecs(prof, [("topk", {"ratio": 0.5}), ("topk", {"ratio": 0.01}), ("fp16", {})], repeats=1)
    assert sorted(prof.codecs) == ["fp16", "topk", "topk:ratio=0.5"]
    half, small = profile.find_codec(prof, "topk", {"ratio": 0.5}), profile.find_codec(prof, "topk", {})
    assert sum(half["payload_bytes"]) > 40 * sum(small["payload_bytes"])
    topo = topology.parse({"nodes_per_rack": 2, "ranks_per_node": 1, "reduce_bps": 8e10,
                           "levels": {"inter-node": {"latency_us": 10, "bandwidth_bps": 1e8}}})
    got = {r: predict(prof, topo, job_config.parse({"algorithm": "ring", "compression": "topk",
                                                "compression_args": {"ratio": r}}))["breakdown"]["comm"]
           for r in (0.5, 0.01)}
    assert got[0.5] > got[0.01] * 5, got
    with pytest.raises(ValueError, match=r"no codec 'topk:ratio=0.2'.*--codec topk:ratio=0.2"):
        predict(prof, topo, job_config.parse({"algorithm": "ring", "compression": "topk",
                                          "compression_args": {"ratio": 0.2}}))
