"""Rank-side body of the compressed-collective tests: ``python -m tests.mpi_compression [ALG [GALG]]``.

ALG is the all-reduce algorithm for summable payloads, GALG the all-gather algorithm. Every case runs
the training hook for several steps and compares each step with the oracle "decompress every rank's
payload and average", computed here from a twin compressor and memory whose payloads are gathered
with mpi4py's own ``comm.allgather``. Exceptions: signsgd's oracle is NumPy's majority vote
``np.sign(sum_r np.sign(x_r))`` of the gathered inputs (times the mean scale), PowerSGD's is PowerSGD run on one rank on the average
of the ranks' inputs. Tolerances (float64 data): rtol 1e-12 of the largest magnitude; 1e-9 for
PowerSGD (QR of P summed in another order); fp16 2**-11 and bf16 2**-8 (their unit roundoffs) of the
sum of magnitudes (each rank's share, divided by P, and each partial sum of the all-reduce are rounded
to the 16-bit dtype: to first order at most that in all). Also: results identical on every rank,
bytes counted from the payloads, an all-zero gradient gives no NaN/Inf and a zero output, signsgd's ties and exact zeros
(``[0, -2, 2, 0]`` on every rank votes ``[0, -1, 1, 0]``), the sparse aggregation case, state round
trip, and the 16-bit all-reduce (float16 and bfloat16 on the wire: sum, avg, min and max against
NumPy).
Exits 0 when every case passes on every rank, 1 otherwise (the failing cases are printed).
"""
import sys
import traceback

import numpy as np
from mpi4py import MPI

from collectives.compression import make_hook, payload_nbytes, sparse_allreduce
from tests.mpicases import check, report

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()
N = 300
SHAPES = [(12, 20), (20,), (5, 4), (4,)]  # 240 + 20 + 20 + 4 = 284 (PowerSGD with layer shapes)
CASES = [
    ("none", {}), ("fp16", {}), ("bf16", {}), ("int8", {}), ("qsgd", {"levels": 15, "bucket": 64}),
    ("terngrad", {}), ("signsgd", {}), ("signsgd", {"scaled": False}), ("efsignsgd", {}),
    ("onebit", {}), ("topk", {"ratio": 0.05}), ("randomk", {"ratio": 0.1}),
    ("randomk", {"k": 17, "rescale": True, "error_feedback": False}),
    ("threshold", {"threshold": 1.5}), ("dgc", {"ratio": 0.02, "warmup_steps": 2}),
    ("powersgd", {"matrix_rank": 2, "error_feedback": False}),
    ("powersgd", {"matrix_rank": 3, "error_feedback": False, "shapes": SHAPES}),
]


def gradient(step, n, salt=0):
    """This rank's gradient of ``step``: different on every rank, some elements exactly shared."""
    g = np.random.default_rng([rank, step, salt]).standard_normal(n)
    g[:5] = np.arange(5) - 2.0  # the same on every rank: repeated sparse indices across ranks
    return g


def identical_everywhere(a):
    """True when ``a`` has the same bytes on every rank."""
    return all(np.array_equal(a, b) for b in comm.allgather(a))


def oracle(name, twin, mem, x):
    """Return the oracle mean of the compressed tensors of all ranks; advance twin and memory."""
    p = mem.compensate(x, "grad") if mem is not None else x
    if name == "powersgd":
        mean_p = sum(comm.allgather(p)) / P
        payloads, ctx = twin.compress(mean_p, "grad")
        return twin.decompress(payloads, ctx), payloads, 1e-9
    payloads, ctx = twin.compress(p, "grad")
    if mem is not None:
        mem.update(p, "grad", twin.decompress(payloads, ctx))
    everyone = comm.allgather(payloads)
    if name == "signsgd":
        votes = sum(np.sign(q) for q in comm.allgather(p))  # NumPy: sign(0) = 0
        scale = np.mean([float(pl[1][0]) for pl in everyone]) if twin.scaled else 1.0
        return np.sign(votes).astype(x.dtype) * x.dtype.type(scale), payloads, 0.0
    parts = [twin.decompress(pl, ctx) for pl in everyone]
    if name in ("fp16", "bf16"):  # unit roundoff u: each share's division by P and each hop's partial sum
        u = 2.0 ** (-11 if name == "fp16" else -8)  # are rounded once, at most u sum_r |q_r| in all
        return sum(parts) / P, payloads, u * float(np.max(sum(np.abs(q) for q in parts)))
    return sum(parts) / P, payloads, 1e-12


def run_case(name, kwargs, alg, galg, steps=3):
    kw = dict(kwargs)
    n = sum(int(np.prod(s)) for s in kw["shapes"]) if "shapes" in kw else N
    hook = make_hook(name, comm=comm, algorithm=alg, gather_algorithm=galg, **kw)
    twin_hook = make_hook(name, comm=MPI.COMM_SELF, **kw)
    twin, mem = twin_hook.compressor, twin_hook.memory
    twin.comm_rank = rank
    label = f"{name}{kwargs} P={P} {alg}/{galg}"
    for step in range(steps):
        x = gradient(step, n)
        out, info = hook(x)
        want, payloads, tol = oracle(name, twin, mem, x)
        scale = max(1.0, float(np.max(np.abs(want))))
        err = float(np.max(np.abs(out - want)))
        check(out.shape == x.shape and out.dtype == x.dtype, f"{label} step {step}: shape/dtype")
        check(err <= tol * (scale if tol < 1e-3 else 1.0) + 1e-300,
              f"{label} step {step}: max error {err:.3g} > tol {tol:.3g}")
        check(identical_everywhere(out), f"{label} step {step}: result differs between ranks")
        low = payload_nbytes(payloads)
        check(low <= info["bytes_sent"] <= low + 3 + 8 * len(payloads),
              f"{label} step {step}: bytes_sent {info['bytes_sent']} vs payload bytes {low}")
        check(info["compress_s"] >= 0 and info["decompress_s"] >= 0, f"{label}: negative seconds")
    hook.close()
    twin_hook.close()


