"""Time one training step of the NumPy MLP against PyTorch on the CPU, single thread.

``python -m experiments.bench_trainer [--steps 30] [--repeats 5] [--optimizer sgd]``

Model 784-1024-1024-10 (ReLU), batch 128, float32: forward, softmax cross-entropy, backward and
an optimizer step, on one rank with one BLAS thread. When PyTorch is importable the same model,
initial weights, data and optimizer run in PyTorch with ``torch.set_num_threads(1)`` in the same
process, and the ratio of step times is printed (target: NumPy within 1.5x of PyTorch). Results go
to ``results/bench_trainer.json`` with the host, library versions and the configuration.
"""
import argparse
import json
import platform
import socket
import statistics
import time

import numpy

from experiments.outputs import unwritable
from training.job import limit_threads

__all__ = ["SIZES", "numpy_step", "torch_step", "main"]

SIZES = (784, 1024, 1024, 10)  # layer widths (units)


def _timed(steps_by_name, steps, repeats, warmup=5):
    """Time each step function, alternating between them every repeat (fair under drifting load).

    Returns
    -------
    dict of str -> list of float
        Mean seconds per step of each repeat, per name.
    """
    for step in steps_by_name.values():
        for _ in range(warmup):
            step()
    times = {name: [] for name in steps_by_name}
    for _ in range(repeats):
        for name, step in steps_by_name.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            times[name].append((time.perf_counter() - t0) / steps)
    return times


def _optimizer(name, model):
    from training.optim import SGD, Adam

    if name == "sgd":
        return SGD(model.params, model.grads, lr=0.01, momentum=0.9)
    return Adam(model.params, model.grads, lr=1e-3)


def numpy_step(x, y, optimizer, seed=0):
    """Return (step function, model) of the NumPy trainer: forward, backward, optimizer step."""
    from training.nn import SoftmaxCrossEntropy, build_mlp
    from training.parallel import compute_gradient

    model = build_mlp(SIZES, dtype="float32", seed=seed)
    opt, loss_fn = _optimizer(optimizer, model), SoftmaxCrossEntropy()

    def step():
        compute_gradient(model, loss_fn, x, y)
        opt.step()

    return step, model


def torch_step(x, y, optimizer, init):
    """Return (step function, version) of the same model in PyTorch on the CPU.

    ``init`` is a NumPy model whose initial weights are copied, so both start alike.
    """
    import torch

    layers = []
    for k, (a, b) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        layers.append(torch.nn.Linear(a, b))
        if k < len(SIZES) - 2:
            layers.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*layers)
    lin = [m for m in net if isinstance(m, torch.nn.Linear)]
    src = [m for m in init.layers if hasattr(m, "W")]
    with torch.no_grad():
        for t, s in zip(lin, src):
            t.weight.copy_(torch.from_numpy(s.W.T.copy()))
            t.bias.copy_(torch.from_numpy(s.b.copy()))
    if optimizer == "sgd":
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad(set_to_none=False)
        loss_fn(net(tx), ty).backward()
        opt.step()

    return step, torch.__version__


def main(argv=None):
    """Run the benchmark, print the step times and ratio, write the results file."""
    p = argparse.ArgumentParser(prog="python -m experiments.bench_trainer", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30, help="steps per timed repeat (default: 30)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported (default: 5)")
    p.add_argument("--batch", type=int, default=128, help="batch size in samples (default: 128)")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                   help="sgd (momentum 0.9) or adam (default: sgd)")
    p.add_argument("--threads", type=int, default=1, help="BLAS / PyTorch threads (default: 1)")
    p.add_argument("--out", default="results/bench_trainer.json", help="results file (JSON)")
    args = p.parse_args(argv)
    for name in ("steps", "repeats", "batch", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if why := unwritable(args.out):  # fail before the timing, not after it
        p.error(f"cannot write --out: {why}")
    limited = limit_threads(args.threads)
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((args.batch, SIZES[0])).astype(numpy.float32)
    y = rng.integers(0, SIZES[-1], args.batch).astype(numpy.int64)
    steps = {"numpy": numpy_step(x, y, args.optimizer)[0]}
    try:
        import torch
    except ImportError:
        torch = None
    else:
        torch.set_num_threads(args.threads)
        fresh = numpy_step(x, y, args.optimizer)[1]
        steps["torch"], version = torch_step(x, y, args.optimizer, fresh)
    times = _timed(steps, args.steps, args.repeats)
    result = {"model": list(SIZES), "batch": args.batch, "dtype": "float32", "optimizer": args.optimizer,
              "threads": args.threads, "blas_threads_limited": limited, "numpy": numpy.__version__,
              "numpy_step_s": statistics.median(times["numpy"]), "numpy_step_s_all": times["numpy"],
              "host": socket.gethostname(), "python": platform.python_version(),
              "cpu": platform.processor() or platform.machine()}
    print(f"MLP {'-'.join(map(str, SIZES))}, batch {args.batch}, float32, {args.optimizer}, "
          f"{args.threads} thread(s): forward + backward + step, median of {args.repeats} x {args.steps} steps")
    print(f"  NumPy   {1e3 * result['numpy_step_s']:8.2f} ms/step")
    if torch is None:
        print("  PyTorch not installed: no comparison (pip install torch to measure it)")
    else:
        result.update({"torch": version, "torch_step_s": statistics.median(times["torch"]),
                       "torch_step_s_all": times["torch"]})
        result["ratio"] = result["numpy_step_s"] / result["torch_step_s"]
        print(f"  PyTorch {1e3 * result['torch_step_s']:8.2f} ms/step ({version})")
        print(f"  ratio NumPy / PyTorch = {result['ratio']:.2f} (target <= 1.5)")
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(f"  -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
