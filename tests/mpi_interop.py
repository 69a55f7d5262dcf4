"""Rank-side body of the interoperability tests: ``python -m tests.mpi_interop PART``.

PART ``dlpack``: every collective on PyTorch CPU tensors (float32/float64/int32/bfloat16), compared
with mpi4py's own collective on NumPy copies (the oracle), for every algorithm and for ``op`` given as
``mpi4py.MPI.SUM/PROD/MIN/MAX``: the result is a ``torch.Tensor`` of the input's dtype, ``out=`` a
tensor is written in its own memory (same ``data_ptr``), in-place broadcast returns the caller's
tensor. bfloat16 reducing collectives accumulate in float32 and round once (oracle: float32
``MPI_Allreduce`` of the bfloat16 values, rounded once), so ``[256, 1, 1]`` on 3 ranks sums to 258
(bfloat16 accumulation would give 256); copy-only collectives move it bit for bit. Bad ``op`` and
``out`` raise on every rank.

PART ``torch``: (1) DDP on a gloo process group with ``commlab_hook`` ends with the parameters of DDP's
default hook (float64, 6 steps, several buckets, max |diff| <= 1e-12), for ring, recursive doubling and
``mpi``; (2) DDP with ``commlab_hook`` and ``compression="powersgd"`` reaches the test accuracy of
PyTorch's own ``powerSGD_hook`` on the digits within 1 point (same model, data, seed and rank 2);
(3) ``DistributedOptimizer`` in a plain loop equals a single-process full-batch run (float64, 1e-12)
and ``broadcast_parameters`` copies root's values.

PART ``peers`` (2 ranks), PyTorch's own hooks as oracles: (1) fp16 compression equals
``fp16_compress_hook`` bit for bit at the float16 edge (36,500 on both ranks
stays finite; Inf exactly where one rank's own value reaches 65520), and bf16 equals
``bf16_compress_hook`` at bfloat16's (2e38 on both ranks stays finite; Inf where one rank's own value
does); (2) DDP with ``commlab_hook`` and
PowerSGD ends with the parameters of DDP with ``powerSGD_hook`` (float64, 1e-10; start step 2, rank
2, ``min_compression_rate`` 2, error feedback and warm start) through DDP's bucket rebuild after step 0,
PyTorch's first random Q computed here from its seed rule and handed to commlab's state;
(3) ``CommHookState`` whose buckets change their parameters after compression started gives every
parameter the result of a state whose buckets never changed (residuals and warm-start Qs follow the
parameters), and refuses ``start_iter`` below 2 with error feedback. Exits 0 when every case passes
on every rank.
"""
import os
import socket
import sys
import time
import traceback

import ml_dtypes
import numpy as np
import torch
from mpi4py import MPI

import collectives
import collectives.schedules.schedule
from collectives.interop.torch_hook import CommHookState, DistributedOptimizer, broadcast_parameters, commlab_hook
from tests.mpicases import FAILS, check, report

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()
BF16 = np.dtype(ml_dtypes.bfloat16)
OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}


def data(dtype, n=37, salt=0):
    """This rank's values of ``dtype``: small integers (exact sums and products in every dtype)."""
    g = np.random.default_rng([rank, salt]).integers(-3, 4, n)
    return g.astype(np.float32).astype(BF16) if dtype == "bfloat16" else g.astype(dtype)


