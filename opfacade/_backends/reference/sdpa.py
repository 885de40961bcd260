"""Scaled dot-product attention in float64 over [B, H, S, D]: the oracle for every SDPA SKU.

Conventions, shared by ``varlen`` and ``decode``:

- Scores are ``scale * q . k + bias + alibi_slopes[h] * (j - i)``; ``scale`` defaults to
  ``1 / sqrt(D)``. Query head ``h`` reads kv head ``h // (Hq // Hkv)`` (GQA/MQA).
- Masks are written against a diagonal offset ``d``: 0 for top-left alignment and
  ``skv_b - sq_b`` for bottom-right, where ``sq_b``/``skv_b`` are the sequence's real lengths
  (``seq_len_q``/``seq_len_kv`` when given, else the padded ``Sq``/``Skv``). Key ``j`` is allowed
  for query ``i`` iff ``j <= i + d`` under ``causal`` and
  ``i + d - left <= j <= i + d + right`` under ``window=(left, right)``, a None side being
  unbounded. A window takes its alignment from ``causal``; without ``causal`` it takes it from
  ``alignment`` (top-left by default). The ALiBi distance stays ``j - i`` whatever the alignment.
- Padded query rows, padded key columns and scores of -inf (from a bias) are masked. A row with no
  allowed key yields ``out = 0`` and ``lse = -inf``, never NaN, and passes no gradient.
- ``lse`` is the log-sum-exp of the undropped scores. Dropout multiplies the probabilities by the
  given ``dropout_keep`` mask and by ``1 / (1 - dropout_p)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .alibi import alibi_distance
from .linear import _broadcasts_to, _sum_to_shape

__all__ = ["CAUSAL_MODES", "SCORE_SENSITIVITY", "sdpa_mask", "sdpa_forward", "sdpa_backward",
           "sdpa_forward_magnitude", "sdpa_backward_magnitude", "sdpa_forward_underflow",
           "sdpa_backward_underflow"]

CAUSAL_MODES = (None, "top_left", "bottom_right")
_ALIGNMENTS = ("top_left", "bottom_right")


def _resolve_alignment(causal: str | None, alignment: str | None) -> str:
    if causal not in CAUSAL_MODES:
        raise ValueError(f"causal must be one of {CAUSAL_MODES}, got {causal!r}")
    if alignment is not None and alignment not in _ALIGNMENTS:
        raise ValueError(f"alignment must be one of {_ALIGNMENTS} or None, got {alignment!r}")
    if causal is None:
        return alignment or "top_left"
    if alignment is not None and alignment != causal:
        raise ValueError(
            f"alignment must match causal when both are given, got alignment={alignment!r} "
            f"and causal={causal!r}"
        )
    return causal


def _check_window(window: tuple[int | None, int | None] | None) -> None:
    if window is None:
        return
    if len(window) != 2:
        raise ValueError(f"window must be a pair (left, right), got {window!r}")
    for side, value in zip(("left", "right"), window, strict=True):
        if value is not None and (int(value) != value or value < 0):
            raise ValueError(f"window {side} must be a non-negative int or None, got {value!r}")


def _lengths(seq_len: np.ndarray | None, batch: int, padded: int, name: str) -> np.ndarray:
    if seq_len is None:
        return np.full(batch, padded, dtype=np.int64)
    lengths = np.asarray(seq_len)
    if lengths.shape != (batch,):
        raise ValueError(f"{name} must have shape ({batch},) to match B, got {lengths.shape}")
    if not np.issubdtype(lengths.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {lengths.dtype}")
    if lengths.min(initial=0) < 0 or lengths.max(initial=0) > padded:
        raise ValueError(f"{name} must lie in [0, {padded}], got {lengths.tolist()}")
    return lengths.astype(np.int64)


def sdpa_mask(
    batch: int,
    seq_q: int,
    seq_kv: int,
    *,
    causal: str | None = None,
    window: tuple[int | None, int | None] | None = None,
    alignment: str | None = None,
    seq_len_q: np.ndarray | None = None,
    seq_len_kv: np.ndarray | None = None,
) -> np.ndarray:
    """Which keys each query may attend to, before any -inf bias is taken into account.

    Args:
        batch, seq_q, seq_kv: B and the padded lengths Sq and Skv.
        causal: None, "top_left" or "bottom_right".
        window: None or (left, right), either side None for unbounded.
        alignment: the window's alignment when ``causal`` is None (default "top_left").
        seq_len_q, seq_len_kv: [B] real lengths; rows/columns past them are masked.

    Returns:
        A bool array [B, Sq, Skv], True where the key is allowed.
    """
    aligned = _resolve_alignment(causal, alignment)
    _check_window(window)
    len_q = _lengths(seq_len_q, batch, seq_q, "seq_len_q")
    len_kv = _lengths(seq_len_kv, batch, seq_kv, "seq_len_kv")
    offset = len_kv - len_q if aligned == "bottom_right" else np.zeros(batch, dtype=np.int64)
    rows = np.arange(seq_q)[None, :, None]
    cols = np.arange(seq_kv)[None, None, :]
    diagonal = rows + offset[:, None, None]
    allowed = (rows < len_q[:, None, None]) & (cols < len_kv[:, None, None])
    if causal is not None:
        allowed &= cols <= diagonal
    if window is not None:
        left, right = window
        if left is not None:
            allowed &= cols >= diagonal - left
        if right is not None:
            allowed &= cols <= diagonal + right
    return allowed


@dataclass(frozen=True)
class _Problem:
    """Inputs upcast to float64 and options resolved, shared by forward and backward."""

    q: np.ndarray
    k: np.ndarray  # kv heads repeated to Hq
    v: np.ndarray  # kv heads repeated to Hq
    group: int
    scale: float
    bias: np.ndarray | None  # as given, upcast
    alibi_slopes: np.ndarray | None
    allowed: np.ndarray  # [B, 1, Sq, Skv]
    keep_scale: np.ndarray | None  # keep / (1 - p), [B, Hq, Sq, Skv]


def _check_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> int:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise ValueError(f"{name} must have 4 dimensions [B, H, S, D], got shape {x.shape}")
    batch, heads_q, _, dim = q.shape
    if k.shape[0] != batch or k.shape[3] != dim:
        raise ValueError(f"k must have shape ({batch}, Hkv, Skv, {dim}), got {k.shape}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v must have shape {k.shape[:3]} + (Dv,) to match k, got {v.shape}")
    heads_kv = k.shape[1]
    if heads_kv == 0 or heads_q % heads_kv:
        raise ValueError(f"Hq={heads_q} of q must be a multiple of Hkv={heads_kv} of k")
    return heads_q // heads_kv


def _prepare(q, k, v, *, scale, causal, window, alignment, bias, alibi_slopes, dropout_p,
             dropout_keep, seq_len_q, seq_len_kv) -> _Problem:
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    group = _check_qkv(q, k, v)
    batch, heads, seq_q, dim = q.shape
    seq_kv = k.shape[2]
    score_shape = (batch, heads, seq_q, seq_kv)
    if bias is not None:
        bias = np.asarray(bias, dtype=np.float64)
        if not _broadcasts_to(bias.shape, score_shape):
            raise ValueError(
                f"bias must broadcast to the scores' shape {score_shape}, got {bias.shape}"
            )
    if alibi_slopes is not None:
        alibi_slopes = np.asarray(alibi_slopes, dtype=np.float64)
        if alibi_slopes.shape != (heads,):
            raise ValueError(
                f"alibi_slopes must have shape ({heads},) to match Hq, got {alibi_slopes.shape}"
            )
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must lie in [0, 1), got {dropout_p}")
    keep_scale = None
    if dropout_keep is not None:
        keep = np.asarray(dropout_keep)
        if keep.shape != score_shape or keep.dtype != np.bool_:
            raise ValueError(
                f"dropout_keep must be a bool array of shape {score_shape}, "
                f"got {keep.dtype} {keep.shape}"
            )
        keep_scale = keep / (1.0 - dropout_p)
    elif dropout_p > 0.0:
        raise ValueError("dropout_keep is required when dropout_p > 0 (the oracle draws no mask)")
    allowed = sdpa_mask(batch, seq_q, seq_kv, causal=causal, window=window, alignment=alignment,
                        seq_len_q=seq_len_q, seq_len_kv=seq_len_kv)
    return _Problem(
        q=q,
        k=np.repeat(k, group, axis=1),
        v=np.repeat(v, group, axis=1),
        group=group,
        scale=1.0 / np.sqrt(dim) if scale is None else float(scale),
        bias=bias,
        alibi_slopes=alibi_slopes,
        allowed=allowed[:, None],
        keep_scale=keep_scale,
    )


def _probabilities(pb: _Problem) -> tuple[np.ndarray, np.ndarray]:
    """Softmax over allowed keys and its log-sum-exp, stable and NaN-free on empty rows."""
    scores = pb.scale * np.einsum("bhid,bhjd->bhij", pb.q, pb.k)
    if pb.bias is not None:
        scores = scores + pb.bias
    if pb.alibi_slopes is not None:
        distance = alibi_distance(scores.shape[2], scores.shape[3])
        scores = scores + pb.alibi_slopes[None, :, None, None] * distance
    allowed = pb.allowed & (scores > -np.inf)
    masked = np.where(allowed, scores, -np.inf)
    row_max = np.max(masked, axis=-1, keepdims=True, initial=-np.inf)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.where(allowed, np.exp(masked - row_max), 0.0)
    total = weights.sum(axis=-1, keepdims=True)
    probs = weights / np.where(total > 0.0, total, 1.0)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0.0, row_max + np.log(total), -np.inf)
    return probs, lse[..., 0]


def sdpa_forward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    scale: float | None = None,
    causal: str | None = None,
    window: tuple[int | None, int | None] | None = None,
    alignment: str | None = None,
    bias: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    dropout_p: float = 0.0,
    dropout_keep: np.ndarray | None = None,
    seq_len_q: np.ndarray | None = None,
    seq_len_kv: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Attention output and log-sum-exp (the module docstring states the conventions).

    Args:
        q: [B, Hq, Sq, D] queries.
        k: [B, Hkv, Skv, D] keys; Hq must be a multiple of Hkv.
        v: [B, Hkv, Skv, Dv] values.
        scale: score scale, default ``1 / sqrt(D)``.
        causal: None, "top_left" or "bottom_right".
        window: None or (left, right) sliding window, a None side unbounded.
        alignment: the window's alignment when ``causal`` is None (default "top_left").
        bias: additive bias broadcastable to [B, Hq, Sq, Skv].
        alibi_slopes: [Hq] slopes of an ALiBi bias ``slope * (j - i)``.
        dropout_p: dropout probability in [0, 1).
        dropout_keep: bool [B, Hq, Sq, Skv], True where a probability is kept.
        seq_len_q, seq_len_kv: [B] real lengths of padded sequences.

    Returns:
        ``(out, lse)``: out [B, Hq, Sq, Dv] and lse [B, Hq, Sq], both float64.
    """
    pb = _prepare(q, k, v, scale=scale, causal=causal, window=window, alignment=alignment,
                  bias=bias, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
                  dropout_keep=dropout_keep, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv)
    probs, lse = _probabilities(pb)
    if pb.keep_scale is not None:
        probs = probs * pb.keep_scale
    return probs @ pb.v, lse


