"""ALiBi bias in float64: the oracle for the fused ALiBi kernels and for SDPA's ``alibi_slopes``.

The bias of query ``i`` and key ``j`` is ``slope * (j - i)``: zero on the top-left diagonal and
more negative (for a positive slope) the further a key lies behind its query.
"""

from __future__ import annotations

import numpy as np

__all__ = ["alibi_distance", "alibi_forward", "alibi_backward", "alibi_forward_magnitude",
           "alibi_backward_magnitude"]


def alibi_distance(query_len: int, key_len: int) -> np.ndarray:
    """The signed distance ``j - i`` of every (query ``i``, key ``j``) pair.

    Args:
        query_len: number of query rows Q.
        key_len: number of key columns K.

    Returns:
        A float64 array of shape [Q, K] holding ``j - i``.
    """
    if query_len < 0 or key_len < 0:
        raise ValueError(
            f"alibi_distance needs non-negative lengths, got query_len={query_len}, "
            f"key_len={key_len}"
        )
    rows = np.arange(query_len, dtype=np.float64)[:, None]
    cols = np.arange(key_len, dtype=np.float64)[None, :]
    return cols - rows


def alibi_forward(a: np.ndarray, slopes: np.ndarray) -> np.ndarray:
    """Adds the ALiBi bias to attention scores.

    Args:
        a: scores of shape [B, H, Q, K], any float dtype.
        slopes: one slope per head, shape [H].

    Returns:
        ``a[b, h, i, j] + slopes[h] * (j - i)`` in float64, shape [B, H, Q, K].
    """
    a = np.asarray(a, dtype=np.float64)
    slopes = np.asarray(slopes, dtype=np.float64)
    if a.ndim != 4:
        raise ValueError(f"a must have 4 dimensions [B, H, Q, K], got shape {a.shape}")
    if slopes.shape != (a.shape[1],):
        raise ValueError(
            f"slopes must have shape ({a.shape[1]},) to match H of a, got {slopes.shape}"
        )
    distance = alibi_distance(a.shape[2], a.shape[3])
    return a + slopes[None, :, None, None] * distance[None, None]


def alibi_backward(
    dy: np.ndarray, *, need_input_grad: bool = True, need_slope_grad: bool = True
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Gradients of ``alibi_forward`` given the gradient of its output.

    The op is affine in both operands, so the gradients need only ``dy``: the input gradient is
    ``dy`` itself and each slope collects ``dy`` weighted by the distance ``j - i``.

    Args:
        dy: gradient of the output, shape [B, H, Q, K].
        need_input_grad: whether to return the gradient of ``a``.
        need_slope_grad: whether to return the gradient of ``slopes``.

    Returns:
        ``(d_input, d_slopes)``, each None when not asked for; d_slopes has shape [H].
    """
    if not (need_input_grad or need_slope_grad):
        raise ValueError("alibi_backward needs need_input_grad or need_slope_grad to be True")
    dy = np.asarray(dy, dtype=np.float64)
    if dy.ndim != 4:
        raise ValueError(f"dy must have 4 dimensions [B, H, Q, K], got shape {dy.shape}")
    d_input = dy.copy() if need_input_grad else None
    d_slopes = None
    if need_slope_grad:
        distance = alibi_distance(dy.shape[2], dy.shape[3])
        d_slopes = np.einsum("bhij,ij->h", dy, distance)
    return d_input, d_slopes



# Magnitude references: each result recomputed over absolute values, the scale a kernel's
# rounding error is bounded by (PrecisionGuarantee). They take the arguments of the functions
# above and return arrays shaped like their results.

def alibi_forward_magnitude(a: np.ndarray, slopes: np.ndarray) -> np.ndarray:
    """``|a| + |slope[h]| |j - i|``: one addition, whose rounding scales with both terms."""
    a = np.abs(np.asarray(a, dtype=np.float64))
    slopes = np.abs(np.asarray(slopes, dtype=np.float64))
    distance = np.abs(alibi_distance(a.shape[2], a.shape[3]))
    return a + slopes[None, :, None, None] * distance[None, None]


def alibi_backward_magnitude(
    dy: np.ndarray, *, need_input_grad: bool = True, need_slope_grad: bool = True
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(|dy|, sum |dy| |j - i|)``: the slope gradient's error grows with the sum of its terms'
    sizes, not with the (possibly cancelling) sum itself."""
    dy = np.abs(np.asarray(dy, dtype=np.float64))
    d_slopes = None
    if need_slope_grad:
        distance = np.abs(alibi_distance(dy.shape[2], dy.shape[3]))
        d_slopes = np.einsum("bhij,ij->h", dy, distance)
    return (dy if need_input_grad else None), d_slopes
