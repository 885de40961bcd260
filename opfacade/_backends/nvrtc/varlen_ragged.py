"""The kernels around cuDNN's ragged attention graphs (native/varlen_ragged.cu), bound once per
prepared call: each ``*_call`` packs its kernel's arguments and returns the launch.

Their device buffers (starts, lengths, offsets, padded stats) live in the cuDNN SKU's workspace,
laid out by ``RaggedWorkspace``; everything they read is device data, so they may be captured.
What they index: starts and lengths in ``int`` (tokens < 2**31, as cu_seqlens are int32), row
and element offsets in ``i64``; the grids put heads on y and sequences on z, which the SKU's
limits keep within GRID_YZ_MAX.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..._internal.sku import Workspace
from ...types import ElementKind
from .launch import get_kernel, launch

__all__ = ["SOURCE", "RaggedMask", "RaggedWorkspace", "backward_rows_call", "gather_stats_call",
           "forward_rows_call", "prepare_call"]

SOURCE = "varlen_ragged.cu"
ROW_THREADS = 128  # the row kernels' block: one thread per row of one (head, sequence)
PREPARE_THREADS = 256
MAX_GROUPS = 8  # ragged_prepare's stride parameters


@dataclass(frozen=True)
class RaggedMask:
    """The kernels' mask arguments: bottom-right alignment, and the window sides (-1 unbounded),
    in the reference convention (``attention_masks``)."""

    bottom_right: bool
    left: int
    right: int

    @classmethod
    def of(cls, desc) -> RaggedMask:
        left, right = desc.left_bound, desc.right_bound
        return cls(desc.alignment == "bottom_right", -1 if left is None else left,
                   -1 if right is None else right)

    def args(self) -> tuple:
        return np.int32(self.bottom_right), np.int64(self.left), np.int64(self.right)


@dataclass(frozen=True)
class RaggedWorkspace:
    """Byte offsets in the SKU's workspace: the graph's own, then the offsets (i64
    [MAX_GROUPS][B + 1]), starts and lengths (int32 [2][B] each), and the padded stats (f32
    [B, Hq, S_q]) when the graph reads or writes them. Each region starts on a 256-byte line."""

    graph: int
    offsets: int
    starts: int
    lens: int
    stats: int | None
    size: int

    @classmethod
    def plan(cls, graph_bytes: int, batch: int, heads_q: int, seq_q: int, stats: bool
             ) -> RaggedWorkspace:
        regions = [graph_bytes, MAX_GROUPS * (batch + 1) * 8, 2 * batch * 4, 2 * batch * 4,
                   batch * heads_q * seq_q * 4 if stats else 0]
        starts, at = [], 0
        for size in regions:
            starts.append(at)
            at += Workspace.round_up(size)
        return cls(starts[0], starts[1], starts[2], starts[3], starts[4] if stats else None,
                   at)


def _grid(rows: int, heads: int, batch: int) -> tuple[int, int, int]:
    return -(-rows // ROW_THREADS), heads, batch


def prepare_call(device: int, cu_q: int, cu_kv: int, entries: int, tokens_q: int,
                 tokens_kv: int, batch: int, max_q: int, max_kv: int, base: int,
                 regions: RaggedWorkspace, groups: tuple[tuple[int, int], ...], stream: int
                 ) -> Callable[[], None]:
    """Starts, lengths and the offsets of every (side, token stride) group, from the offsets."""
    if not 1 <= len(groups) <= MAX_GROUPS:
        raise ValueError(f"1 to {MAX_GROUPS} offset groups, got {len(groups)}")
    kv_sides = sum(side << g for g, (side, _) in enumerate(groups))
    strides = [stride for _, stride in groups] + [0] * (MAX_GROUPS - len(groups))
    args = (np.uint64(cu_q), np.uint64(cu_kv), np.int32(entries), np.int32(tokens_q),
            np.int32(tokens_kv), np.int32(batch), np.int32(max_q), np.int32(max_kv),
            np.uint64(base + regions.starts), np.uint64(base + regions.lens),
            np.uint64(base + regions.offsets), np.int32(len(groups)), np.int32(kv_sides),
            *(np.int64(s) for s in strides))
    kernel = get_kernel(SOURCE, "ragged_prepare", device)
    grid = (max(1, min(-(-(batch + 1) // PREPARE_THREADS), 1024)),)

    def prepare() -> None:
        launch(kernel, grid, (PREPARE_THREADS,), args, stream, device)

    return prepare


def forward_rows_call(element: ElementKind, device: int, out: int, out_strides: tuple[int, int],
                      lse: int | None, lse_ld: int, base: int, regions: RaggedWorkspace,
                      batch: int, heads: int, seq_q: int, dim_v: int, mask: RaggedMask,
                      stream: int) -> Callable[[], None]:
    """lse from the padded stats (when given), and out 0 / lse -inf on rows with no key."""
    stats = base + regions.stats if lse is not None else 0
    args = (np.uint64(out), np.uint64(lse or 0), np.uint64(stats),
            np.uint64(base + regions.starts), np.uint64(base + regions.lens), np.int32(batch),
            np.int32(heads), np.int32(seq_q), np.int32(dim_v), np.int64(out_strides[0]),
            np.int64(out_strides[1]), np.int64(lse_ld), *mask.args())
    kernel = get_kernel(SOURCE, f"ragged_forward_rows_{element.value}", device)
    grid = _grid(seq_q, heads, batch)

    def forward_rows() -> None:
        launch(kernel, grid, (ROW_THREADS,), args, stream, device)

    return forward_rows


def gather_stats_call(device: int, lse: int, lse_ld: int, base: int, regions: RaggedWorkspace,
                      batch: int, heads: int, seq_q: int, stream: int) -> Callable[[], None]:
    """The padded stats the backward graph reads, from lse (+inf where lse is -inf)."""
    args = (np.uint64(lse), np.uint64(base + regions.stats), np.uint64(base + regions.starts),
            np.uint64(base + regions.lens), np.int32(heads), np.int32(seq_q), np.int64(lse_ld))
    kernel = get_kernel(SOURCE, "ragged_gather_stats", device)
    grid = _grid(seq_q, heads, batch)

    def gather() -> None:
        launch(kernel, grid, (ROW_THREADS,), args, stream, device)

    return gather


def backward_rows_call(element: ElementKind, device: int, grads: tuple[int, int, int],
                       grad_strides: tuple[tuple[int, int], ...], base: int,
                       regions: RaggedWorkspace, batch: int, heads_q: int, heads_kv: int,
                       dim: int, dim_v: int, seq_q: int, seq_kv: int, mask: RaggedMask,
                       stream: int) -> Callable[[], None]:
    """grad_q 0 on query rows with no key; grad_k, grad_v 0 on keys no query sees."""
    (dq_st, dq_sh), (dk_st, dk_sh), (dv_st, dv_sh) = grad_strides
    args = (*(np.uint64(g) for g in grads), np.uint64(base + regions.starts),
            np.uint64(base + regions.lens), np.int32(batch), np.int32(heads_q),
            np.int32(heads_kv), np.int32(dim), np.int32(dim_v),
            *(np.int64(s) for s in (dq_st, dq_sh, dk_st, dk_sh, dv_st, dv_sh)), *mask.args())
    kernel = get_kernel(SOURCE, f"ragged_backward_rows_{element.value}", device)
    grid = _grid(max(seq_q, seq_kv), max(heads_q, heads_kv), batch)

    def backward_rows() -> None:
        launch(kernel, grid, (ROW_THREADS,), args, stream, device)

    return backward_rows
