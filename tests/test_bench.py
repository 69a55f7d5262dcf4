"""Collectives sweep, tuning table and plots: tiny sweeps under mpiexec (P = 2, 3) and single-process checks.

Oracles: the sweep's own #wrong column (every result compared with MPI's collective called directly;
its counter is itself tested on planted errors), nccl-tests' busbw definitions recomputed from the
rows (relative tolerance 1e-5: the files keep 6 significant digits), and for the tuning table the
fastest hand-made algorithm read off the rows against ``auto.select_allreduce`` after ``load_table``.
"""
import csv
import json
import os
import re
import statistics

import numpy as np
import pytest
from mpi4py import MPI

from collectives.model import auto as select
from experiments.bench import collectives as bench
from experiments.bench import sweep_options as bench_options
from experiments.bench import output as bench_output
from experiments.bench import tune
from plots import bench as plot
from tests.mpirun import run_mpi

OPS = "allreduce,reduce_scatter,allgather,broadcast"


def _sweep(P, prefix, *args):
    proc = run_mpi(P, "experiments.bench.collectives", "--ops", OPS, "--min-bytes", "64", "--max-bytes", "128",
                   "--out", prefix, "--allow-noisy", *args, timeout=120)  # the test machine may be busy
    with open(f"{prefix}.json", encoding="utf-8") as f:
        results = json.load(f)
    with open(f"{prefix}.csv", newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header, csv_rows = reader.fieldnames, list(reader)
    return proc.stdout, results, header, csv_rows


@pytest.fixture(scope="module")
def sweep_p2(tmp_path_factory):
    """P = 2, sizes 64 and 128 B; 128 B counts as large (--large-bytes 64), so each uses its own iters."""
    prefix = str(tmp_path_factory.mktemp("bench") / "p2")
    return prefix, _sweep(2, prefix, "--iters-small", "4", "--iters-large", "2", "--warmup", "1",
                          "--large-bytes", "64", "--repeats", "2")


def _check_sweep(P, results, header, csv_rows):
    rows = results["rows"]
    assert header == list(bench_output.COLUMNS)
    assert len(csv_rows) == len(rows) > 0
    assert results["P"] == P and results["complete"] is True
    assert results["mpi_library"] and results["numpy"] == np.__version__ and results["host"] and results["date"]
    assert results["config"]["ops"] == OPS.split(",")
    prov = results["provenance"]  # commlab.provenance.stamp: the command and P that made the file
    assert (prov["P"], prov["cores"], prov["versions"]["numpy"]) == (P, os.cpu_count(), np.__version__), prov
    assert "experiments.bench.collectives" in prov["command"] and "--allow-noisy" in prov["command"], prov
    for op in OPS.split(","):
        expected = set(bench_options.default_algorithms(op))
        for nbytes in (64, 128):
            count = nbytes // 4 - (nbytes // 4) % P if op == "allgather" else nbytes // 4
            got = {r["algorithm"] for r in rows if r["collective"] == op and r["count"] == count}
            assert got == expected, (op, nbytes, got)
    for r, c in zip(rows, csv_rows):
        assert r["wrong"] == 0 and int(c["wrong"]) == 0, r
        assert r["P"] == P and r["type"] == "float32" and r["bytes"] == 4 * r["count"]
        assert r["time_min_us"] <= r["time_mean_us"] <= r["time_us"]
        reps = r["time_repeats_us"]  # the row holds the median pass; its spread is that of the passes
        assert len(reps) == r["passes"] == results["config"]["repeats"] and min(reps) <= r["time_us"] <= max(reps)
        assert r["spread"] == pytest.approx(max(reps) / min(reps) - 1, rel=1e-3, abs=1e-4)  # 6 digits kept
        assert r["unstable"] == (r["spread"] > 0.2)
        # files keep 6 significant digits
        assert r["time_s"] == pytest.approx(r["time_us"] * 1e-6, rel=1e-5) and r["time_median_us"] > 0
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9, rel=1e-5)
        factor = {"allreduce": 2 * (P - 1) / P, "reduce_scatter": (P - 1) / P, "allgather": (P - 1) / P,
                  "broadcast": 1.0}[r["collective"]]
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor, rel=1e-5)
        assert float(c["busbw_GBps"]) == r["busbw_GBps"]
        if r["algorithm"] == "auto" and r["collective"] == "allreduce":
            assert r["resolved"] in tune.CHOICES
    return rows


