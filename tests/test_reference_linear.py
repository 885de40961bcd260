"""The float64 GEMM-with-epilogue oracle against explicit loops and central differences."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numeric import numeric_grad

from opfacade._backends.reference import (
    ACTIVATIONS,
    activation,
    activation_grad,
    linear_backward,
    linear_forward,
)

M, K, N, BT = 3, 4, 5, 2

# (x batched, w batched): 2-D GEMM, one weight shared by a batch of x, per-batch weights.
BATCHING = {"plain": (False, False), "shared_weight": (True, False), "batched": (True, True)}
# Residual shapes: none, the full output, and broadcast ones.
RESIDUALS = {"none": None, "full": "out", "row": (N,), "column": (M, 1)}


# The activations from their textbook formulas, one float at a time.
TEXTBOOK = {
    "none": lambda x: x,
    "relu": lambda x: x if x > 0 else 0.0,
    "gelu_tanh": lambda x: 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi)
                                                    * (x + 0.044715 * x**3))),
    "gelu_erf": lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2))),
    "silu": lambda x: x / (1 + math.exp(-x)),
}


def scalar_activation(x: float, name: str) -> float:
    return TEXTBOOK[name](x)


def test_every_activation_has_a_textbook_formula():
    assert set(TEXTBOOK) == set(ACTIVATIONS)


def make_operands(batching: str, layout: str, residual: str, seed: int):
    x_batched, w_batched = BATCHING[batching]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BT, M, K) if x_batched else (M, K))
    w_shape = (K, N) if layout == "kn" else (N, K)
    w = rng.standard_normal((BT, *w_shape) if w_batched else w_shape)
    out_shape = (BT, M, N) if x_batched else (M, N)
    shape = RESIDUALS[residual]
    res = None if shape is None else rng.standard_normal(out_shape if shape == "out" else shape)
    return x, w, rng.standard_normal(N), res, rng.standard_normal(out_shape)


def loop_gemm(x, w, layout, bias, name, residual, alpha, beta):
    """Output element by element from the definition."""
    batch = x.shape[0] if x.ndim == 3 else None
    xs = x if batch else x[None]
    ws = w if w.ndim == 3 else np.broadcast_to(w, (xs.shape[0], *w.shape))
    out_shape = (xs.shape[0], M, N)
    res = None if residual is None else np.broadcast_to(residual, x.shape[:-2] + (M, N))
    res = None if res is None else (res if batch else res[None])
    out = np.empty(out_shape)
    for t, m, n in np.ndindex(out_shape):
        acc = 0.0
        for kk in range(K):
            weight = ws[t, kk, n] if layout == "kn" else ws[t, n, kk]
            acc += xs[t, m, kk] * weight
        pre = alpha * acc + bias[n] + (0.0 if res is None else beta * res[t, m, n])
        out[t, m, n] = scalar_activation(pre, name)
    return out if batch else out[0]


@pytest.mark.parametrize("residual", list(RESIDUALS))
@pytest.mark.parametrize("batching", list(BATCHING))
@pytest.mark.parametrize("layout", ["kn", "nk"])
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_forward_matches_loops(name, layout, batching, residual):
    x, w, bias, res, _ = make_operands(batching, layout, residual, seed=len(name + batching))
    alpha, beta = 0.8, 1.3
    out, pre = linear_forward(x, w, weight_layout=layout, bias=bias, activation=name,
                            residual=res, alpha=alpha, beta=beta)
    want = loop_gemm(x, w, layout, bias, name, res, alpha, beta)
    want_pre = loop_gemm(x, w, layout, bias, "none", res, alpha, beta)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(pre, want_pre, rtol=1e-12, atol=1e-12)


def test_forward_without_epilogue_is_a_matmul():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((N, K))
    out, pre = linear_forward(x, w, weight_layout="nk")
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T, rtol=1e-14)
    np.testing.assert_array_equal(out, pre)


@pytest.mark.parametrize("residual", ["none", "column"])
@pytest.mark.parametrize("batching", list(BATCHING))
@pytest.mark.parametrize("layout", ["kn", "nk"])
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_backward_matches_finite_differences(name, layout, batching, residual):
    x, w, bias, res, weights = make_operands(batching, layout, residual, seed=len(name) + 17)
    alpha, beta = 0.7, 1.4
    _, pre = linear_forward(x, w, weight_layout=layout, bias=bias, activation=name, residual=res,
                          alpha=alpha, beta=beta)
    grads = linear_backward(weights, x, w, pre, weight_layout=layout, activation=name,
                          alpha=alpha, beta=beta,
                          residual_shape=None if res is None else res.shape)
    tensors = {"x": x, "w": w, "bias": bias}
    if res is not None:
        tensors["residual"] = res
    else:
        assert grads["dresidual"] is None

    for key, value in tensors.items():
        def loss(bumped, key=key):
            inputs = {**tensors, key: bumped}
            out, _ = linear_forward(inputs["x"], inputs["w"], weight_layout=layout,
                                  bias=inputs["bias"], activation=name,
                                  residual=inputs.get("residual"), alpha=alpha, beta=beta)
            return float(np.sum(out * weights))

        analytic = grads["dbias" if key == "bias" else "d" + key]
        assert analytic.shape == value.shape
        np.testing.assert_allclose(analytic, numeric_grad(loss, value), rtol=1e-6, atol=1e-7)


def test_backward_options():
    x, w, bias, res, weights = make_operands("shared_weight", "nk", "full", seed=5)
    _, pre = linear_forward(x, w, weight_layout="nk", bias=bias, residual=res, activation="silu",
                          beta=0.5)
    grads = linear_backward(weights, x, w, pre, weight_layout="nk", activation="silu",
                          need_bias_grad=False, beta=0.5, has_residual=True)
    assert grads["dbias"] is None
    np.testing.assert_allclose(grads["dresidual"], 0.5 * grads["d_pre"], rtol=1e-15)
    np.testing.assert_allclose(grads["d_pre"], weights * activation_grad(pre, "silu"))


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_and_its_gradient(name):
    x = np.random.default_rng(9).uniform(-4.0, 4.0, 64)
    want = np.array([scalar_activation(value, name) for value in x])
    np.testing.assert_allclose(activation(x, name), want, rtol=1e-13, atol=1e-15)
    step = 1e-6
    numeric = (activation(x + step, name) - activation(x - step, name)) / (2 * step)
    np.testing.assert_allclose(activation_grad(x, name), numeric, rtol=1e-6, atol=1e-8)


def test_silu_does_not_overflow():
    x = np.array([-1000.0, 1000.0])
    assert np.isfinite(activation(x, "silu")).all()
    assert np.isfinite(activation_grad(x, "silu")).all()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(activation="tanh"), "activation must be one of"),
        (dict(weight_layout="mk"), "weight_layout must be one of"),
        (dict(bias=np.ones(4)), r"bias must have shape \(5,\)"),
        (dict(residual=np.ones((2, N))), "residual must broadcast"),
    ],
)
def test_invalid_arguments_raise_value_error(kwargs, message):
    rng = np.random.default_rng(1)
    with pytest.raises(ValueError, match=message):
        linear_forward(rng.standard_normal((M, K)), rng.standard_normal((K, N)), **kwargs)


def test_mismatched_inner_dimension_is_named():
    rng = np.random.default_rng(1)
    with pytest.raises(ValueError, match="must have K=4"):
        linear_forward(rng.standard_normal((M, K)), rng.standard_normal((K, N)), weight_layout="nk")
