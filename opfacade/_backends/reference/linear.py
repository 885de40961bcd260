"""Row-major GEMM with bias, residual and activation epilogues in float64: the GEMM oracle.

``pre = alpha * (x @ W) + bias + beta * residual`` and ``out = activation(pre)``, where ``W`` is
``w`` in "kn" layout ([K, N]) or ``w``'s transpose in "nk" layout ([N, K], how ``nn.Linear``
holds its weight). A training forward keeps ``pre`` as its auxiliary output, which is what the
backward's activation gradient needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = [
    "ACTIVATIONS",
    "WEIGHT_LAYOUTS",
    "activation",
    "activation_grad",
    "linear_forward",
    "linear_backward",
    "linear_forward_magnitude",
    "linear_backward_magnitude",
    "linear_backward_underflow",
]

WEIGHT_LAYOUTS = ("kn", "nk")

_GELU_TANH_C = math.sqrt(2.0 / math.pi)
_GELU_TANH_A = 0.044715
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # never overflows, unlike 1 / (1 + exp(-x))


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(_GELU_TANH_C * (x + _GELU_TANH_A * x**3)))


def _gelu_tanh_grad(x: np.ndarray) -> np.ndarray:
    t = np.tanh(_GELU_TANH_C * (x + _GELU_TANH_A * x**3))
    d_inner = _GELU_TANH_C * (1.0 + 3.0 * _GELU_TANH_A * x**2)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t**2) * d_inner


def _gelu_erf_grad(x: np.ndarray) -> np.ndarray:
    return _normal_cdf(x) + x * np.exp(-0.5 * x**2) / math.sqrt(2.0 * math.pi)


def _silu_grad(x: np.ndarray) -> np.ndarray:
    s = _sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


# Each activation and its derivative at the pre-activation, in float64 (relu's derivative is 0
# at 0). The names are the linear contract's (its ACTIVATIONS table; a test checks they agree).
_MATH: dict[str, tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]] = {
    "none": (np.copy, np.ones_like),
    "relu": (lambda x: np.maximum(x, 0.0), lambda x: (x > 0.0).astype(np.float64)),
    "gelu_tanh": (_gelu_tanh, _gelu_tanh_grad),
    "gelu_erf": (lambda x: x * _normal_cdf(x), _gelu_erf_grad),
    "silu": (lambda x: x * _sigmoid(x), _silu_grad),
}
ACTIVATIONS = tuple(_MATH)
# sup |act'(x)|: the most an error in the pre-activation grows through the activation. Each of
# these also has |act(x)| <= |x|, so the rounding of act(pre) is within the same scale.
_STEEPEST_SLOPE = {"none": 1.0, "relu": 1.0, "gelu_tanh": 1.13, "gelu_erf": 1.13, "silu": 1.1}


def _math(name: str) -> tuple[Callable[[np.ndarray], np.ndarray], ...]:
    try:
        return _MATH[name]
    except (KeyError, TypeError):
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {name!r}") from None


def activation(x: np.ndarray, name: str) -> np.ndarray:
    """Applies the named activation elementwise, in float64."""
    return _activate(x, name)


def _activate(x: np.ndarray, name: str) -> np.ndarray:
    # Separate from ``activation`` because linear_forward's keyword of that name shadows it.
    return _math(name)[0](np.asarray(x, dtype=np.float64))


def activation_grad(x: np.ndarray, name: str) -> np.ndarray:
    """Derivative of the named activation at the pre-activation ``x`` (relu's is 0 at 0)."""
    return _math(name)[1](np.asarray(x, dtype=np.float64))


def _weight_kn(w: np.ndarray, weight_layout: str) -> np.ndarray:
    if weight_layout not in WEIGHT_LAYOUTS:
        raise ValueError(f"weight_layout must be one of {WEIGHT_LAYOUTS}, got {weight_layout!r}")
    if w.ndim not in (2, 3):
        raise ValueError(f"w must have 2 or 3 dimensions, got shape {w.shape}")
    return w if weight_layout == "kn" else np.swapaxes(w, -1, -2)


def _check_operands(x: np.ndarray, w_kn: np.ndarray, weight_layout: str) -> None:
    if x.ndim not in (2, 3):
        raise ValueError(f"x must have shape [M, K] or [Bt, M, K], got {x.shape}")
    if x.shape[-1] != w_kn.shape[-2]:
        raise ValueError(
            f"w in layout {weight_layout!r} must have K={x.shape[-1]} to match x, got {w_kn.shape}"
        )
    if x.ndim == 3 and w_kn.ndim == 3 and x.shape[0] != w_kn.shape[0]:
        raise ValueError(f"w must have batch {x.shape[0]} to match x, got {w_kn.shape[0]}")


def linear_forward(
    x: np.ndarray,
    w: np.ndarray,
    *,
    weight_layout: str = "kn",
    bias: np.ndarray | None = None,
    activation: str = "none",
    residual: np.ndarray | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """GEMM with its epilogue.

    Args:
        x: [M, K] or [Bt, M, K].
        w: [K, N] / [Bt, K, N] in "kn" layout, [N, K] / [Bt, N, K] in "nk"; a 2-D weight is
            shared by every batch of x.
        weight_layout: "kn" or "nk".
        bias: [N], added to every row.
        activation: one of ``ACTIVATIONS``.
        residual: broadcastable to the output [.., M, N], scaled by ``beta``.
        alpha: scale of the product.
        beta: scale of the residual (unused without one).

    Returns:
        ``(out, pre)``: the activated output and the pre-activation, both [.., M, N] float64.
    """
    _math(activation)  # a bad name fails before any arithmetic
    x = np.asarray(x, dtype=np.float64)
    w_kn = _weight_kn(np.asarray(w, dtype=np.float64), weight_layout)
    _check_operands(x, w_kn, weight_layout)
    pre = alpha * (x @ w_kn)
    if bias is not None:
        bias = np.asarray(bias, dtype=np.float64)
        if bias.shape != (pre.shape[-1],):
            raise ValueError(
                f"bias must have shape ({pre.shape[-1]},) to match N of the output, "
                f"got {bias.shape}"
            )
        pre = pre + bias
    if residual is not None:
        residual = np.asarray(residual, dtype=np.float64)
        if not _broadcasts_to(residual.shape, pre.shape):
            raise ValueError(
                f"residual must broadcast to the output's shape {pre.shape}, got {residual.shape}"
            )
        pre = pre + beta * residual
    return _activate(pre, activation), pre


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether an operand of ``shape`` broadcasts to ``target`` without growing it."""
    if len(shape) > len(target):
        return False
    tail = target[len(target) - len(shape) :]
    return all(size in (1, want) for size, want in zip(shape, tail, strict=True))


def _sum_to_shape(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sums ``x`` over the axes along which an operand of ``shape`` was broadcast (the gradient
    of a broadcast); attention's bias gradient uses it too."""
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    axes = tuple(i for i, size in enumerate(shape) if size == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def linear_backward(
    d_out: np.ndarray,
    x: np.ndarray,
    w: np.ndarray,
    pre: np.ndarray,
    *,
    weight_layout: str = "kn",
    activation: str = "none",
    need_bias_grad: bool = True,
    alpha: float = 1.0,
    beta: float = 1.0,
    has_residual: bool = False,
    residual_shape: tuple[int, ...] | None = None,
) -> dict[str, np.ndarray | None]:
    """Gradients of ``linear_forward`` from the saved pre-activation.

    Args:
        d_out: gradient of the output, shaped like ``pre``.
        x, w, pre: the forward's operands and its saved pre-activation.
        weight_layout, activation, alpha, beta: as in the forward.
        need_bias_grad: return ``dbias`` (else None).
        has_residual: return ``dresidual`` (else None).
        residual_shape: the residual's own shape when it was broadcast; ``dresidual`` is then
            summed down to it. Implies ``has_residual``.

    Returns:
        A dict with ``dx`` (shaped like x), ``dw`` (shaped like w, in its layout, summed over
        the batch when a 2-D w was shared), ``dbias`` [N] or None, ``dresidual`` or None, and
        ``d_pre``, the gradient of the pre-activation.
    """
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    w_kn = _weight_kn(w, weight_layout)
    _check_operands(x, w_kn, weight_layout)
    pre = np.asarray(pre, dtype=np.float64)
    d_out = np.asarray(d_out, dtype=np.float64)
    if d_out.shape != pre.shape:
        raise ValueError(f"d_out must have shape {pre.shape} to match pre, got {d_out.shape}")
    d_pre = d_out * activation_grad(pre, activation)
    dx = _sum_to_shape(alpha * (d_pre @ np.swapaxes(w_kn, -1, -2)), x.shape)
    dw_kn = _sum_to_shape(alpha * (np.swapaxes(x, -1, -2) @ d_pre), w_kn.shape)
    dw = dw_kn if weight_layout == "kn" else np.swapaxes(dw_kn, -1, -2)
    dresidual = None
    if has_residual or residual_shape is not None:
        dresidual = beta * d_pre
        if residual_shape is not None:
            dresidual = _sum_to_shape(dresidual, tuple(residual_shape))
    return {
        "dx": dx,
        "dw": np.ascontiguousarray(dw),
        "dbias": d_pre.reshape(-1, d_pre.shape[-1]).sum(axis=0) if need_bias_grad else None,
        "dresidual": dresidual,
        "d_pre": d_pre,
    }


def _absolute(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else np.abs(np.asarray(a, dtype=np.float64))


def linear_forward_magnitude(x: np.ndarray, w: np.ndarray, *, activation: str = "none",
                             bias: np.ndarray | None = None, residual: np.ndarray | None = None,
                             alpha: float = 1.0, beta: float = 1.0,
                             **options) -> tuple[np.ndarray, np.ndarray]:
    """Magnitude references of ``linear_forward``'s ``(out, pre)`` (same arguments): ``pre``
    over absolute values, ``|alpha| |x| @ |W| + |bias| + |beta| |residual|``, and for ``out``
    that times the activation's steepest slope. The scale a GEMM's rounding error is bounded
    by, whatever cancels (see PrecisionGuarantee)."""
    _math(activation)
    _, pre = linear_forward(_absolute(x), _absolute(w), bias=_absolute(bias),
                            residual=_absolute(residual), alpha=abs(alpha), beta=abs(beta),
                            **options)
    return _STEEPEST_SLOPE[activation] * pre, pre


def linear_backward_magnitude(d_out: np.ndarray, x: np.ndarray, w: np.ndarray, pre: np.ndarray,
                              *, activation: str = "none", alpha: float = 1.0,
                              **options) -> dict[str, np.ndarray | None]:
    """Magnitude references of ``linear_backward``'s results (same arguments and keys):
    ``d_pre`` becomes ``|d_out| |act'(pre)|`` and every product and sum after it runs over
    absolute values."""
    d_pre = _absolute(d_out) * np.abs(activation_grad(np.asarray(pre, dtype=np.float64),
                                                      activation))
    options["beta"] = abs(options.get("beta", 1.0))
    return linear_backward(d_pre, _absolute(x), _absolute(w), pre, activation="none",
                           alpha=abs(alpha), **options)


def linear_backward_underflow(
    d_out: np.ndarray,
    x: np.ndarray,
    w: np.ndarray,
    *,
    unit: float,
    weight_layout: str = "kn",
    need_bias_grad: bool = True,
) -> dict[str, np.ndarray | None]:
    """What rounding ``d_pre`` to the element (before the two GEMMs) can lose in its subnormal
    range, per result of ``linear_backward`` (same keys): each d_pre term is allowed ``unit``."""
    floor = np.full(np.shape(d_out), unit)
    return linear_backward(floor, _absolute(x), _absolute(w), floor,
                           weight_layout=weight_layout, activation="none",
                           need_bias_grad=need_bias_grad)