def test_sweep_p2_columns_busbw_and_checks(sweep_p2):
    _, (out, results, header, csv_rows) = sweep_p2
    rows = _check_sweep(2, results, header, csv_rows)
    assert {r["iters"] for r in rows if r["bytes"] == 64} == {4}
    assert {r["iters"] for r in rows if r["bytes"] == 128} == {2}
    assert "busbw(GB/s)" in out and "#wrong" in out  # the live table
    assert re.search(r"^\| size +\| best all-reduce +\|", out, re.M), out  # the summary, a Markdown table
    s = results["summary"]["sizes"]
    assert {e["bytes"] for e in s} == {64, 128} and all("ring_vs_direct" in e for e in s)
    reps = results["summary_repeats"]["mpi_vs_raw_geomean"]  # a figure's median and range over the passes
    assert reps["passes"] == 2 and reps["min"] <= reps["median"] <= reps["max"]
    assert "over 2 passes" in out and "rows whose passes differ by more than 20%" in out


def test_sweep_p3_allgather_rounding_and_time_cap(tmp_path):
    """P = 3: all-gather sizes round down to P blocks; --max-time cuts every loop to the minimum 3 calls,
    which --rounds 2 splits into segments of 1 and 2."""
    _, results, header, csv_rows = _sweep(3, str(tmp_path / "p3"), "--iters", "50", "--warmup", "1",
                                          "--max-time", "1e-9", "--rounds", "2", "--repeats", "1")
    rows = _check_sweep(3, results, header, csv_rows)
    assert {r["bytes"] for r in rows if r["collective"] == "allgather"} == {60, 120}
    assert {r["iters"] for r in rows} == {3}


def _has_torch():
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(_has_torch(), reason="torch is installed: the gloo run itself is tested")
def test_gloo_baseline_without_torch_fails_clearly(tmp_path):
    proc = run_mpi(2, "experiments.bench.collectives", "--ops", "allreduce", "--max-bytes", "8", "--baseline",
                   "gloo", "--out", str(tmp_path / "g"), timeout=60, check=False)
    assert proc.returncode == 2 and "needs PyTorch" in proc.stdout
    assert proc.stdout.count("needs PyTorch") == 1  # rank 0 alone reports


@pytest.mark.skipif(not _has_torch(), reason="needs torch")
def test_gloo_baseline_checked_against_mpi(tmp_path):
    _, results, _, _ = _sweep(2, str(tmp_path / "g"), "--ops", "allreduce", "--algorithms", "mpi", "--baseline",
                              "gloo", "--redop", "avg", "--iters", "2", "--warmup", "0")
    gloo = [r for r in results["rows"] if r["algorithm"] == "gloo"]
    assert [r["bytes"] for r in gloo] == [64, 128] and all(r["wrong"] == 0 and r["time_s"] > 0 for r in gloo)


def test_count_wrong_detects_planted_errors():
    from experiments.bench.oracle import count_wrong

    ref = np.arange(10, dtype=np.float32)
    assert count_wrong(ref.copy(), ref) == 0
    assert count_wrong(ref * (1 + 1e-7), ref) == 0  # within float32 rtol 1e-5
    bad = ref.copy()
    bad[[2, 7]] += 1
    assert count_wrong(bad, ref) == 2
    bad[0] = np.nan
    assert count_wrong(bad, ref) == 3
    assert count_wrong(ref[:5], ref) == 10
    ints = np.arange(6, dtype=np.int64)
    assert count_wrong(ints + (ints == 3), ints) == 1


