"""SDPA's edges (native/sdpa_edges.cu), which the cuDNN SDPA SKUs run around their graphs.

- ``DropoutDraw``: before a forward that was given a dropout counter, ``offset = counter`` and
  ``counter += stride`` (the descriptor's ``dropout_offset_stride``), so successive calls draw
  disjoint Philox streams and a replayed CUDA graph draws a fresh one each replay.
- ``PaddingRows``: after a padded forward, out rows (and stats) of every sequence with
  ``seq_len_kv == 0`` become 0 (and -inf), as every other row without keys is, and rows past
  ``seq_len_q`` become 0 (stats 0: finite, for the backward to read). cuDNN leaves the former
  unwritten. (Its backward writes grad_q 0 for such sequences itself.)

Both read their data (counter, lengths) on the device at run time and are enqueued on the run's
stream: no host synchronisation, and safe to capture in a CUDA graph. Each ``bind`` packs the
kernel's arguments once; the returned call only launches.

What the kernels index: (batch, head) pairs in ``i64`` over a block-stride loop (so any batch *
heads), element offsets in ``i64`` from ``i64`` strides, and ``int`` extents (the descriptor keeps
every extent below 2**31). Nothing here needs a limit of its own.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...types import ElementKind
from .launch import get_kernel, launch

__all__ = ["PADDING_ROWS_ELEMENTS", "SOURCE", "DropoutDraw", "PaddingRows"]

SOURCE = "sdpa_edges.cu"
THREADS = 256
# (batch, head) pairs per launch beyond which blocks loop: enough to fill any current GPU; a
# pair with keys costs its block one int load.
MAX_BLOCKS = 8192
PADDING_ROWS_ELEMENTS = (ElementKind.f32, ElementKind.f16, ElementKind.bf16)


class DropoutDraw:
    """``offset[0] = counter[0]; counter[0] += stride`` on one thread (wrapping modulo 2**64)."""

    name = "sdpa_dropout_draw"

    def __init__(self, device: int, stride: int):
        if stride <= 0:
            raise ValueError(f"stride must be positive, got {stride}")
        self.device, self.stride = device, stride

    def bind(self, counter: int, offset: int, stream: int) -> Callable[[], None]:
        kernel, device = get_kernel(SOURCE, self.name, self.device), self.device
        args = (np.uint64(counter), np.uint64(offset), np.int64(self.stride))

        def draw() -> None:
            launch(kernel, (1,), (32,), args, stream, device)

        return draw


class PaddingRows:
    """Writes the [B, H, S, D] ``rows`` (and the [B, H, S, 1] f32 ``stats``) the lengths leave
    out: 0 (stats 0) past ``seq_len_q``, and 0 (stats -inf) before it when ``seq_len_kv`` is 0.
    Strides are in elements, fixed at build time (the plan's layout); D has unit stride."""

    def __init__(self, element: ElementKind, device: int, shape: tuple[int, int, int, int],
                 rows_strides: tuple[int, ...], stats_strides: tuple[int, ...] | None):
        if element not in PADDING_ROWS_ELEMENTS:
            raise ValueError(f"element must be one of "
                             f"{[e.value for e in PADDING_ROWS_ELEMENTS]}, got {element.value}")
        batch, heads, seq, dim = shape
        self.device = device
        self.name = f"sdpa_padding_rows_{element.value}"
        self.blocks = max(1, min(batch * heads, MAX_BLOCKS))
        self.with_stats = stats_strides is not None
        stats = stats_strides[:3] if stats_strides is not None else (0, 0, 0)
        self.args = (np.int32(batch), np.int32(heads), np.int32(seq), np.int32(dim),
                     *(np.int64(s) for s in rows_strides[:3]), *(np.int64(s) for s in stats))

    def bind(self, rows: int, stats: int | None, seq_len_q: int, seq_len_kv: int, stream: int
             ) -> Callable[[], None]:
        if (stats is not None) != self.with_stats:
            raise ValueError("stats must be given exactly when stats strides were")
        kernel, device, grid = get_kernel(SOURCE, self.name, self.device), self.device, (
            self.blocks,)
        args = (np.uint64(rows), np.uint64(stats or 0), np.uint64(seq_len_q),
                np.uint64(seq_len_kv), *self.args)

        def fix_up() -> None:
            launch(kernel, grid, (THREADS,), args, stream, device)

        return fix_up
