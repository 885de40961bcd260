"""The kv_append family's contract (issue 13): writes a decode step's new keys and values into
the KV caches (contracts/kv_cache.py: the cache forms, the envelope, seq_lens, checked mode).

    k_new    [b, q_len, Hkv, D], v_new [b, q_len, Hkv, Dv]   the step's tokens (strided views,
             such as slices of a fused QKV projection, are fine; the NVRTC SKUs take strides
             below 2 GiB)
    seq_lens int32 [b]              tokens each sequence holds, the new ones counted

New token t of sequence s is written at position ``seq_lens[s] - q_len + t``: the caller counts
the new tokens into seq_lens first, then appends, then decodes with the same seq_lens. The
caches are the op's outputs; nothing else is written, and a position outside a sequence's
capacity or a page outside the pool is skipped (checked mode names it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._internal.contract import BoundArgs, OpContract, TensorSpec
from .._internal.tensors import TensorView, expect_args_type, expect_no_overlaps
from ..types import ElementKind, OpCategory
from .kv_cache import (
    ELEMENTS,
    SAMPLE_SHAPES,
    KvCacheEnvelope,
    cache_specs,
    cache_views,
    large_copy_scales,
    token_view,
    verification_inputs,
)

__all__ = ["ELEMENTS", "KV_APPEND", "OPS", "KvAppendArgs", "KvAppendDescriptor"]


class KvAppendDescriptor(KvCacheEnvelope):
    """Writes q_len new tokens' keys and values per sequence into the cache."""



@dataclass
class KvAppendArgs:
    """k_new [b, q_len, Hkv, D], v_new [b, q_len, Hkv, Dv]; the caches (written); seq_lens int32
    [b] with the new tokens counted; page_table int32 [b, max_pages] when paged."""

    k_new: Any
    v_new: Any
    k_cache: Any
    v_cache: Any
    seq_lens: Any
    page_table: Any = None


def _bind_append(desc: KvAppendDescriptor, args: KvAppendArgs) -> BoundArgs:
    expect_args_type(args, KvAppendArgs)
    k_new = token_view(args.k_new, "k_new", desc, desc.heads_kv, desc.head_dim)
    sequences = k_new.shape[0]
    views: dict[str, TensorView | None] = {
        "k_new": k_new,
        "v_new": token_view(args.v_new, "v_new", desc, desc.heads_kv, desc.dim_v, sequences,
                         "k_new"),
        **cache_views(desc, args, sequences, "k_new")}
    outputs = ("k_cache", "v_cache")
    expect_no_overlaps(views, outputs)
    return BoundArgs(views, outputs=outputs)


def _append_signature(desc: KvAppendDescriptor) -> dict[str, TensorSpec]:
    b = desc.batch
    return {"k_new": TensorSpec((b, desc.q_len, desc.heads_kv, desc.head_dim), desc.element),
            "v_new": TensorSpec((b, desc.q_len, desc.heads_kv, desc.dim_v), desc.element),
            **cache_specs(desc, "inout"),
            "seq_lens": TensorSpec((b,), ElementKind.i32)}


def _append_samples(element: ElementKind) -> list[KvAppendDescriptor]:
    return [KvAppendDescriptor(**{k: v for k, v in shape.items()
                                  if k not in ("heads_q", "window")}, element=element)
            for shape in SAMPLE_SHAPES]


KV_APPEND: OpContract[KvAppendDescriptor] = OpContract(
    name="kv_append",
    category=OpCategory.decode_attention,
    descriptor=KvAppendDescriptor,
    args=KvAppendArgs,
    bind=_bind_append,
    summary="writes q_len new tokens' k and v per sequence into a contiguous or paged cache",
    signature=_append_signature,
    sample_problems=_append_samples,
    verification_inputs=verification_inputs,
    large_scales=lambda desc: large_copy_scales(("k_new", "v_new", "k_cache", "v_cache"), desc),
)

OPS = (KV_APPEND,)
