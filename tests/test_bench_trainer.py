"""The trainer benchmark compares like with like: commlab's step against PyTorch's as the oracle.

Training steps of a small MLP, run by the benchmark's own step functions, must leave the same
parameters in commlab and in PyTorch (same initial weights, data and hyper-parameters), for SGD
with momentum and for Adam; float32 throughout. Timings are not asserted (speed is the
benchmark's output, not a test's).
"""
import json

import numpy as np
import pytest

from experiments.bench import trainer_vs_torch as bench_trainer

SMALL = (20, 16, 12, 5)  # layer widths of the test model

# float32: after 6 steps the two implementations differ only by rounding (different GEMM kernels
# and operation order), a few ulp of the updates, far below one step's change (lr * grad ~ 1e-3)
RTOL, ATOL = 2e-5, 2e-6


def _torch_params(net):
    """Flat float32 parameters of a torch Sequential in commlab's order (W as (in, out), then b)."""
    import torch

    out = []
    for m in net:
        if isinstance(m, torch.nn.Linear):
            out += [m.weight.detach().numpy().T.ravel(), m.bias.detach().numpy().ravel()]
    return np.concatenate(out)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_steps_match_pytorch(optimizer):
    pytest.importorskip("torch")
    batches = bench_trainer.make_batches(8, n_batches=3, sizes=SMALL, seed=1)
    step, model = bench_trainer.numpy_step(batches, optimizer, seed=3, sizes=SMALL)
    fresh = bench_trainer.numpy_step(batches, optimizer, seed=3, sizes=SMALL)[1]
    tstep, net = bench_trainer.torch_step(batches, optimizer, fresh, sizes=SMALL)
    np.testing.assert_array_equal(_torch_params(net), model.params)  # same start
    start = model.params.copy()
    for _ in range(6):
        loss, tloss = step(), tstep()
        assert loss == pytest.approx(tloss, rel=1e-5)
    assert model.params.dtype == np.float32 and model.grads.dtype == np.float32
    assert np.abs(model.params - start).max() > 1e-3  # the steps did move the weights
    np.testing.assert_allclose(model.params, _torch_params(net), rtol=RTOL, atol=ATOL)


def test_step_stays_float32():
    # no silent float64 upcast: every buffer a float32 step touches is float32
    batches = bench_trainer.make_batches(6, n_batches=1, sizes=SMALL)
    for optimizer in ("sgd", "adam"):
        step, model = bench_trainer.numpy_step(batches, optimizer, sizes=SMALL)
        step()
        step()
        for layer in model.layers:
            for name, buf in layer.__dict__.get("_bufs", {}).items():
                assert buf.dtype in (np.float32, np.bool_), (type(layer).__name__, name, buf.dtype)


def test_repeats_alternate_order():
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    times = bench_trainer.time_interleaved(fns, steps=2, repeats=3, warmup=1)
    assert calls == ["a", "b"] + ["a", "a", "b", "b"] + ["b", "b", "a", "a"] + ["a", "a", "b", "b"]
    assert [(len(v["wall"]), len(v["cpu"])) for v in times.values()] == [(3, 3), (3, 3)]


def test_grid_table_and_results_file(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    out = tmp_path / "bench.json"
    threads = torch.get_num_threads()
    try:  # main caps this process's BLAS pools at one thread: the limiter puts them back
        from threadpoolctl import threadpool_limits
    except ImportError:
        import contextlib

        threadpool_limits = contextlib.nullcontext
    with threadpool_limits():
        try:
            assert bench_trainer.main(["--batch", "4", "16", "--optimizer", "sgd", "adam", "--steps", "2",
                                       "--repeats", "3", "--warmup", "1", "--model", "20-16-5",
                                       "--out", str(out), "--allow-noisy"]) == 0  # the test machine may be busy
        finally:
            torch.set_num_threads(threads)
    text = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["model"] == [20, 16, 5] and res["torch"] == torch.__version__
    assert [(c["batch"], c["optimizer"]) for c in res["cells"]] == [(4, "sgd"), (4, "adam"), (16, "sgd"),
                                                                    (16, "adam")]
    assert res["torch_zero_grad"] == "none" and res["repeats"] == 3
    for c in res["cells"]:
        for key, num, den in (("ratio", "numpy_step_s", "torch_step_s"), ("cpu_ratio", "numpy_cpu_s", "torch_cpu_s")):
            ratios = [a / b for a, b in zip(c[num]["all"], c[den]["all"])]
            assert len(ratios) == 3
            assert c[key]["median"] == pytest.approx(np.median(ratios))
            assert c[key]["min"] == pytest.approx(min(ratios)) and c[key]["max"] == pytest.approx(max(ratios))
            assert f"{c[key]['median']:.3f}x ({c[key]['min']:.3f}-{c[key]['max']:.3f})" in text
    assert text.count("\n|") == 2 + 4  # header, rule, one row per cell
