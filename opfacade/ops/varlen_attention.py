"""Packed (varlen) attention plans and functional forms, over the varlen_attention contract
(``opfacade/contracts/varlen_attention.py``).

    desc = VarlenAttentionDescriptor(batch=8, heads_q=32, heads_kv=8, head_dim=128,
                                     max_seqlen_q=4096, max_seqlen_kv=4096, element="f32",
                                     causal="bottom_right", save_lse=True)
    pair = VarlenAttentionForwardPlan.select_for_training(desc)
    pair.forward.run(VarlenAttentionArgs(q, k, v, cu_q, cu_kv, out, lse), stream=s)

    out, lse = varlen_attention(q, k, v, cu_q, cu_kv, max_seqlen_q=4096, max_seqlen_kv=4096,
                                causal="bottom_right")
"""

from __future__ import annotations

from typing import Any

from .._internal.memory import OutputAllocator
from .._internal.tensors import TensorView, wrap
from ..contracts.varlen_attention import (
    VARLEN_ATTENTION_BACKWARD,
    VARLEN_ATTENTION_FORWARD,
    VarlenAttentionArgs,
    VarlenAttentionBackwardArgs,
    VarlenAttentionBackwardDescriptor,
    VarlenAttentionDescriptor,
)
from ..errors import InvalidArgument
from ..plan import plan_class
from ..types import PlanPreference

__all__ = [
    "VarlenAttentionDescriptor",
    "VarlenAttentionBackwardDescriptor",
    "VarlenAttentionArgs",
    "VarlenAttentionBackwardArgs",
    "VarlenAttentionForwardPlan",
    "VarlenAttentionBackwardPlan",
    "varlen_attention",
    "varlen_attention_backward",
]

VarlenAttentionForwardPlan = plan_class(VARLEN_ATTENTION_FORWARD.name)
VarlenAttentionBackwardPlan = plan_class(VARLEN_ATTENTION_BACKWARD.name)


def _problem(q: TensorView, k: TensorView, v: TensorView, cu_seqlens_q: Any,
             max_seqlen_q: int, max_seqlen_kv: int, options: dict) -> dict:
    """The descriptor's fields from the tensors and the caller's options, on the bucket ladder
    (so that packings of nearby sizes share one cached plan)."""
    for view, name in ((q, "q"), (k, "k"), (v, "v")):
        if view.ndim != 3:
            raise InvalidArgument(f"{name} must be 3-D [tokens, heads, dim], got shape "
                                  f"{view.shape}", argument=name)
    offsets = wrap(cu_seqlens_q, "cu_seqlens_q")
    if offsets.ndim != 1 or offsets.shape[0] < 2:
        raise InvalidArgument(f"cu_seqlens_q must be 1-D with batch + 1 >= 2 offsets, got shape "
                              f"{offsets.shape}", argument="cu_seqlens_q")
    return dict(batch=offsets.shape[0] - 1, heads_q=q.shape[1], heads_kv=k.shape[1],
                head_dim=q.shape[2], head_dim_v=v.shape[2], max_seqlen_q=max_seqlen_q,
                max_seqlen_kv=max_seqlen_kv, element=q.element, **options)


def varlen_attention(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_kv: Any, *,
                     max_seqlen_q: int, max_seqlen_kv: int, scale: float | None = None,
                     causal: str | bool | None = None, window: Any = None,
                     return_lse: bool = True, stream: Any = None) -> tuple[Any, Any]:
    """Functional form of VarlenAttentionForwardPlan: returns (out, lse), lse None unless
    ``return_lse``. ``max_seqlen_*`` are host ints, as FlashAttention's varlen function takes
    them; the plan is cached for the bucket they round up to."""
    views = [wrap(t, name) for t, name in ((q, "q"), (k, "k"), (v, "v"))]
    fields = _problem(*views, cu_seqlens_q, max_seqlen_q, max_seqlen_kv,
                      dict(scale=scale, causal=causal, window=window))
    desc = VarlenAttentionDescriptor(**fields, save_lse=return_lse).bucketed()
    q_view = views[0]
    plan = VarlenAttentionForwardPlan.cached(
        desc, device="cpu" if q_view.device is None else q_view.device)
    allocate = OutputAllocator(q_view, stream)
    out = allocate((q_view.shape[0], desc.heads_q, desc.dim_v), desc.element)
    lse = allocate((desc.heads_q, q_view.shape[0]), desc.lse_element) if return_lse else None
    plan.run(VarlenAttentionArgs(q, k, v, cu_seqlens_q, cu_seqlens_kv, out, lse),
             stream=stream)
    return out, lse


def varlen_attention_backward(grad_out: Any, q: Any, k: Any, v: Any, out: Any, lse: Any,
                              cu_seqlens_q: Any, cu_seqlens_kv: Any, *, max_seqlen_q: int,
                              max_seqlen_kv: int, scale: float | None = None,
                              causal: str | bool | None = None, window: Any = None,
                              stream: Any = None, deterministic: bool = False
                              ) -> tuple[Any, Any, Any]:
    """Functional form of VarlenAttentionBackwardPlan: returns (grad_q, grad_k, grad_v).
    ``deterministic`` selects under PlanPreference(deterministic=True)."""
    views = [wrap(t, name) for t, name in ((q, "q"), (k, "k"), (v, "v"))]
    fields = _problem(*views, cu_seqlens_q, max_seqlen_q, max_seqlen_kv,
                      dict(scale=scale, causal=causal, window=window))
    desc = VarlenAttentionBackwardDescriptor(**fields).bucketed()
    q_view = views[0]
    plan = VarlenAttentionBackwardPlan.cached(
        desc, PlanPreference(deterministic=deterministic),
        device="cpu" if q_view.device is None else q_view.device)
    allocate = OutputAllocator(q_view, stream)
    grads = tuple(allocate(view.shape, view.element) for view in views)
    plan.run(VarlenAttentionBackwardArgs(q, k, v, out, grad_out, lse, cu_seqlens_q,
                                         cu_seqlens_kv, *grads), stream=stream)
    return grads
