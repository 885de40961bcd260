"""Packed (varlen) attention in float64 over [tokens, heads, dim], one sequence at a time.

Sequence ``b`` owns query tokens ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` and key tokens
``cu_seqlens_kv[b]:cu_seqlens_kv[b + 1]``. Each is attended on its own through ``sdpa_*``, so the
masking conventions (causal and window aligned against the sequence's own lengths, -inf lse for
a query with no key) are those of ``sdpa``, and every keyword of ``sdpa_forward`` but the
padding, bias and dropout ones applies. Tokens past ``cu_seqlens[-1]`` belong to no sequence:
their results are 0 (lse -inf).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .sdpa import (
    sdpa_backward,
    sdpa_backward_magnitude,
    sdpa_backward_underflow,
    sdpa_forward,
    sdpa_forward_magnitude,
    sdpa_forward_underflow,
)

__all__ = ["varlen_forward", "varlen_backward", "varlen_forward_magnitude",
           "varlen_backward_magnitude", "varlen_forward_underflow", "varlen_backward_underflow"]


def _check_cu_seqlens(cu: np.ndarray, tokens: int, name: str) -> np.ndarray:
    cu = np.asarray(cu)
    if cu.ndim != 1 or cu.size < 1 or not np.issubdtype(cu.dtype, np.integer):
        raise ValueError(
            f"{name} must be a 1-D int array of B + 1 offsets, got {cu.dtype} {cu.shape}"
        )
    if cu[0] != 0 or np.any(np.diff(cu) < 0) or cu[-1] > tokens:
        raise ValueError(
            f"{name} must start at 0, never decrease and end at most at {tokens} tokens, got "
            f"{cu.tolist()}"
        )
    return cu.astype(np.int64)


def _sequences(q, k, v, cu_seqlens_q, cu_seqlens_kv):
    """Upcasts, validates and yields (query slice, kv slice) per sequence."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 3:
            raise ValueError(f"{name} must have 3 dimensions [T, H, D], got shape {x.shape}")
    if v.shape[0] != k.shape[0] or v.shape[1] != k.shape[1]:
        raise ValueError(f"v must have shape {k.shape[:2]} + (Dv,) to match k, got {v.shape}")
    cu_q = _check_cu_seqlens(cu_seqlens_q, q.shape[0], "cu_seqlens_q")
    cu_kv = _check_cu_seqlens(cu_seqlens_kv, k.shape[0], "cu_seqlens_kv")
    if cu_q.size != cu_kv.size:
        raise ValueError(
            f"cu_seqlens_kv must have {cu_q.size} entries to match cu_seqlens_q, got {cu_kv.size}"
        )
    spans = [
        (slice(cu_q[b], cu_q[b + 1]), slice(cu_kv[b], cu_kv[b + 1])) for b in range(cu_q.size - 1)
    ]
    return q, k, v, spans


def _dense(x: np.ndarray) -> np.ndarray:
    """[S, H, D] -> [1, H, S, D]."""
    return x.transpose(1, 0, 2)[None]


def _packed(x: np.ndarray) -> np.ndarray:
    """[1, H, S, D] -> [S, H, D]."""
    return x[0].transpose(1, 0, 2)


def _map_forward(dense: Callable, q, k, v, cu_seqlens_q, cu_seqlens_kv, *,
                 unowned_lse: float = -np.inf, **options) -> tuple[np.ndarray, np.ndarray]:
    """``dense`` (sdpa_forward or one of its magnitude / underflow twins) on each sequence,
    packed back: (out [Tq, Hq, Dv], lse [Tq, Hq])."""
    q, k, v, spans = _sequences(q, k, v, cu_seqlens_q, cu_seqlens_kv)
    out = np.zeros(q.shape[:2] + v.shape[2:])
    lse = np.full(q.shape[:2], unowned_lse)
    for rows, cols in spans:
        seq_out, seq_lse = dense(_dense(q[rows]), _dense(k[cols]), _dense(v[cols]), **options)
        out[rows] = _packed(seq_out)
        lse[rows] = seq_lse[0].T
    return out, lse


def _map_backward(dense: Callable, q, k, v, d_out, cu_seqlens_q, cu_seqlens_kv, **options
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``dense`` (sdpa_backward or a twin) on each sequence, packed back: (dq, dk, dv)."""
    q, k, v, spans = _sequences(q, k, v, cu_seqlens_q, cu_seqlens_kv)
    d_out = np.asarray(d_out, dtype=np.float64)
    out_shape = q.shape[:2] + v.shape[2:]
    if d_out.shape != out_shape:
        raise ValueError(
            f"d_out must have shape {out_shape} to match the output, got {d_out.shape}"
        )
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for rows, cols in spans:
        grads = dense(_dense(q[rows]), _dense(k[cols]), _dense(v[cols]), _dense(d_out[rows]),
                      **options)
        dq[rows] = _packed(grads["dq"])
        dk[cols] = _packed(grads["dk"])
        dv[cols] = _packed(grads["dv"])
    return dq, dk, dv


def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_kv, **options
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Attention over packed sequences.

    Args:
        q: [Tq, Hq, D] packed queries.
        k: [Tk, Hkv, D] packed keys; Hq must be a multiple of Hkv.
        v: [Tk, Hkv, Dv] packed values.
        cu_seqlens_q, cu_seqlens_kv: [B + 1] token offsets of each sequence.
        options: sdpa_forward's ``scale``, ``causal``, ``window``, ``alignment``, per sequence.

    Returns:
        ``(out, lse)``: out [Tq, Hq, Dv] and lse [Tq, Hq], float64.
    """
    return _map_forward(sdpa_forward, q, k, v, cu_seqlens_q, cu_seqlens_kv, **options)


def varlen_backward(q, k, v, d_out, cu_seqlens_q, cu_seqlens_kv, **options
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of ``varlen_forward`` given ``d_out`` [Tq, Hq, Dv] (same options).

    Returns:
        ``(dq, dk, dv)`` shaped like q, k and v.
    """
    return _map_backward(sdpa_backward, q, k, v, d_out, cu_seqlens_q, cu_seqlens_kv, **options)


def varlen_forward_magnitude(q, k, v, cu_seqlens_q, cu_seqlens_kv, **options):
    """Magnitude references of ``varlen_forward``'s (out, lse): sdpa's, per sequence."""
    return _map_forward(sdpa_forward_magnitude, q, k, v, cu_seqlens_q, cu_seqlens_kv,
                        unowned_lse=0.0, **options)


def varlen_backward_magnitude(q, k, v, d_out, cu_seqlens_q, cu_seqlens_kv, **options):
    """Magnitude references of ``varlen_backward``'s (dq, dk, dv): sdpa's, per sequence."""
    return _map_backward(sdpa_backward_magnitude, q, k, v, d_out, cu_seqlens_q, cu_seqlens_kv,
                         **options)


def varlen_forward_underflow(q, k, v, cu_seqlens_q, cu_seqlens_kv, *, unit: float, **options):
    """Underflow allowances of ``varlen_forward``'s (out, lse): sdpa's, per sequence."""
    return _map_forward(sdpa_forward_underflow, q, k, v, cu_seqlens_q, cu_seqlens_kv,
                        unowned_lse=0.0, unit=unit, **options)


def varlen_backward_underflow(q, k, v, d_out, cu_seqlens_q, cu_seqlens_kv, *, unit: float,
                              **options):
    """Underflow allowances of ``varlen_backward``'s (dq, dk, dv): sdpa's, per sequence."""
    return _map_backward(sdpa_backward_underflow, q, k, v, d_out, cu_seqlens_q, cu_seqlens_kv,
                         unit=unit, **options)
