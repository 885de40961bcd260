"""The decode_attention family's contract (issue 13): one decode step of a batch of sequences over
their KV caches, and ``kv_append``, which writes the step's new keys and values into the caches.

    q        [b, q_len, Hq, D]      the new tokens' queries (q_len 1..8: speculative decoding)
    seq_lens int32 [b]              tokens each sequence holds, the new ones included
    out      [b, q_len, Hq, Dv]     lse f32 [b, q_len, Hq] when save_lse

New token t of sequence s sits at position ``seq_lens[s] - q_len + t`` and attends to positions 0
up to its own (causal among the new tokens, bottom-right), within a sliding window when one is
set: keys ``p >= position - left``. Query head h reads kv head ``h // (Hq // Hkv)``.

The cache comes in three forms (``cache``), each token-major ("nhd", FlashInfer's NHD) or
heads-major ("hnd"):

    contiguous  k_cache [B, max_seq, Hkv, D] (hnd: [B, Hkv, max_seq, D]), row s is sequence s
    paged       k_cache [num_pages, page_size, Hkv, D] (hnd: [num_pages, Hkv, page_size, D]) and
                page_table int32 [b, max_pages]: position p of sequence s is in page
                page_table[s, p // page_size], slot p % page_size
    pointers    k_cache, v_cache int64 [b]: each sequence's own [max_seq, Hkv, D] (hnd:
                [Hkv, max_seq, D]) contiguous cache at that device address

v_cache is shaped like k_cache with Dv last. The descriptor states an envelope: at most
``batch`` sequences, each up to ``max_seq`` tokens (paged: ``max_pages`` pages of
``page_size``). A plan runs any batch within it; seq_lens and page tables are device data, read
on the device only.

Edges: a sequence with seq_len 0 (or a query whose position is negative) gets out 0 and lse
-inf, never NaN. Cache content past a sequence's length, and pages it does not own, never reach
its output. Checked mode (``checked=True``) tests on the device that seq_lens lie in
[q_len, max_seq] (an empty sequence, seq_len 0, passes too), that the page indices a sequence
uses lie in [0, num_pages), and raises InvalidArgument naming the argument and the first bad
index.

kv_append writes k_new, v_new [b, q_len, Hkv, D] (and Dv) at positions
``seq_lens[s] - q_len + t``: the caller counts the new tokens into seq_lens first, then appends,
then decodes with the same seq_lens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from .._internal.contract import BoundArgs, Descriptor, OpContract, TensorSpec
from .._internal.tensors import (
    TensorView,
    argument_when,
    expect,
    expect_args_type,
    expect_no_overlaps,
    wrap,
)
from ..errors import InvalidArgument, ShapeMismatch
from ..types import ElementKind, OpCategory
from .attention_masks import ELEMENTS, MAX_EXTENT, AttentionMask, SlidingWindow

__all__ = [
    "CACHES",
    "DECODE_ATTENTION",
    "KV_APPEND",
    "KV_LAYOUTS",
    "MAX_PAGE_SIZE",
    "MAX_Q_LEN",
    "DecodeAttentionArgs",
    "DecodeAttentionDescriptor",
    "KvAppendArgs",
    "KvAppendDescriptor",
    "cache_shape",
]

Cache = Literal["contiguous", "paged", "pointers"]
KvLayout = Literal["nhd", "hnd"]
CACHES: tuple[str, ...] = ("contiguous", "paged", "pointers")
KV_LAYOUTS: tuple[str, ...] = ("nhd", "hnd")
MAX_Q_LEN = 8  # speculative decoding's draft tokens per step
MAX_PAGE_SIZE = 256


class _KvCache(Descriptor):
    """The cache envelope both ops share, and its rules."""

    batch: int = Field(ge=1, lt=MAX_EXTENT)
    q_len: int = Field(default=1, ge=1, le=MAX_Q_LEN)
    heads_kv: int = Field(ge=1, lt=MAX_EXTENT)
    head_dim: int = Field(ge=1, lt=MAX_EXTENT)
    head_dim_v: int | None = Field(default=None, ge=1, lt=MAX_EXTENT)
    element: ElementKind
    cache: Cache
    kv_layout: KvLayout = "nhd"
    # contiguous and pointers: each sequence's capacity. paged: page_size * max_pages (derived
    # when left None).
    max_seq: int | None = Field(default=None, ge=1, lt=MAX_EXTENT)
    page_size: int | None = Field(default=None, ge=1, le=MAX_PAGE_SIZE)
    max_pages: int | None = Field(default=None, ge=1, lt=MAX_EXTENT)
    checked: bool = False

    @model_validator(mode="after")
    def _cache_fields(self):
        paged = self.cache == "paged"
        if paged and (self.page_size is None or self.max_pages is None):
            raise ValueError("a paged cache needs page_size and max_pages")
        if not paged and (self.page_size is not None or self.max_pages is not None):
            raise ValueError(f"page_size and max_pages describe a paged cache, not a "
                             f"{self.cache} one")
        if not paged and self.max_seq is None:
            raise ValueError(f"a {self.cache} cache needs max_seq")
        if paged and self.max_seq is not None and self.max_seq != self.capacity:
            raise ValueError(f"max_seq {self.max_seq} must be page_size * max_pages = "
                             f"{self.capacity} for a paged cache (or left out)")
        if self.element not in ELEMENTS:
            raise ValueError(f"element must be one of {[e.value for e in ELEMENTS]}")
        return self

    @property
    def dim_v(self) -> int:
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def capacity(self) -> int:
        """The most tokens one sequence can hold."""
        if self.cache == "paged":
            return self.page_size * self.max_pages
        return self.max_seq


class DecodeAttentionDescriptor(_KvCache, AttentionMask):
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
        return ElementKind.f64 if self.element is ElementKind.f64 else ElementKind.f32


class KvAppendDescriptor(_KvCache):
    """Writes q_len new tokens' keys and values per sequence into the cache."""


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


