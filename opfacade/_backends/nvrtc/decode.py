"""Launching native/decode_attention.cu: split-KV decode attention and kv_append (issue 13).

NOT YET RUN ON A GPU. The kernels compile for sm_90 and receive the parameters they declare
(tests/test_decode_kernels.py); no SKU uses them until a GPU session has verified them.

A decode call is two launches on one stream: ``decode_partial`` over (chunk, kv head x row tile,
sequence), then ``decode_merge`` over (sequence, query head, new token). The partials live in
the workspace, sized for the descriptor's envelope (``workspace_bytes``). Everything the kernels
read about lengths and pages is device data: a call may be captured and replayed with new
seq_lens, page tables and batch composition, for any batch up to the envelope's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..._internal.sku import Workspace
from ...types import ElementKind
from .launch import get_kernel, launch

__all__ = ["CHUNK", "KINDS", "ROWS", "SOURCE", "DecodeCache", "append_call", "decode_call",
           "workspace_bytes"]

SOURCE = "decode_attention.cu"
CHUNK = 256  # keys per chunk: kChunk
ROWS = 16  # query rows per CTA tile: kRows
THREADS = 128
MAX_DIM = 256  # kMaxDim: the query tile's row length
SHARED_BYTES = 4 * ROWS * (MAX_DIM + CHUNK)  # under the 48 KiB every launch may take
KINDS = {"contiguous": 0, "paged": 1, "pointers": 2}


@dataclass(frozen=True)
class DecodeCache:
    """A cache as the kernels address it (native/decode_attention.cu, "Caches")."""

    kind: str
    hnd: bool
    capacity: int
    heads_kv: int
    dim: int
    dim_v: int
    page_size: int = 0
    max_pages: int = 0
    pages: int = 0

    @classmethod
    def of(cls, desc, pages: int = 0) -> DecodeCache:
        """From a decode_attention or kv_append descriptor; ``pages``: the pool's size."""
        paged = desc.cache == "paged"
        return cls(desc.cache, desc.kv_layout == "hnd", desc.capacity, desc.heads_kv,
                   desc.head_dim, desc.dim_v, desc.page_size if paged else 0,
                   desc.max_pages if paged else 0, pages)

    def args(self, k: int, v: int, table: int) -> tuple:
        return (np.uint64(k), np.uint64(v), np.uint64(table), np.int32(KINDS[self.kind]),
                np.int32(self.hnd), np.int32(self.capacity), np.int32(self.page_size),
                np.int32(self.max_pages), np.int32(self.pages), np.int32(self.heads_kv),
                np.int32(self.dim), np.int32(self.dim_v))


def chunks(capacity: int) -> int:
    return -(-capacity // CHUNK)


def workspace_bytes(batch: int, heads_q: int, q_len: int, capacity: int, dim_v: int) -> int:
    """The partials of ``batch`` sequences: acc (Dv floats) and (m, l) per query row and chunk."""
    rows = batch * heads_q * q_len * chunks(capacity)
    return Workspace.round_up(rows * dim_v * 4) + Workspace.round_up(rows * 2 * 4)


def decode_call(element: ElementKind, device: int, cache: DecodeCache, sequences: int,
                heads_q: int, q_len: int, scale: float, window_left: int | None,
                q: int, q_strides: tuple[int, int, int], k: int, v: int, table: int,
                seq_lens: int, out: int, out_strides: tuple[int, int, int], lse: int | None,
                workspace: int, stream: int) -> Callable[[], None]:
    """The two launches of one decode step over ``sequences`` sequences (strides in elements:
    batch, token, head)."""
    group = heads_q // cache.heads_kv
    tiles = -(-group * q_len // ROWS)
    n_chunks = chunks(cache.capacity)
    rows = sequences * heads_q * q_len * n_chunks
    ws_acc, ws_ml = workspace, workspace + Workspace.round_up(rows * cache.dim_v * 4)
    partial = get_kernel(SOURCE, f"decode_partial_{element.value}", device)
    merge = get_kernel(SOURCE, f"decode_merge_{element.value}", device)
    partial_args = (np.uint64(q), *(np.int64(x) for x in q_strides), *cache.args(k, v, table),
                    np.uint64(seq_lens), np.uint64(ws_acc), np.uint64(ws_ml), np.int32(q_len),
                    np.int32(group), np.int32(n_chunks), np.float32(scale),
                    np.int32(-1 if window_left is None else window_left))
    merge_args = (np.uint64(out), *(np.int64(x) for x in out_strides), np.uint64(lse or 0),
                  np.uint64(ws_acc), np.uint64(ws_ml), np.uint64(seq_lens),
                  np.int32(cache.capacity), np.int32(cache.heads_kv), np.int32(group),
                  np.int32(q_len), np.int32(n_chunks), np.int32(cache.dim_v))
    partial_grid = (n_chunks, cache.heads_kv * tiles, sequences)
    merge_grid = (sequences, heads_q, q_len)

    def step() -> None:
        launch(partial, partial_grid, (THREADS,), partial_args, stream, device, SHARED_BYTES)
        launch(merge, merge_grid, (THREADS,), merge_args, stream, device)

    return step


def append_call(element: ElementKind, device: int, cache: DecodeCache, sequences: int,
                q_len: int, k_new: int, v_new: int, k: int, v: int, table: int, seq_lens: int,
                stream: int) -> Callable[[], None]:
    """One launch writing every sequence's new tokens (k_new, v_new dense [b, q_len, Hkv, D])."""
    kernel = get_kernel(SOURCE, f"kv_append_{element.value}", device)
    args = (np.uint64(k_new), np.uint64(v_new), *cache.args(k, v, table), np.uint64(seq_lens),
            np.int32(q_len))
    grid = (sequences, q_len, cache.heads_kv)

    def append() -> None:
        launch(kernel, grid, (THREADS,), args, stream, device)

    return append
