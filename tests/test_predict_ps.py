"""The parameter-server step against step times computed by hand (oracle: the arithmetic in each test's
comment): replies ending by a measured fan-out, workers sharing a host's cores, pushes taken one at a
time as they come; and the topology's ``fanout`` field."""
import doctest
import re

import numpy
import pytest

from training.predict import job_config, message_times, ps_step, topology
from training.predict.profile import Profile
from training.predict.step import predict

MS = 1e-3
PS1 = job_config.parse({"mode": "ps", "servers": 1})


def _topo(nodes, fanout=None, cores=0, per_host=0, rpn=1):
    # 1 ms per message between nodes, 1 us per byte (8 Mbit/s), reductions free
    doc = {"racks": 1, "nodes_per_rack": nodes, "ranks_per_node": rpn, "reduce_bps": 8e30, "cores": cores,
           "ranks_per_host": per_host, "levels": {"inter-node": {"latency_us": 1000, "bandwidth_bps": 8e6}}}
    return topology.parse(doc if fanout is None else dict(doc, fanout=fanout))


def _prof():  # 1000 float32 (4000 bytes), forward 10 ms and backward 20 ms at 4 rows, optimizer 6 ms
    layer = {"kind": "Linear", "params": 1000, "offset": 0, "n_in": None, "n_out": None,
             "forward_s": 10 * MS, "backward_s": 20 * MS}
    return Profile(rows=4, itemsize=4, layers=[layer], optimizer_s=6 * MS)


HALF = [{"bytes": 4000, "fractions": [0.5, 1.0]}]  # the first of two messages ends at half the last


def test_replies_end_together_without_a_fanout():
    # P = 3, S = 1: the replay's replies end at 6.008 and 11.008 ms (requests 1.008, then 5 ms each);
    # shared evenly both end at 11.008; compute 30 -> both push at 41.008; the link takes one push at a
    # time, 9 ms for both at once / 2 = 4.5 each: 45.508, 50.008; the update 6: 56.008 ms
    r = predict(_prof(), _topo(3), PS1)
    assert r["step_s"] == pytest.approx(56.008 * MS, rel=1e-9)
    server = r["ranks"][0]
    assert server["ranks"] == "0" and server["compute"] == pytest.approx(6 * MS)


def test_a_measured_fanout_starts_the_first_worker_early():
    # the first reply at max(6.008, 0.5 x 11.008) = 6.008, the second at 11.008; pushes posted at 36.008
    # and 41.008; a push's bytes take (9 - 1) / 2 = 4 ms after one latency (1 ms): the first arrives at
    # 36.008 + 1 + 4 = 41.008, the second at max(41.008, 42.008) + 4 = 46.008; the update: 52.008 ms
    r = predict(_prof(), _topo(3, HALF), PS1)
    assert r["step_s"] == pytest.approx(52.008 * MS, rel=1e-9)
    w1, w2 = r["ranks"][1:]
    assert w1["compute"] == pytest.approx(30 * MS) and w1["comm"] == pytest.approx((6.008 + 5) * MS)
    assert w2["comm"] == pytest.approx((11.008 + 5) * MS)


def test_a_fanout_never_ends_a_reply_before_the_link_could():
    # fractions of 0.1: the first reply still ends at its replay time 6.008 (the link's own rate), not 1.1
    r = predict(_prof(), _topo(3, [{"bytes": 4000, "fractions": [0.1, 1.0]}]), PS1)
    assert r["step_s"] == pytest.approx(52.008 * MS, rel=1e-9)
    assert r["ranks"][1]["comm"] == pytest.approx((6.008 + 5) * MS)


def test_workers_share_the_hosts_cores():
    # every rank on one host of 1 core: both replies at 11.008, both compute on the one core, 60 ms:
    # 71.008; pushes 71.008 + 1 + 4 = 76.008, 80.008; the update (one server on the core) 6: 86.008 ms
    assert predict(_prof(), _topo(3, cores=1, per_host=3), PS1)["step_s"] == pytest.approx(86.008 * MS, rel=1e-9)
    # with the fan-out: worker 1 alone from 6.008 to 11.008 (5 of its 30 ms), then both at half a core:
    # worker 1 ends at 11.008 + 50 = 61.008, worker 2 (5 ms left) at 66.008; pushes 66.008, 71.008;
    # the update: 77.008 ms
    r = predict(_prof(), _topo(3, HALF, cores=1, per_host=3), PS1)
    assert r["step_s"] == pytest.approx(77.008 * MS, rel=1e-9)


def test_a_worker_beside_its_server_pushes_over_shared_memory():
    # P = 4 on 2 nodes of 2, S = 1: worker 1 shares node 0 with the server, workers 2 and 3 are remote.
    # The remote pushes queue at node 0's link (one latency, then (all at once - latency) / 2 each);
    # worker 1's arrives after its own replay time, long before
    topo = _topo(2, rpn=2)
    net = topo.with_gamma(1e-30)
    push, pull = message_times.ps_clocks(net, 1, 4000)
    last = float(max(pull[2:].max(), pull[0]))
    posted = last + 30 * MS  # no fan-out: both remote replies end with the last
    expect = posted + 1 * MS + 2 * (float(push[0]) - 1 * MS) / 2 + 6 * MS
    assert predict(_prof(), topo, PS1)["step_s"] == pytest.approx(expect, rel=1e-9)
    assert pull[1] < 0.2 * last  # worker 1's reply over shared memory ends long before


