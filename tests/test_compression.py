"""Single-process tests of the compressors and memories (oracles: NumPy, exact arithmetic, the papers'
bounds); the multi-rank tests are in test_compression_mpi.py."""
import math

import numpy as np
import pytest
from mpi4py import MPI

from collectives.compression import (COMPRESSORS, DGC, QSGD, Compressor, ErrorFeedback, Memory,
                                     PowerSGD, TernGrad, TopK, compressed_allreduce, make_compressor, make_hook,
                                     matrix_layout, parse_compression_args, payload_nbytes)
from collectives.compression.quantize import Int8Compressor

ALL = sorted(COMPRESSORS)


def _round_trip(c, x, name="g"):
    payloads, ctx = c.compress(x, name)
    return c.decompress(payloads, ctx), payloads


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (3, 5)])
def test_none_round_trips_exactly(dtype, shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    y, payloads = _round_trip(make_compressor("none"), x)
    assert y.dtype == x.dtype and np.array_equal(y, x)
    assert payload_nbytes(payloads) == x.nbytes


def test_fp16_error_within_rounding_bound():
    # oracle: IEEE half has 11 significant bits -> relative error <= 2**-11 for normal numbers,
    # absolute error <= 2**-25 (half the subnormal spacing 2**-24) below 2**-14
    rng = np.random.default_rng(1)
    x = rng.standard_normal(4000) * 10.0 ** rng.uniform(-9, 4, 4000)
    y, payloads = _round_trip(make_compressor("fp16"), x)
    bound = np.maximum(2.0 ** -11 * np.abs(x), 2.0 ** -25)
    assert np.all(np.abs(y - x) <= bound)
    assert payload_nbytes(payloads) == 2 * x.size and y.dtype == x.dtype


def test_bf16_error_within_rounding_bound_and_range_is_float32s():
    # oracle: bfloat16 has 8 significant bits -> relative error <= 2**-8 for normal numbers (its
    # exponent is float32's: 1e-30 and 1e30 keep that bound)
    rng = np.random.default_rng(2)
    x = rng.standard_normal(4000) * 10.0 ** rng.uniform(-30, 30, 4000)
    y, payloads = _round_trip(make_compressor("bf16"), x)
    assert np.all(np.abs(y - x) <= 2.0 ** -8 * np.abs(x))
    assert payload_nbytes(payloads) == 2 * x.size and y.dtype == x.dtype
    assert make_compressor("bf16").decompress(*make_compressor("bf16").compress(np.float32([257, 3.4e38]), "w")
                                              ).tolist() == [256.0, np.inf]
    # float16 input: 65504 rounds to bfloat16's 65536, which float16 cannot hold: it saturates, not Inf
    half = np.float16([65504, -65440, 1.0, np.inf])
    assert make_compressor("bf16").decompress(*make_compressor("bf16").compress(half, "w")).tolist() == [
        65504.0, -65504.0, 1.0, np.inf]


def _draws(c, x, n):
    return np.stack([_round_trip(c, x)[0] for _ in range(n)])


@pytest.mark.parametrize("make", [lambda: QSGD(levels=2, bucket=4, seed=3),
                                  lambda: TernGrad(seed=4), lambda: Int8Compressor(seed=5)],
                         ids=["qsgd", "terngrad", "int8"])
def test_stochastic_quantizers_are_unbiased(make):
    # mean over 4000 draws within 3 standard errors of x, for each of 8 elements (fixed seeds; a
    # biased rounding fails by many standard errors), plus the float32 rounding of the sent scale
    # (2**-23 relative: the largest element is sent as the scale itself, with zero variance)
    x = np.random.default_rng(2).standard_normal(8)
    draws = _draws(make(), x, 4000)
    se = draws.std(axis=0, ddof=1) / math.sqrt(len(draws))
    assert np.all(np.abs(draws.mean(axis=0) - x) <= 3 * se + 2.0 ** -23 * np.abs(x).max())


@pytest.mark.parametrize("levels,n", [(1, 64), (2, 64), (4, 256), (16, 256)])
def test_qsgd_variance_within_lemma_3_1(levels, n):
    # E||Q(v) - v||^2 <= min(n / s^2, sqrt(n) / s) ||v||^2 (Alistarh et al. 2017, Lemma 3.1);
    # the empirical mean over 500 draws must stay below the bound
    v = np.random.default_rng(levels).standard_normal(n)
    err = ((_draws(QSGD(levels=levels, bucket=n, seed=1), v, 500) - v) ** 2).sum(axis=1)
    bound = min(n / levels ** 2, math.sqrt(n) / levels) * float(v @ v)
    assert err.mean() <= bound
    assert err.mean() > 0  # it really quantizes


def test_qsgd_levels_use_the_smallest_integer_type():
    x = np.ones(10, np.float32)
    assert QSGD(levels=127).compress(x, "g")[0][1].dtype == np.int8
    assert QSGD(levels=128).compress(x, "g")[0][1].dtype == np.int16
    assert QSGD(levels=40000).compress(x, "g")[0][1].dtype == np.int32


@pytest.mark.parametrize("name,per_element_bits,extra_bytes", [
    ("signsgd", 2, 4), ("efsignsgd", 1, 4), ("onebit", 1, 8), ("terngrad", 2, 4),
    ("int8", 8, 4), ("fp16", 16, 0), ("bf16", 16, 0)])
def test_wire_size_is_bits_per_element(name, per_element_bits, extra_bytes):
    n = 1001
    _, payloads = _round_trip(make_compressor(name), np.random.default_rng(0).standard_normal(n))
    assert payload_nbytes(payloads) == math.ceil(n * per_element_bits / 8) + extra_bytes


def test_topk_error_feedback_conserves_mass_exactly():
    # top-1 on g = [3, -1, 2] twice: sent [3, 0, 0] then [0, 0, 4]; residual [3, -2, 0]
    c, mem = TopK(k=1), ErrorFeedback()
    g = np.array([3.0, -1.0, 2.0])
    sent = np.zeros(3)
    for _ in range(2):
        p = mem.compensate(g, "g")
        y, _ = _round_trip(c, p)
        mem.update(p, "g", y)
        sent += y
    assert np.array_equal(sent, [3.0, 0.0, 4.0])
    assert np.array_equal(sent + mem.residuals["g"], [6.0, -2.0, 4.0])


@pytest.mark.parametrize("name", ALL)
def test_every_memory_conserves_mass(name):
    # sum of what was transmitted + residual == sum of the gradients (float64, rtol 1e-12);
    # DGC with momentum 0 (with momentum the identity holds for the corrected momenta)
    kwargs = {"dgc": {"momentum": 0.0, "ratio": 0.05}, "threshold": {"threshold": 1.0},
              "powersgd": {"matrix_rank": 2}}.get(name, {})
    hook = make_hook(name, comm=MPI.COMM_SELF, error_feedback=True, **kwargs)
    rng = np.random.default_rng(7)
    total, sent = np.zeros(60), np.zeros(60)
    for _ in range(5):
        g = rng.standard_normal(60)
        total += g
        out, _ = hook(g)  # one rank: the output is what this rank transmitted
        sent += out
    residual = hook.memory.state_dict()
    residual = residual.get("residual/grad", residual.get("velocity/grad"))
    assert np.allclose(sent + residual, total, rtol=0, atol=1e-12 * np.abs(total).max())
    hook.close()


def test_dgc_momentum_correction_and_masking():
    # g = [1, 0.1] each step, k = 1, m = 0.5: u = [1, .1], v = [1, .1] -> send 1; then
    # u = [1, .15] (u[0] was masked), v = [1, .25] -> send 1 again; v keeps [0, .25], u [0, .15]
    c = DGC(k=1, momentum=0.5)
    mem = c.make_memory()
    for _ in range(2):
        v = mem.compensate(np.array([1.0, 0.1]), "g")
        y, _ = _round_trip(c, v)
        mem.update(v, "g", y)
        assert np.array_equal(y, [1.0, 0.0])
    assert np.allclose(mem.velocities["g"], [0.0, 0.25], atol=1e-15)
    for name, owns in (("dgc", True), ("topk", False)):  # the trainer then drops its SGD momentum
        hook = make_hook(name, comm=MPI.COMM_SELF)
        assert hook.owns_momentum is owns
        hook.close()
    assert np.allclose(mem.momenta["g"], [0.0, 0.15], atol=1e-15)


def test_dgc_sparsity_warm_up():
    c = DGC(ratio=0.01, warmup_steps=4)
    x = np.random.default_rng(0).standard_normal(10000)
    kept = [c.compress(x, "g")[0][0].size for _ in range(6)]
    assert kept[0] == 2500 and kept[-2:] == [100, 100]
    assert all(a > b for a, b in zip(kept[:5], kept[1:5]))


def test_powersgd_recovers_a_low_rank_matrix_exactly():
    rng = np.random.default_rng(0)
    m = rng.standard_normal((30, 2)) @ rng.standard_normal((2, 20))  # rank 2
    bias = rng.standard_normal(20)
    x = np.concatenate([m.ravel(), bias])
    c = PowerSGD(matrix_rank=2, shapes=[(30, 20), (20,)])
    y, payloads = _round_trip(c, x)
    assert np.allclose(y, x, atol=1e-10)
    p_hat = payloads[0][:60].reshape(30, 2)
    assert np.allclose(p_hat.T @ p_hat, np.eye(2), atol=1e-12)  # orthogonalized
    assert np.array_equal(y[600:], bias)  # 1-D pieces go uncompressed
    assert payload_nbytes(payloads) == 8 * (2 * (30 + 20) + 20)


def test_powersgd_layout():
    assert matrix_layout(100, 4) == [(0, 100, 10, 10, 4)]  # near-square, rank 4
    assert matrix_layout(10, 4) == [(0, 10, 4, 3, 0)]  # too small to gain: sent raw
    assert matrix_layout(74, 8, [(8, 8), (2, 5)]) == [(0, 64, 8, 8, 0), (64, 74, 2, 5, 0)]
    assert matrix_layout(110, 8, [(100, 1, 1), (10,)])[0][4] == 0  # rank clamped to 1: no gain
    assert matrix_layout(2000, 8, [(40, 50)]) == [(0, 2000, 40, 50, 8)]
    with pytest.raises(ValueError, match="shapes"):
        matrix_layout(10, 2, [(3, 3)])


@pytest.mark.parametrize("name", ALL)
def test_all_zero_gradient_gives_no_nan_or_inf(name):
    for n in (0, 1, 50):
        hook = make_hook(name, comm=MPI.COMM_SELF)
        for _ in range(3):
            out, info = hook(np.zeros(n, np.float32))
            assert out.shape == (n,) and out.dtype == np.float32
            assert np.all(np.isfinite(out)) and np.all(out == 0)
        hook.close()


@pytest.mark.parametrize("name", ALL)
def test_state_dict_round_trip_continues_exactly(name, tmp_path):
    kwargs = {"dgc": {"warmup_steps": 3}, "powersgd": {"shapes": [(8, 10), (10,)]}}.get(name, {})
    grads = [np.random.default_rng(i).standard_normal(90).astype(np.float32) for i in range(6)]
    first = make_hook(name, comm=MPI.COMM_SELF, **kwargs)
    for g in grads[:3]:
        first(g)
    np.savez(tmp_path / "state.npz", **first.state_dict())
    a = [first(g)[0] for g in grads[3:]]
    second = make_hook(name, comm=MPI.COMM_SELF, **kwargs)
    with np.load(tmp_path / "state.npz", allow_pickle=False) as f:
        state = dict(f)
    state["world_size"] = state.pop("size")  # the key of states written before it was renamed
    second.load_state_dict(state)
    b = [second(g)[0] for g in grads[3:]]
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert second.iteration == first.iteration == 6
    first.close()
    second.close()


def test_registry_and_arguments():
    assert make_compressor("topk", ratio="0.05").ratio == 0.05  # strings from the command line
    assert make_compressor("powersgd", matrix_rank="4").r == 4
    with pytest.warns(DeprecationWarning, match="matrix_rank"):  # the old name still works
        assert make_compressor("powersgd", rank="3").r == 3
    assert make_compressor("signsgd", scaled="false").scaled is False
    assert parse_compression_args(["ratio=0.01", "rank=4", "rescale=true", "shapes=[(2, 3)]"]) == {
        "ratio": 0.01, "rank": 4, "rescale": True, "shapes": [(2, 3)]}
    with pytest.raises(ValueError, match="name"):
        make_compressor("gzip")
    with pytest.raises(ValueError, match="ratoi"):
        make_compressor("topk", ratoi=0.1)
    for name, kwargs, arg in [("topk", {"ratio": 0}, "ratio"), ("qsgd", {"levels": 0}, "levels"),
                              ("powersgd", {"matrix_rank": 0}, "rank"), ("dgc", {"momentum": 1.0}, "momentum"),
                              ("terngrad", {"clip": -1.0}, "clip"), ("int8", {"seed": -1}, "seed")]:
        with pytest.raises(ValueError, match=arg):
            make_compressor(name, **kwargs)
    with pytest.raises(ValueError, match="parse"):
        parse_compression_args(["parse"])


def test_boundary_errors():
    hook = make_hook("topk", comm=MPI.COMM_SELF)
    with pytest.raises(TypeError):
        hook(np.arange(5))
    with pytest.raises(ValueError, match="1-D"):
        hook(np.zeros((2, 3)))
    with pytest.raises(TypeError):
        make_compressor("qsgd").compress(np.zeros(3), 7)
    hook.close()
    with pytest.raises(ValueError, match="algorithm"):
        make_hook("topk", comm=MPI.COMM_SELF, algorithm="carrier-pigeon")
    with pytest.raises(ValueError, match="gather_algorithm"):
        make_hook("topk", comm=MPI.COMM_SELF, gather_algorithm="tree")
    with pytest.raises(NotImplementedError):
        Compressor().compress(np.zeros(3), "g")
    with pytest.raises(NotImplementedError):
        Compressor().decompress([], {})
    with pytest.raises(NotImplementedError):  # transport "own" without its rounds
        Compressor().reduce(np.zeros(3), "g", lambda b: b, 1)
    pigeon = type("Pigeon", (TopK,), {"transport": "carrier-pigeon"})()
    with pytest.raises(ValueError, match="transport"):  # refused before any message
        compressed_allreduce(np.zeros(4), "g", pigeon, comm=MPI.COMM_SELF)
    with pytest.raises(NotImplementedError):
        Memory().compensate(np.zeros(3), "g")


def _sign_vote(grads, **kwargs):
    """Return signsgd's aggregate of ``grads`` (one per simulated rank), from each rank's payloads."""
    c = make_compressor("signsgd", **kwargs)
    packed = [c.compress(g, "g") for g in grads]
    return c.aggregate([p for p, _ in packed], packed[0][1])


def test_signsgd_majority_vote_gives_zero_for_zeros_and_ties():
    # oracle: NumPy's majority vote np.sign(sum_r np.sign(g_r)), where np.sign(0) = 0; a zero
    # element casts no vote and signs summing to 0 give 0 (before: [0, -2, 2, 0] -> [1, -1, 1, 1])
    g = np.array([0.0, -2.0, 2.0, 0.0])
    vote = _sign_vote([g, g], scaled=False)
    assert np.array_equal(vote, [0.0, -1.0, 1.0, 0.0])
    rng = np.random.default_rng(3)
    for P in (2, 3, 4):
        grads = [rng.integers(-2, 3, 101).astype(np.float64) for _ in range(P)]  # many 0s and ties
        want = np.sign(sum(np.sign(q) for q in grads))
        assert np.array_equal(_sign_vote(grads, scaled=False), want)
        scale = sum(float(np.float32(np.abs(q).mean())) for q in grads) / P  # float32 per rank
        assert np.array_equal(_sign_vote(grads, scaled=True), want * scale)


def test_signsgd_all_zero_gradient_gives_zero_update():
    # one rank and two: every element's vote is 0, so the update (lr * vote) is exactly 0
    for scaled in (False, True):
        assert not np.any(_sign_vote([np.zeros(13)] * 2, scaled=scaled))
        hook = make_hook("signsgd", comm=MPI.COMM_SELF, scaled=scaled)
        out, _ = hook(np.zeros(13, np.float32))
        assert out.dtype == np.float32 and not np.any(out)
        hook.close()


def test_signsgd_round_trip_is_the_three_valued_sign():
    x = np.array([[0.0, -3.0, 0.5], [-0.0, 2.0, -1e-30]], np.float32)
    y, payloads = _round_trip(make_compressor("signsgd", scaled=False), x)
    assert y.dtype == x.dtype and np.array_equal(y, np.sign(x))
    assert payload_nbytes(payloads) == math.ceil(x.size / 4)  # 2 bits per element, no scale
