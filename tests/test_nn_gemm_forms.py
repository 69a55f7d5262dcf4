"""Linear's two GEMM forms (small batches: y = (W.T @ x.T).T + b, dL/dx = (W @ dy.T).T; larger:
x @ W + b, dy @ W.T) against NumPy.

The reference is the product computed in float64 from the same float32 operands; float32 GEMMs
with 1024-term sums differ from it by rounding only: rtol 1e-5 relative to the largest element.
"""
import numpy as np
import pytest

from training.model import nn
from training.model.nn import Linear, Sequential


BATCHES = sorted({1, 7, nn._TRANSPOSED_Y_ROWS, nn._TRANSPOSED_Y_ROWS + 1, nn._TRANSPOSED_DX_ROWS,
                  nn._TRANSPOSED_DX_ROWS + 1, 200})


@pytest.mark.parametrize("batch", BATCHES)
def test_linear_matches_float64_products(batch):
    rng = np.random.default_rng(batch)
    model = Sequential([Linear(1024, 300)], dtype="float32", seed=1)
    lin = model.layers[0]
    x = rng.standard_normal((batch, 1024)).astype(np.float32)
    dy = rng.standard_normal((batch, 300)).astype(np.float32)
    lin.b[...] = rng.standard_normal(300).astype(np.float32)
    y = lin.forward(x)
    assert y.shape == (batch, 300) and y.dtype == np.float32 and y.flags.c_contiguous
    ref_y = x.astype(np.float64) @ lin.W.astype(np.float64) + lin.b
    np.testing.assert_allclose(y, ref_y, rtol=0, atol=1e-5 * np.abs(ref_y).max())
    dx = lin.backward(dy)
    assert dx.shape == (batch, 1024) and dx.dtype == np.float32 and dx.flags.c_contiguous
    ref = dy.astype(np.float64) @ lin.W.astype(np.float64).T
    np.testing.assert_allclose(dx, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    ref_dw = x.astype(np.float64).T @ dy.astype(np.float64)
    np.testing.assert_allclose(lin.dW, ref_dw, rtol=0, atol=1e-5 * np.abs(ref_dw).max())


def test_both_forms_agree_across_the_threshold():
    # the same rows through the small-batch forms (alone) and the large-batch forms (inside a batch
    # above the thresholds) give the same y and dL/dx up to float32 rounding
    rng = np.random.default_rng(0)
    lin = Sequential([Linear(512, 256)], dtype="float32", seed=2).layers[0]
    x = rng.standard_normal((2 * nn._TRANSPOSED_DX_ROWS, 512)).astype(np.float32)
    dy = rng.standard_normal((2 * nn._TRANSPOSED_DX_ROWS, 256)).astype(np.float32)
    y_big = lin.forward(x).copy()
    big = lin.backward(dy).copy()
    y_small = lin.forward(x[:5]).copy()
    small = lin.backward(dy[:5]).copy()
    np.testing.assert_allclose(y_small, y_big[:5], rtol=0, atol=1e-5 * np.abs(y_big).max())
    np.testing.assert_allclose(small, big[:5], rtol=0, atol=1e-5 * np.abs(big).max())
