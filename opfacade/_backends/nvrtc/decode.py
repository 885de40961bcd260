"""Launching native/decode_attention.cu (split-KV decode attention; its tiles of more than 8 rows
at D 128 on sm_90 are native/decode_wg.cu's), issue 13. The caches' addressing, kv_append and the
checked mode's kernel are kv_cache.py's.

A decode call is two launches on one stream: ``decode_partial`` over (kv head x row tile, chunk,
sequence), then ``decode_merge`` over (sequence, query head, new token). On sm_90 each launches
while the kernel before it ends and waits in the kernel for its writes. A batch of the 16-row
tile on a grid of many waves runs as two halves, each those two launches, the second half on a
stream forked from the call's and joined back (``splits_batch``). The partials live in
the workspace, sized for the descriptor's envelope (``workspace_bytes``). Everything the kernels
read about lengths and pages is device data: a call may be captured and replayed with new
seq_lens, page tables and batch composition, for any batch up to the envelope's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..._internal.device import device_arch, device_sm_count
from ..._internal.graph_replay import GraphedLaunches
from ..._internal.sku import Workspace
from ..._internal.stream_fork import forked
from ...types import ElementKind
from .compiler import ARCH_SPECIFIC
from .kv_cache import DecodeCache
from .launch import PackedLaunch, allow_shared, get_kernel, programmatic, resident_blocks

__all__ = ["CHUNK", "DIMS", "SOURCE", "WG_SOURCE", "Tile", "chunks", "decode_call",
           "kq_build", "mma_build", "row_tile", "shared_bytes", "span_for", "wgmma_on",
           "workspace_bytes"]

SOURCE = "decode_attention.cu"  # decode_partial, decode_merge
WG_SOURCE = "decode_wg.cu"  # decode_partial_*_128_<16|32>wg (sm_90a)
# Keys per chunk: kChunk, a constant (batch invariance rests on it, and bit stability on
# its not following the device). Each chunk costs its CTA a softmax pause and an epilogue,
# the step a row of f32 partials and its merge; fewer chunks leave fewer CTAs to spread.
# 512 read as fast as 256 or faster on both GPUs, 128 and 1024 slower (docs/DECODE.md,
# "decode.py's constants").
CHUNK = 512
THREADS = 128  # kThreads
# The merge kernel's threads (it is built with each), by the capacity's chunks: more slices
# of chunks in flight pay for long caches, small CTAs (more of them resident) for short
# ones and for batches of many sequences. The capacity picks, so one plan always sums in
# one order (docs/DECODE.md, "decode.py's constants").
MERGE_THREADS = ((16, 64), (32, 256), (64, 512), (None, 1024))  # (up to this many chunks, threads)
# The 64-thread merge's sums also come from decode_merge_<T>_rows (decode_merge.cuh), which
# merges a row with Dv / 4 threads, several rows a CTA, bit for bit as that merge does, for
# caches of at most ROWS_CHUNKS chunks (its threads load their first 4 with the maxima)
# in a grid that fits (docs/DECODE.md, "decode.py's constants").
MERGE_ROWS = True
ROWS_CHUNKS = 4  # decode_merge.cuh's kRowsEarly
ROWS_THREADS = 128  # decode_merge.cuh's kRowsThreads
GRID_X_MAX = (1 << 31) - 1
# The merge's CTAs launch while the partial kernel's last CTAs run and wait in the kernel for
# its writes (programmatic dependent launch, sm_90), rather than after it on the stream.
OVERLAP_MERGE = True
# The partial kernel in turn launches as a programmatic dependent of the stream's previous
# kernel (sm_90): its CTAs may start while that kernel ends (kv_append, the merge of the step
# before, a caller's kernel), and wait for it (follow_previous_grid) before touching memory.
# Where it pays: a caller's CUDA graph of steps, or direct launches; a prepared step's own
# graph replay waits for the stream's earlier work whatever its first node says.
PARTIAL_FOLLOWS_PREVIOUS = True
DIMS = (64, 128, 256)  # head dims the partial kernel is built for (K and V alike)
TILES = (4, 8)  # query rows per CTA tile of the CUDA-core partial kernel
# The tensor-core tile (decode_partial_*_16, mma.sync): 16 rows, built for the half types at
# D 64 and 128. It takes every kv head of more than 4 rows, where the 8-row CUDA-core tiles
# were compute-bound (H100, scripts/decode_variants.py: B64 S4096 q_len 4, 16 rows, 38% of a
# device copy against 78%; q_len 2, 8 rows, 70% against 85%).
MMA_TILE = 16
MMA_DIMS = (64, 128)
MMA_WARPS = THREADS // 32
# A 4-row partial CTA may run several consecutive chunks of its sequence (its span), loading
# the next chunk's first keys while it writes the last one's partials. Each chunk's partial
# is computed exactly as alone, so the span changes no bit and may follow the grid: a grid
# of a few waves becomes one wave of CTAs with spans (up to MAX_SPAN chunks a CTA), a grid
# of many stays at one chunk a CTA (docs/DECODE.md, "decode.py's constants").
MAX_SPAN = 4
# The kq tile (decode_partial_*_128_<4|8>kq_b*, native/decode_kq.cuh): every kv head of up to 8
# rows in f16/bf16 at D 128, on tensor cores with K and V as mma's A operand. Built for 3
# CTAs an SM (168 registers: best on grids of many waves for the 8-row build, level for the
# 4-row build) and for 4 (128 registers), which takes grids of at most KQ_FEW_WAVES of its
# waves. The builds compute alike, so the choice changes no bit. Kv heads of 16 rows stay on
# the 16-row tile (docs/DECODE.md, "decode.py's constants").
KQ_ROWS = 8
KQ_DIMS = (128,)
KQ_FEW_WAVES = 2
# The kq tile's one-wave build KQ_DEEP (``_d4``: 4 groups of keys in each warp's ring, where
# the 3- and 4-an-SM builds hold 2) takes the grids of KQ_DEEP_GRIDS: (more than, up to) CTAs
# an SM. On grids of few CTAs an SM each CTA streams its chunk alone, at what its loads in
# flight allow. Its arithmetic is the other builds', so the choice changes no bit. Two H200s,
# from CUDA graphs of steps (docs/DECODE.md, "Small grids"): 12-18% off every step of 16-64
# CTAs (B1 S1024 9.02 against 10.34 us) and 11-23% off every one of 256 CTAs (B8 S2048 21.1
# against 27.2-27.4 us), where three of four steps of 128 CTAs were slower (with the partial
# kernel a programmatic dependent; launched plainly, all faster), hence the gap between.
KQ_DEEP = "_d4"
KQ_DEEP_GRIDS = ((0.0, 0.5), (1.0, 2.0))
# Kv heads of up to KQ_LINE_ROWS rows (GQA 4 at one new token) take the kq tile's 4-row build
# (decode_partial_*_128_4kq_b*), whose lanes read K in whole 128-byte lines: its scores' free
# B columns hold the rows again over other quarters of D, so each load instruction reads 4
# keys x 128 bytes where the 8-row build reads 8 x 64 (two L2 requests a line). Its scores
# add two halves of D (another order, fixed by the descriptor's rows). On an H200 it read
# 0.5-2.3 points of a copy above the 8-row build at up to 4 rows (B64 S4096 99.7% against
# 98.5-98.6%) (docs/DECODE.md, "The kq tile's K in whole lines").
KQ_LINE_ROWS = 4
# The 16-row tile also builds with K and V staged through shared memory (``_16_staged``:
# each warp's load batches land by cp.async in a ring of STAGES of them, and V's first
# batches fly through the softmax; the register build spills at 168 registers, this one
# not at d 128). Each lane reads back its own fragments, so the bits are the register
# build's: grids of more than MMA_FEW_WAVES waves of the register build take the staged
# one. The same ring lost on the kq tile (docs/DECODE.md, "decode.py's constants").
STAGES = 3  # native: OPFACADE_MMA_STAGES
STAGED_VECTORS = 8  # 16-byte vectors a lane copies a batch
MMA_FEW_WAVES = 4
# The wgmma tile (decode_partial_*_128_16wg, native/decode_wg.cu): on sm_90 devices every kv
# head of more than KQ_ROWS rows at D 128 in f16/bf16, 16 rows a CTA, both products by wgmma
# from shared memory, K and V landing by cp.async in a ring of WG_STAGES blocks of WG_KEYS
# keys that the CTA's four warps share; kv heads of more than 16 rows take tiles of 32. On an
# H200 the step read 94% of a device copy at B64 S4096 q_len 4 where the 16-row mma.sync
# tile's read 88-89% (docs/DECODE.md, "The wgmma tile"). Its bits are its own (another order),
# and on sm_90 the descriptor alone picks it.
WG_TILE = 16
WG_ROWS_MOST = 32  # kv heads of more than WG_TILE rows take tiles of 32 (each reads the KV once)
WG_DIMS = (128,)
WG_STAGES = {WG_TILE: 3, WG_ROWS_MOST: 2}  # ring blocks by the tile's rows; native: kWgStages
WG_KEYS = 64  # native: kWgKeys
# A wgmma CTA may run WG_SPAN[rows] consecutive chunks (decode_wg.cu's *_spans kernels: its ring
# runs on into the next chunk, whose first copies then wait on no CTA start or epilogue; each
# chunk's partial as alone, so no bit changes): without a window, over caches of at least
# WG_SPAN_CHUNKS chunks, on grids of at least WG_SPAN_WAVES waves of one-chunk CTAs. The
# 32-row tile gained 3-7 points of a copy from spans of 4 (MQA B64 S32768 80.9-81.6% against
# 73.9-75.7%, the same with lengths spread over the cache +4); a window's few chunks a sequence
# (-16 to -25%) and spread lengths in caches of 8 chunks (q_len 8 B64 S4096, -10%) lost, hence
# the window and WG_SPAN_CHUNKS; the 16-row tile lost 1-2 points at spans of 2 and 4 (docs/
# DECODE.md, "decode.py's constants").
WG_SPAN = {WG_TILE: 1, WG_ROWS_MOST: 4}
WG_SPAN_WAVES = 4
WG_SPAN_CHUNKS = 16
# The batch in two halves, each a partial grid and its merge, on two streams (a fork and a
# join in the step's graph): one half's merge runs while the other's partial grid still
# streams, where one grid's merge waits for all of it. It gained 1.3-1.9 points of a copy
# at q_len 4 and lost on grids of a few waves, hence SPLIT_WAVES. The fork costs a prepared
# step's replay about 1.2 us of host time (scripts/decode_host_probe.py, one process; record
# catalog/probes/decode_host_H200.json) (docs/DECODE.md, "decode.py's constants").
SPLIT_TILES = ("mma", "wg")
SPLIT_WAVES = 8
# The wgmma tile's batches split on grids of any size (two sequences or more). So they did
# until the forty-second session without anyone choosing it: the occupancy query behind
# SPLIT_WAVES answered 0 CTAs for a kernel not yet allowed its shared memory. Measured then
# against one grid: B32 S4096 q_len 4 (7.8 waves) 91.5-91.7% of a copy against 89.1-90.0%,
# B16 S4096 and B2 S32768 (3.9 waves) alike (docs/DECODE.md, "decode.py's constants").
SPLIT_WAVES_WG = 0
DEFAULT_SHARED = 48 << 10  # dynamic shared memory a kernel has without opting in


def launcher(function, grid, block, args, stream: int, device: int, shared: int = 0,
             overlap_previous: bool = False) -> Callable[[], None]:
    """A launch packed once (``PackedLaunch``: one driver call per step, the decode loop's
    host time)."""
    return PackedLaunch(function, grid, block, args, stream, device, shared, overlap_previous)


def overlaps_merge(device: int) -> bool:
    """Whether the merge launches as a programmatic dependent of the partial kernel: sm_90 and
    newer (griddepcontrol), unless OVERLAP_MERGE is off (the variants script's baseline)."""
    return OVERLAP_MERGE and programmatic(device)


def partial_follows_previous(device: int) -> bool:
    """Whether the partial kernel launches as a programmatic dependent of the stream's previous
    kernel: sm_90 and newer, unless PARTIAL_FOLLOWS_PREVIOUS is off (a probe's baseline)."""
    return PARTIAL_FOLLOWS_PREVIOUS and programmatic(device)


def steps(launches: Callable[[int], list[Callable[[], None]]], stream: int, device: int
          ) -> Callable[[], None]:
    """The step's launches on ``stream``, replayed as one CUDA graph from the second call
    (``GraphedLaunches``: one driver call per step, and a graph replay costs the host less than
    a kernel launch: 3.2 against 5.8 us on an H100 machine, scripts/decode_variants.py)."""
    return GraphedLaunches(launches, stream, device)


def merge_threads_for(n_chunks: int) -> int:
    return next(threads for most, threads in MERGE_THREADS if most is None or n_chunks <= most)


def merges_in_rows(n_chunks: int) -> bool:
    """Whether a cache of ``n_chunks`` chunks merges in rows (the 64-thread merge's sums)."""
    return MERGE_ROWS and n_chunks <= ROWS_CHUNKS and merge_threads_for(n_chunks) == 64


def chunks(capacity: int) -> int:
    return -(-capacity // CHUNK)


@dataclass(frozen=True)
class Tile:
    """A partial CTA's tile of a kv head's query rows, and the kernel family that runs it:
    "cuda" (CUDA cores, TILES), "mma" (tensor cores, Q as mma's A operand, MMA_TILE), "kq"
    (tensor cores, K and V as mma's A operand, KQ_ROWS) or "wg" (wgmma, WG_TILE)."""

    rows: int
    kind: str = "cuda"

    def kernel(self, element: ElementKind, dim: int) -> str:
        """The partial kernel's name; decode_call appends the kq tile's build (``_b3``, ``_b4``,
        ``_d4``) and the spans kernels' ``_spans``."""
        return f"decode_partial_{element.value}_{dim}_{self.rows}" + (
            self.kind if self.kind in ("kq", "wg") else "")

    @property
    def source(self) -> str:
        """The native file whose kernel runs the tile."""
        return WG_SOURCE if self.kind == "wg" else SOURCE


def wgmma_on(device: int) -> bool:
    """Whether ``device`` runs decode_wg.cu's tiles: the architecture its sm_90a build is for."""
    return device_arch(device) == ARCH_SPECIFIC[WG_SOURCE]


def row_tile(rows: int, element: ElementKind, dim: int, wgmma: bool = False) -> Tile:
    """The tile for a kv head of ``rows`` query rows (group x q_len): the kq tile for up to 8
    where it is built (its 4-row build for up to KQ_LINE_ROWS); else up to 4 in one CUDA-core
    tile; more on the wgmma tile where it is built and ``wgmma`` (an sm_90 device), else on the
    16-row tensor-core tile where it is built, else in CUDA-core tiles of 8. The descriptor and
    the device's architecture fix it, so batch invariance holds."""
    half = element in (ElementKind.f16, ElementKind.bf16)
    if half and dim in KQ_DIMS and rows <= KQ_ROWS:
        return Tile(KQ_LINE_ROWS if rows <= KQ_LINE_ROWS else KQ_ROWS, "kq")
    if rows <= TILES[0]:
        return Tile(TILES[0])
    if half and wgmma and dim in WG_DIMS:  # 16 rows, or 32 a tile (one KV read for 32 rows)
        return Tile(WG_TILE if rows <= WG_TILE else WG_ROWS_MOST, "wg")
    if half and dim in MMA_DIMS:
        return Tile(MMA_TILE, "mma")
    return Tile(TILES[-1])


def shared_bytes(element: ElementKind, dim: int, tile: Tile, build: str = "") -> int:
    """The partial kernel's shared memory. CUDA-core tiles: the scores [CHUNK][rows] f32, then
    reused for the key groups' sums [groups][rows][dim] f32 (groups x dim = THREADS x the
    columns a thread holds), two buffers of each key's row offset [CHUNK] i64 (this chunk's
    and the next's, for a CTA that runs several) and the scaled queries [rows][dim] f32. The
    tensor-core tiles: the row offsets, each warp's row maxima and sums [warps][rows] f32, for
    the 16-row tile Q's fragments (rows x dim elements), then the warps' accumulators
    [warps][rows][dim] f32 or, in a staged ``build``, the warps' rings (which hold them)."""
    rows = tile.rows
    if tile.kind == "wg":  # alignment slack, the ring, Q, P (hi and lo), row offsets, maxima, sums
        return (1024 + WG_STAGES[rows] * 2 * WG_KEYS * dim * element.itemsize
                + rows * dim * element.itemsize + WG_KEYS * 2 * rows * element.itemsize
                + 8 * CHUNK + 3 * 4 * MMA_WARPS * rows)
    if tile.kind != "cuda":
        fragments = 2 * rows * dim if tile.kind == "mma" else 0
        per_warp = (STAGES * STAGED_VECTORS * 32 * 16 if build.endswith("_staged")
                    else 4 * rows * dim)
        return 8 * CHUNK + 4 * MMA_WARPS * rows * 2 + fragments + MMA_WARPS * per_warp
    vec = 16 // element.itemsize
    lanes = min(dim // vec, 32)
    groups = THREADS // lanes
    return 4 * max(CHUNK * rows, groups * rows * dim) + 2 * 8 * CHUNK + 4 * rows * dim


def span_for(ctas: int, resident: int) -> int:
    """Chunks per CUDA-core partial CTA for a grid of ``ctas`` one-chunk CTAs on a device holding
    ``resident`` of them at once: the waves it would take, if at most MAX_SPAN, else 1."""
    waves = -(-ctas // max(resident, 1))
    return waves if waves <= MAX_SPAN else 1


def kq_build(ctas: int, resident_at_4: int, sms: int) -> str:
    """The kq tile's build for a grid of ``ctas`` on a device of ``sms`` multiprocessors holding
    ``resident_at_4`` CTAs of the 4-an-SM build at once: the one-wave build KQ_DEEP on the grids
    of KQ_DEEP_GRIDS, else the 4-an-SM build for at most KQ_FEW_WAVES of its waves, else the
    3-an-SM one."""
    if any(above * sms < ctas <= most * sms for above, most in KQ_DEEP_GRIDS):
        return KQ_DEEP
    return "_b4" if ctas <= KQ_FEW_WAVES * resident_at_4 else "_b3"


def splits_batch(tile: Tile, sequences: int, ctas: int, resident: Callable[[], int]) -> bool:
    """Whether a step runs its batch as two halves on two streams: kv heads of the 16-row tile
    (SPLIT_TILES), at least two sequences, and a grid of ``ctas`` of at least SPLIT_WAVES
    waves of ``resident()`` CTAs (an occupancy query, asked only where the rest allows a
    split). Each half is the same kernels over its own sequences, so the bits are the whole
    batch's (batch invariance), and the choice may follow the grid."""
    waves = SPLIT_WAVES_WG if tile.kind == "wg" else SPLIT_WAVES
    return tile.kind in SPLIT_TILES and sequences >= 2 and ctas >= waves * max(resident(), 1)


def row_tiles(heads_q: int, heads_kv: int, q_len: int, tile: Tile) -> int:
    """The tiles of one kv head's query rows (its group's heads times the new tokens)."""
    return -(-(heads_q // heads_kv * q_len) // tile.rows)


def partial_ctas(cache: DecodeCache, tile: Tile, heads_q: int, q_len: int,
                 sequences: int) -> int:
    """The partial grid's CTAs at one chunk a CTA: (kv head x row tile, chunk, sequence)."""
    return (cache.heads_kv * row_tiles(heads_q, cache.heads_kv, q_len, tile)
            * chunks(cache.capacity) * sequences)


def resident_ctas(element: ElementKind, device: int, cache: DecodeCache, tile: Tile,
                  kernel: str) -> int:
    """CTAs of partial ``kernel`` (a register build, one-chunk shared memory) held at once.
    The kernel is first allowed its shared memory: past DEFAULT_SHARED the occupancy query
    answers for the kernel as allowed so far, which is 0 CTAs before it is allowed."""
    function = get_kernel(tile.source, kernel, device)
    shared = shared_bytes(element, cache.dim, tile)
    if shared > DEFAULT_SHARED:
        function = allow_shared(function, kernel, device, shared)
    return device_sm_count(device) * resident_blocks(function, THREADS, shared, device)


def wg_span(rows: int, n_chunks: int, windowed: bool, ctas: int, resident: int) -> int:
    """Chunks a wgmma CTA of ``rows`` rows runs over a cache of ``n_chunks`` chunks, for a grid
    of ``ctas`` one-chunk CTAs on a device holding ``resident`` at once: WG_SPAN's without a
    window, over at least WG_SPAN_CHUNKS chunks, on grids of at least WG_SPAN_WAVES waves;
    else 1."""
    spans = not windowed and n_chunks >= WG_SPAN_CHUNKS and ctas >= WG_SPAN_WAVES * resident
    return WG_SPAN[rows] if spans else 1


def mma_build(ctas: int, resident: int) -> str:
    """The 16-row tile's build for a grid of ``ctas`` on a device holding ``resident`` of its
    register build's CTAs at once: staged above MMA_FEW_WAVES of their waves."""
    return "_staged" if ctas > MMA_FEW_WAVES * resident else ""


def workspace_bytes(batch: int, heads_q: int, q_len: int, capacity: int, dim_v: int,
                    halves: bool = True) -> int:
    """The partials of ``batch`` sequences: acc (Dv floats) and (m, l) per query row and chunk;
    with ``halves``, enough for the two halves' partials where the batch splits
    (``splits_batch``): each half's are rounded up on their own."""
    rows = batch * heads_q * q_len * chunks(capacity)
    whole = Workspace.round_up(rows * dim_v * 4) + Workspace.round_up(rows * 2 * 4)
    if not halves or batch < 2:
        return whole
    half = -(-batch // 2)
    return max(whole, workspace_bytes(half, heads_q, q_len, capacity, dim_v, False)
               + workspace_bytes(batch - half, heads_q, q_len, capacity, dim_v, False))


def decode_call(element: ElementKind, device: int, cache: DecodeCache, sequences: int,
                heads_q: int, q_len: int, scale: float, window_left: int | None,
                q: int, q_strides: tuple[int, int, int], k: int, v: int, table: int,
                seq_lens: int, out: int, out_strides: tuple[int, int, int], lse: int | None,
                workspace: int, stream: int) -> Callable[[], None]:
    """One decode step over ``sequences`` sequences (strides in elements: batch, token, head):
    the partial and merge launches, or, where the batch splits (``splits_batch``), theirs for
    each half, the second half on a stream forked from ``stream`` and joined to it."""
    tile = row_tile(heads_q // cache.heads_kv * q_len, element, cache.dim, wgmma_on(device))

    def part(first: int, count: int, at: int) -> Callable[[int], list[Callable[[], None]]]:
        """The launches of sequences [first, first + count), with their partials at ``at``:
        every pointer moved to the part's first sequence (a cache's table rows, or its own rows
        where it has them; the pages are shared)."""
        size = element.itemsize
        rows_k = cache.capacity * cache.heads_kv * cache.dim * size  # a contiguous cache's row
        rows_v = cache.capacity * cache.heads_kv * cache.dim_v * size
        step_k, step_v, step_table = {"contiguous": (rows_k, rows_v, 0),
                                      "paged": (0, 0, 4 * cache.max_pages),
                                      "pointers": (8, 8, 0)}[cache.kind]
        return part_launches(
            element, device, cache, tile, count, heads_q, q_len, scale, window_left,
            q + first * q_strides[0] * size, q_strides, k + first * step_k, v + first * step_v,
            table + first * step_table if table else table, seq_lens + 4 * first,
            out + first * out_strides[0] * size, out_strides,
            None if lse is None else lse + 4 * first * q_len * heads_q, at)

    ctas = partial_ctas(cache, tile, heads_q, q_len, sequences)
    if not splits_batch(tile, sequences, ctas, lambda: resident_ctas(
            element, device, cache, tile, tile.kernel(element, cache.dim))):
        return steps(part(0, sequences, workspace), stream, device)
    half = -(-sequences // 2)
    first = part(0, half, workspace)
    second = part(half, sequences - half,
                  workspace + workspace_bytes(half, heads_q, q_len, cache.capacity, cache.dim_v,
                                              halves=False))

    def launches(on: int) -> list[Callable[[], None]]:
        side, fork, join = forked(on, device)
        return [*fork, *first(on), *second(side), *join]

    return steps(launches, stream, device)


def part_launches(element: ElementKind, device: int, cache: DecodeCache, tile: Tile,
                  sequences: int, heads_q: int, q_len: int, scale: float,
                  window_left: int | None, q: int, q_strides: tuple[int, int, int], k: int,
                  v: int, table: int, seq_lens: int, out: int,
                  out_strides: tuple[int, int, int], lse: int | None, workspace: int
                  ) -> Callable[[int], list[Callable[[], None]]]:
    """The two launches of a decode step over ``sequences`` sequences, on a stream to be named:
    ``decode_partial`` then ``decode_merge``."""
    group = heads_q // cache.heads_kv
    tiles = row_tiles(heads_q, cache.heads_kv, q_len, tile)
    n_chunks = chunks(cache.capacity)
    rows = sequences * heads_q * q_len * n_chunks
    ws_acc, ws_ml = workspace, workspace + Workspace.round_up(rows * cache.dim_v * 4)
    suffix = element.value
    name = tile.kernel(element, cache.dim)
    merge_threads = merge_threads_for(n_chunks)
    merge_grid, merge_block = (sequences, heads_q, q_len), merge_threads
    merge_kernel, merge_extra = f"decode_merge_{suffix}_{merge_threads}", ()
    rows_grid = -(-sequences * heads_q * q_len // (ROWS_THREADS // (cache.dim_v // 4)))
    if merges_in_rows(n_chunks) and rows_grid <= GRID_X_MAX:  # the 64-thread merge's sums
        merge_grid, merge_block = (rows_grid, 1, 1), ROWS_THREADS
        merge_kernel, merge_extra = f"decode_merge_{suffix}_rows", (np.int32(sequences),)
    merge = get_kernel(SOURCE, merge_kernel, device)
    cache_args = cache.args(k, v, table)
    partial_args = (np.uint64(q), *(np.int64(x) for x in q_strides), *cache_args,
                    np.uint64(seq_lens), np.uint64(ws_acc), np.uint64(ws_ml), np.int32(q_len),
                    np.int32(group), np.int32(tiles), np.int32(n_chunks), np.float32(scale),
                    np.int32(-1 if window_left is None else window_left))
    ctas = partial_ctas(cache, tile, heads_q, q_len, sequences)

    def resident(kernel: str) -> int:
        return resident_ctas(element, device, cache, tile, kernel)

    span, build = 1, ""
    if tile.kind == "kq":
        build = kq_build(ctas, resident(name + "_b4"), device_sm_count(device))
    elif tile.kind == "mma":
        build = mma_build(ctas, resident(name))
    elif tile == Tile(TILES[0]):  # the 4-row tiles may run spans (their *_spans kernels)
        span = span_for(ctas, resident(name))
    elif tile.kind == "wg":
        span = wg_span(tile.rows, n_chunks, window_left is not None, ctas, resident(name))
    if span > 1:
        build = "_spans"
        partial_args = (*partial_args, np.int32(span))
    name += build
    shared = shared_bytes(element, cache.dim, tile, build)
    partial = get_kernel(tile.source, name, device)
    if shared > DEFAULT_SHARED:
        partial = allow_shared(partial, name, device, shared)
    merge_args = (np.uint64(out), *(np.int64(x) for x in out_strides), np.uint64(lse or 0),
                  np.uint64(ws_acc), np.uint64(ws_ml), *cache_args, np.uint64(seq_lens),
                  np.int32(group), np.int32(q_len), np.int32(n_chunks), *merge_extra)
    partial_grid = (cache.heads_kv * tiles, -(-n_chunks // span), sequences)
    follows, overlap = partial_follows_previous(device), overlaps_merge(device)

    def launches(on: int) -> list[Callable[[], None]]:
        return [launcher(partial, partial_grid, (THREADS,), partial_args, on, device, shared,
                         overlap_previous=follows),
                launcher(merge, merge_grid, (merge_block,), merge_args, on, device,
                         overlap_previous=overlap)]

    return launches
