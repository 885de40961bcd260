"""The decode_attention family's contract (issue 13): one decode step of a batch of sequences over
their KV caches (contracts/kv_cache.py: the cache forms, the envelope, seq_lens, checked mode).

    q        [b, q_len, Hq, D]      the new tokens' queries (q_len 1..8: speculative decoding)
    seq_lens int32 [b]              tokens each sequence holds, the new ones included
    out      [b, q_len, Hq, Dv]     lse f32 [b, q_len, Hq] when save_lse

New token t of sequence s sits at position ``seq_lens[s] - q_len + t`` and attends to positions 0
up to its own (causal among the new tokens, bottom-right), within a sliding window when one is
set: keys ``p >= position - left``. Query head h reads kv head ``h // (Hq // Hkv)``.

Edges: a sequence with seq_len 0 (or a query whose position is negative) gets out 0 and lse
-inf, never NaN. Cache content past a sequence's length, and pages it does not own, never reach
its output. lse is the natural-log log-sum-exp of the scaled scores, so two partial attentions
over disjoint keys merge exactly (cascade or shared-prefix serving).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from .._internal.contract import BoundArgs, OpContract, TensorSpec
from .._internal.tensors import (
    TensorView,
    argument_when,
    expect,
    expect_args_type,
    expect_no_overlaps,
    wrap,
)
from ..types import ElementKind, OpCategory
from .attention_masks import MAX_EXTENT, AttentionMask, SlidingWindow, large_forward_scales
from .kv_cache import (
    ELEMENTS,
    SAMPLE_SHAPES,
    KvCacheEnvelope,
    cache_specs,
    cache_views,
    token_view,
    verification_inputs,
)

__all__ = ["DECODE_ATTENTION", "ELEMENTS", "OPS", "DecodeAttentionArgs",
           "DecodeAttentionDescriptor"]


class DecodeAttentionDescriptor(KvCacheEnvelope, AttentionMask):
    """One decode step: q_len new tokens per sequence attend over its cache. The mask is causal
    among the new tokens (aligned bottom-right); a window keeps the last ``left + 1`` positions
    up to each query's own (``window=(left, None)``)."""

    heads_q: int = Field(ge=1, lt=MAX_EXTENT)
    scale: float | None = None
    causal: Literal["bottom_right"] = "bottom_right"
    window: SlidingWindow | None = None
    save_lse: bool = False

    @model_validator(mode="after")
    def _decode_fields(self):
        if self.heads_q % self.heads_kv:
            raise ValueError(f"heads_q {self.heads_q} must be a multiple of heads_kv "
                             f"{self.heads_kv}")
        if self.window is not None and (self.window.left is None or self.window.right):
            raise ValueError("a decode window bounds keys on the left only: window=(left, None)")
        return self

    @property
    def lse_element(self) -> ElementKind:
        return self.element.accumulator


@dataclass
class DecodeAttentionArgs:
    """q [b, q_len, Hq, D]; k_cache, v_cache as the descriptor's ``cache`` says; seq_lens int32
    [b]; out [b, q_len, Hq, Dv]; page_table int32 [b, max_pages] when paged; lse f32
    [b, q_len, Hq] when save_lse."""

    q: Any
    k_cache: Any
    v_cache: Any
    seq_lens: Any
    out: Any
    page_table: Any = None
    lse: Any = None


def _bind_decode(desc: DecodeAttentionDescriptor, args: DecodeAttentionArgs) -> BoundArgs:
    expect_args_type(args, DecodeAttentionArgs)
    q = token_view(args.q, "q", desc, desc.heads_q, desc.head_dim)
    sequences = q.shape[0]
    views: dict[str, TensorView | None] = {"q": q, **cache_views(desc, args, sequences, "q")}
    views["out"] = token_view(args.out, "out", desc, desc.heads_q, desc.dim_v, sequences, "q")
    lse = argument_when(args.lse, "lse", desc.save_lse, "save_lse is True")
    views["lse"] = None
    if lse is not None:
        views["lse"] = wrap(lse, "lse")
        expect(views["lse"], "lse", shape=(sequences, desc.q_len, desc.heads_q),
               element=desc.lse_element)
    outputs = ("out", "lse")
    expect_no_overlaps(views, outputs)
    return BoundArgs(views, outputs=outputs)


def _decode_signature(desc: DecodeAttentionDescriptor) -> dict[str, TensorSpec]:
    b = desc.batch
    signature = {"q": TensorSpec((b, desc.q_len, desc.heads_q, desc.head_dim), desc.element),
                 **cache_specs(desc, "in"),
                 "seq_lens": TensorSpec((b,), ElementKind.i32),
                 "out": TensorSpec((b, desc.q_len, desc.heads_q, desc.dim_v), desc.element,
                                   "out")}
    if desc.save_lse:
        signature["lse"] = TensorSpec((b, desc.q_len, desc.heads_q), desc.lse_element, "out")
    return signature


def _decode_samples(element: ElementKind) -> list[DecodeAttentionDescriptor]:
    return [DecodeAttentionDescriptor(**shape, element=element, save_lse=True)
            for shape in SAMPLE_SHAPES]


def _large_scales(desc: DecodeAttentionDescriptor) -> dict[str, float]:
    """The attention forward's "large" multipliers, under the caches' names."""
    scales = large_forward_scales(desc)
    return {"q": scales["q"], "k_cache": scales["k"], "v_cache": scales["v"]}


DECODE_ATTENTION: OpContract[DecodeAttentionDescriptor] = OpContract(
    name="decode_attention",
    category=OpCategory.decode_attention,
    descriptor=DecodeAttentionDescriptor,
    args=DecodeAttentionArgs,
    bind=_bind_decode,
    summary="out = softmax(scale*q.k^T).v of q_len new tokens per sequence over its KV cache",
    signature=_decode_signature,
    sample_problems=_decode_samples,
    verification_inputs=verification_inputs,
    large_scales=_large_scales,
)

OPS = (DECODE_ATTENTION,)
