"""Adam and SGD in float32 against their update formulas evaluated in float64.

The reference is Kingma & Ba's Algorithm 1 as written (and SGD in PyTorch's form), in float64 from
the same float32 gradients: no step may compute in float64 behind the caller's back, and the
chunked in-place update must equal the formula. Over 5 steps the float32 parameters stay within float32 rounding of it
(rtol 1e-5, atol 1e-7; one step moves a weight by up to lr = 1e-2), on a buffer longer than one
optimizer chunk, with weight decay.
"""
import numpy as np

from training.model import optim
from training.model.optim import SGD, Adam


def test_adam_float32_matches_algorithm_1():
    rng = np.random.default_rng(5)
    n = 2 * optim._CHUNK + 17
    p = rng.standard_normal(n).astype(np.float32)
    g = np.zeros(n, np.float32)
    opt = Adam(p, g, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-3)
    w, m, v = p.astype(np.float64), np.zeros(n), np.zeros(n)
    start = p.copy()
    for t in range(1, 6):
        g[:] = rng.standard_normal(n).astype(np.float32) * np.float32(10.0 ** (-t))  # shrinking gradients
        opt.step()
        assert p.dtype == np.float32 and opt.m.dtype == np.float32 and opt.v.dtype == np.float32
        d = g.astype(np.float64) + 1e-3 * w
        m = 0.9 * m + 0.1 * d
        v = 0.999 * v + 0.001 * d * d
        w = w - 1e-2 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
        np.testing.assert_allclose(p, w, rtol=1e-5, atol=1e-7)
    assert np.abs(p - start).max() > 1e-2  # the steps moved the weights


def test_sgd_momentum_float32_matches_formula():
    rng = np.random.default_rng(6)
    n = optim._CHUNK + 3
    p = rng.standard_normal(n).astype(np.float32)
    g = np.zeros(n, np.float32)
    opt = SGD(p, g, lr=0.05, momentum=0.9, weight_decay=1e-4)
    w, vel = p.astype(np.float64), np.zeros(n)
    for _ in range(5):
        g[:] = rng.standard_normal(n).astype(np.float32)
        opt.step()
        assert p.dtype == np.float32 and opt.velocity.dtype == np.float32
        vel = 0.9 * vel + g.astype(np.float64) + 1e-4 * w
        w = w - 0.05 * vel
        np.testing.assert_allclose(p, w, rtol=1e-5, atol=1e-6)


def test_adam_lr_zero_leaves_weights():
    # a parameter server may hand a zero learning rate (a step scaled away): no change, no error
    p = np.ones(10, np.float32)
    g = np.full(10, 0.5, np.float32)
    opt = Adam(p, g, lr=1e-3)
    opt.lr = 0.0
    opt.step()
    np.testing.assert_array_equal(p, 1.0)
