"""Linear's two GEMM forms of dL/dx (small batches: (W @ dy.T).T; larger: dy @ W.T) against NumPy.

The reference is the product computed in float64 from the same float32 operands; float32 GEMMs
with 1024-term sums differ from it by rounding only: rtol 1e-5 relative to the largest element.
"""
import numpy as np
import pytest

from training import nn
from training.nn import Linear, Sequential


@pytest.mark.parametrize("batch", [1, 7, nn._SMALL_BATCH, nn._SMALL_BATCH + 1, 200])
def test_input_gradient_matches_float64_product(batch):
    rng = np.random.default_rng(batch)
    model = Sequential([Linear(1024, 300)], dtype="float32", seed=1)
    lin = model.layers[0]
    x = rng.standard_normal((batch, 1024)).astype(np.float32)
    dy = rng.standard_normal((batch, 300)).astype(np.float32)
    lin.forward(x)
    dx = lin.backward(dy)
    assert dx.shape == (batch, 1024) and dx.dtype == np.float32 and dx.flags.c_contiguous
    ref = dy.astype(np.float64) @ lin.W.astype(np.float64).T
    np.testing.assert_allclose(dx, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    ref_dw = x.astype(np.float64).T @ dy.astype(np.float64)
    np.testing.assert_allclose(lin.dW, ref_dw, rtol=0, atol=1e-5 * np.abs(ref_dw).max())


def test_both_forms_agree_across_the_threshold():
    # the same rows through the small-batch form (alone) and the large-batch form (inside a batch
    # above the threshold) give the same dL/dx up to float32 rounding
    rng = np.random.default_rng(0)
    lin = Sequential([Linear(512, 256)], dtype="float32", seed=2).layers[0]
    x = rng.standard_normal((2 * nn._SMALL_BATCH, 512)).astype(np.float32)
    dy = rng.standard_normal((2 * nn._SMALL_BATCH, 256)).astype(np.float32)
    lin.forward(x)
    big = lin.backward(dy).copy()
    lin.forward(x[:5])
    small = lin.backward(dy[:5]).copy()
    np.testing.assert_allclose(small, big[:5], rtol=0, atol=1e-5 * np.abs(big).max())