# ----------------------------------------------------------------------------- binding


def cache_shape(desc: _KvCache, dim: int, rows: int) -> tuple[int, ...]:
    """A cache tensor's shape: ``rows`` sequences (contiguous) or pages (paged) of
    ``desc.capacity`` / ``page_size`` tokens, in the descriptor's layout; one sequence's own
    cache for "pointers" (``rows`` ignored)."""
    if desc.cache == "paged":
        tokens, lead = desc.page_size, (rows,)
    elif desc.cache == "contiguous":
        tokens, lead = desc.max_seq, (rows,)
    else:
        tokens, lead = desc.max_seq, ()
    inner = (tokens, desc.heads_kv, dim) if desc.kv_layout == "nhd" else (
        desc.heads_kv, tokens, dim)
    return (*lead, *inner)


def _required(obj: Any, name: str) -> TensorView:
    if obj is None:
        raise InvalidArgument(f"{name} is required", argument=name)
    return wrap(obj, name)


def _tokens(obj: Any, name: str, desc: _KvCache, heads: int, dim: int,
            sequences: int | None = None, like: str | None = None) -> TensorView:
    """A [b, q_len, heads, dim] tensor of the step's tokens; b is the first one's."""
    view = _required(obj, name)
    if view.ndim != 4:
        raise ShapeMismatch(f"{name} must be 4-D [b, {desc.q_len}, {heads}, {dim}], got shape "
                            f"{view.shape}", argument=name)
    b = view.shape[0] if sequences is None else sequences
    expect(view, name, shape=(b, desc.q_len, heads, dim), element=desc.element, like=like)
    return view


def _lengths(obj: Any, batch: int, sequences: int, of: str) -> TensorView:
    """seq_lens: int32, one entry per sequence of ``of``, at most ``batch``."""
    view = _required(obj, "seq_lens")
    if view.ndim != 1 or not 1 <= view.shape[0] <= batch:
        raise ShapeMismatch(f"seq_lens must be 1-D with 1 to batch = {batch} entries, got shape "
                            f"{view.shape}", argument="seq_lens")
    if view.shape[0] != sequences:
        raise ShapeMismatch(f"seq_lens must have one entry per sequence of {of} ({sequences}), "
                            f"got shape {view.shape}", argument="seq_lens")
    expect(view, "seq_lens", shape=view.shape, element=ElementKind.i32)
    return view