def test_two_servers_reply_in_pieces():
    # P = 8 on 4 nodes of 2, S = 2 (both on node 0): each of the 6 workers gets two pieces, so the k-th
    # reply in the replay's order ends at max(its replay end, f(sqrt(k / 6)) x last), f(q) = max(0.5, q)
    # for HALF: sqrt(1/6) = 0.41 -> 0.5, sqrt(2/6) = 0.58, 0.71, 0.82, 0.91, 1
    topo = _topo(4, HALF, rpn=2)
    net = topo.with_gamma(1e-30)
    _, pull = message_times.ps_clocks(net, 2, 4000)
    replay = pull[2:]
    order = numpy.argsort(replay, kind="stable")
    last = max(replay.max(), pull[:2].max())
    want = numpy.empty(6)
    for k, w in enumerate(order, 1):
        want[w] = max(replay[w], max(0.5, (k / 6) ** 0.5) * last)
    got = ps_step.reply_ends(topo, net, 2, pull, 4000)
    assert got == pytest.approx(want, rel=1e-12)
    assert got[order[1]] > max(replay[order[1]], 0.5 * last)  # the pieces matter: f(2/6) would be 0.5


@pytest.mark.parametrize("S,rpn", [(1, 1), (2, 1), (3, 1), (1, 2), (2, 2), (3, 2)])
@pytest.mark.parametrize("fanout,cores", [(None, 0), (HALF, 0), (None, 1), (HALF, 1)])
def test_every_rank_s_parts_add_up_to_the_step(S, rpn, fanout, cores):
    nodes = 6 // rpn  # P = 6: servers on one node or on several
    r = predict(_prof(), _topo(nodes, fanout, cores=cores, per_host=6 if cores else 0, rpn=rpn),
                job_config.parse({"mode": "ps", "servers": S}))
    for cls in r["ranks"]:
        assert min(cls["compute"], cls["comm"], cls["wait"]) >= -1e-12, (cls, r["step_s"])
        assert cls["compute"] + cls["comm"] + cls["bubble"] + cls["wait"] == pytest.approx(r["step_s"], abs=1e-8)


def test_processor_sharing_by_hand():
    ends = ps_step.share_cores([0.0, 0.0, 1.0], [2.0, 1.0, 1.0], [0, 0, 1], 1)
    assert ends.tolist() == pytest.approx([3.0, 2.0, 2.0])  # host 0: both at half a core; host 1 alone


@pytest.mark.parametrize("fanout,field", [
    ("fast", "'fanout' must be a non-empty list"), ([], "'fanout' must be a non-empty list"),
    ([{"bytes": 10}], "'fanout[0].fractions' is missing"), ([3], "'fanout[0]' must be an object"),
    ([{"bytes": 10, "fractions": [1.0], "reps": 5}], "'fanout[0].reps' is unknown; accepted: bytes, fractions"),
    ([{"bytes": 10, "fractions": [float("nan"), 1.0]}], "'fanout[0].fractions[0]' must be a finite number"),
    ([{"bytes": float("inf"), "fractions": [1.0]}], "'fanout[0].bytes' must be a finite number"),
    ([{"bytes": 10, "fractions": [1.0]}, {"bytes": 10, "fractions": [1.0]}], "'fanout[1].bytes' repeats"),
    ([{"bytes": 0, "fractions": [1.0]}], "'fanout[0].bytes' must be > 0"),
    ([{"bytes": 10, "fractions": [0.6, 0.5, 1.0]}], "'fanout[0].fractions' must be non-decreasing and end at 1"),
    ([{"bytes": 10, "fractions": [0.5, 0.9]}], "'fanout[0].fractions' must be non-decreasing and end at 1"),
    ([{"bytes": 10, "fractions": [0.0, 1.0]}], "'fanout[0].fractions[0]' must be > 0"),
    ([{"bytes": 10, "fractions": [0.5, 1.0]}, {"bytes": 20, "fractions": [1.0]}],
     "'fanout[1].fractions' must be a non-empty list of 2 (as fanout[0])"),
])
def test_bad_fanout_is_one_line_naming_the_field(fanout, field):
    with pytest.raises(ValueError, match=re.escape(f"topology field {field}")):
        _topo(3, fanout)


def test_the_calibration_s_fanout_reaches_the_topology():
    cal = {"summary": {"levels": {"inter-node": {"latency_us": 10, "bandwidth_bps": 1e9}},
                       "fanout": [{"bytes": 1000, "messages": 2, "reps": 3, "fractions": [0.6, 1.0]}]}}
    doc = topology.from_calibration(cal, 1, 2, 1, cores=2)
    assert doc["fanout"] == [{"bytes": 1000, "fractions": [0.6, 1.0]}]
    assert topology.parse(doc).fanout == [{"bytes": 1000.0, "fractions": [0.6, 1.0]}]
    assert "fanout" not in topology.from_calibration({"summary": {"levels": cal["summary"]["levels"]}}, 1, 2, 1)
    one = dict(cal["summary"]["fanout"][0], fractions=[1.0])  # one receiver: both sizes are S, one entry kept
    cal["summary"]["fanout"] = [one, dict(one)]
    assert topology.parse(topology.from_calibration(cal, 1, 2, 1)).fanout == [{"bytes": 1000.0, "fractions": [1.0]}]


@pytest.mark.parametrize("text,message", [
    ('{"racks": 1' + "0" * 400 + ', "nodes_per_rack": 2, "ranks_per_node": 1}', "'racks' must be an integer"),
    ("[" * 100000, "not JSON"), ("{\"racks\": 1}\xff", "not JSON")])
def test_an_unreadable_topology_file_is_one_line_naming_it(tmp_path, text, message):
    path = tmp_path / "t.json"
    path.write_text(text, encoding="latin-1")
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        topology.load(str(path))
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="cannot read it"):
        topology.load(str(tmp_path))


def test_docstring_examples():
    assert doctest.testmod(ps_step).failed == 0
