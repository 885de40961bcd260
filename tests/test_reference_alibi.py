"""The float64 ALiBi oracle against explicit loops and central differences."""

from __future__ import annotations

import numpy as np
import pytest
from numeric import numeric_grad

from opfacade._backends.reference import (
    alibi_backward,
    alibi_distance,
    alibi_forward,
    sdpa_forward,
)

SHAPES = [(2, 3, 4, 5), (1, 4, 5, 3), (2, 1, 1, 4), (3, 2, 3, 3)]


def test_distance_is_key_minus_query():
    distance = alibi_distance(3, 4)
    assert distance.dtype == np.float64
    for i in range(3):
        for j in range(4):
            assert distance[i, j] == j - i


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_matches_loops(shape):
    rng = np.random.default_rng(sum(shape))
    a = rng.standard_normal(shape)
    slopes = rng.uniform(-1.0, 1.0, shape[1])
    want = np.empty(shape)
    for b, h, i, j in np.ndindex(shape):
        want[b, h, i, j] = a[b, h, i, j] + slopes[h] * (j - i)
    np.testing.assert_allclose(alibi_forward(a, slopes), want, rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("shape", SHAPES)
def test_backward_matches_finite_differences(shape):
    rng = np.random.default_rng(10 + sum(shape))
    a = rng.standard_normal(shape)
    slopes = rng.uniform(-1.0, 1.0, shape[1])
    weights = rng.standard_normal(shape)
    d_input, d_slopes = alibi_backward(weights)

    numeric_a = numeric_grad(lambda x: float(np.sum(alibi_forward(x, slopes) * weights)), a)
    numeric_s = numeric_grad(lambda s: float(np.sum(alibi_forward(a, s) * weights)), slopes)
    np.testing.assert_allclose(d_input, numeric_a, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(d_slopes, numeric_s, rtol=1e-6, atol=1e-7)


def test_backward_returns_only_what_is_asked():
    weights = np.random.default_rng(2).standard_normal((1, 2, 3, 3))
    d_input, d_slopes = alibi_backward(weights, need_input_grad=False)
    assert d_input is None and d_slopes.shape == (2,)
    d_input, d_slopes = alibi_backward(weights, need_slope_grad=False)
    assert d_slopes is None and d_input.shape == weights.shape
    with pytest.raises(ValueError, match="need_input_grad or need_slope_grad"):
        alibi_backward(weights, need_input_grad=False, need_slope_grad=False)


def test_forward_rejects_mismatched_slopes():
    with pytest.raises(ValueError, match=r"slopes must have shape \(3,\)"):
        alibi_forward(np.ones((1, 3, 2, 2)), np.ones(2))


def test_sdpa_alibi_slopes_equal_an_alibi_bias():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 3, n, 3)) for n in (4, 5, 5))
    slopes = rng.uniform(-1.0, 1.0, 3)
    bias = alibi_forward(np.zeros((1, 3, 4, 5)), slopes)
    out_slopes, lse_slopes = sdpa_forward(q, k, v, alibi_slopes=slopes, causal="top_left")
    out_bias, lse_bias = sdpa_forward(q, k, v, bias=bias, causal="top_left")
    np.testing.assert_allclose(out_slopes, out_bias, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(lse_slopes, lse_bias, rtol=1e-13, atol=1e-13)
