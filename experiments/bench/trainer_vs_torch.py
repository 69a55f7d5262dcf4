"""Time one training step of the NumPy MLP against PyTorch on the CPU, over batch sizes and optimizers.

``python -m experiments.bench.trainer_vs_torch [--batch 32 128 512] [--optimizer sgd adam] [--repeats 7]``

Model 784-1024-1024-10 (ReLU), float32: forward, softmax cross-entropy, backward and an optimizer
step (SGD with momentum 0.9, or Adam), on one process with one BLAS thread. When PyTorch is
importable the same model, initial weights, data and optimizer run in PyTorch (``torch.optim``'s
default implementation, ``zero_grad()`` with its default ``set_to_none=True``) with
``torch.set_num_threads(1)`` in the same process. For each cell of the batch x optimizer grid the
two step functions are timed in alternating repeats (the order flips every repeat, so drifting load
hits both alike), by wall time and by CPU time; the ratio commlab / PyTorch is taken per repeat and
reported as its median and range, and a cell whose wall-time ratios spread by more than 20 % of
the median is flagged. Target: wall-time ratio <= 1.0 in every cell. Results go to
``results/bench_trainer.json`` with the host, library versions, the resolved configuration and the
``provenance`` (:mod:`commlab.provenance`: on a busy machine the benchmark refuses to start unless
``--allow-noisy`` marks its file noisy).
"""
import argparse
import platform
import socket
import statistics
import time

import numpy

from commlab.provenance import mpi_library
from experiments import harness
from plots.tables.study_tables import trainer_table
from commlab.job_control import limit_threads
from training.settings.options import INT32_MAX, Parser, integer, text

__all__ = ["SIZES", "numpy_step", "torch_step", "make_batches", "time_interleaved", "bench_cell",
           "main"]

SIZES = (784, 1024, 1024, 10)  # layer widths (units)
SPREAD_FLAG = 0.20  # a cell whose ratios' (max - min) / median exceeds this is flagged unstable


def _optimizer(name, model):
    from training.model.optim import SGD, Adam

    if name == "sgd":
        return SGD(model.params, model.grads, lr=0.01, momentum=0.9)
    return Adam(model.params, model.grads, lr=1e-3)


def make_batches(batch, n_batches=4, sizes=SIZES, seed=0):
    """Return ``n_batches`` (x, y) pairs: x (batch, sizes[0]) float32 standard normal, y (batch,) int64.

    The timed steps cycle through them, so that neither framework trains on one batch for hundreds
    of steps (which drives the softmax towards one-hot outputs and the gradients towards subnormal
    numbers, whose arithmetic is slow on x86).
    """
    rng = numpy.random.default_rng(seed)
    return [(rng.standard_normal((batch, sizes[0])).astype(numpy.float32),
             rng.integers(0, sizes[-1], batch).astype(numpy.int64)) for _ in range(n_batches)]


def numpy_step(batches, optimizer, seed=0, sizes=SIZES):
    """Return (step function, model) of the NumPy trainer: forward, backward, optimizer step.

    Parameters
    ----------
    batches : list of (ndarray (B, F) float32, ndarray (B,) int64)
        Batches the step cycles through, one per call.
    optimizer : {"sgd", "adam"}
    seed : int
        Initialization seed of :func:`training.model.nn.build_mlp`.
    sizes : sequence of int
        Layer widths.

    Returns
    -------
    (callable, training.model.nn.Sequential)
        ``step() -> float`` returns the batch's mean loss.
    """
    from training.model.nn import SoftmaxCrossEntropy, build_mlp
    from training.dp.data_parallel import compute_gradient

    model = build_mlp(sizes, dtype="float32", seed=seed)
    opt, loss_fn = _optimizer(optimizer, model), SoftmaxCrossEntropy()
    count = [0]

    def step():
        x, y = batches[count[0] % len(batches)]
        count[0] += 1
        loss = compute_gradient(model, loss_fn, x, y)
        opt.step()
        return loss

    return step, model