def as_torch(a):
    """A torch tensor holding NumPy array ``a`` (bfloat16 through its bits)."""
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def as_numpy(t):
    """NumPy copy of tensor ``t`` (bfloat16 as ml_dtypes.bfloat16)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().copy().view(BF16)
    return t.numpy().copy()


def mpi_reduce(a, op):
    """Oracle: MPI_Allreduce of ``a`` (bfloat16 reduced in float32 and rounded once)."""
    wide = a.astype(np.float32) if a.dtype == BF16 else a.copy()
    comm.Allreduce(MPI.IN_PLACE, wide, OPS[op])
    return wide.astype(a.dtype)


def case_dlpack():
    algorithms = [a for a in collectives.ALGORITHMS if a != "auto"]
    for dtype in ("float32", "float64", "int32", "bfloat16"):
        for op in ("sum", "max", "min", "prod"):
            a = data(dtype, salt=len(op))
            want = mpi_reduce(a, op)
            for alg in algorithms:
                got = collectives.allreduce(as_torch(a), op=OPS[op], algorithm=alg)
                check(isinstance(got, torch.Tensor) and got.dtype == as_torch(a).dtype,
                      f"allreduce {alg} {dtype}: returned {type(got).__name__} {getattr(got, 'dtype', '')}")
                check(np.array_equal(as_numpy(got), want), f"allreduce {alg} {dtype} MPI.{op.upper()} != MPI oracle")
        x = as_torch(data(dtype, salt=9))
        out = torch.empty_like(x)
        ptr = out.data_ptr()
        got = collectives.allreduce(x, op="sum", algorithm="ring", out=out)
        check(got is out and out.data_ptr() == ptr, f"out= {dtype}: not written in the caller's tensor")
        check(np.array_equal(as_numpy(out), mpi_reduce(data(dtype, salt=9), "sum")), f"out= {dtype}: wrong values")
        req = collectives.iallreduce(x, op=MPI.MAX, algorithm="tree")
        got = req.wait()
        check(isinstance(got, torch.Tensor) and np.array_equal(as_numpy(got), mpi_reduce(data(dtype, salt=9), "max")),
              f"iallreduce {dtype}: wrong result or type")
        # copy-only collectives: bit for bit against MPI's own
        a = data(dtype, n=5 + rank, salt=3)
        bits = a.view(f"u{a.dtype.itemsize}")
        counts = comm.allgather(bits.size)
        want = np.empty(sum(counts), bits.dtype)
        comm.Allgatherv(bits, [want, counts])
        got = collectives.allgather(as_torch(a))
        check(isinstance(got, torch.Tensor) and np.array_equal(as_numpy(got).view(bits.dtype), want),
              f"allgather {dtype}: differs from MPI_Allgatherv")
        b = as_torch(data(dtype, salt=4))
        root_bits = data(dtype, salt=4).view(f"u{a.dtype.itemsize}").copy()
        comm.Bcast(root_bits, root=P - 1)
        got = collectives.broadcast(b, root=P - 1)
        check(got is b and np.array_equal(as_numpy(b).view(root_bits.dtype), root_bits),
              f"broadcast {dtype}: not in place in the caller's tensor or differs from MPI_Bcast")
        a = data(dtype, n=11, salt=5)
        want = mpi_reduce(a, "max")
        got = collectives.reduce_scatter(as_torch(a), op=MPI.MAX)
        lo, hi = collectives.schedules.schedule.chunk_bounds(a.size, P)[rank:rank + 2]
        check(np.array_equal(as_numpy(got), want[lo:hi]), f"reduce_scatter {dtype} MPI.MAX != MPI oracle")
        want = mpi_reduce(a, "min")
        got = collectives.reduce(as_torch(a), root=0, op=MPI.MIN)
        check((got is None) == (rank != 0) and (rank != 0 or np.array_equal(as_numpy(got), want)),
              f"reduce {dtype} MPI.MIN != MPI oracle")
    # bfloat16 accumulates in float32: 256 + 1 + 1 = 258 (bfloat16 additions would round to 256)
    if P == 3:
        x = torch.tensor([256.0 if rank == 0 else 1.0], dtype=torch.bfloat16)
        for alg in algorithms:
            got = collectives.allreduce(x, algorithm=alg)
            check(float(got[0]) == 258.0, f"bfloat16 {alg}: 256+1+1 gave {float(got[0])}, not 258")
    # requires_grad tensors are read through a detached view; the caller's tensor is not modified
    w = torch.arange(4, dtype=torch.float64, requires_grad=True)
    got = collectives.allreduce(w, op="avg")
    check(np.array_equal(got.numpy(), np.arange(4.0)) and np.array_equal(w.detach().numpy(), np.arange(4.0)),
          "requires_grad input: wrong result")
    # bad input raises on every rank before any message
    for kwargs, exc in (({"op": MPI.LAND}, ValueError), ({"out": torch.empty(3, dtype=torch.float32)}, ValueError),
                        ({"out": torch.empty(4, dtype=torch.float32)}, TypeError)):
        try:
            collectives.allreduce(torch.ones(4, dtype=torch.float64), **kwargs)
            check(False, f"{kwargs}: no error")
        except exc:
            pass
    check(collectives.allreduce(np.ones(3), op=MPI.SUM).sum() == 3 * P, "NumPy input with MPI.SUM")
    # in-place writes go through PyTorch, as its own in-place ops do: a leaf that requires grad is
    # refused; a tensor saved for backward makes backward fail (autograd's version counter); a plain
    # tensor receives the sum in place (oracle: P x its value)
    leaf = torch.ones(4, requires_grad=True)
    try:
        collectives.allreduce(leaf, out=leaf)
        check(False, "in-place all-reduce into a leaf that requires grad: no error")
    except RuntimeError as exc:
        check("requires grad" in str(exc), f"leaf: unclear error {exc}")
    a, b = torch.ones(4, requires_grad=True), torch.full((4,), 2.0)
    loss = (a * b).sum()  # saves b for backward
    collectives.allreduce(b, out=b)
    try:
        loss.backward()
        check(False, "backward after an in-place all-reduce of a saved tensor: no error")
    except RuntimeError as exc:
        check("modified by an inplace operation" in str(exc), f"saved tensor: unclear error {exc}")
    t = torch.ones(4)
    check(collectives.allreduce(t, out=t) is t and t.tolist() == [float(P)] * 4, "plain tensor in place")


def free_port():
    """Rank 0's free TCP port, sent to every rank (for gloo's rendezvous)."""
    port = np.zeros(1, np.int64)
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    comm.Bcast(port, root=0)
    return int(port[0])


def mlp(seed, dtype=torch.float64, hidden=32):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)).to(dtype)


def digits(dtype):
    """The digits split as in training.data.datasets (80/20, stratified, standardized), as tensors."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    scaler = StandardScaler().fit(xtr)
    xtr, xte = scaler.transform(xtr), scaler.transform(xte)
    return (torch.tensor(xtr, dtype=dtype), torch.tensor(ytr), torch.tensor(xte, dtype=dtype), torch.tensor(yte))