def _caches(desc: _KvCache, args, sequences: int) -> dict[str, TensorView | None]:
    """k_cache and v_cache as the descriptor's form says, and the page table."""
    k_view, v_view = _required(args.k_cache, "k_cache"), _required(args.v_cache, "v_cache")
    if desc.cache == "pointers":
        for view, name in ((k_view, "k_cache"), (v_view, "v_cache")):
            expect(view, name, shape=(sequences,), element=ElementKind.i64)
    else:
        rows = k_view.shape[0] if k_view.ndim == 4 else 0
        if desc.cache == "contiguous" and not sequences <= rows <= desc.batch:
            raise ShapeMismatch(f"k_cache must hold {sequences} to batch = {desc.batch} "
                                f"sequences, got shape {k_view.shape}", argument="k_cache")
        if rows < 1:
            raise ShapeMismatch(f"k_cache must be 4-D {cache_shape(desc, desc.head_dim, 1)[1:]}"
                                f" per {'page' if desc.cache == 'paged' else 'sequence'}, got "
                                f"shape {k_view.shape}", argument="k_cache")
        expect(k_view, "k_cache", shape=cache_shape(desc, desc.head_dim, rows),
               element=desc.element)
        expect(v_view, "v_cache", shape=cache_shape(desc, desc.dim_v, rows),
               element=desc.element, like="k_cache")
    table = argument_when(args.page_table, "page_table", desc.cache == "paged",
                          'cache is "paged"')
    table_view = None
    if table is not None:
        table_view = wrap(table, "page_table")
        expect(table_view, "page_table", shape=(sequences, desc.max_pages),
               element=ElementKind.i32)
    return {"k_cache": k_view, "v_cache": v_view, "page_table": table_view}


def _bind_decode(desc: DecodeAttentionDescriptor, args: DecodeAttentionArgs) -> BoundArgs:
    expect_args_type(args, DecodeAttentionArgs)
    q = _tokens(args.q, "q", desc, desc.heads_q, desc.head_dim)
    sequences = q.shape[0]
    views: dict[str, TensorView | None] = {
        "q": q, "seq_lens": _lengths(args.seq_lens, desc.batch, sequences, "q")}
    views.update(_caches(desc, args, sequences))
    views["out"] = _tokens(args.out, "out", desc, desc.heads_q, desc.dim_v, sequences, "q")
    lse = argument_when(args.lse, "lse", desc.save_lse, "save_lse is True")
    views["lse"] = None
    if lse is not None:
        views["lse"] = wrap(lse, "lse")
        expect(views["lse"], "lse", shape=(sequences, desc.q_len, desc.heads_q),
               element=desc.lse_element)
    outputs = ("out", "lse")
    expect_no_overlaps(views, outputs)
    return BoundArgs(views, outputs=outputs)


def _bind_append(desc: KvAppendDescriptor, args: KvAppendArgs) -> BoundArgs:
    expect_args_type(args, KvAppendArgs)
    k_new = _tokens(args.k_new, "k_new", desc, desc.heads_kv, desc.head_dim)
    sequences = k_new.shape[0]
    views: dict[str, TensorView | None] = {
        "k_new": k_new,
        "v_new": _tokens(args.v_new, "v_new", desc, desc.heads_kv, desc.dim_v, sequences,
                         "k_new"),
        "seq_lens": _lengths(args.seq_lens, desc.batch, sequences, "k_new")}
    views.update(_caches(desc, args, sequences))
    outputs = ("k_cache", "v_cache")
    expect_no_overlaps(views, outputs)
    return BoundArgs(views, outputs=outputs)


# ----------------------------------------------------------------------------- verification