def _sum_groups(x: np.ndarray, group: int) -> np.ndarray:
    """Folds per-query-head gradients [B, Hq, ...] onto the kv heads they share."""
    batch, heads = x.shape[:2]
    return x.reshape(batch, heads // group, group, *x.shape[2:]).sum(axis=2)


def sdpa_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    d_out: np.ndarray,
    *,
    scale: float | None = None,
    causal: str | None = None,
    window: tuple[int | None, int | None] | None = None,
    alignment: str | None = None,
    bias: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    dropout_p: float = 0.0,
    dropout_keep: np.ndarray | None = None,
    seq_len_q: np.ndarray | None = None,
    seq_len_kv: np.ndarray | None = None,
    need_bias_grad: bool = False,
) -> dict[str, np.ndarray]:
    """Analytic gradients of ``sdpa_forward`` (same options), recomputing the probabilities.

    Args:
        q, k, v: the forward's inputs.
        d_out: [B, Hq, Sq, Dv] gradient of the output.
        need_bias_grad: also return ``dbias`` (only when a bias was given).
        Other keywords: as ``sdpa_forward``.

    Returns:
        A dict with ``dq``, ``dk``, ``dv`` shaped like q, k, v (GQA gradients summed over the
        query heads sharing a kv head), and ``dbias`` shaped like the given bias when asked for.
    """
    pb = _prepare(q, k, v, scale=scale, causal=causal, window=window, alignment=alignment,
                  bias=bias, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
                  dropout_keep=dropout_keep, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv)
    d_out = np.asarray(d_out, dtype=np.float64)
    out_shape = pb.q.shape[:3] + pb.v.shape[3:]
    if d_out.shape != out_shape:
        raise ValueError(
            f"d_out must have shape {out_shape} to match the output, got {d_out.shape}"
        )
    probs, _ = _probabilities(pb)
    dropped = probs if pb.keep_scale is None else probs * pb.keep_scale
    dv = np.einsum("bhij,bhid->bhjd", dropped, d_out)
    d_probs = np.einsum("bhid,bhjd->bhij", d_out, pb.v)
    if pb.keep_scale is not None:
        d_probs = d_probs * pb.keep_scale
    d_scores = probs * (d_probs - np.sum(d_probs * probs, axis=-1, keepdims=True))
    dq = pb.scale * np.einsum("bhij,bhjd->bhid", d_scores, pb.k)
    dk = pb.scale * np.einsum("bhij,bhid->bhjd", d_scores, pb.q)
    grads = {"dq": dq, "dk": _sum_groups(dk, pb.group), "dv": _sum_groups(dv, pb.group)}
    if need_bias_grad and pb.bias is not None:
        grads["dbias"] = _sum_to_shape(d_scores, pb.bias.shape)
    return grads


