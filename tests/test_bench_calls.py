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
    """P = 1 in this process: every row timed in every pass, the derived rows (``rest`` and the parts
    no row times alone) from the same passes, passes and calls recorded, the ratios, and the results
    file stamped with its provenance."""
    from experiments.bench import breakdown

    out = tmp_path / "bd.json"
    assert breakdown.main(["--sizes", "8,4096", "--passes", "3", "--calls", "20", "--algorithm", "mpi",
                           "--allow-noisy", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rec = json.loads(out.read_text())
    assert rec["P"] == 1 and rec["provenance"]["command"] and set(rec["sizes"]) == {"8", "4096"}
    assert (rec["collective"], rec["passes"], rec["calls"]) == ("allreduce", 3, 20)
    derived = {"public entry", "in the plan", "rest", "keyword-only call", "call and its tests"}
    assert set(rec["derived"]) == derived
    for n, size in rec["sizes"].items():
        gone = {row for row, passes in rec["dropped"][n].items() if len(passes) == 3}
        assert set(size) == set(breakdown.STEPS) | (derived - gone)
        for step in breakdown.STEPS:
            med, lo, hi = size[step]
            assert 0 < lo <= med <= hi, (step, size[step])
        for row in derived & set(size):
            assert 0 <= size[row][1] <= size[row][0] <= size[row][2], (row, size[row])  # never negative
    assert set(rec["ratios"]) >= {"auto / MPI_Iallreduce+Wait", "persistent plan / MPI_Allreduce"}
    assert "look-up" in text and "plan.run" in text and "geometric mean" in text
    with pytest.raises(SystemExit):  # above the cached path's limit: a usage error before any measurement
        breakdown.main(["--sizes", "9000", "--allow-noisy", "--out", str(out)])


def test_breakdown_of_a_repeated_reduce_scatter(tmp_path, capsys):
    """``--op reduce_scatter`` at P = 1: the references, both library calls, the plan's parts and
    steps, each row in every pass, and the reduce-scatter ratios."""
    from experiments.bench import breakdown

    out = tmp_path / "rs.json"
    assert breakdown.main(["--op", "reduce_scatter", "--sizes", "8,512", "--passes", "3", "--calls", "20",
                           "--allow-noisy", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert (rec["collective"], rec["passes"], rec["calls"], rec["algorithm"]) == ("reduce_scatter", 3, 20, "auto")
    timed = {"MPI_Reduce_scatter", "MPI_Ireduce_scatter_block+Wait", "MPI_Iallreduce 16 B+Wait",
             "both library calls", "auto", "look-up", "fast form", "check", "statistics",
             "loop", "empty call", "call and tests"}
    for n, size in rec["sizes"].items():
        assert timed <= set(size) and all(0 < size[k][1] <= size[k][0] <= size[k][2] for k in timed), n
        gone = {row for row, passes in rec["dropped"][n].items() if len(passes) == 3}
        assert set(size) - timed == set(rec["derived"]) - gone, n
    assert "auto / MPI_Ireduce_scatter_block+Wait" in rec["ratios"]
    assert "both library calls / MPI_Ireduce_scatter_block+Wait" in rec["ratios"]
    assert "fast form" in capsys.readouterr().out


def test_breakdown_drops_inconsistent_passes_and_the_table_says_so():
    """A pass whose timed parts add up to more than the whole call leaves that derived row (no
    negative range); the table names the dropped pass and shows ``-`` for a row with none left."""
    from experiments.bench.breakdown import summarize
    from plots.tables.study_tables import breakdown_table

    times = {"auto": [4.0, 4.0, 4.0], "look-up": [0.4, 0.4, 0.4], "plan.run": [3.0, 3.0, 3.0],
             "library call": [2.0, 9.0, 2.1], "statistics": [0.1, 0.1, 0.1], "loop": [0.05, 0.05, 0.05]}
    derived = {"rest": ("auto", ["look-up", "library call"]), "public entry": ("auto", ["look-up", "plan.run"])}
    table, dropped = summarize(times, derived)
    assert dropped == {"rest": [1]}
    assert [round(v, 9) for v in table["rest"]] == [1.6, 1.55, 1.65]  # 4 - 0.4 - 2.0/2.1 + 0.05, pass 2 left out
    assert [round(v, 9) for v in table["public entry"]] == [0.65] * 3  # every pass kept
    assert table["library call"] == (2.1, 2.0, 9.0)  # the timed rows keep every pass
    late, gone = summarize({**times, "auto": [1.0, 1.0, 1.0]}, derived)
    assert gone == {"rest": [0, 1, 2], "public entry": [0, 1, 2]} and "rest" not in late
    record = {"P": 2, "collective": "allreduce", "sizes": {"8": {k: list(v) for k, v in table.items()},
                                                   "64": {k: list(v) for k, v in late.items()}},
              "dropped": {"8": dropped, "64": gone}, "ratios": {"auto / MPI_Iallreduce+Wait": [1.5, 1.4, 1.6]}}
    text = breakdown_table(record)
    assert "derived: the rest" in text and "rest at 8 B: 2;" in text and "rest at 64 B: 1, 2, 3" in text
    rest = next(line for line in text.splitlines() if line.startswith("| derived: the rest"))
    assert "(-" not in text and rest.rstrip(" |").endswith("-")  # no negative range; 64 B has none left


def test_mpi_baseline_refuses_a_size_range_upside_down_before_any_launch(capsys, tmp_path):
    """--max-bytes below --min-bytes (its default 64K) is one line and status 2; no launch, no results file."""
    from experiments.bench.mpi_baseline import main

    with pytest.raises(SystemExit) as stop:
        main(["-n", "2", "--max-bytes", "4K", "--out", str(tmp_path / "b")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--min-bytes (65536) is larger than --max-bytes (4096)" in err and "round" not in err, err
    assert not (tmp_path / "b.json").exists()