def zero_case(name, kwargs, alg):
    kw = dict(kwargs)
    n = sum(int(np.prod(s)) for s in kw["shapes"]) if "shapes" in kw else N
    hook = make_hook(name, comm=comm, algorithm=alg, **kw)
    for step in range(3):
        out, _ = hook(np.zeros(n))
        check(bool(np.all(np.isfinite(out))), f"zero {name}{kwargs} P={P} step {step}: NaN/Inf")
        check(not np.any(out), f"zero {name}{kwargs} P={P} step {step}: nonzero output")
    hook.close()


def sign_tie_case(alg, galg):
    """Unscaled signsgd: exact zeros cast no vote and a sum of signs of 0 gives 0.

    Every rank holds ``[0, -2, 2, 0]`` and then ``+1`` on even ranks, ``-1`` on odd ones (a tie
    when P is even); the oracle is NumPy's ``np.sign(sum_r np.sign(g_r))`` on the gathered inputs,
    for P = 2 ``[0, -1, 1, 0, 0]``.
    """
    g = np.array([0.0, -2.0, 2.0, 0.0, 1.0 if rank % 2 == 0 else -1.0])
    hook = make_hook("signsgd", comm=comm, algorithm=alg, gather_algorithm=galg, scaled=False)
    out, _ = hook(g)
    want = np.sign(sum(np.sign(q) for q in comm.allgather(g)))
    check(np.array_equal(out, want), f"signsgd ties P={P}: {out.tolist()} != {want.tolist()}")
    if P == 2:
        check(np.array_equal(out, [0, -1, 1, 0, 0]), f"signsgd ties P=2: {out.tolist()}")
    hook.close()


def resume_case(name, kwargs, alg):
    """Two steps, save the state, two more; new hooks loaded with rank 0's state must repeat them."""
    kw = dict(kwargs)
    n = sum(int(np.prod(s)) for s in kw["shapes"]) if "shapes" in kw else N
    first = make_hook(name, comm=comm, algorithm=alg, **kw)
    for step in range(2):
        first(gradient(step, n, salt=1))
    state = comm.bcast(first.state_dict(), root=0)  # as a checkpoint: written by rank 0, read by all
    a = [first(gradient(step, n, salt=1))[0] for step in (2, 3)]
    second = make_hook(name, comm=comm, algorithm=alg, **kw)
    second.load_state_dict(state)
    b = [second(gradient(step, n, salt=1))[0] for step in (2, 3)]
    check(all(np.array_equal(u, v) for u, v in zip(a, b)), f"resume {name}{kwargs} P={P}: differs")
    first.close()
    second.close()


def sparse_case():
    """Rank 0 sends rows [0, 1], rank 1 rows [0, 2] (rows of ones, width 3): mean rows 1, .5, .5."""
    indices = np.array([0, 1] if rank == 0 else [0, 2])
    out = sparse_allreduce(indices, np.ones((2, 3)), 3, comm=comm)
    want = np.array([[1.0] * 3, [0.5] * 3, [0.5] * 3])
    check(np.array_equal(out, want), f"sparse aggregation P=2: {out.tolist()}")


def native_case(alg):
    """The all-reduce that carries 16-bit payloads (``accumulate="native"``), float16 and bfloat16, every op:
    oracle NumPy on the gathered inputs, exact on small integers and halves (each partial sum fits 8
    significant bits), ``avg`` a true division (``[1, 0.5, -1, 3]`` and zeros on 2 ranks average to
    ``[0.5, 0.25, -0.5, 1.5]``)."""
    import ml_dtypes

    from collectives import allreduce

    for dtype in (np.float16, ml_dtypes.bfloat16):
        x = (np.array([1.0, 0.5, -1.0, 3.0, -2.5, 0.0, 4.0]) * (rank + 1 if rank < 2 else 0)).astype(dtype)
        every = np.array(comm.allgather(x.astype(np.float64)))
        for op, want in (("sum", every.sum(0)), ("avg", every.sum(0) / P), ("max", every.max(0)),
                         ("min", every.min(0))):
            out = allreduce(x, op=op, algorithm=alg, accumulate="native")
            rounded = want.astype(dtype).astype(np.float64)
            check(out.dtype == x.dtype and np.array_equal(out.astype(np.float64), rounded),
                  f"native {np.dtype(dtype).name} {op} {alg} P={P}: {out.tolist()} != {want.tolist()}")


def main():
    alg = sys.argv[1] if len(sys.argv) > 1 else "auto"
    galg = sys.argv[2] if len(sys.argv) > 2 else "ring"
    try:
        for name, kwargs in CASES:
            run_case(name, kwargs, alg, galg)
            zero_case(name, kwargs, alg)
        sign_tie_case(alg, galg)
        native_case(alg)
        for name, kwargs in CASES[::3] + [CASES[-1], CASES[-3]]:
            resume_case(name, kwargs, alg)
        if P == 2:
            sparse_case()
    except Exception:  # noqa: BLE001 - report any failure on this rank and stop the job
        traceback.print_exc()
        sys.stdout.flush()
        comm.Abort(1)
    return report(comm, f"mpi_compression ({len(CASES)} cases)")


if __name__ == "__main__":
    sys.exit(main())