def test_unwritten_output_is_counted_wrong(monkeypatch):
    """An algorithm that leaves the output untouched is caught: outputs are poisoned before each check."""
    real = bench._case

    def with_broken(op, nbytes, cfg, comm):
        c = real(op, nbytes, cfg, comm)
        c.calls["broken"] = lambda: c.poisoned  # returns the output buffer without writing it
        c.in_place["broken"] = lambda: c.buffer + 1  # an in-place result off by one everywhere
        return c

    monkeypatch.setattr(bench, "_case", with_broken)
    cfg = bench_options.BenchConfig(algorithms=("mpi", "ring"), iters_small=1, warmup_small=0, format="nccl-tests")
    rows = bench._measure("allreduce", 64, cfg, MPI.COMM_SELF)
    wrong = {r["algorithm"]: (r["wrong"], r["inplace_wrong"]) for r in rows}
    assert wrong == {"mpi": (0, 0), "ring": (0, 0), "broken": (16, 16)}


def test_bus_factor_and_arguments():
    assert bench_output.bus_factor("allreduce", 4) == 1.5 and bench_output.bus_factor("allreduce", 1) == 0.0
    assert bench_output.bus_factor("reduce_scatter", 4) == 0.75 == bench_output.bus_factor("allgather", 4)
    assert bench_output.bus_factor("broadcast", 7) == 1.0
    cfg = bench_options.parse_args(["--max-bytes", "4M", "--min-bytes", "1K", "--iters", "7", "--ops", "allgather",
                            "--algorithms", "ring"])
    assert (cfg.min_bytes, cfg.max_bytes, cfg.iters_small, cfg.iters_large) == (1024, 4 << 20, 7, 7)
    assert cfg.ops == ("allgather",) and cfg.algorithms == ("ring",)
    for bad in (["--min-bytes", "0"], ["--min-bytes", "2K", "--max-bytes", "1K"], ["--ops", "gather"],
                ["--algorithms", "ring-direct", "--ops", "allgather"], ["--iters", "0"], ["--max-bytes", "lots"]):
        with pytest.raises(SystemExit):
            bench_options.parse_args(bad)


def _row(P, alg, nbytes, t, wrong=0):
    return {"collective": "allreduce", "algorithm": alg, "P": P, "bytes": nbytes, "count": nbytes // 4, "type": "float32",
            "time_s": t, "wrong": wrong}


def test_tune_table_round_trips_through_select(tmp_path):
    """Winners per P and size, ranges merged, mpi / auto / references / wrong rows never chosen."""
    sizes = [8 << k for k in range(8)]  # 8 B .. 1 KiB
    winners = {2: ["tree"] * 3 + ["ring"] * 5, 4: ["recursive_doubling"] * 2 + ["2d"] + ["rabenseifner"] * 5}
    results = []
    for P, win in winners.items():
        rows = []
        for n, w in zip(sizes, win):
            rows += [_row(P, a, n, 2e-6 if a == w else 3e-6) for a in tune.HAND_MADE]
            rows += [_row(P, "mpi", n, 1e-6), _row(P, "auto", n, 1e-6), _row(P, "ring-direct", n, 1e-6),
                     _row(P, "ring", n, 1e-7, wrong=1)]  # fastest of all, but wrong
        results.append({"P": P, "config": {"dtype": "float32"}, "rows": rows})
    for i, res in enumerate(results):
        with open(tmp_path / f"r{i}.json", "w", encoding="utf-8") as f:
            json.dump(res, f)
    out = tmp_path / "tuning.json"
    tune.main([str(tmp_path / "r0.json"), str(tmp_path / "r1.json"), "--out", str(out), "--library-max-bytes", "0"])
    table = json.loads(out.read_text())
    assert "model" not in table  # no rows of 64 KiB or more to fit it to
    assert [(r["size"], r["algorithm"], r["max_bytes"]) for r in table["allreduce"]] == [
        (2, "tree", 32), (2, "ring", None),
        (4, "recursive_doubling", 16), (4, "2d", 32), (4, "rabenseifner", None)]
    try:
        select.load_table(str(out))
        for P, win in winners.items():
            for n, w in zip(sizes, win):
                assert select.select_allreduce(P, n) == w, (P, n)
            assert select.select_allreduce(P, 1 << 30) == win[-1]
        assert select.select_allreduce(3, 8) == select.model_choice(3, 8, table.get("model"))  # P not in table
    finally:
        select.reset_table()  # the other tests see auto as the ranks do