def train_ddp(hook, state, xtr, ytr, epochs, batch, lr, dtype, bucket_mb=25, steps=None):
    """Train a DDP MLP with ``hook`` (None: DDP's default); return the module."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(mlp(0, dtype), bucket_cap_mb=bucket_mb)
    if hook is not None:
        model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    n = xtr.shape[0] // P
    mine = slice(rank * n, (rank + 1) * n)
    xs, ys = xtr[mine], ytr[mine]
    done = 0
    for epoch in range(epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(epoch))
        for i in range(0, n - batch + 1, batch):
            idx = order[i:i + batch]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xs[idx]), ys[idx]).backward()
            opt.step()
            done += 1
            if steps is not None and done == steps:
                return model.module
    return model.module


def accuracy(model, x, y):
    with torch.no_grad():
        return 100.0 * float((model(x).argmax(1) == y).double().mean())


def case_ddp_equal():
    xtr, ytr, _, _ = digits(torch.float64)
    ref = train_ddp(None, None, xtr, ytr, 1, 16, 0.05, torch.float64, bucket_mb=0.005, steps=6)
    for alg in ("ring", "recursive_doubling", "mpi"):
        state = CommHookState(algorithm=alg)
        got = train_ddp(commlab_hook, state, xtr, ytr, 1, 16, 0.05, torch.float64, bucket_mb=0.005, steps=6)
        diff = max(float((a - b).abs().max()) for a, b in zip(ref.state_dict().values(), got.state_dict().values()))
        check(diff <= 1e-12, f"DDP commlab_hook {alg}: parameters differ from the default hook by {diff:.3g}")
        check(state.iteration >= 6, f"DDP commlab_hook {alg}: the hook ran {state.iteration} times in 6 steps")
        state.close()


def case_powersgd():
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD

    xtr, ytr, xte, yte = digits(torch.float32)
    theirs_state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2,
                                          min_compression_rate=1.0, random_seed=0)
    theirs = accuracy(train_ddp(powerSGD.powerSGD_hook, theirs_state, xtr, ytr, 8, 32, 0.05, torch.float32),
                      xte, yte)
    state = CommHookState(algorithm="ring", compression="powersgd", matrix_rank=2)
    ours = accuracy(train_ddp(commlab_hook, state, xtr, ytr, 8, 32, 0.05, torch.float32), xte, yte)
    if rank == 0:
        print(f"digits test accuracy: PyTorch powerSGD_hook {theirs:.2f}%, commlab powersgd {ours:.2f}%")
    check(abs(ours - theirs) <= 1.0, f"powersgd: commlab {ours:.2f}% vs PyTorch's hook {theirs:.2f}%")
    check(ours > 90.0, f"powersgd: commlab reached only {ours:.2f}%")
    sd = state.state_dict()
    check(any(k.endswith("/memory/grad") or "/memory/" in k for k in sd), f"powersgd state_dict keys: {sorted(sd)}")
    state.close()


def case_optimizer():
    xtr, ytr, _, _ = digits(torch.float64)
    ref, model = mlp(0), mlp(100 + rank)  # different starts: broadcast_parameters must fix that
    broadcast_parameters(model.state_dict(), root=0)
    root0 = [p.detach().numpy().copy() for p in model.parameters()]
    for a in root0:
        b = a.copy()
        comm.Bcast(b, root=0)
        check(np.array_equal(a, b), "broadcast_parameters: ranks differ from root")
    model.load_state_dict({k: v for k, v in zip(model.state_dict(), mlp(0).state_dict().values())})
    opt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2), algorithm="rabenseifner")
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    batch = 24  # global; each rank takes its contiguous 24 / P
    per = batch // P
    for step in range(5):
        x, y = xtr[step * batch:(step + 1) * batch], ytr[step * batch:(step + 1) * batch]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[rank * per:(rank + 1) * per]), y[rank * per:(rank + 1) * per]).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x[:per * P]), y[:per * P]).backward()
        ref_opt.step()
    diff = max(float((a - b).abs().max()) for a, b in zip(ref.state_dict().values(), model.state_dict().values()))
    check(diff <= 1e-12, f"DistributedOptimizer: parameters differ from the single-process run by {diff:.3g}")
    check(len(opt.param_groups) == 1 and "commlab" in opt.state_dict(), "DistributedOptimizer: delegation")
    opt.close()


def case_half_edge():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    # both ranks 36,500 (the sum 73,000 is beyond float16; the shares are not), 65,504 and 65,519
    # (still float16's 65,504 each), one rank at 65,520 or 1e5 (Inf there), small and subnormal values
    edge = np.array([36500, 65504, 65519, -65519, 65520, 1e5, 1.0, -3e-5, 6e-8, 0.0], np.float32)
    mine = edge.copy() if rank == 0 else np.array([36500, 65504, 65519, -65519, -7, 2, 1.0, 5e-5, 6e-8, 0.0],
                                                  np.float32)
    _half_edge("fp16", default_hooks.fp16_compress_hook, mine, np.float16)
    # bfloat16 has float32's range: both ranks 2e38 (the sum 4e38 is beyond bfloat16; the shares are
    # not), 3.3895e38 (bfloat16's largest finite), one rank at 3.4e38 (Inf there), 257 (a tie: to even),
    # a float32 subnormal
    mine = np.array([2e38, 3.3895e38, -3.3895e38, 3.4e38, 257.0, 1.0, -3e-5, 1e-40, 0.0], np.float32)
    if rank == 1:
        mine[3:5] = [-7.0, 255.0]
    _half_edge("bf16", default_hooks.bf16_compress_hook, mine, ml_dtypes.bfloat16)


def _half_edge(codec, hook, mine, half):
    """``codec``'s compressed all-reduce of ``mine`` equals PyTorch's ``hook`` bit for bit, Inf included."""
    from collectives.compression import make_compressor
    from collectives.compression.comm import compressed_allreduce

    own_inf = np.isinf(np.array(comm.allgather(mine)).astype(half)).any(axis=0)
    theirs = hook(None, (torch.from_numpy(mine.copy()),)).wait().numpy()
    check(np.array_equal(np.isinf(theirs), own_inf), f"{codec}: PyTorch's hook: Inf at {np.isinf(theirs)}, "
                                                     f"want {own_inf}")
    for alg in ("ring", "recursive_doubling", "rabenseifner", "mpi"):
        ours, _ = compressed_allreduce(mine, "g", make_compressor(codec), comm=comm, algorithm=alg)
        check(np.array_equal(ours, theirs, equal_nan=True),
              f"{codec} {alg}: {ours.tolist()} != PyTorch's hook {theirs.tolist()}")


def _powersgd_first_qs(rng, bucket, matrix_rank, min_rate, dtype):
    """PyTorch powerSGD_hook's first Q per compressed matrix of ``bucket`` (by position in the bucket).

    Its rule: one seed per bucket, ``torch.manual_seed(rng.randint(1_000_000_000))``, then one
    ``randn(1, m, r)`` per matrix in the order of its shape groups, each orthogonalized.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize, _should_compress

    groups = {}  # (n, m) -> [(position, m, r)], in first-seen order, as the hook groups them
    for i, t in enumerate(bucket.gradients()):
        n, m = t.shape[0], t.numel() // t.shape[0]
        r = min(n, m, matrix_rank)
        if _should_compress(n, m, r, min_rate)[0]:
            groups.setdefault((n, m), []).append((i, m, r))
    qs = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(rng.randint(1_000_000_000))
        for items in groups.values():
            for i, m, r in items:
                q = torch.randn(1, m, r, dtype=dtype)
                _orthogonalize(q, 0)
                qs[i] = q[0].numpy().copy()
    return qs


