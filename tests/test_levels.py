"""The three-level network model (collectives.model.network) and its fit (experiments.cluster.levels),
against the two-level simulators, hand-computed times and a fit that must recover known parameters."""
import json
import math

import pytest

from collectives.model import cost
from collectives.model.network import Network, allreduce_time, default_grid
from experiments.cluster import levels
from experiments.cluster import model as two_level

ALPHA, BETA = dict(alpha_intra=2e-6, alpha_node=40e-6), dict(beta_intra=1 / 3e9, beta_node=8 / 1e9)


@pytest.mark.parametrize("alg", ["ring", "rabenseifner", "recursive_doubling", "tree", "2d"])
@pytest.mark.parametrize("K", [1, 2])
def test_one_rack_is_the_two_level_model(alg, K):
    """One rack: the network model is the two-level simulator with independent links (shared=False) and
    the emulated cluster's shared-link simulator (shared=True)."""
    P, n = 4, 3 << 20
    net = Network(racks=1, nodes_per_rack=P // K, ranks_per_node=K, gamma=1 / 2e9, **ALPHA, **BETA)
    topo = cost.Topology(ranks_per_node=K, alpha_intra=ALPHA["alpha_intra"], beta_intra=BETA["beta_intra"],
                         alpha_inter=ALPHA["alpha_node"], beta_inter=BETA["beta_node"], gamma=1 / 2e9)
    grid = default_grid(alg, net)
    assert math.isclose(allreduce_time(alg, n, net, shared=False), cost.simulate(alg, P, n, topo, grid=grid),
                        rel_tol=1e-9)
    grid = (P // K, K) if alg == "2d" else None  # the two-level simulator's 2d grid, also with K = 1
    mine, theirs = allreduce_time(alg, n, net, grid), two_level.simulate(alg, P, n, topo, True)
    if alg == "tree":  # a parent receiving from two children across nodes: two flows into its link here
        assert mine >= theirs * (1 - 1e-9)
    else:
        assert math.isclose(mine, theirs, rel_tol=1e-9)


def test_hand_computed_times():
    """Two racks of one rank: each ring message crosses both node links and the uplinks; the slower
    of them, the latencies added. Oversubscription scales copies and reductions, and the CPU term
    bounds a flow once it is the slower."""
    n, g = 1 << 20, 1 / 1e9
    net = Network(racks=2, nodes_per_rack=1, ranks_per_node=1, alpha_node=1e-5, alpha_rack=2e-5,
                  beta_node=1e-8, beta_rack=3e-8, gamma=g)
    half = n / 2
    assert math.isclose(allreduce_time("ring", n, net), 2 * (3e-5 + half * 3e-8) + half * g, rel_tol=1e-12)
    busy = Network(racks=2, nodes_per_rack=1, ranks_per_node=1, alpha_node=1e-5, alpha_rack=2e-5,
                   beta_node=1e-8, beta_rack=3e-8, gamma=g, cpu=1e-8, cores=1, ranks_per_host=8)
    assert busy.oversubscription == 8
    assert math.isclose(allreduce_time("ring", n, busy), 2 * (3e-5 + half * 8e-8) + half * g * 8, rel_tol=1e-12)
    shm = Network(racks=1, nodes_per_rack=1, ranks_per_node=2, alpha_intra=1e-6, beta_intra=1e-9, gamma=g,
                  cores=1)
    assert math.isclose(allreduce_time("ring", n, shm), 2 * (1e-6 + half * 2e-9) + half * g * 2, rel_tol=1e-12)


def test_the_uplink_is_shared_by_the_flows_that_cross_it():
    """2 racks x 2 nodes x 1 rank, Rabenseifner: the first round's exchange at distance 2 sends both
    nodes of a rack across the uplink at once (2 flows), in both of its halves; with a slow uplink and
    free node links it takes twice as long as with a link per flow."""
    kw = dict(racks=2, nodes_per_rack=2, ranks_per_node=1, alpha_node=0.0, alpha_rack=0.0, gamma=0.0,
              beta_node=1e-12)
    n = 1 << 20
    shared = allreduce_time("rabenseifner", n, Network(beta_rack=1e-8, **kw))
    alone = allreduce_time("rabenseifner", n, Network(beta_rack=1e-8, **kw), shared=False)
    assert shared > 1.9 * alone
    torus = allreduce_time("torus", n, Network(beta_rack=1e-8, **kw))
    assert torus < shared  # only the rack dimension's block crosses, one flow per node


def test_fit_recovers_known_parameters(tmp_path, capsys):
    """Sweeps made by the model itself with known parameters: the fit predicts a layout it never saw
    within 1 %, and the study's files and tables come out."""
    truth = dict(alpha_intra=3e-6, beta_intra=1 / 4e9, gamma=1 / 3e9, alpha_node=60e-6, beta_node=8 / 0.9e9,
                 alpha_rack=20e-6, beta_rack=8 / 0.8e9)
    sizes = [64 << 10, 1 << 20, 8 << 20]

    def sweep(layout, algs, name):
        rows = []
        for alg in algs:
            for n in sizes:
                t = allreduce_time(alg, n, levels.network(layout, 2, truth))
                rows.append({"collective": "allreduce", "algorithm": alg, "bytes": n, "time_s": t,
                             "time_repeats_us": [t * 1e6, t * 1.01e6, t * 0.99e6]})
        R, N, K = layout
        data = {"P": R * N * K, "rows": rows,
                "provenance": {"cores": 2, "P": R * N * K, "noisy": False, "command": "x", "date": "2026-12-03",
                               "versions": {"python": "3"}, "max_load": 0.5, "load": {"before": 0.1, "during_max": 0.2}}}
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data))
        return str(path)

    calib = {"summary": {"levels": {"inter-node": {"latency_us": 50.0, "bandwidth_bps": 0.95e9},
                                    "inter-rack": {"latency_us": 80.0, "bandwidth_bps": 0.9e9}}}}
    (tmp_path / "calib.json").write_text(json.dumps(calib))
    argv = ["--intra", sweep((1, 1, 2), ["ring", "rabenseifner"], "shm2"),
            "--intra", sweep((1, 1, 4), ["ring", "rabenseifner"], "shm4"),
            "--calibration", f"1gbit={tmp_path / 'calib.json'}",
            "--fit", "1gbit/1x2x2=" + sweep((1, 2, 2), ["ring", "rabenseifner", "2d"], "fa"),
            "--fit", "1gbit/2x2x1=" + sweep((2, 2, 1), ["ring", "rabenseifner", "torus"], "fb"),
            "--predict", "1gbit/2x2x2=" + sweep((2, 2, 2), ["ring", "2d", "torus", "rabenseifner"], "target"),
            "--out", str(tmp_path / "levels")]
    assert levels.main(argv) == 0
    out = json.loads((tmp_path / "levels.json").read_text())
    assert max(abs(r["rel_error"]) for r in out["rows"]) < 0.01
    assert out["rates"]["1gbit"]["fitted"]["fraction"] == 1.0
    assert "torus over ring" in capsys.readouterr().out


@pytest.mark.parametrize("bad, message", [
    (dict(racks=0), "racks=0 must be >= 1"),
    (dict(ranks_per_node=-1), "ranks_per_node=-1 must be >= 1"),
    (dict(beta_rack=-1.0), "beta_rack=-1.0 must be >= 0"),
])
def test_bad_networks(bad, message):
    with pytest.raises(ValueError, match=message):
        Network(**bad)


def test_bad_layouts_and_arguments(capsys):
    with pytest.raises(ValueError, match="expected RxNxK"):
        levels.parse_layout("2x0x2")
    with pytest.raises(SystemExit):
        levels.main(["--intra", "x.json"])
    assert "give --intra, --calibration, --fit and --predict" in capsys.readouterr().err
