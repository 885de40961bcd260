"""Decode attention plans and the functional form, over the decode_attention contract
(``opfacade/contracts/decode_attention.py``; the cache forms in ``contracts/kv_cache.py``).

    desc = DecodeAttentionDescriptor(batch=64, heads_q=32, heads_kv=8, head_dim=128,
                                     element="bf16", cache="paged", page_size=16,
                                     max_pages=512, save_lse=True)
    plan = DecodeAttentionPlan.select(desc, PlanPreference(batch_invariant=True), device=0)
    step = plan.prepare(DecodeAttentionArgs(q, k_pages, v_pages, seq_lens, out, page_table,
                                            lse), stream=s)
    step()                      # each decode step; capture it once in a CUDA graph

    out, lse = decode_attention(q, k_cache, v_cache, seq_lens, page_table=table,
                                return_lse=True)
"""

from __future__ import annotations

from typing import Any

from .._internal import operands
from .._internal.tensors import TensorView, wrap
from ..contracts.decode_attention import (
    DECODE_ATTENTION,
    DecodeAttentionArgs,
    DecodeAttentionDescriptor,
)
from ..errors import InvalidArgument
from ..plan import plan_class

__all__ = ["DecodeAttentionArgs", "DecodeAttentionDescriptor", "DecodeAttentionPlan",
           "decode_attention", "cache_fields"]

DecodeAttentionPlan = plan_class(DECODE_ATTENTION.name)


def cache_fields(k_cache: TensorView, page_table: Any, kv_layout: str) -> dict:
    """The envelope's cache fields read off a contiguous or paged cache tensor: heads_kv, the
    head dim and the capacity (per-sequence address arrays need the plan API, which states
    them)."""
    if k_cache.ndim != 4:
        raise InvalidArgument(f"k_cache must be a 4-D cache tensor (per-sequence addresses go "
                              f"through the plan API), got shape {k_cache.shape}",
                              argument="k_cache")
    tokens, heads = ((k_cache.shape[1], k_cache.shape[2]) if kv_layout == "nhd"
                     else (k_cache.shape[2], k_cache.shape[1]))
    fields = dict(heads_kv=heads, head_dim=k_cache.shape[3], kv_layout=kv_layout)
    if page_table is None:
        return {**fields, "cache": "contiguous", "max_seq": tokens}
    table = wrap(page_table, "page_table")
    if table.ndim != 2:
        raise InvalidArgument(f"page_table must be 2-D [b, max_pages], got shape {table.shape}",
                              argument="page_table")
    return {**fields, "cache": "paged", "page_size": tokens, "max_pages": table.shape[1]}


def decode_attention(q: Any, k_cache: Any, v_cache: Any, seq_lens: Any, *,
                     page_table: Any = None, kv_layout: str = "nhd",
                     scale: float | None = None, window_left: int | None = None,
                     return_lse: bool = False, stream: Any = None) -> tuple[Any, Any]:
    """Functional form of DecodeAttentionPlan over a contiguous cache, or a paged one when
    ``page_table`` is given: returns (out, lse), lse None unless ``return_lse``. The plan is
    cached for this batch and cache; serving loops keep a plan for their envelope instead."""
    # The plan by the call's facts (no descriptor built, nothing wrapped, on a repeat call):
    # the arrays' shapes, q's dtype and device, and every option the descriptor reads.
    q_facts = operands.facts(q, "q")
    facts = (q_facts, operands.facts(k_cache, "k_cache")[0], operands.facts(v_cache, "v_cache")[0],
             None if page_table is None else operands.facts(page_table, "page_table")[0],
             kv_layout, scale, window_left, return_lse)
    plan = DecodeAttentionPlan.cached_for(
        facts, lambda: _descriptor(q, k_cache, v_cache, page_table, kv_layout, scale,
                                   window_left, return_lse),
        device=operands.device_of(q_facts))
    desc, q_shape = plan.descriptor, q_facts[0]
    out = operands.allocate(q, q_facts, (*q_shape[:3], desc.dim_v), desc.element, stream)
    lse = (operands.allocate(q, q_facts, tuple(q_shape[:3]), desc.lse_element, stream)
           if return_lse else None)
    plan.run(DecodeAttentionArgs(q, k_cache, v_cache, seq_lens, out, page_table, lse),
             stream=stream)
    return out, lse


def _descriptor(q: Any, k_cache: Any, v_cache: Any, page_table: Any, kv_layout: str,
                scale: float | None, window_left: int | None, return_lse: bool
                ) -> DecodeAttentionDescriptor:
    """The functional form's descriptor (built on a plan-cache miss only)."""
    q_view, k_view, v_view = wrap(q, "q"), wrap(k_cache, "k_cache"), wrap(v_cache, "v_cache")
    if q_view.ndim != 4:
        raise InvalidArgument(f"q must be 4-D [b, q_len, heads_q, head_dim], got shape "
                              f"{q_view.shape}", argument="q")
    return DecodeAttentionDescriptor(
        batch=q_view.shape[0], q_len=q_view.shape[1], heads_q=q_view.shape[2],
        head_dim_v=v_view.shape[3], element=q_view.element, scale=scale,
        window=None if window_left is None else (window_left, None), save_lse=return_lse,
        **cache_fields(k_view, page_table, kv_layout))