class _Seeded:
    """commlab's hook state plus the test's copy of PyTorch's seed rule for the first Q."""

    def __init__(self, state, start, matrix_rank, min_rate):
        self.state, self.start, self.r, self.min_rate = state, start, matrix_rank, min_rate
        self.rng = np.random.RandomState(0)  # PowerSGDState(random_seed=0).rng
        self.step, self.seeded, self.orders = 0, set(), {}  # orders: step -> the buckets' parameter ids


def _seeded_hook(seeded, bucket):
    """``commlab_hook`` that, at the first compressed step, hands each bucket PyTorch's first Qs."""
    key = bucket.index()
    seeded.orders.setdefault(seeded.step, []).append([id(p) for p in bucket.parameters()])
    if seeded.step == seeded.start and key not in seeded.seeded:
        seeded.seeded.add(key)
        qs = _powersgd_first_qs(seeded.rng, bucket, seeded.r, seeded.min_rate, bucket.buffer().dtype)
        hook = seeded.state.hooks[key][1]  # built at step 0, rebuilt at step 1 with DDP's buckets
        sd = hook.compressor.state_dict()
        sd.update({f"q/{hook.name}/{i}": q for i, q in qs.items()})
        hook.compressor.load_state_dict(sd)
    return commlab_hook(seeded.state, bucket)


