"""What the decode_attention and kv_append families share (issue 13): the KV cache they read and
write, its envelope, how a call's cache tensors are bound and checked, and the verification
problems both draw from.

The cache comes in three forms (``cache``), each token-major ("nhd", FlashInfer's NHD) or
heads-major ("hnd"):

    contiguous  k_cache [B, max_seq, Hkv, D] (hnd: [B, Hkv, max_seq, D]), row s is sequence s
    paged       k_cache [num_pages, page_size, Hkv, D] (hnd: [num_pages, Hkv, page_size, D]) and
                page_table int32 [b, max_pages]: position p of sequence s is in page
                page_table[s, p // page_size], slot p % page_size
    pointers    k_cache, v_cache int64 [b]: each sequence's own [max_seq, Hkv, D] (hnd:
                [Hkv, max_seq, D]) contiguous cache at that device address

v_cache is shaped like k_cache with Dv last. A descriptor states an envelope: at most ``batch``
sequences, each up to ``max_seq`` tokens (paged: ``max_pages`` pages of ``page_size``). A plan
runs any batch within it; seq_lens and page tables are device data, read on the device only.

seq_lens int32 [b] counts the tokens each sequence holds, the step's q_len new ones included: new
token t of sequence s sits at position ``seq_lens[s] - q_len + t``. Checked mode
(``checked=True``) tests on the device that seq_lens lie in [q_len, capacity] (an empty
sequence, seq_len 0, passes too), that the page indices a sequence uses lie in
[0, num_pages), and that per-sequence addresses are non-null and 16-byte aligned, and raises
InvalidArgument naming the argument and the first bad index.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from .._internal.contract import Descriptor, TensorSpec
from .._internal.tensors import TensorView, argument_when, expect, wrap
from ..errors import InvalidArgument, ShapeMismatch
from ..types import ElementKind
from .attention_masks import ELEMENTS, MAX_EXTENT, floating_element

__all__ = [
    "CACHES",
    "ELEMENTS",
    "KV_LAYOUTS",
    "MAX_PAGE_SIZE",
    "MAX_Q_LEN",
    "SAMPLE_SHAPES",
    "KvCacheEnvelope",
    "cache_shape",
    "cache_specs",
    "cache_views",
    "check_lengths",
    "large_copy_scales",
    "violation",
    "required_view",
    "seq_lens_view",
    "token_view",
    "verification_inputs",
    "verification_lengths",
]

Cache = Literal["contiguous", "paged", "pointers"]
KvLayout = Literal["nhd", "hnd"]
CACHES: tuple[str, ...] = ("contiguous", "paged", "pointers")
KV_LAYOUTS: tuple[str, ...] = ("nhd", "hnd")
MAX_Q_LEN = 8  # speculative decoding's draft tokens per step
MAX_PAGE_SIZE = 256


class KvCacheEnvelope(Descriptor):
    """The cache envelope both families share, and its rules."""

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
        # A sequence holds its step's new tokens, so a non-empty one has at least q_len: with
        # more new tokens than the cache holds, only empty sequences would be valid.
        if self.q_len > self.capacity:
            raise ValueError(f"q_len {self.q_len} must be at most the cache's capacity "
                             f"{self.capacity} (a sequence holds the step's new tokens)")
        return self

    @field_validator("element")
    @classmethod
    def _floating(cls, element: ElementKind) -> ElementKind:
        return floating_element(element)

    @property
    def dim_v(self) -> int:
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def capacity(self) -> int:
        """The most tokens one sequence can hold."""
        if self.cache == "paged":
            return self.page_size * self.max_pages
        return self.max_seq


# ----------------------------------------------------------------------------- binding


def cache_shape(desc: KvCacheEnvelope, dim: int, rows: int) -> tuple[int, ...]:
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


def required_view(obj: Any, name: str) -> TensorView:
    if obj is None:
        raise InvalidArgument(f"{name} is required", argument=name)
    return wrap(obj, name)


def token_view(obj: Any, name: str, desc: KvCacheEnvelope, heads: int, dim: int,
            sequences: int | None = None, like: str | None = None) -> TensorView:
    """A [b, q_len, heads, dim] tensor of the step's tokens; b is the first one's."""
    view = required_view(obj, name)
    if view.ndim != 4:
        raise ShapeMismatch(f"{name} must be 4-D [b, {desc.q_len}, {heads}, {dim}], got shape "
                            f"{view.shape}", argument=name)
    b = view.shape[0] if sequences is None else sequences
    expect(view, name, shape=(b, desc.q_len, heads, dim), element=desc.element, like=like)
    return view


def seq_lens_view(obj: Any, batch: int, sequences: int, of: str) -> TensorView:
    """seq_lens: int32, one entry per sequence of ``of``, at most ``batch``."""
    view = required_view(obj, "seq_lens")
    if view.ndim != 1 or not 1 <= view.shape[0] <= batch:
        raise ShapeMismatch(f"seq_lens must be 1-D with 1 to batch = {batch} entries, got shape "
                            f"{view.shape}", argument="seq_lens")
    if view.shape[0] != sequences:
        raise ShapeMismatch(f"seq_lens must have one entry per sequence of {of} ({sequences}), "
                            f"got shape {view.shape}", argument="seq_lens")
    expect(view, "seq_lens", shape=view.shape, element=ElementKind.i32)
    return view


def cache_views(desc: KvCacheEnvelope, args, sequences: int, of: str
                ) -> dict[str, TensorView | None]:
    """The step's cache arguments: seq_lens (one per sequence of ``of``), k_cache and v_cache
    as the descriptor's form says, and the page table."""
    lengths = seq_lens_view(args.seq_lens, desc.batch, sequences, of)
    k_view, v_view = required_view(args.k_cache, "k_cache"), required_view(args.v_cache, "v_cache")
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
    return {"seq_lens": lengths, "k_cache": k_view, "v_cache": v_view, "page_table": table_view}