def test_tune_lets_mpi_win_small_sizes_only():
    rows = [_row(2, a, n, t) for n in (8, 4096, 1 << 20) for a, t in (("mpi", 1.0), ("ring", 2.0), ("tree", 3.0))]
    rules = tune.build_table([{"rows": rows}])["allreduce"]
    assert [(r["algorithm"], r["max_bytes"]) for r in rules] == [("mpi", 4096), ("ring", None)]
    last = tune.build_table([{"rows": rows[:6]}])["allreduce"]  # mpi wins the largest size measured
    assert [(r["algorithm"], r["max_bytes"]) for r in last] == [("mpi", 4096)]  # above it: the model
    assert [r["algorithm"] for r in tune.build_table([{"rows": rows}], library_max_bytes=0)["allreduce"]] == ["ring"]


def test_tune_tolerance_absorbs_noise():
    rows = []
    for n, (ring, tree) in zip((8, 16, 32), ((1.0, 2.0), (1.02, 1.0), (1.0, 2.0))):
        rows += [_row(2, "ring", n, ring), _row(2, "tree", n, tree)]
    strict = tune.build_table([{"rows": rows}])["allreduce"]
    loose = tune.build_table([{"rows": rows}], tolerance=0.05)["allreduce"]
    assert [r["algorithm"] for r in strict] == ["ring", "tree", "ring"]
    assert [(r["algorithm"], r["max_bytes"]) for r in loose] == [("ring", None)]
    with pytest.raises(ValueError):
        tune.build_table([{"rows": [_row(2, "mpi", 1 << 20, 1.0)]}])  # above the library limit
    with pytest.raises(ValueError):  # no medians in these rows
        tune.build_table([{"rows": rows}], stat="median")
    medians = [dict(r, time_median_us={"ring": 2.0, "tree": 1.0}[r["algorithm"]]) for r in rows]
    assert [r["algorithm"] for r in tune.build_table([{"rows": medians}], stat="median")["allreduce"]] == ["tree"]


def test_tune_and_plot_on_a_real_sweep(sweep_p2, tmp_path, capsys):
    prefix, (_, results, _, _) = sweep_p2
    out = tmp_path / "tuning.json"
    tune.main([f"{prefix}.json", "--out", str(out)])
    try:
        select.load_table(str(out))
        for n in (64, 128):
            mine = {r["algorithm"]: r["time_s"] for r in results["rows"]
                    if r["collective"] == "allreduce" and r["bytes"] == n and r["algorithm"] in tune.CHOICES}
            assert select.select_allreduce(2, n) == min(mine, key=mine.get)
    finally:
        select.reset_table()  # the other tests see auto as the ranks do
    plot.main([f"{prefix}.json", "--out", str(tmp_path / "png"), "--markdown"])
    printed = capsys.readouterr().out
    assert re.search(r"^\| size +\| best all-reduce +\|", printed, re.M) and "**P = 2**" in printed, printed
    assert "-x" not in printed  # a ratio not measured reads "-"
    for op in OPS.split(","):
        png = tmp_path / "png" / f"bench_{op}_p2.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20000


def test_summary_ratios():
    rows = [_row(2, "mpi", 1 << 16, 2.0), _row(2, "ring", 1 << 16, 1.0), _row(2, "tree", 1 << 16, 4.0),
            _row(2, "ring-direct", 1 << 16, 0.5), _row(2, "auto", 8, 3.0), _row(2, "mpi", 8, 2.0)]
    rows += [dict(_row(2, a, 1 << 16, t), collective="allgather") for a, t in (("mpi", 1.0), ("ring", 1.5))]
    s = bench_output.summarize(rows)
    big = next(e for e in s["sizes"] if e["bytes"] == 1 << 16)
    assert big["allreduce_best"] == "ring" and big["allreduce_best_vs_mpi"] == 2.0
    assert big["ring_vs_direct"] == 2.0 and big["allgather_vs_mpi"] == 1.5
    assert s["aggregates"]["auto_vs_mpi_max_8_4K"] == 1.5
    assert s["aggregates"]["allreduce_best_vs_mpi_geomean_64K_64M"] == 2.0


