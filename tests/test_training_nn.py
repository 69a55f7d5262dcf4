"""Layers, flat buffers and optimizers against finite differences and hand-computed formulas."""
import numpy as np
import pytest

from training.model.nn import Linear, ReLU, Sequential, SoftmaxCrossEntropy, Tanh, build_mlp
from training.model.optim import SGD, Adam

# Central differences in float64 with h = 1e-6 have truncation + rounding error ~1e-9 relative;
# every analytic gradient must match to rtol 1e-6, atol 1e-8.
RTOL, ATOL, H = 1e-6, 1e-8, 1e-6


def _numeric_grad(f, x):
    """Central finite-difference gradient of scalar f() with respect to array x (in place)."""
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + H
        fp = f()
        flat[i] = old - H
        fm = f()
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * H)
    return g


def _single(layer, seed=0):
    """Bind a layer's parameters into its own flat buffers and init them."""
    return Sequential([layer], dtype="float64", seed=seed)


@pytest.mark.parametrize("act", [ReLU, Tanh])
def test_activation_gradient_matches_finite_differences(act):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 7))
    x[np.abs(x) < 1e-3] = 0.5  # keep ReLU away from its kink
    w = rng.standard_normal((5, 7))  # loss = sum(w * layer(x))
    layer = act()
    layer.forward(x)
    dx = layer.backward(w).copy()
    num = _numeric_grad(lambda: float((w * layer.forward(x)).sum()), x)
    np.testing.assert_allclose(dx, num, rtol=RTOL, atol=ATOL)


