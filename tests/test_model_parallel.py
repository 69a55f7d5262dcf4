"""Model parallelism: the shard rule, pipeline schedules, grid checks (one process), and the
multi-rank cases of tests/mpi_model_parallel.py on 2, 4 and 8 ranks, plus the command line."""
import json
import os

import numpy as np
import pytest

from tests.mpirun import ROOT, run_mpi
from training.settings.cli import build_parser, parse_args
from training.model_parallel.grid import check_grid, layer_kinds
from training.model.nn import Linear, ReLU
from training.model_parallel.layers import ColumnParallelLinear, shard_bounds
from training.model_parallel.pipeline import SCHEDULES, bubble_formula, schedule, simulate_bubble, stage_layers


@pytest.mark.parametrize("width,parts", [(10, 4), (7, 7), (73, 4), (2048, 3)])
def test_shard_bounds_follow_array_split(width, parts):
    want = [len(a) for a in np.array_split(np.arange(width), parts)]
    got = [hi - lo for lo, hi in (shard_bounds(width, parts, i) for i in range(parts))]
    assert got == want and shard_bounds(width, parts, parts - 1)[1] == width


def test_shard_bounds_refuse_a_width_below_the_group():
    with pytest.raises(ValueError, match="cannot be split over a tensor group of 4"):
        shard_bounds(3, 4, 0)


def test_column_shards_rebuild_the_dense_layer():
    rng = np.random.default_rng(0)
    W, b, x = rng.standard_normal((5, 9)), rng.standard_normal(9), rng.standard_normal((3, 5))
    parts = [ColumnParallelLinear.from_dense(W, b, rank=r, size=4) for r in range(4)]
    y = np.concatenate([p.forward(x).copy() for p in parts], axis=1)
    assert np.allclose(y, x @ W + b, rtol=1e-14)


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("stages,m", [(1, 1), (2, 3), (4, 4), (4, 8), (3, 2)])
def test_schedules_are_complete_and_their_bubble_is_the_formula(name, stages, m):
    for s in range(stages):
        ops = schedule(name, s, stages, m)
        assert sorted(ops) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        in_flight, most = 0, 0
        for kind, i in ops:
            assert kind == "F" or ops.index(("F", i)) < ops.index(("B", i))
            in_flight += 1 if kind == "F" else -1
            most = max(most, in_flight)
        assert most == (m if name == "gpipe" else min(stages - s, m))
    assert simulate_bubble(name, stages, m) == pytest.approx(bubble_formula(stages, m), abs=1e-12)


def test_stages_balance_parameters_and_refuse_too_many():
    layers = [Linear(64, 64), ReLU(), Linear(64, 64), ReLU(), Linear(64, 64), ReLU(), Linear(64, 64), ReLU(),
              Linear(64, 2)]
    assert [stage_layers(layers, 2, s) for s in range(2)] == [(0, 4), (4, 9)]
    assert [stage_layers(layers, 4, s) for s in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 9)]
    with pytest.raises(ValueError, match="6 pipeline stages for 5 linear layers"):
        stage_layers(layers, 6, 0)


def test_grid_checks_name_the_problem():
    sizes = [12, 10, 7, 5]
    assert layer_kinds(3) == ["column", "row", "replicated"]
    assert check_grid(8, 2, 2, sizes, 64, 4) == 2
    for args, words in [((6, 4, 1, sizes, 64, 1), "does not divide the 6 ranks"),
                        ((4, 4, 1, [12, 3, 7, 5], 64, 1), "layer 0 has 3 units, fewer than the tensor group"),
                        ((4, 1, 4, sizes, 64, 1), "4 stages for 3 linear layers"),
                        ((4, 1, 2, sizes, 64, 3), "--micro-batches 3 does not divide the local batch of 32"),
                        ((3, 1, 1, sizes, 64, 1), "multiple of the data-parallel degree 3")]:
        with pytest.raises(ValueError, match=words):
            check_grid(*args)


def test_help_explains_the_grid_flags():
    text = build_parser().format_help()
    for flag in ("--tensor-parallel T", "--pipeline-parallel Q", "--micro-batches M", "--schedule"):
        assert flag in text
    cfg = parse_args(["--tensor-parallel", "2", "--pipeline-parallel", "2", "--micro-batches", "4"])
    assert (cfg.tensor_parallel, cfg.pipeline_parallel, cfg.micro_batches) == (2, 2, 4)


def test_model_parallel_on_two_ranks(tmp_path):
    cases = ("gradcheck", "equivalence", "resume", "errors")  # schedules and memory: on four ranks
    out = run_mpi(2, "tests.mpi_model_parallel", str(tmp_path), *cases, timeout=120).stdout
    for case in cases:
        assert f"case_{case}: ok" in out, out


def test_model_parallel_on_four_ranks(tmp_path):
    out = run_mpi(4, "tests.mpi_model_parallel", str(tmp_path), timeout=180).stdout
    for case in ("gradcheck", "equivalence", "schedules", "memory", "resume", "errors"):
        assert f"case_{case}: ok" in out, out


def test_equivalence_on_one_rank(tmp_path):
    """P = 1: four micro-batches of gradient accumulation equal one batch."""
    out = run_mpi(1, "tests.mpi_model_parallel", str(tmp_path), "equivalence", timeout=60).stdout
    assert "case_equivalence: ok" in out and out.count("equivalence D=") == 1, out


