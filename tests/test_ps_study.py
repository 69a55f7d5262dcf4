"""The staleness study end to end on a small budget: results file fields and the figure."""
import json
import os

from tests.mpirun import run_mpi


def test_staleness_sweep_and_plot(tmp_path):
    out = str(tmp_path)
    run_mpi(5, "experiments.staleness_sweep", "--out", out, "--epochs", "1", "--protocols", "bsp,ssp2",
            "--set", "hidden=16", timeout=90)
    with open(os.path.join(out, "staleness_sweep.json")) as f:
        res = json.load(f)
    assert [r["protocol"] for r in res["table"]] == ["bsp", "ssp2"]
    assert {"mpi_library", "P", "host"} <= set(res["run"]) and res["run"]["P"] == 5
    bsp, ssp = res["runs"]
    assert bsp["staleness_max"] == 0 and set(bsp["staleness_histogram"]) == {"0"}
    assert ssp["staleness_max"] <= 2 and ssp["updates_per_s"] > 0 and ssp["curve"]
    assert res["table"][0]["throughput_vs_bsp"] == 1.0 and len(res["targets"]) == 1
    from plots.staleness import main

    png = os.path.join(out, "s.png")
    assert main([os.path.join(out, "staleness_sweep.json"), "--out", png]) == 0
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
