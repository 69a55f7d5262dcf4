"""The per-call benchmarks beside the sweep: MPI's local reduction against NumPy's, the best-of-MPI
baseline's ratios, and the breakdown of a repeated small all-reduce into its steps (single-process;
the breakdown's steps are the cached plan's own, its references MPI's calls made directly)."""
import json

import pytest


def test_reduce_local_benchmark_times_the_same_sum(capsys):
    """MPI's reduction loop and NumPy's add are checked equal before they are timed; the table prints."""
    from experiments.bench import reduce_local as bench_reduce_local
    times = bench_reduce_local.measure(4096, "int32", 2, budget=0.001)
    assert set(times) == {"mpi", "numpy", "copy"} and all(len(v) == 2 and min(v) > 0 for v in times.values())
    assert bench_reduce_local.main(["--sizes", "4K,8K", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[2].split()[:2] == ["4", "KiB"] and lines[3].split()[:2] == ["8", "KiB"]


def test_mpi_baseline_combines_rounds_into_per_size_ratios_and_a_geomean():
    """Two rounds of synthetic sweeps: best-of-MPI time / commlab's best, per size, and the geomean per round."""
    from experiments.bench.mpi_baseline import combine

    def row(alg, n, t, wrong=0):
        return {"algorithm": alg, "bytes": n, "time_s": t, "wrong": wrong}

    def round_(scale):
        commlab = {"rows": [row("ring", 1024, 2.0 * scale), row("tree", 1024, 1.0 * scale), row("MPI_Allreduce", 1024, 3.0),
                            row("ring", 2048, 4.0), row("mpi", 2048, 0.1), row("MPI_Allreduce", 2048, 8.0)]}
        forced = {"rows": [row("MPI_Allreduce", 1024, 2.0), row("MPI_Allreduce", 2048, 1.0),
                           row("MPI_Allreduce", 4096, 0.5, wrong=1)]}
        return {"commlab": commlab, "mpich:ring": forced}

    out = combine([round_(1.0), round_(0.5)], 1024, 2048)
    first, second = out["sizes"]
    assert (first["bytes"], first["commlab_best"], first["mpi_best"]) == (1024, "tree", "mpich:ring")
    assert (first["ratio_min"], first["ratio_max"]) == (2.0, 4.0) and first["ratio_median"] == 3.0
    assert second["ratio_median"] == 0.25 and second["mpi_default_ratio"] == 2.0
    assert [s["bytes"] for s in out["sizes"]] == [1024, 2048]  # the wrong 4096 row and `mpi` rows are left out
    geo = out["geomean"]  # per round: sqrt(2 * 0.25) and sqrt(4 * 0.25)
    assert geo["rounds"] == 2 and abs(geo["min"] - 0.5 ** 0.5) < 1e-12 and abs(geo["max"] - 1.0) < 1e-12


def test_breakdown_times_every_step_of_the_repeated_call(tmp_path, capsys):
    """P = 1 in this process: every row timed in every pass, ``rest`` the call less its steps, the
    ratios from the same passes, and the results file stamped with its provenance."""
    from experiments.bench import breakdown

    out = tmp_path / "bd.json"
    assert breakdown.main(["--sizes", "8,4096", "--passes", "3", "--calls", "20", "--algorithm", "mpi",
                           "--allow-noisy", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rec = json.loads(out.read_text())
    assert rec["P"] == 1 and rec["provenance"]["command"] and set(rec["sizes"]) == {"8", "4096"}
    for size in rec["sizes"].values():
        assert set(size) == set(breakdown.STEPS) | {"rest"}
        for step in breakdown.STEPS:
            med, lo, hi = size[step]
            assert 0 < lo <= med <= hi, (step, size[step])
    assert set(rec["ratios"]) >= {"auto / MPI_Iallreduce+Wait", "persistent plan / MPI_Allreduce"}
    assert "look-up" in text and "library call" in text and "geometric mean" in text
    with pytest.raises(SystemExit):  # above the cached path's limit: a usage error before any measurement
        breakdown.main(["--sizes", "9000", "--allow-noisy", "--out", str(out)])