def _train_steps(hook, state, steps, on_step=None):
    """Train a float64 DDP MLP for ``steps`` steps (DDP rebuilds its bucket after step 0: the parameters
    in the order their gradients became ready, the reverse of the first step's)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    xtr, ytr, _, _ = digits(torch.float64)
    model = DDP(mlp(0, torch.float64))
    model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batch = 16
    for step in range(steps):
        if on_step is not None:
            on_step(step)
        lo = (step * P + rank) * batch
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xtr[lo:lo + batch]), ytr[lo:lo + batch]).backward()
        opt.step()
    return [p.detach().numpy().copy() for p in model.module.parameters()]


def case_powersgd_equals_pytorch():
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD

    start, r, rate, steps = 2, 2, 2.0, 8
    theirs_state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=start,
                                          min_compression_rate=rate, use_error_feedback=True, warm_start=True,
                                          random_seed=0)
    theirs = _train_steps(powerSGD.powerSGD_hook, theirs_state, steps)
    ours_state = CommHookState(algorithm="ring", compression="powersgd", matrix_rank=r, start_iter=start,
                               min_compression_rate=rate)
    seeded = _Seeded(ours_state, start, r, rate)
    ours = _train_steps(_seeded_hook, seeded, steps, on_step=lambda s: setattr(seeded, "step", s))
    diff = max(float(np.abs(a - b).max()) for a, b in zip(theirs, ours))
    moved = max(float(np.abs(a - b).max()) for a, b in zip(theirs, [p.detach().numpy() for p in mlp(0).parameters()]))
    if rank == 0:
        print(f"PowerSGD vs PyTorch's powerSGD_hook after {steps} steps: max |diff| {diff:.3g} "
              f"(parameters moved {moved:.3g})", flush=True)
    check(diff <= 1e-10, f"powersgd under DDP: parameters differ from powerSGD_hook's by {diff:.3g}")
    rebuilt = seeded.orders[0] != seeded.orders[1] and seeded.orders[1] == seeded.orders[steps - 1]
    check(moved > 1e-2 and rebuilt, f"powersgd under DDP: moved {moved:.3g}, bucket orders {seeded.orders}")
    ours_state.close()


def case_rebuild_keeps_state():
    g = np.random.default_rng([rank, 7])
    shapes = {"a": (8, 6), "b": (6,), "c": (7, 5)}
    grads = [{k: g.standard_normal(s) for k, s in shapes.items()} for _ in range(6)]
    results = {}
    for name, rebuild_at in (("fixed", None), ("rebuilt", 3)):
        state = CommHookState(algorithm="ring", compression="powersgd", matrix_rank=2, start_iter=2)
        got = []
        for step, grad in enumerate(grads):
            order = ["a", "b", "c"] if rebuild_at is None or step < rebuild_at else ["c", "a", "b"]
            flat = np.concatenate([grad[k].ravel() for k in order])
            state.reduce(flat, 0, [shapes[k] for k in order], order)
            sizes = np.cumsum([0] + [int(np.prod(shapes[k])) for k in order])
            got.append({k: flat[sizes[i]:sizes[i + 1]].copy() for i, k in enumerate(order)})
        results[name] = got
        state.close()
    diff = max(float(np.abs(results["fixed"][s][k] - results["rebuilt"][s][k]).max())
               for s in range(len(grads)) for k in shapes)
    check(diff <= 1e-12, f"CommHookState: a bucket rebuilt after step 3 changed the result by {diff:.3g}")
    for bad in ({"start_iter": 1}, {"start_iter": 0, "warm_start": False}):
        try:
            CommHookState(compression="powersgd", **bad)
            check(False, f"CommHookState(powersgd, {bad}) accepted a start below 2")
        except ValueError as e:
            check("start_iter must be >= 2" in str(e), f"CommHookState(powersgd, {bad}): {e}")
    CommHookState(compression="powersgd", start_iter=0, warm_start=False, error_feedback=False).close()


def main():
    part = sys.argv[1]
    cases = {"dlpack": [case_dlpack], "torch": [case_ddp_equal, case_powersgd, case_optimizer],
             "peers": [case_half_edge, case_powersgd_equals_pytorch, case_rebuild_keeps_state]}[part]
    if part in ("torch", "peers"):
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=rank, world_size=P)
    for case in cases:
        t0 = time.perf_counter()
        try:
            case()
        except Exception:
            FAILS.append(f"{case.__name__}: {traceback.format_exc()}")
        if rank == 0:
            print(f"{case.__name__}: {time.perf_counter() - t0:.1f} s", flush=True)
    if part in ("torch", "peers"):
        import torch.distributed as dist

        dist.destroy_process_group()
    sys.exit(report(comm, part))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
