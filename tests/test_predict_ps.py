"""The parameter-server step against step times computed by hand (oracle: the arithmetic in each test's
comment): replies ending by a measured fan-out, workers sharing a host's cores, pushes taken one at a
time as they come; and the topology's ``fanout`` field."""
import doctest

import numpy
import pytest

from experiments.predict import comm, config, ps_step, topology
from experiments.predict.profile import Profile
from experiments.predict.step import predict

MS = 1e-3
PS1 = config.parse({"mode": "ps", "servers": 1})


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
    # and 41.008: 40.508, then max(40.508, 41.008) + 4.5 = 45.508; the update: 51.508 ms
    r = predict(_prof(), _topo(3, HALF), PS1)
    assert r["step_s"] == pytest.approx(51.508 * MS, rel=1e-9)
    w1, w2 = r["ranks"][1:]
    assert w1["compute"] == pytest.approx(30 * MS) and w1["comm"] == pytest.approx(6.008 * MS + 4.5 * MS)
    assert w2["comm"] == pytest.approx(11.008 * MS + 4.5 * MS)


def test_a_fanout_never_ends_a_reply_before_the_link_could():
    # fractions of 0.1: the first reply still ends at its replay time 6.008 (the link's own rate)
    r = predict(_prof(), _topo(3, [{"bytes": 4000, "fractions": [0.1, 1.0]}]), PS1)
    assert r["step_s"] == pytest.approx(51.508 * MS, rel=1e-9)


def test_workers_share_the_hosts_cores():
    # every rank on one host of 1 core: both replies at 11.008, both compute on the one core, 60 ms:
    # 71.008; pushes 75.508, 80.008; the update (one server on the core) 6: 86.008 ms
    assert predict(_prof(), _topo(3, cores=1, per_host=3), PS1)["step_s"] == pytest.approx(86.008 * MS, rel=1e-9)
    # with the fan-out: worker 1 alone from 6.008 to 11.008 (5 of its 30 ms), then both at half a core:
    # worker 1 ends at 11.008 + 50 = 61.008, worker 2 (5 ms left) at 66.008; pushes 65.508, 70.508;
    # the update: 76.508 ms
    r = predict(_prof(), _topo(3, HALF, cores=1, per_host=3), PS1)
    assert r["step_s"] == pytest.approx(76.508 * MS, rel=1e-9)


def test_a_worker_beside_its_server_pushes_over_shared_memory():
    # P = 4 on 2 nodes of 2, S = 1: worker 1 shares node 0 with the server, workers 2 and 3 are remote.
    # The remote pushes queue at node 0's link; worker 1's arrives after its own replay time, so the
    # step is the remote workers' as if worker 1 were not there, plus nothing
    topo = _topo(2, rpn=2)
    net = topo.with_gamma(1e-30)
    push, pull = comm.ps_clocks(net, 1, 4000)
    last = float(max(pull[2:].max(), pull[0]))
    posted = numpy.full(2, last + 30 * MS)  # no fan-out: both remote replies end with the last
    each = float(push[0]) / 2
    expect = max(posted[0] + each, posted[1]) + each + 6 * MS
    assert predict(_prof(), topo, PS1)["step_s"] == pytest.approx(expect, rel=1e-9)
    assert pull[1] < 0.2 * last  # worker 1's reply over shared memory ends long before


def test_two_servers_reply_in_pieces():
    # S = 2: a worker's reply is the last of two pieces, so the k-th of n gets the fan-out at (k / n) ** 0.5
    f = ps_step.fanout_fractions(HALF, 2000, (numpy.arange(1, 3) / 2) ** 0.5)
    assert f.tolist() == pytest.approx([0.5 + 0.5 * (0.5 ** 0.5 - 0.5) / 0.5, 1.0])
    two = config.parse({"mode": "ps", "servers": 2})
    assert predict(_prof(), _topo(4, HALF), two)["step_s"] <= predict(_prof(), _topo(4), two)["step_s"]


def test_processor_sharing_by_hand():
    ends = ps_step.share_cores([0.0, 0.0, 1.0], [2.0, 1.0, 1.0], [0, 0, 1], 1)
    assert ends.tolist() == pytest.approx([3.0, 2.0, 2.0])  # host 0: both at half a core; host 1 alone


@pytest.mark.parametrize("fanout,field", [
    ("fast", "'fanout' must be a non-empty list"), ([], "'fanout' must be a non-empty list"),
    ([{"bytes": 10}], "'fanout[0]' must be an object with bytes and fractions"),
    ([{"bytes": 0, "fractions": [1.0]}], "'fanout[0].bytes' must be > 0"),
    ([{"bytes": 10, "fractions": [0.6, 0.5, 1.0]}], "'fanout[0].fractions' must be non-decreasing and end at 1"),
    ([{"bytes": 10, "fractions": [0.5, 0.9]}], "'fanout[0].fractions' must be non-decreasing and end at 1"),
    ([{"bytes": 10, "fractions": [0.0, 1.0]}], "'fanout[0].fractions[0]' must be > 0"),
    ([{"bytes": 10, "fractions": [0.5, 1.0]}, {"bytes": 20, "fractions": [1.0]}],
     "'fanout[1].fractions' must be a non-empty list of 2 (as fanout[0])"),
])
def test_bad_fanout_is_one_line_naming_the_field(fanout, field):
    with pytest.raises(ValueError, match=f"topology field {field}".replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        _topo(3, fanout)


def test_the_calibration_s_fanout_reaches_the_topology():
    cal = {"summary": {"levels": {"inter-node": {"latency_us": 10, "bandwidth_bps": 1e9}},
                       "fanout": [{"bytes": 1000, "messages": 2, "reps": 3, "fractions": [0.6, 1.0]}]}}
    doc = topology.from_calibration(cal, 1, 2, 1, cores=2)
    assert doc["fanout"] == [{"bytes": 1000, "fractions": [0.6, 1.0]}]
    assert topology.parse(doc).fanout == [{"bytes": 1000.0, "fractions": [0.6, 1.0]}]
    assert "fanout" not in topology.from_calibration({"summary": {"levels": cal["summary"]["levels"]}}, 1, 2, 1)


def test_docstring_examples():
    assert doctest.testmod(ps_step).failed == 0