# ----------------------------------------------------------------------------- verification


def verification_lengths(desc: KvCacheEnvelope) -> np.ndarray:
    """seq_lens verify and the GPU tests use, a function of the descriptor: a full sequence, an
    empty one, one of exactly q_len tokens, one that ends inside a page or a chunk, in that
    cycle."""
    cycle = (desc.capacity, 0, desc.q_len, max(desc.q_len, desc.capacity // 3 + 1))
    return np.array([cycle[s % len(cycle)] for s in range(desc.batch)], np.int64)


def verification_pages(desc: KvCacheEnvelope) -> int:
    """Pages of the verification pool: every sequence's table row filled, plus spares, so that
    tables point at scattered pages."""
    return desc.batch * desc.max_pages + 3


def cache_specs(desc: KvCacheEnvelope, role: str) -> dict[str, TensorSpec]:
    rows = verification_pages(desc) if desc.cache == "paged" else desc.batch
    specs = {"k_cache": TensorSpec(cache_shape(desc, desc.head_dim, rows), desc.element, role),
             "v_cache": TensorSpec(cache_shape(desc, desc.dim_v, rows), desc.element, role)}
    if desc.cache == "paged":
        specs["page_table"] = TensorSpec((desc.batch, desc.max_pages), ElementKind.i32)
    return specs


def verification_inputs(desc: KvCacheEnvelope, inputs: dict[str, np.ndarray],
                         rng: np.random.Generator) -> dict[str, np.ndarray]:
    """seq_lens from the cycle above; a page table of distinct pages in a random order (spare
    pages and table entries past a sequence's length point anywhere in the pool)."""
    result = dict(inputs)
    result["seq_lens"] = verification_lengths(desc).astype(np.int32)
    if desc.cache == "paged":
        pool = rng.permutation(verification_pages(desc))
        result["page_table"] = pool[:desc.batch * desc.max_pages].reshape(
            desc.batch, desc.max_pages).astype(np.int32)
    return result


SAMPLE_SHAPES = (
    dict(batch=5, heads_q=8, heads_kv=2, head_dim=64, cache="contiguous", max_seq=200),
    dict(batch=4, heads_q=4, heads_kv=4, head_dim=128, cache="paged", page_size=16,
         max_pages=9, kv_layout="hnd"),
    dict(batch=3, heads_q=8, heads_kv=1, head_dim=64, cache="paged", page_size=64,
         max_pages=3, q_len=4),
    dict(batch=4, heads_q=6, heads_kv=2, head_dim=64, cache="contiguous", max_seq=130,
         kv_layout="hnd", q_len=3, window=(40, None)),
    # 8 rows a kv head at d 128 (decode's kq tile), over two of decode's chunks of 512 keys
    dict(batch=3, heads_q=16, heads_kv=4, head_dim=128, cache="contiguous", max_seq=700,
         q_len=2, window=(300, None)),
    # 16 and 32 rows a kv head at d 128 (on sm_90 decode's wgmma tiles of 16 and 32 rows, the
    # 16-row mma.sync tile elsewhere), over two chunks: no shape above reaches them
    dict(batch=3, heads_q=16, heads_kv=2, head_dim=128, cache="paged", page_size=32,
         max_pages=20, q_len=2),
    dict(batch=2, heads_q=8, heads_kv=1, head_dim=128, cache="contiguous", max_seq=600,
         q_len=4, window=(200, None)),
)


# ----------------------------------------------------------------------------- checked mode


def violation(rule: int, sequence: int, detail: int, value: int, capacity: int, q_len: int,
              pages: int) -> InvalidArgument:
    """The error for the first sequence that breaks a rule (the device check's verdict, and the
    host oracle's own check): 1 its length, 2 a page index it uses, 3/4 its k/v cache address."""
    name = {1: "seq_lens", 2: "page_table", 3: "k_cache", 4: "v_cache"}[rule]
    what = {
        1: f"seq_lens[{sequence}] = {value} must be 0 or within [q_len, capacity] = [{q_len}, "
           f"{capacity}]",
        2: f"page_table[{sequence}, {detail}] = {value} must be a page of the pool, within "
           f"[0, {pages})",
        3: f"k_cache[{sequence}] must be a non-null, 16-byte aligned address",
        4: f"v_cache[{sequence}] must be a non-null, 16-byte aligned address",
    }[rule]
    return InvalidArgument(what, argument=name)


def check_lengths(desc: KvCacheEnvelope, seq_lens: np.ndarray, page_table: np.ndarray | None,
                  pages: int) -> None:
    """Checked mode's rules on host arrays (the float64 oracle's check): raises the error the
    device check gives for the first sequence that breaks one."""
    for s, length in enumerate(np.asarray(seq_lens, np.int64).tolist()):
        if length != 0 and not desc.q_len <= length <= desc.capacity:
            raise violation(1, s, 0, length, desc.capacity, desc.q_len, pages)
        if page_table is None:
            continue
        used = np.asarray(page_table)[s, : -(-length // desc.page_size)]
        bad = np.flatnonzero((used < 0) | (used >= pages))
        if bad.size:
            raise violation(2, s, int(bad[0]), int(used[bad[0]]), desc.capacity, desc.q_len,
                            pages)


def large_copy_scales(names: tuple[str, ...], desc: KvCacheEnvelope) -> dict[str, float]:
    """The "large" distribution for ops that copy values: every input near the top of its
    type's range."""
    return {name: 2.0 ** (desc.element.max_exponent - 2) for name in names}
