"""The serving study's report: its markdown tables (tabulate) and its figure, from a synthetic results
document whose medians and ranges are computed here with NumPy (one process, no MPI job)."""
import numpy as np

from experiments.studies.serving_study import markdown
from inference.replicas.tensor import row_parallel_widths
from plots.serving import draw


def _doc():
    rng = np.random.default_rng(0)
    pts = []
    for rep in range(3):
        for pol in ("round-robin", "least-outstanding", "power-of-two"):
            for f in (0.4, 0.8):
                pts.append({"part": "policies", "policy": pol, "fraction": f, "repeat": rep,
                            "latency_p50_ms": float(rng.uniform(1, 5)), "latency_p99_ms": float(rng.uniform(5, 50))})
        for T in (2, 3):
            for a in ("auto", "mpi"):
                pts.append({"part": "tp-algorithm", "tensor_parallel": T, "algorithm": a, "repeat": rep,
                            "latency_p50_ms": float(rng.uniform(1, 5)), "latency_p99_ms": float(rng.uniform(5, 50)),
                            "comm_mean_ms": float(rng.uniform(0.1, 1)), "correct": 100, "answered": 100})
    us = {a: float(rng.uniform(10, 100)) for a in ("ring", "mpi", "auto")}
    ar = [{"P": 2, "elements": 160, "bytes": 1280, "rank_order": True, "us": us, "fastest": "mpi",
           "fastest_hand_made": "ring", "auto_picks": "mpi"}]
    return {"points": pts, "allreduce": ar, "capacities_rps": [100.0], "ratios_at_80": {}, "study": {}, "run": {}}


def _rows(table):
    lines = table.splitlines()
    assert set(lines[1]) <= set("|:-") and lines[1].count("|") == lines[0].count("|")  # pipe format
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def test_study_tables_report_medians_and_ranges_of_the_repeats(tmp_path):
    doc = _doc()
    tables = markdown(doc).split("\n\n")
    assert len(tables) == 3  # part B was not run: its table is left out
    pol = _rows(tables[0])
    g = [p["latency_p99_ms"] for p in doc["points"] if p.get("policy") == "power-of-two" and p["fraction"] == 0.8]
    assert pol[1][0] == "0.80" and pol[1][3].endswith(f"/ {np.median(g):.2f} ({min(g):.2f}-{max(g):.2f})")
    assert _rows(tables[1])[0][:3] == ["2", "160 (1280)", "rank order"] and _rows(tables[1])[0][-1] == "mpi"
    tp = _rows(tables[2])
    g = [p["latency_p50_ms"] for p in doc["points"] if p.get("tensor_parallel") == 3 and p["algorithm"] == "mpi"]
    assert tp[3][:3] == ["T = 3", "mpi", f"{np.median(g):.2f} ({min(g):.2f}-{max(g):.2f})"] and tp[3][-1] == "300/300"
    draw(doc, str(tmp_path / "s.png"))
    assert (tmp_path / "s.png").stat().st_size > 10000


def test_row_parallel_widths_follow_the_split_rule():
    w = [(np.zeros((a, b)), np.zeros(b)) for a, b in zip([64, 32, 16, 8], [32, 16, 8, 10])]
    assert row_parallel_widths(w) == [16, 10]  # layers 1 and 3 (odd)
    assert row_parallel_widths(w[:3]) == [16, 8]  # layer 1, and the even last layer


def test_load_sweep_table_and_figure_report_medians_of_both_arms(tmp_path):
    from plots.serving import load_table
    from plots.serving import draw_load

    rng = np.random.default_rng(1)
    pts = [{"part": "load", "fraction": f, "offered_rps": 400 * f, "capacity_rps": 400.0, "slo_ms": s, "repeat": r,
            "throughput_rps": float(rng.uniform(100, 400)), "mean_batch_size": float(rng.uniform(1, 8)),
            "latency_p50_ms": float(rng.uniform(20, 60)), "latency_p99_ms": float(rng.uniform(40, 900)),
            "goodput_rps": float(rng.uniform(0, 400)), "refused": int(rng.integers(0, 50))}
           for r in range(3) for f in (0.5, 2.0) for s in (0.0, 60.0)]
    rows = _rows(load_table(pts))
    g = [p for p in pts if p["fraction"] == 2.0 and p["slo_ms"] == 60.0]
    assert rows[1][:2] == ["2.0", "800"] and rows[1][7] == f"{np.median([p['throughput_rps'] for p in g]):.0f}"
    assert rows[1][9] == (f"{np.median([p['latency_p50_ms'] for p in g]):.1f} / "
                          f"{np.median([p['latency_p99_ms'] for p in g]):.1f}")
    assert load_table([]) == ""
    draw_load({"points": pts, "load_capacity_rps": 400.0, "study": {"load_max_batch": 8}}, str(tmp_path / "l.png"))
    assert (tmp_path / "l.png").stat().st_size > 10000