def test_equivalence_on_eight_ranks(tmp_path):
    """8 = 2x2x2, 1x4x2, 2x1x4 and 4x2x1 (data x tensor x pipeline) against one process."""
    out = run_mpi(8, "tests.mpi_model_parallel", str(tmp_path), "equivalence", timeout=180).stdout
    assert "case_equivalence: ok" in out and out.count("equivalence D=") == 4, out


def test_cli_writes_grid_summary_and_refuses_bad_grids(tmp_path):
    args = ["--data", "synthetic", "--samples", "400", "--features", "16", "--hidden", "24,24", "--epochs", "1",
            "--run-dir", str(tmp_path), "--no-progress"]
    out = run_mpi(4, "training.train", *args, "--tensor-parallel", "2", "--pipeline-parallel", "2",
                  "--micro-batches", "4", "--name", "ok", timeout=90).stdout
    s = json.loads((tmp_path / "ok" / "summary.json").read_text())
    assert s["grid"] == {"data": 1, "tensor": 2, "pipeline": 2} and len(s["ranks"]) == 4, out
    assert set(s["bytes_per_rank_per_step"]) == {"data", "tensor", "pipeline"}
    assert s["bytes_per_rank_per_step"]["tensor"] > 0 and s["bytes_per_rank_per_step"]["pipeline"] > 0
    assert s["bubble_formula"] == pytest.approx(1 / 5) and "rank 3 (d=0 t=1 q=1)" in out
    _check_manifest(tmp_path / "ok")
    res = run_mpi(4, "training.train", *args, "--tensor-parallel", "3", timeout=60, check=False)
    assert res.returncode == 1 and res.stdout.count("error:") == 1 and "does not divide" in res.stdout, res.stdout
    assert "Traceback" not in res.stdout


def test_study_grids_and_plot(tmp_path):
    """The study covers every factorization that fits the model, data-parallel first; its plot draws
    the shipped reference results."""
    from experiments.studies.model_parallel_study import grids
    from plots.model_parallel import draw

    g = grids(8, 5)
    assert g[0] == (8, 1, 1) and len(g) == len(set(g)) == 9 and all(d * t * q == 8 and q <= 5 for d, t, q in g)
    with open(os.path.join(ROOT, "plots", "reference", "model_parallel", "p4.json"), encoding="utf-8") as f:
        results = json.load(f)
    out = draw(results, str(tmp_path / "mp.png"))
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def _check_manifest(run):
    """A sharded checkpoint is read only as its manifest lists it (oracle: the files as written)."""
    import shutil

    from commlab.file_formats import CheckpointError
    from training.model_parallel.sharded import assemble, find_sharded, read_pieces

    ckpt = find_sharded(str(run))
    pieces, _ = read_pieces(ckpt)
    full = assemble(pieces, "model/L0.W")
    assert full.shape == (16, 24)
    shard = sorted(p for p in os.listdir(ckpt) if p.startswith("shard-"))[0]
    for damage, words in (("remove", "listed in the manifest but missing"), ("change", "checksum differs"),
                          ("add", "does not list")):
        copy = run / f"copy-{damage}"
        shutil.copytree(ckpt, copy)
        if damage == "remove":
            os.remove(copy / shard)
        elif damage == "change":
            with open(copy / shard, "ab") as f:
                f.write(b"\0")
        else:
            shutil.copy(copy / shard, copy / "shard-t7-q7.npz")
        with pytest.raises(CheckpointError, match=words):
            read_pieces(str(copy))
    _check_served_values(run, ckpt, shard)
    split = [k for k, parts in pieces.items() if len(parts) > 1][0]
    with pytest.raises(CheckpointError, match="cover"):
        assemble({split: pieces[split][:-1]}, split)  # one part missing: never uninitialised memory
    with pytest.raises(CheckpointError, match="cover"):
        assemble({split: pieces[split] + pieces[split][:1]}, split)  # one part twice


def _check_served_values(run, ckpt, shard):
    """A shard rewritten with a valid checksum (manifest updated) but NaN or integer weights: the
    serving loader, which assembles the parts, refuses it naming the entry (oracle: the untouched
    checkpoint loads)."""
    import hashlib
    import shutil

    from mpi4py import MPI

    from inference.replicas.predictor import load_spec
    from commlab.file_formats import read_npz, write_npz
    from commlab.file_formats import CheckpointError

    assert load_spec(ckpt, MPI.COMM_SELF)[0].weights[0][0].shape == (16, 24)
    for damage, words in (("nan", "not finite"), ("int", "int64 values, not floating-point")):
        copy = run / f"copy-{damage}"
        shutil.copytree(ckpt, copy)
        arrays = read_npz(str(copy / shard))
        W = arrays["model/L0.W"]
        arrays["model/L0.W"] = W.astype(np.int64) if damage == "int" else np.where(W == W.flat[0], np.nan, W)
        os.remove(copy / shard)
        write_npz(str(copy / shard), arrays)
        manifest = json.loads((copy / "manifest.json").read_text())
        manifest["files"][shard] = hashlib.sha256((copy / shard).read_bytes()).hexdigest()
        (copy / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(CheckpointError, match=f"{copy.name}: entry model/L0.W holds .*{words}"):
            load_spec(str(copy), MPI.COMM_SELF)