def torch_step(batches, optimizer, init, sizes=SIZES, set_to_none=True):
    """Return (step function, module) of the same model in PyTorch on the CPU.

    ``init`` is a NumPy model (:class:`training.model.nn.Sequential`) whose initial weights are copied, so
    both start alike; the optimizer is ``torch.optim.SGD`` / ``torch.optim.Adam`` with their default
    implementation and the same hyper-parameters as :func:`numpy_step`'s. ``set_to_none`` is passed
    to ``zero_grad``: True (PyTorch's default) drops the gradients, so that backward hands its
    fresh gradient tensors to the parameters; False zeroes them, and backward adds into them.
    """
    import torch

    layers = []
    for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if k < len(sizes) - 2:
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
    tb = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]
    count = [0]

    def step():
        tx, ty = tb[count[0] % len(tb)]
        count[0] += 1
        opt.zero_grad(set_to_none=set_to_none)
        loss = loss_fn(net(tx), ty)
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step, net


def time_interleaved(steps_by_name, steps, repeats, warmup=3):
    """Time each step function in alternating repeats, the order reversed every other repeat.

    Each repeat is timed by two clocks: wall time (``time.perf_counter``), the step time a user
    waits for, and this process's CPU time (``time.process_time``), which leaves out the time the
    process waited for a core: on a machine shared with other jobs the wall times swing with their
    load, the CPU times much less.

    Parameters
    ----------
    steps_by_name : dict of str -> callable
    steps : int
        Calls per timed repeat.
    repeats : int
        Timed repeats per function.
    warmup : int
        Untimed calls of each function first (buffers allocated, caches and BLAS warmed).

    Returns
    -------
    dict of str -> dict of str -> list of float
        ``times[name]["wall"]`` and ``times[name]["cpu"]``: seconds per call of each repeat, in
        repeat order.
    """
    for step in steps_by_name.values():
        for _ in range(warmup):
            step()
    names = list(steps_by_name)
    times = {name: {"wall": [], "cpu": []} for name in names}
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            step = steps_by_name[name]
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(steps):
                step()
            t1, c1 = time.perf_counter(), time.process_time()
            times[name]["wall"].append((t1 - t0) / steps)
            times[name]["cpu"].append((c1 - c0) / steps)
    return times