def test_linear_gradients_match_finite_differences():
    rng = np.random.default_rng(2)
    model = _single(Linear(6, 4))
    lin = model.layers[0]
    lin.b[...] = rng.standard_normal(4)
    x = rng.standard_normal((3, 6))
    w = rng.standard_normal((3, 4))
    loss = lambda: float((w * lin.forward(x)).sum())  # noqa: E731
    lin.forward(x)
    dx = lin.backward(w).copy()
    np.testing.assert_allclose(lin.dW, _numeric_grad(loss, lin.W), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(lin.db, _numeric_grad(loss, lin.b), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(dx, _numeric_grad(loss, x), rtol=RTOL, atol=ATOL)


def test_softmax_cross_entropy_value_and_gradient():
    rng = np.random.default_rng(3)
    z = rng.standard_normal((4, 5)) * 3
    y = np.array([0, 4, 2, 2])
    ce = SoftmaxCrossEntropy()
    loss = ce.forward(z, y)
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    assert loss == pytest.approx(-np.log(p[np.arange(4), y]).mean(), rel=1e-12)
    dz = ce.backward().copy()
    num = _numeric_grad(lambda: ce.forward(z, y), z)
    np.testing.assert_allclose(dz, num, rtol=RTOL, atol=ATOL)
    # the log-sum-exp shift keeps huge logits finite
    assert np.isfinite(ce.forward(z + 1e4, y))


def test_whole_mlp_gradient_matches_finite_differences():
    rng = np.random.default_rng(4)
    model = build_mlp([5, 6, 4, 3], activation="tanh", dtype="float64", seed=7)
    x, y = rng.standard_normal((8, 5)), rng.integers(0, 3, 8)
    ce = SoftmaxCrossEntropy()
    ce.forward(model.forward(x), y)
    model.backward(ce.backward())
    analytic = model.grads.copy()
    num = _numeric_grad(lambda: ce.forward(model.forward(x), y), model.params)
    np.testing.assert_allclose(analytic, num, rtol=RTOL, atol=ATOL)


def test_parameters_are_views_of_the_flat_buffers():
    model = build_mlp([4, 3, 2], dtype="float32", seed=0)
    assert model.size == 4 * 3 + 3 + 3 * 2 + 2 == model.params.size == model.grads.size
    offsets = []
    for p, g in model.parameters():
        assert np.shares_memory(p, model.params) and np.shares_memory(g, model.grads)
        assert p.dtype == np.float32
        offsets.append(p.__array_interface__["data"][0] - model.params.__array_interface__["data"][0])
    assert offsets == [off * 4 for _, off, _ in model.slices]  # contiguous, in layer order
    model.params[:] = np.arange(model.size)
    np.testing.assert_array_equal(model.layers[0].W.ravel(), np.arange(12))
    model.layers[2].b[...] = -1
    np.testing.assert_array_equal(model.params[-2:], [-1, -1])


def test_init_is_seeded_and_scaled():
    a = build_mlp([200, 300, 10], seed=5, dtype="float64")
    b = build_mlp([200, 300, 10], seed=5, dtype="float64")
    np.testing.assert_array_equal(a.params, b.params)
    he, glorot = a.layers[0].W, a.layers[2].W
    assert he.std() == pytest.approx(np.sqrt(2 / 200), rel=0.05)
    assert np.abs(glorot).max() <= np.sqrt(6 / 310)
    assert not a.layers[0].b.any()


def test_sgd_momentum_weight_decay_matches_formula():
    p = np.array([1.0, -2.0, 3.0])
    g = np.zeros(3)
    opt = SGD(p, g, lr=0.1, momentum=0.9, weight_decay=0.01)
    w, v = p.copy(), np.zeros(3)
    for grad in ([0.5, 0.1, -1.0], [0.2, -0.3, 0.4], [1.0, 1.0, 1.0]):
        g[:] = grad
        opt.step()
        d = np.array(grad) + 0.01 * w
        v = 0.9 * v + d
        w = w - 0.1 * v
        np.testing.assert_allclose(p, w, rtol=1e-15, atol=1e-15)
    assert opt.steps == 3


def test_adam_matches_formula_and_state_roundtrip():
    rng = np.random.default_rng(0)
    n = 70000  # more than one optimizer chunk
    p, g = rng.standard_normal(n), np.zeros(n)
    opt = Adam(p, g, lr=0.01, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1)
    w, m, v = p.copy(), np.zeros(n), np.zeros(n)
    for t in range(1, 4):
        grad = rng.standard_normal(n)
        g[:] = grad
        opt.step()
        d = grad + 0.1 * w
        m = 0.8 * m + 0.2 * d
        v = 0.99 * v + 0.01 * d * d
        w = w - 0.01 * (m / (1 - 0.8 ** t)) / (np.sqrt(v / (1 - 0.99 ** t)) + 1e-6)
        np.testing.assert_allclose(p, w, rtol=1e-12, atol=1e-14)
    state = {k: np.array(val, copy=True) for k, val in opt.state_dict().items()}
    p2 = p.copy()
    other = Adam(p2, g, lr=0.01, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1)
    other.load_state_dict(state)
    opt.step()
    other.step()
    np.testing.assert_array_equal(p, p2)


def test_optimizer_argument_errors():
    p = np.zeros(3, np.float32)
    with pytest.raises(TypeError):
        SGD(p, np.zeros(3, np.float64))
    with pytest.raises(ValueError, match="lr"):
        Adam(p, np.zeros(3, np.float32), lr=0)
    with pytest.raises(ValueError, match="optimizer state"):
        SGD(p, np.zeros(3, np.float32)).load_state_dict({"steps": np.array(1)})


class _FreezableMLP(Sequential):
    """Linear -> Tanh -> Linear whose backward stops before layer 0 while ``frozen`` (the layer's
    backward is not called, as for a frozen or dropped layer)."""

    frozen = False

    def backward(self, dy):
        stop = 1 if self.frozen else 0
        for i in range(len(self.layers) - 1, stop - 1, -1):
            dy = self.layers[i].backward(dy, need_input_grad=i > stop)


def test_layer_skipped_in_a_step_contributes_zero_not_the_last_gradient():
    # step 1 trains every layer; in step 2 layer 0's backward is not called: its gradient must be
    # exactly 0 (so plain SGD leaves its weights bitwise unchanged), and layer 2's gradient must
    # equal finite differences of step 2's loss (rtol 1e-6, atol 1e-8)
    from mpi4py import MPI

    from training.dp.hooks import AllreduceHook
    from training.dp.data_parallel import train_step

    rng = np.random.default_rng(11)
    model = _FreezableMLP([Linear(5, 6, init="glorot"), Tanh(), Linear(6, 3, init="glorot")],
                          dtype="float64", seed=2)
    opt, ce = SGD(model.params, model.grads, lr=0.1, momentum=0.0), SoftmaxCrossEntropy()
    hook = AllreduceHook(MPI.COMM_SELF, "mpi")
    n0 = model.layers[0].W.size + model.layers[0].b.size
    x1, y1 = rng.standard_normal((8, 5)), rng.integers(0, 3, 8)
    train_step(model, ce, opt, hook, MPI.COMM_SELF, x1, y1)
    assert np.abs(model.grads[:n0]).max() > 1e-3  # step 1 did produce a layer-0 gradient
    model.frozen = True
    x2, y2 = rng.standard_normal((8, 5)), rng.integers(0, 3, 8)
    before = model.params.copy()
    top = model.layers[2]
    num_W = _numeric_grad(lambda: ce.forward(model.forward(x2), y2), top.W)
    num_b = _numeric_grad(lambda: ce.forward(model.forward(x2), y2), top.b)
    train_step(model, ce, opt, hook, MPI.COMM_SELF, x2, y2)
    np.testing.assert_array_equal(model.grads[:n0], 0.0)
    np.testing.assert_array_equal(model.params[:n0], before[:n0])
    np.testing.assert_allclose(top.dW, num_W, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(top.db, num_b, rtol=RTOL, atol=ATOL)


def test_a_layer_object_used_twice_is_refused():
    # tied weights: backward writes (does not add) gradients and Linear caches one input, so
    # the gradient of the shared W would be that of its last use only (off from finite
    # differences); the model is refused, naming both positions
    lin = Linear(4, 4)
    with pytest.raises(ValueError, match=r"layers\[2\] is the same Linear object as layers\[0\]"):
        Sequential([lin, Tanh(), lin])
    act = ReLU()
    with pytest.raises(ValueError, match=r"layers\[3\] is the same ReLU object as layers\[1\]"):
        Sequential([Linear(4, 4), act, Linear(4, 4), act, Linear(4, 2)])
    Sequential([Linear(4, 4), ReLU(), Linear(4, 4), ReLU(), Linear(4, 2)])  # distinct objects: fine


def test_plain_mlp_backward_overwrites_every_gradient_so_no_zeroing_is_needed():
    # compute_gradient skips the fill(0) only where backward writes all of grads: a plain MLP's
    # gradient computed on top of NaN garbage must equal the one computed on zeros, bitwise, and
    # match finite differences; a subclass overriding backward and a parameterized layer that is not
    # exactly Linear keep the zeroing
    from training.dp.data_parallel import compute_gradient

    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((6, 4)), rng.integers(0, 3, 6)
    model, ce = build_mlp([4, 5, 3], activation="tanh", dtype="float64", seed=3), SoftmaxCrossEntropy()
    assert model.writes_every_gradient()
    model.grads.fill(0.0)
    compute_gradient(model, ce, x, y)
    clean = model.grads.copy()
    model.grads.fill(np.nan)
    compute_gradient(model, ce, x, y)
    np.testing.assert_array_equal(model.grads, clean)
    first = model.layers[0]
    num_W = _numeric_grad(lambda: ce.forward(model.forward(x), y), first.W)
    np.testing.assert_allclose(first.dW, num_W, rtol=RTOL, atol=ATOL)

    class Scaled(Linear):
        pass

    assert not _FreezableMLP([Linear(4, 3)], dtype="float64").writes_every_gradient()
    assert not Sequential([Scaled(4, 3)], dtype="float64").writes_every_gradient()
    assert Sequential([Linear(4, 3), ReLU(), Linear(3, 2)], dtype="float64").writes_every_gradient()