@pytest.mark.parametrize("dtype,redop", [("float16", "avg"), ("int32", "avg"), ("float64", "max")])
def test_dtypes_and_ops_in_one_process(dtype, redop):
    """P = 1 through every code path of a size: float16 has no MPI_* reference rows (MPI lacks it)."""
    cfg = bench_options.BenchConfig(dtype=dtype, redop=redop, iters_small=1, warmup_small=0)
    for op in bench_options.OPS:
        rows = bench._measure(op, 64, cfg, MPI.COMM_SELF)
        names = {r["algorithm"] for r in rows}
        expected = {a for a in bench_options.default_algorithms(op) if not (dtype == "float16" and a.startswith("MPI_"))}
        assert names == expected and all(r["wrong"] == 0 and r["type"] == dtype for r in rows), (op, rows)


def test_tune_table_carries_the_fitted_model():
    """Rows made exactly by the model with known alpha, beta, gamma: the table's fit recovers them (rel 1e-6)."""
    from collectives.model import cost

    truth = {"alpha": 3e-6, "beta": 4e-10, "gamma": 2e-10}
    rows = [_row(P, a, n, cost.predict(a, P, n, truth)) for P in (2, 4) for a in tune.HAND_MADE
            for n in (1 << 16, 1 << 18, 1 << 20, 1 << 22)]
    rows.append(_row(4, "ring", 8, 1.0))  # below 64 KiB: left out of the fit
    model = tune.build_table([{"rows": rows}])["model"]
    assert model == pytest.approx(truth, rel=1e-6)


def _nccl_blocks(text):
    """Return {(nccl-tests op name, algorithm): (data lines split into fields, Avg bus bandwidth)} of the output."""
    blocks, key = {}, None
    for ln in text.splitlines():
        if m := re.match(r"# (\w+): commlab algorithm ([^\s,]+)", ln):
            key = (m.group(1), m.group(2))
            blocks[key] = ([], None)
        elif m := re.match(r"# Avg bus bandwidth +: (\S+)", ln):
            blocks[key] = (blocks[key][0], float(m.group(1)))
        elif key and ln.strip() and not ln.startswith("#"):
            blocks[key][0].append(ln.split())
    return blocks


