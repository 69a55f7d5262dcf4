"""Overlap of the gradient all-reduce with the backward pass (training/dp/overlap.py).

The multi-rank cases (``tests/mpi_overlap.py``) run on 2 ranks and on 3 (a non-power of two): with
overlap, every algorithm ends bitwise with the parameters of the blocking all-reduce, buckets start
during the backward pass, a non-finite step is skipped, and a silent rank raises CollectiveTimeout
within the deadline. The checks here need no second rank.
"""
import numpy as np
import pytest
from mpi4py import MPI

from tests.mpirun import run_mpi
from training.settings.config import Config
from training.model.nn import SoftmaxCrossEntropy, build_mlp
from training.model.optim import Adam
from training.dp.hooks import AllreduceHook, bucket_bounds, make_grad_hook
from training.dp.data_parallel import train_step


@pytest.mark.parametrize("nprocs", [2, 3])
def test_overlap_bitwise_started_skip_and_deadline(nprocs):
    out = run_mpi(nprocs, "tests.mpi_overlap", timeout=120).stdout
    for case in ("bitwise", "started", "nonfinite", "deadline"):
        assert f"case_{case}: ok" in out, out


def test_overlap_on_one_rank_matches_the_blocking_hook_bitwise():
    # oracle: the blocking hook on the same steps; Adam, float32, 3 buckets, every algorithm name
    rng = np.random.default_rng(3)
    data = [(rng.standard_normal((16, 10)).astype(np.float32), rng.integers(0, 4, 16)) for _ in range(4)]
    for alg in ("ring", "mpi", "auto"):
        finals = []
        for overlap in (False, True):
            model = build_mlp([10, 24, 24, 4], seed=1)
            opt, ce = Adam(model.params, model.grads, lr=1e-2), SoftmaxCrossEntropy()
            hook = AllreduceHook(MPI.COMM_SELF, alg, bucket_bounds(model.slices, 4, 400), 10.0, overlap)
            for x, y in data:
                train_step(model, ce, opt, hook, MPI.COMM_SELF, x, y)
            finals.append(model.params.copy())
        assert np.array_equal(*finals), alg
        assert not np.array_equal(finals[0], build_mlp([10, 24, 24, 4], seed=1).params)


def test_compression_falls_back_and_bad_flag_is_refused():
    model = build_mlp([6, 8, 3], seed=0)
    hook = make_grad_hook(Config(overlap=True, compression="topk", bucket_bytes=64), MPI.COMM_SELF, model)
    assert not getattr(hook, "overlap", False)  # a compressor runs after the backward pass
    plain = make_grad_hook(Config(overlap=True, bucket_bytes=64), MPI.COMM_SELF, model)
    assert plain.overlap and len(plain.buckets) > 1
    with pytest.raises(ValueError, match="overlap"):
        AllreduceHook(MPI.COMM_SELF, "ring", overlap="yes")


def test_trainer_flag_parses_runs_and_ends_bitwise_as_without(tmp_path, capsys):
    # the whole trainer on this process (P = 1), --overlap against --no-overlap: same final checkpoint
    from training.runtime.checkpoint import load_checkpoint
    from training.settings.cli import parse_args
    from training.train import run

    tiny = ["--data", "synthetic", "--samples", "240", "--features", "8", "--classes", "3", "--hidden", "8,8",
            "--batch-size", "24", "--epochs", "2", "--no-progress", "--bucket-bytes", "40", "--run-dir", str(tmp_path)]
    finals = []
    for flag in ("--overlap", "--no-overlap"):
        cfg = parse_args([*tiny, "--name", flag[2:], flag])
        assert cfg.overlap is (flag == "--overlap")
        run(cfg, MPI.COMM_WORLD)
        finals.append(load_checkpoint(str(tmp_path / flag[2:]), MPI.COMM_WORLD)[1]["model/params"])
    assert np.array_equal(*finals)
    assert not np.array_equal(finals[0], build_mlp([8, 8, 8, 3], seed=0).params)
