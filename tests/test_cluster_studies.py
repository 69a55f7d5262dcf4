"""The emulated-cluster studies as one command each (compression, parameter server, collectives): gathering
their runs' outputs, the provenance of the one file they write, the published tables and figures, all from
small synthetic outputs (the runs themselves need the emulator: tests/test_cluster.py). Oracles: the
numbers written into the synthetic outputs, and :func:`plots.publish.check` on hand-written blocks."""
import argparse
import json
import sys

import pytest

from experiments import harness
from experiments.cluster import compression, node_collectives, ps, study
from plots import cluster, publish
from plots.tables import cluster_tables
from plots.publish.sources import check_quiet


def _run_dir(d, per_step, accs=(0.90, 0.96, 0.97), batch=64):
    """A training run's logs: 10 steps of ``per_step`` s per epoch and 0.5 s of evaluation after each."""
    d.mkdir(parents=True)
    with open(d / "epochs.jsonl", "w") as f:
        for e, acc in enumerate(accs, 1):
            f.write(json.dumps({"epoch": e, "steps": 10, "wall_s": e * (10 * per_step + 0.5), "test_acc": acc}) + "\n")
    with open(d / "metrics.jsonl", "w") as f:
        for e in range(len(accs)):
            for k in range(1, 11):
                f.write(json.dumps({"epoch": e + 1, "wall_s": e * (10 * per_step + 0.5) + k * per_step}) + "\n")
    (d / "config.json").write_text(json.dumps({"config": {"batch_size": batch}}))
    return str(d)


def _args(tmp_path, *extra):
    p = argparse.ArgumentParser()
    study.add_options(p, str(tmp_path / "runs"), str(tmp_path / "study.json"))
    return p.parse_args(["--max-load", "1000", *extra])