def _summary(values):
    """Return {"median", "min", "max", "all"} of a list of floats."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": list(values)}


def bench_cell(batch, optimizer, steps, repeats, warmup=3, sizes=SIZES, with_torch=True, set_to_none=True):
    """Time one (batch, optimizer) cell: commlab's step and, when ``with_torch``, PyTorch's.

    Returns
    -------
    dict
        ``batch``, ``optimizer``, ``numpy_step_s`` and ``numpy_cpu_s`` (seconds per step: median,
        min, max, all repeats); with PyTorch also ``torch_step_s``, ``torch_cpu_s``, ``ratio`` and
        ``cpu_ratio`` (commlab / PyTorch per repeat, wall and CPU time: median, min, max, all),
        ``spread`` ((max - min) / median of the wall-time ratios) and ``unstable`` (spread > 20 %).
    """
    batches = make_batches(batch, sizes=sizes)
    fns = {"numpy": numpy_step(batches, optimizer, sizes=sizes)[0]}
    if with_torch:
        init = numpy_step(batches, optimizer, sizes=sizes)[1]
        fns["torch"] = torch_step(batches, optimizer, init, sizes=sizes, set_to_none=set_to_none)[0]
    times = time_interleaved(fns, steps, repeats, warmup)
    cell = {"batch": batch, "optimizer": optimizer, "numpy_step_s": _summary(times["numpy"]["wall"]),
            "numpy_cpu_s": _summary(times["numpy"]["cpu"])}
    if with_torch:
        ratios = {clock: [a / b for a, b in zip(times["numpy"][clock], times["torch"][clock])]
                  for clock in ("wall", "cpu")}
        cell.update({"torch_step_s": _summary(times["torch"]["wall"]), "torch_cpu_s": _summary(times["torch"]["cpu"]),
                     "ratio": _summary(ratios["wall"]), "cpu_ratio": _summary(ratios["cpu"])})
        cell["spread"] = (max(ratios["wall"]) - min(ratios["wall"])) / statistics.median(ratios["wall"])
        cell["unstable"] = cell["spread"] > SPREAD_FLAG
    return cell


def _parser():
    doc = __doc__.split("\n")
    p = Parser(prog="python -m experiments.bench.trainer_vs_torch", description=doc[0],
                                epilog="\n".join(doc[4:]).strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=integer(1, INT32_MAX), nargs="+", default=[32, 128, 512], metavar="B",
                   help="batch sizes in samples, one grid row each (default: 32 128 512)")
    p.add_argument("--optimizer", nargs="+", choices=("sgd", "adam"), default=["sgd", "adam"],
                   help="optimizers: sgd (momentum 0.9, lr 0.01) and/or adam (lr 1e-3) (default: both)")
    p.add_argument("--steps", type=integer(1, INT32_MAX), default=None,
                   help="steps per timed repeat (default: 40 at batch <= 32, 20 at <= 128, 8 above)")
    p.add_argument("--warmup", type=integer(0, INT32_MAX), default=3, help="untimed steps per framework and cell (default: 3)")
    p.add_argument("--threads", type=integer(0, INT32_MAX), default=1, help="BLAS / PyTorch threads (default: 1)")
    p.add_argument("--model", type=text(), default="-".join(map(str, SIZES)), metavar="W0-W1-...-WL",
                   help="layer widths, input first, classes last (default: %(default)s)")
    p.add_argument("--no-torch", action="store_true", help="time commlab alone, even when PyTorch is installed")
    p.add_argument("--torch-zero-grad", choices=("none", "zeros"), default="none",
                   help="PyTorch's zero_grad: none (set_to_none=True, PyTorch's default: backward hands "
                        "its gradient tensors over) or zeros (set_to_none=False: gradients zeroed, "
                        "backward adds into them) (default: none)")
    harness.add_options(p, out="results/bench_trainer.json", repeats=7)
    return p


def _default_steps(batch):
    return 40 if batch <= 32 else 20 if batch <= 128 else 8


def main(argv=None):
    """Run the grid, print the table, write the results file; return the exit status (0).

    Exits 2 with one error line before any timing on a bad argument, an unwritable ``--out`` or a
    busy machine (:func:`experiments.harness.start`).
    """
    p = _parser()
    args = p.parse_args(argv)
    if args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    try:
        sizes = tuple(int(w) for w in args.model.split("-"))
    except ValueError:
        sizes = ()
    if len(sizes) < 2 or min(sizes) < 1:
        p.error(f"--model must be at least two positive widths joined by '-', got {args.model!r}")
    watch = harness.start(args, paths=[args.out], prog=p.prog)  # before the timing, not after it
    if watch is None:
        return 2
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            torch = None
        else:
            torch.set_num_threads(args.threads)
    limited = limit_threads(args.threads)  # after importing torch, so its BLAS pools are capped too
    cells = []
    for batch in args.batch:
        for opt in args.optimizer:
            steps = args.steps or _default_steps(batch)
            cell = bench_cell(batch, opt, steps, args.repeats, args.warmup, sizes, with_torch=torch is not None,
                              set_to_none=args.torch_zero_grad == "none")
            cell["steps"] = steps
            cells.append(cell)
    result = {"model": list(sizes), "dtype": "float32", "batches": args.batch, "optimizers": args.optimizer,
              "repeats": args.repeats, "warmup": args.warmup, "threads": args.threads,
              "blas_threads_limited": limited, "numpy": numpy.__version__,
              "torch": None if torch is None else torch.__version__,
              "torch_zero_grad": None if torch is None else args.torch_zero_grad, "mpi_library": mpi_library(), "size": 1,
              "host": socket.gethostname(), "python": platform.python_version(),
              "cpu": platform.processor() or platform.machine(), "cells": cells}
    print(f"MLP {'-'.join(map(str, sizes))}, float32, {args.threads} thread(s): forward + backward + "
          f"optimizer step; median [range] of {args.repeats} alternating repeats"
          + ("" if torch is None else f"; PyTorch {torch.__version__}, zero_grad set_to_none="
                                         f"{args.torch_zero_grad == 'none'}"))
    print(trainer_table(cells))
    if torch is None:
        print("PyTorch not measured (not installed, or --no-torch): no ratio")
    else:
        shaky = [f"{c['batch']}/{c['optimizer']}" for c in cells if c["unstable"]]
        print(f"cells with wall-time ratio median <= 1.0: {sum(c['ratio']['median'] <= 1.0 for c in cells)} "
              f"of {len(cells)}" + (f"; unstable (wall-time ratios spread > {SPREAD_FLAG:.0%} of the median): "
                                    + ", ".join(shaky) if shaky else ""))
    harness.finish(result, watch, args.out, P=1, module="experiments.bench.trainer_vs_torch", argv=argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
