"""The staleness study end to end on a small budget: results file fields, rerun and errors, the figure."""
import json
import os

import pytest

from tests.mpirun import run_mpi


def test_staleness_sweep_reruns_over_a_previous_sweep_and_plots(tmp_path):
    out = str(tmp_path)
    runs = os.path.join(out, "runs")
    os.makedirs(os.path.join(runs, "bsp-r0"))  # what an earlier sweep leaves behind
    for name in ("ssp8-r5.log", "keep.txt"):
        open(os.path.join(runs, name), "w").close()
    with open(os.path.join(out, "staleness_sweep.json"), "w") as f:
        json.dump({"stale": True}, f)
    proc = run_mpi(5, "experiments.studies.staleness_sweep", "--out", out, "--epochs", "1", "--protocols", "bsp,ssp2",
                   "--set", "hidden=16", "--allow-noisy", timeout=90)  # the test machine may be busy
    assert "Traceback" not in proc.stdout and "target" not in proc.stdout, proc.stdout
    assert "removed 3 entries of the previous sweep" in proc.stdout, proc.stdout
    assert sorted(os.listdir(runs)) == ["bsp-r0", "bsp-r0.log", "keep.txt", "latest", "ssp2-r0", "ssp2-r0.log"]
    lines = [ln for ln in proc.stdout.splitlines() if "x BSP) | test acc" in ln and "| staleness max" in ln]
    assert len(lines) == 2 and "SSP s=2" in lines[1] and "(bound 2)" in lines[1], proc.stdout
    with open(os.path.join(out, "staleness_sweep.json")) as f:
        res = json.load(f)
    assert "stale" not in res and res["finished"] >= res["started"]
    assert [r["protocol"] for r in res["table"]] == ["bsp", "ssp2"]
    assert {"mpi_library", "P", "host"} <= set(res["run"]) and res["run"]["P"] == 5
    bsp, ssp = res["runs"]
    assert bsp["staleness_max"] == 0 and set(bsp["staleness_histogram"]) == {"0"}
    assert ssp["staleness_max"] <= 2 and ssp["updates_per_s"] > 0 and ssp["curve"]
    assert [w["worker"] for w in ssp["worker_stats"]] == [0, 1, 2, 3]  # ints in the JSON, not 0.0
    assert all(type(w[k]) is int for w in ssp["worker_stats"] for k in ("clock", "pushes", "samples"))
    assert res["table"][0]["throughput_vs_bsp"] == 1.0
    assert [(t["protocol"], t["staleness_bound"]) for t in res["summary"]] == [("bsp", 0), ("ssp2", 2)]
    from plots.staleness import main

    png = os.path.join(out, "s.png")
    assert main([os.path.join(out, "staleness_sweep.json"), "--out", png]) == 0
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_staleness_sweep_error_is_one_message(tmp_path):
    """An --out that cannot hold run directories: one error line from rank 0 naming it, exit 2 (refused
    as the command line is parsed), no traceback."""
    blocked = tmp_path / "file"
    blocked.write_text("")
    proc = run_mpi(2, "experiments.studies.staleness_sweep", "--out", str(blocked), "--straggler", "", "--allow-noisy",
                   timeout=60, check=False)
    assert proc.returncode == 2, proc.stdout
    assert proc.stdout.count("error:") == 1 and "--out" in proc.stdout and "Traceback" not in proc.stdout, proc.stdout


def test_staleness_sweep_help(capsys):
    from experiments.studies.staleness_sweep import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0 and text.startswith("usage: python -m experiments.studies.staleness_sweep ")
    assert "sspS = stale synchronous parallel with staleness bound S clocks" in text


def test_staleness_sweep_checks_its_arguments_before_removing_the_previous_sweep(tmp_path, capsys):
    """Single process: a setting the job cannot run stops the sweep with the flag named, and the
    previous sweep's results are left in place."""
    from experiments.studies.staleness_sweep import base_config, main
    from training.ps_mode.worker import check_ps

    previous = tmp_path / "staleness_sweep.json"
    previous.write_text("{}")
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path), "--set", "servers=4"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--mode ps with --servers 4 needs at least 5 ranks" in err, err
    assert previous.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["staleness_sweep.json"]
    for straggler, jitter, word in (("2:inf", 0.0, "straggler"), ("2:nan", 0.0, "straggler"),
                                    ("", float("inf"), "jitter"), ("", float("nan"), "jitter")):
        with pytest.raises(ValueError, match=f"{word} .*must be a finite number"):
            check_ps(base_config(1, straggler, jitter, []), 5)


def test_ps_study_end_to_end_small(tmp_path):
    """Every part on 5 ranks, one short repeat: the tables pair each variant with its baseline in the
    same repeat (the baseline's own ratios are exactly 1), the transient part meets the same delays,
    SSP(0) is BSP (staleness 0 everywhere), and both figures are drawn."""
    out = str(tmp_path)
    proc = run_mpi(5, "experiments.studies.ps_study", "--out", out, "--epochs", "1", "--repeats", "1",
                   "--delay-prob", "0.2", "--delay-s", "0.002", "--snapshots", "4", "--set", "hidden=16",
                   "--straggler-set", "batch_size=64", "--stop-after", "0", "--allow-noisy", timeout=120)
    assert "Traceback" not in proc.stdout, proc.stdout
    with open(os.path.join(out, "ps_study.json")) as f:
        res = json.load(f)
    tables = res["tables"]
    assert res["part_configs"]["straggler"]["even"]["batch_size"] == 64  # --straggler-set applied
    assert res["part_configs"]["transient"]["bsp"]["ps_extra"]["delay_s"] == 0.002
    assert [r["variant"] for r in tables["transient"]] == ["bsp", "ssp0", "ssp2", "ssp4", "asp"]
    assert [r["variant"] for r in tables["straggler"]] == ["even", "bsp", "ssp2", "asp", "bsp-balance"]
    assert [r["variant"] for r in tables["servers"]] == ["s1", "s2", "s4"]
    for part, base in (("transient", "bsp"), ("straggler", "even"), ("servers", "s1")):
        row = next(r for r in tables[part] if r["variant"] == base)
        assert row["updates_vs_baseline"]["median"] == row["samples_vs_baseline"]["median"] == 1.0
    runs = {(r["part"], r["variant"]): r for r in res["runs"]}
    for name in ("bsp", "ssp0"):
        r = runs[("transient", name)]
        assert r["staleness_max"] == 0 and r["delay_prob"] == 0.2 and r["delay_s"] == 0.002
        assert sum(w["delay_s"] for w in r["worker_stats"]) > 0  # the delays were slept
    assert runs[("transient", "ssp2")]["staleness_max"] <= 2
    assert runs[("servers", "s2")]["servers"] == 2 and runs[("servers", "s2")]["workers"] == 3
    assert runs[("straggler", "bsp-balance")]["balance"] is True and not runs[("straggler", "even")]["straggler"]
    slow = runs[("straggler", "bsp")]["worker_stats"]
    assert slow[1]["delay_s"] > 0 and slow[0]["delay_s"] == 0  # rank 2 is worker 1 behind one server
    from plots.staleness import main

    png = os.path.join(out, "s.png")
    assert main([os.path.join(out, "ps_study.json"), "--out", png]) == 0
    for path in (png, os.path.join(out, "s_throughput.png")):
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