def test_compression_study_gathers_its_sweeps_into_one_quiet_file_and_publishes_it(tmp_path):
    """Three networks' sweeps gathered by run_study: rows per network, the sweeps' provenance, a failed run
    named and a noisy sweep making the file noisy; the table names the faster compressor; the figure draws."""
    per = {"shm": 0.010, "1gbit": 0.020, "100mbit": 0.040}
    for net, step in per.items():
        runs = [{"spec": "none", "seed": 0, "run_dir": _run_dir(tmp_path / net / "none", step),
                 "final_test_acc": 0.97, "bytes_per_step": 1000},
                {"spec": "topk", "seed": 0, "run_dir": _run_dir(tmp_path / net / "topk", 0.010),
                 "final_test_acc": 0.96, "bytes_per_step": 20}]
        (tmp_path / net / "compression_sweep.json").write_text(json.dumps(
            {"P": 4, "runs": runs, "provenance": {"noisy": net == "100mbit"}}))
    dirs = {net: str(tmp_path / net) for net in per}
    args = _args(tmp_path)
    cmds = ["python -c pass", "python -c 'import sys; sys.exit(3)'"]
    assert study.run_study(args, cmds, lambda: compression.gather(dirs, 0.95, {"nodes": 4, "ranks_per_node": 1,
                                                                               "epochs": 3, "seeds": "0"}),
                           P=5, label="test", pause=0) == 1
    record = json.loads((tmp_path / "study.json").read_text())
    assert record["failed"] == [cmds[1]] and record["networks"] == list(per)
    assert record["provenance"]["noisy"] and record["provenance"]["noisy_runs"] == ["100mbit"]
    topk = {r["network"]: r for r in record["rows"] if r["spec"] == "topk"}
    assert topk["100mbit"]["speedup"] == pytest.approx(4.0) and topk["shm"]["speedup"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="busy machine"):
        check_quiet(record, "cluster/compression_study.json")
    text = cluster_tables.compression_markdown(record)
    assert "100mbit: shorter steps than `none` in every epoch with topk; the largest median speedup is 4.00x" in text
    assert "shm: shorter steps than `none` in every epoch with no compressor" in text
    cluster.draw_compression(record, str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").stat().st_size > 0


def test_ps_study_gathers_both_models_with_their_wire_time(tmp_path):
    """Per model: the ring's samples/s from its step time, the PS's own, the ratio to all-reduce, and the
    busiest link's wire time from the protocol's bytes at 1 Gbit/s."""
    cmds = ps.commands(str(tmp_path), repeats=2)
    assert len(cmds) == 2 * 2 * 4 and "--hidden 1024,1024" in cmds[4] and cmds[0].endswith("dp-ring-r1")
    for h, n in (("512", 38410), ("1024,1024", 1126410)):
        root = tmp_path / ps._model(h)
        for r in (1, 2):
            d = root / f"dp-ring-r{r}"
            _run_dir(d, 0.064)  # 64 samples per 64 ms: 1000 samples/s
            (d / "summary.json").write_text(json.dumps({"P": 4, "bytes_sent_per_rank": 100, "steps": 10,
                                                        "final_test_acc": 0.97, "parameters": n, "run_dir": str(d),
                                                        "compute_s": 0.02}))
            for s in (1, 2):
                d = root / f"ps-bsp-s{s}-r{r}"
                d.mkdir()
                (d / "summary.json").write_text(json.dumps({"samples_per_s": 500.0 * s + r, "workers": 4, "servers": s,
                                                            "final_test_acc": 0.97, "parameters": n}))
    record = ps.gather(str(tmp_path))
    assert record["models"] == {"h512": {"hidden": "512", "parameters": 38410},
                                "h1024x1024": {"hidden": "1024,1024", "parameters": 1126410}}
    rows = {(r["model"], r["config"]): r for r in record["rows"]}
    assert rows["h512", "dp-ring"]["samples_per_s"] == pytest.approx(1000.0)
    assert rows["h512", "ps-bsp-s2"]["vs_allreduce"] == pytest.approx(1.0015)
    one = rows["h1024x1024", "ps-bsp-s1"]  # the server's link carries W = 4 gradients each way
    assert one["busiest_link_bytes"] == 4 * 4 * 1126410 and one["wire_ms"] == pytest.approx(4 * 4 * 1126410 * 8 / 1e6)
    text = cluster_tables.ps_markdown(record)
    assert "Model h1024x1024 (hidden 1024,1024, 1,126,410 parameters" in text and "Fastest: ps-bsp-s2" in text
    assert "own counter: 0.0 KB sent per rank per step (protocol 230.5 KB). A step computes in 2.0 ms (the ring runs' own timer); its gradient takes 1.8 ms on a ring link, less." in text
    cluster.draw_ps(record, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 0


def test_collectives_study_gathers_both_links_and_names_where_2d_wins(tmp_path):
    """Speedups over the ring pass by pass, and the sizes at which 2d is faster, from two sweeps' rows."""
    assert len(node_collectives.commands("x")) == 2
    files = {}
    for link, slow in (("1gbit", 1.0), ("100mbit", 10.0)):
        rows = []
        for size in (64 << 10, 128 << 10):
            for alg, f in (("ring", 1.0), ("2d", 0.5 if size > 64 << 10 else 2.0), ("mpi", 1.0)):
                t = [slow * f * size / 1e3 * k for k in (1.0, 1.1, 1.2)]
                rows.append({"collective": "allreduce", "bytes": size, "count": size // 4, "algorithm": alg,
                             "time_s": t[0] * 1e-6, "time_us": t[0], "time_repeats_us": t})
        path = tmp_path / f"collectives_{link}.json"
        path.write_text(json.dumps({"P": 8, "config": {"repeats": 3}, "rows": rows, "provenance": {"noisy": False}}))
        files[link] = str(path)
    record = node_collectives.gather(files, 2)
    assert record["summary"]["1gbit"]["2d_faster_than_ring_at"] == [128 << 10]
    assert record["summary"]["100mbit"]["2d_faster_from_bytes"] == 128 << 10
    text = cluster_tables.collectives_markdown(record)
    assert "1gbit: `2d` is faster than `ring` at 128 KiB; it stays faster from 128 KiB up." in text
    one = {**record, "rows": [r for r in record["rows"] if r["link"] == "1gbit"]}  # one row of panels: quicker
    cluster.draw(one, str(tmp_path / "k.png"))
    assert (tmp_path / "k.png").stat().st_size > 0


def test_a_block_of_an_item_not_yet_measured_must_stay_empty(monkeypatch):
    """An item whose reference file is not committed renders empty text: its empty block passes the
    check, a block with text in it fails."""
    monkeypatch.setitem(publish.ITEMS, "not-measured", ("cluster/not_measured.json", lambda rel: 1 / 0, None))
    empty = "<!-- results:not-measured -->\n\n<!-- /results:not-measured -->\n"
    assert publish.check({"x.md": empty}) == []
    written = "<!-- results:not-measured -->\n| 1 |\n<!-- /results:not-measured -->\n"
    assert len(publish.check({"x.md": written})) == 1


def test_study_commands_parse_and_a_busy_machine_is_refused(tmp_path, capsys):
    """Each study's ``commands`` prints its runs; ``run`` on a busy machine (``--max-load -1``: every load
    is above it) exits 2 with one line before any run and writes nothing."""
    assert compression.main(["commands", "--out", "d"]) == 0
    assert ps.main(["commands", "--out", "d", "--repeats", "1", "--hidden", "16"]) == 0
    assert node_collectives.main(["commands", "--out", "d"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 + 4 + 2 and all(line.startswith(("mpiexec", "python")) for line in out)
    assert ps.main(["run", "--max-load", "-1", "--study", str(tmp_path / "s.json")]) == 2
    assert "load average" in capsys.readouterr().err and not (tmp_path / "s.json").exists()
    with pytest.raises(SystemExit):
        ps.main(["commands", "--hidden", "wide"])
    assert sys.executable == harness.argv("python")[0]