# -- magnitude references -------------------------------------------------------------------------
#
# The scale an attention kernel's rounding error is bounded by (PrecisionGuarantee), whatever
# cancels. Two effects set it:
# - every product and sum after the softmax rounds relative to its terms' sizes: ``P @ |V|`` for
#   the output, and over absolute values through the backward's chain;
# - softmax turns an absolute error d in a score into a relative error of about d in its
#   probability, and a score's rounding error grows with the sizes that formed it, A_ij =
#   |scale| |q_i| . |k_j| + |bias_ij| + |slope (j - i)|. So each row's reference is widened by
#   (1 + A_i / SCORE_SENSITIVITY), A_i being the row's largest allowed A_ij: rows of small
#   scores are held to the output rounding alone, and a row of scores in the thousands (where
#   an f32 score is off by ~1e-4) is allowed in proportion. A backward that reads an f32
#   log-sum-exp has the same sensitivity: its error is ~u32 |lse| <= u32 (A_i + log Skv).
SCORE_SENSITIVITY = 64.0


def _score_sizes(pb: _Problem) -> np.ndarray:
    """[B, Hq, Sq, 1]: each row's largest allowed score magnitude A_i (0 for an empty row)."""
    sizes = abs(pb.scale) * np.einsum("bhid,bhjd->bhij", np.abs(pb.q), np.abs(pb.k))
    if pb.bias is not None:
        sizes = sizes + np.where(np.isfinite(pb.bias), np.abs(pb.bias), 0.0)
    if pb.alibi_slopes is not None:
        distance = np.abs(alibi_distance(sizes.shape[2], sizes.shape[3]))
        sizes = sizes + np.abs(pb.alibi_slopes)[None, :, None, None] * distance
    return np.max(np.where(pb.allowed, sizes, 0.0), axis=-1, keepdims=True, initial=0.0)