def _verification_lengths(desc: _KvCache) -> np.ndarray:
    """seq_lens verify and the GPU tests use, a function of the descriptor: a full sequence, an
    empty one, one of exactly q_len tokens, one that ends inside a page or a chunk, in that
    cycle."""
    cycle = (desc.capacity, 0, desc.q_len, max(desc.q_len, desc.capacity // 3 + 1))
    return np.array([cycle[s % len(cycle)] for s in range(desc.batch)], np.int64)


def _pages(desc: _KvCache) -> int:
    """Pages of the verification pool: every sequence's table row filled, plus spares, so that
    tables point at scattered pages."""
    return desc.batch * desc.max_pages + 3


def _cache_specs(desc: _KvCache, role: str) -> dict[str, TensorSpec]:
    rows = _pages(desc) if desc.cache == "paged" else desc.batch
    specs = {"k_cache": TensorSpec(cache_shape(desc, desc.head_dim, rows), desc.element, role),
             "v_cache": TensorSpec(cache_shape(desc, desc.dim_v, rows), desc.element, role)}
    if desc.cache == "paged":
        specs["page_table"] = TensorSpec((desc.batch, desc.max_pages), ElementKind.i32)
    return specs


def _decode_signature(desc: DecodeAttentionDescriptor) -> dict[str, TensorSpec]:
    b = desc.batch
    signature = {"q": TensorSpec((b, desc.q_len, desc.heads_q, desc.head_dim), desc.element),
                 **_cache_specs(desc, "in"),
                 "seq_lens": TensorSpec((b,), ElementKind.i32),
                 "out": TensorSpec((b, desc.q_len, desc.heads_q, desc.dim_v), desc.element,
                                   "out")}
    if desc.save_lse:
        signature["lse"] = TensorSpec((b, desc.q_len, desc.heads_q), desc.lse_element, "out")
    return signature


def _append_signature(desc: KvAppendDescriptor) -> dict[str, TensorSpec]:
    b = desc.batch
    return {"k_new": TensorSpec((b, desc.q_len, desc.heads_kv, desc.head_dim), desc.element),
            "v_new": TensorSpec((b, desc.q_len, desc.heads_kv, desc.dim_v), desc.element),
            **_cache_specs(desc, "inout"),
            "seq_lens": TensorSpec((b,), ElementKind.i32)}


def _verification_inputs(desc: _KvCache, inputs: dict[str, np.ndarray],
                         rng: np.random.Generator) -> dict[str, np.ndarray]:
    """seq_lens from the cycle above; a page table of distinct pages in a random order (spare
    pages and table entries past a sequence's length point anywhere in the pool)."""
    result = dict(inputs)
    result["seq_lens"] = _verification_lengths(desc).astype(np.int32)
    if desc.cache == "paged":
        pool = rng.permutation(_pages(desc))
        result["page_table"] = pool[:desc.batch * desc.max_pages].reshape(
            desc.batch, desc.max_pages).astype(np.int32)
    return result


_SHAPES = (
    dict(batch=5, heads_q=8, heads_kv=2, head_dim=64, cache="contiguous", max_seq=200),
    dict(batch=4, heads_q=4, heads_kv=4, head_dim=128, cache="paged", page_size=16,
         max_pages=9, kv_layout="hnd"),
    dict(batch=3, heads_q=8, heads_kv=1, head_dim=64, cache="paged", page_size=64,
         max_pages=3, q_len=4),
    dict(batch=4, heads_q=6, heads_kv=2, head_dim=64, cache="contiguous", max_seq=130,
         kv_layout="hnd", q_len=3, window=(40, None)),
)


def _decode_samples(element: ElementKind) -> list[DecodeAttentionDescriptor]:
    return [DecodeAttentionDescriptor(**shape, element=element, save_lse=True)
            for shape in _SHAPES]


def _append_samples(element: ElementKind) -> list[KvAppendDescriptor]:
    return [KvAppendDescriptor(**{k: v for k, v in shape.items()
                                  if k not in ("heads_q", "window")}, element=element)
            for shape in _SHAPES]


DECODE_ATTENTION: OpContract[DecodeAttentionDescriptor] = OpContract(
    name="decode_attention",
    category=OpCategory.decode_attention,
    descriptor=DecodeAttentionDescriptor,
    args=DecodeAttentionArgs,
    bind=_bind_decode,
    summary="out = softmax(scale*q.k^T).v of q_len new tokens per sequence over its KV cache",
    signature=_decode_signature,
    sample_problems=_decode_samples,
    verification_inputs=_verification_inputs,
)

KV_APPEND: OpContract[KvAppendDescriptor] = OpContract(
    name="kv_append",
    category=OpCategory.decode_attention,
    descriptor=KvAppendDescriptor,
    args=KvAppendArgs,
    bind=_bind_append,
    summary="writes q_len new tokens' k and v per sequence into a contiguous or paged cache",
    signature=_append_signature,
    sample_problems=_append_samples,
    verification_inputs=_verification_inputs,
)

# No OPS yet: a contract module with OPS is a family of the registry table (tests/test_house.py),
# and this one joins it with its GPU SKUs. Issue 13 names two op families, decode_attention and
# kv_append; the table's naming rule (ops start with "<family>_") is to be settled then.
