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
and ``broadcast_parameters`` copies root's values. Exits 0 when every case passes on every rank.
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
    """The digits split as in training.data (80/20, stratified, standardized), as tensors."""
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


def main():
    part = sys.argv[1]
    cases = [case_dlpack] if part == "dlpack" else [case_ddp_equal, case_powersgd, case_optimizer]
    if part == "torch":
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
    if part == "torch":
        import torch.distributed as dist

        dist.destroy_process_group()
    sys.exit(report(comm, part))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