def sdpa_forward_magnitude(q: np.ndarray, k: np.ndarray, v: np.ndarray, **options
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Magnitude references of ``sdpa_forward``'s ``(out, lse)`` (same arguments): out's is
    ``(1 + A_i / SCORE_SENSITIVITY) P @ |V|``, lse's ``|lse| + A_i`` (0 on rows with no key)."""
    pb = _prepare(q, k, v, **_with_defaults(options))
    probs, lse = _probabilities(pb)
    widen = 1.0 + _score_sizes(pb) / SCORE_SENSITIVITY
    if pb.keep_scale is not None:
        probs = probs * pb.keep_scale
    lse_size = np.where(np.isfinite(lse), np.abs(lse) + _score_sizes(pb)[..., 0], 0.0)
    return widen * (probs @ np.abs(pb.v)), lse_size


def sdpa_backward_magnitude(q: np.ndarray, k: np.ndarray, v: np.ndarray, d_out: np.ndarray,
                            *, need_bias_grad: bool = False, **options) -> dict[str, np.ndarray]:
    """Magnitude references of ``sdpa_backward``'s results (same arguments and keys): the
    backward's chain over absolute values, ``|dS| -> P (|dO| |V|^T + sum_j P |dO| |V|^T)``,
    each row widened by ``(1 + A_i / SCORE_SENSITIVITY)``."""
    pb = _prepare(q, k, v, **_with_defaults(options))
    d_out = np.abs(np.asarray(d_out, dtype=np.float64))
    probs, _ = _probabilities(pb)
    widen = 1.0 + _score_sizes(pb) / SCORE_SENSITIVITY
    dropped = probs if pb.keep_scale is None else probs * pb.keep_scale
    dv = np.einsum("bhij,bhid->bhjd", widen * dropped, d_out)
    d_probs = np.einsum("bhid,bhjd->bhij", d_out, np.abs(pb.v))
    if pb.keep_scale is not None:
        d_probs = d_probs * pb.keep_scale
    d_scores = widen * probs * (d_probs + np.sum(d_probs * probs, axis=-1, keepdims=True))
    dq = abs(pb.scale) * np.einsum("bhij,bhjd->bhid", d_scores, np.abs(pb.k))
    dk = abs(pb.scale) * np.einsum("bhij,bhid->bhjd", d_scores, np.abs(pb.q))
    grads = {"dq": dq, "dk": _sum_groups(dk, pb.group), "dv": _sum_groups(dv, pb.group)}
    if need_bias_grad and pb.bias is not None:
        grads["dbias"] = _sum_to_shape(d_scores, pb.bias.shape)
    return grads


# Underflow allowances: GPU kernels round the probabilities (forward) and dS (backward) to the
# element type before their second products. A value in the element's subnormal range loses up
# to ``unit`` (its subnormal spacing) however small it is, which no relative bound can cover:
# each such term is allowed ``unit`` in place of its size.

def _allowed_weights(pb: _Problem) -> np.ndarray:
    """[B, Hq, Sq, Skv]: 1 where a key is allowed (times the dropout scale where it applies)."""
    shape = pb.q.shape[:3] + pb.k.shape[2:3]
    allowed = np.broadcast_to(pb.allowed, shape).astype(np.float64)
    return allowed if pb.keep_scale is None else allowed * pb.keep_scale


def sdpa_forward_underflow(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, unit: float,
                           **options) -> tuple[np.ndarray, np.ndarray]:
    """``(unit * allowed @ |V|, 0)``: what rounding the probabilities into the element's
    subnormals can lose in ``(out, lse)``."""
    pb = _prepare(q, k, v, **_with_defaults(options))
    out = unit * (_allowed_weights(pb) @ np.abs(pb.v))
    return out, np.zeros(pb.q.shape[:3])


def sdpa_backward_underflow(q: np.ndarray, k: np.ndarray, v: np.ndarray, d_out: np.ndarray, *,
                            unit: float, need_bias_grad: bool = False, **options
                            ) -> dict[str, np.ndarray]:
    """What rounding P (before dV = P^T dO) and ``scale * dS`` (before dQ = (scale dS) K,
    dK = (scale dS)^T Q and the bias gradient's sum) into the element's subnormals can lose,
    per gradient (same keys as ``sdpa_backward``).

    The kernels hold dS with the softmax scale folded in: cuDNN's f16 bias gradient on an H100
    was off by 4.6 subnormal spacings (rms) where two batch terms of ``scale * dS`` rounded to
    f16 and divided by scale = 1/sqrt(128) predict 4.6, and one of dS alone 0.4.
    """
    pb = _prepare(q, k, v, **_with_defaults(options))
    weights = _allowed_weights(pb)
    allowed = np.broadcast_to(pb.allowed, weights.shape).astype(np.float64)
    d_out = np.abs(np.asarray(d_out, dtype=np.float64))
    dv = unit * np.einsum("bhij,bhid->bhjd", weights, d_out)
    dq = unit * np.einsum("bhij,bhjd->bhid", allowed, np.abs(pb.k))
    dk = unit * np.einsum("bhij,bhid->bhjd", allowed, np.abs(pb.q))
    grads = {"dq": dq, "dk": _sum_groups(dk, pb.group), "dv": _sum_groups(dv, pb.group)}
    if need_bias_grad and pb.bias is not None:
        # dS summed over what the bias broadcasts along, each term rounded as scale * dS.
        grads["dbias"] = unit / abs(pb.scale) * _sum_to_shape(allowed, pb.bias.shape)
    return grads


def _with_defaults(options: dict) -> dict:
    """sdpa_forward's keyword defaults under ``options``, as _prepare takes them."""
    defaults = dict(scale=None, causal=None, window=None, alignment=None, bias=None,
                    alibi_slopes=None, dropout_p=0.0, dropout_keep=None, seq_len_q=None,
                    seq_len_kv=None)
    unknown = set(options) - set(defaults)
    if unknown:
        raise TypeError(f"unexpected keyword arguments {sorted(unknown)}")
    return {**defaults, **options}