def test_nccl_tests_format_p2(tmp_path):
    """--format nccl-tests on 2 ranks: nccl-tests' 13 columns, time = the mean over ranks of the JSON rows,
    #wrong 0 (checked against MPI's own collective) in both groups wherever commlab has the call, N/A
    elsewhere, and the footer's Avg bus bandwidth = the mean of busbw = size / time x the bus factor."""
    out, results, _, _ = _sweep(2, str(tmp_path / "n"), "--iters", "3", "--warmup", "1", "--repeats", "1",
                                "--format", "nccl-tests")
    assert "busbw(GB/s)" not in out  # not the default table
    blocks = _nccl_blocks(out)
    names = {"allreduce": "all_reduce", "reduce_scatter": "reduce_scatter", "allgather": "all_gather",
             "broadcast": "broadcast"}
    assert set(blocks) == {(names[r["collective"]], r["algorithm"]) for r in results["rows"]}
    for (op, alg), (lines, avg) in blocks.items():
        rows = sorted((r for r in results["rows"] if names[r["collective"]] == op and r["algorithm"] == alg),
                      key=lambda r: r["bytes"])
        assert [int(f[0]) for f in lines] == [r["bytes"] for r in rows], (op, alg)
        factor = bench_output.bus_factor(rows[0]["collective"], 2)
        bus = []
        for f, r in zip(lines, rows):
            assert len(f) == 13 and f[2] == "float" and f[4] == ("0" if op == "broadcast" else "-1"), f
            assert f[3] == ("sum" if op in ("all_reduce", "reduce_scatter") else "none"), f
            assert int(f[1]) == (r["count"] // 2 if op in ("all_gather", "reduce_scatter") else r["count"]), f
            groups = {"out": f[5:9], "in": f[9:13]}
            measured = {"out": op != "broadcast",
                        "in": op == "broadcast" or (op == "all_reduce" and (alg in bench.collectives.ALGORITHMS
                                                                          or alg == "MPI_Allreduce"))}
            for g, cols in groups.items():
                if not measured[g]:
                    assert cols == ["N/A"] * 4, (op, alg, g, f)
                    continue
                t = r["time_mean_us"] if g == "out" or op == "broadcast" else r["inplace_time_mean_us"]
                assert cols[3] == "0" and float(cols[0]) == pytest.approx(t, rel=5e-3, abs=6e-3), (op, alg, g, f)
                bus.append(r["bytes"] / t / 1e3 * factor)
        assert avg == pytest.approx(statistics.fmean(bus), rel=1e-4), (op, alg)
    ar = [r for r in results["rows"] if r["collective"] == "allreduce" and r["algorithm"] in bench.collectives.ALGORITHMS]
    assert ar and all(r["inplace_wrong"] == 0 and r["inplace_time_us"] >= r["inplace_time_mean_us"] > 0 for r in ar)


def test_nccl_tests_bandwidth_columns():
    """Printed algbw = size / time and busbw = algbw x 2(P-1)/P, in nccl-tests' widths and decimals."""
    cases = ((8, 5.0), (1 << 20, 100.0), (1 << 26, 12345.0))
    rows = [{"collective": "allreduce", "algorithm": "ring", "resolved": "ring", "bytes": n, "count": n // 4,
             "type": "float32", "redop": "sum", "time_mean_us": t, "wrong": 0, "inplace_time_mean_us": 2 * t,
             "inplace_wrong": 0} for n, t in reversed(cases)]  # printed by size
    text = bench_output.nccl_tests({"P": 4, "mpi_library": "MPICH", "rows": rows})
    (lines, avg), = _nccl_blocks(text).values()
    assert [ln for ln in text.splitlines() if not ln.startswith("#")][1] == (
        "     1048576        262144     float     sum      -1    100.0   10.49   15.73       0    200.0    5.24    7.86"
        "       0")
    busbw = []
    for f, (n, t) in zip(lines, cases):
        for k, tt in ((5, t), (9, 2 * t)):
            assert float(f[k + 1]) == pytest.approx(n / tt / 1e3, abs=0.006)  # algbw, GB/s
            assert float(f[k + 2]) == pytest.approx(float(f[k + 1]) * 1.5, abs=0.02)  # busbw = algbw x 1.5
            busbw.append(n / tt / 1e3 * 1.5)
    assert [f[5] for f in lines] == ["5.00", "100.0", "12345"]  # nccl-tests' decimals by magnitude
    assert avg == pytest.approx(statistics.fmean(busbw), rel=1e-5)


def test_wrong_rows_name_rank_element_expected_and_got(monkeypatch):
    """A wrong row says where: the rank, the first wrong element, what MPI's call gave and what the algorithm gave."""
    real = bench._case

    def off_by_one(op, nbytes, cfg, comm):
        c = real(op, nbytes, cfg, comm)
        c.calls["off"] = lambda: np.concatenate([c.ref[:3], c.ref[3:] + 1])  # right up to element 3
        return c

    monkeypatch.setattr(bench, "_case", off_by_one)
    cfg = bench_options.BenchConfig(algorithms=("mpi",), iters_small=1, warmup_small=0)
    rows = {r["algorithm"]: r for r in bench._measure("allreduce", 64, cfg, MPI.COMM_SELF)}
    assert "wrong_at" not in rows["mpi"]
    (at,) = rows["off"]["wrong_at"]
    assert (at["form"], at["rank"], at["element"]) == ("out of place", 0, 3)
    assert at["got"] == at["expected"] + 1
    text = bench.wrong_rows([rows["off"]])
    assert f"allreduce off 64 B P=1 out of place: rank 0 element 3 expected {at['expected']:g} got {at['got']:g}" in text
