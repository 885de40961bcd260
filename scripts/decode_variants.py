"""Times builds of native/decode_attention.cu with other tuning knobs (OPFACADE_DECODE_UNROLL,
OPFACADE_DECODE_MIN_BLOCKS) on the bench's decode shapes, through the real plans: KV bandwidth
as a fraction of a device copy, and host microseconds per prepared step and per run(). The knobs
change no sum's order, so every variant's output is checked bitwise against the default build's
(except where a variant picks another tile, which sums in another order).

    python3 scripts/decode_variants.py [out.json] [--quick | --occupancy | --streaming | --mma
                                       | --overlap | --overlap-ab | --span | --span-many
                                       | --inflight | --dense-spans | --chunk
                                       | --mma4 | --waves | --span-dense
                                       | --chunk512 | --chunk-other
                                       | --v-early | --kq | --lu | --kq-q | --merge-early
                                       | --staged
                                       | --merge-64 | --kq-pairs | --partials-l2
                                       | --merge-rows | --split | --offsets
                                       | --paged-form=DIR | --tree=DIR | --wg | --wg-stages
                                       | --mma-few | --mma-many | --occupancy16=DIR
                                       | --masks [--fast-exp=DIR]
                                       | --many-rows [--variant=LABEL@DIR ...]
                                       | --tree-vs=DIR | --wg-spans | --wg-span-most
                                       | --kq-lines | --kq-hints | --kq-b4]
                                       [--mma-only] [--parts] [--kq-cases] [--set-aside=BYTES|max]
                                       [--before=DIR]
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from decode_builds import load_build, use_module  # beside this script, as is noop_launch
from noop_launch import noop_kernel  # scripts/noop_launch.py, beside this script
from probe_record import write_to_argument  # beside this script

from opfacade import DecodeAttentionArgs, DecodeAttentionDescriptor, DecodeAttentionPlan
from opfacade._backends.nvrtc import decode as kernels
from opfacade._bench.device_state import device_state, format_state


def flag_value(name: str) -> str | None:
    """VALUE of a ``--name=VALUE`` argument, or None."""
    return next((arg.split("=", 1)[1] for arg in sys.argv if arg.startswith(f"--{name}=")), None)


def interleaved(others: dict[str, tuple]) -> dict[str, tuple]:
    """This tree's build (the default) and each of ``others`` (label: build options), then all
    of them again: two passes, interleaved, so that a drift of the GPU lands on every build."""
    return {"this tree (default)": (), **others, "default again": (),
            **{f"{label} again": options for label, options in others.items()}}

# Each mode's record (catalog/probes/) names the commit it ran at: a mode's "default" is the
# build of that commit. (--waves and --chunk512 ran at 7919c26, when the chunk was 256 and the
# half types' one-chunk 4-row tiles had a six-block build an H200 took: "512 dense" there ran
# that build's -D flags through its dense kernels, "512 u4 b5" and "u2 b7" the plain ones.
# --ring-hint, which compared the staged ring with and without its L2 evict-first policy, ran
# at 9891cbc, when a build macro chose the policy; it went with the macro.)
# The build's own per-tile choice first; then every tile at one setting (what it was chosen
# against: docs/PERF-NOTES.md has the H100 figures).
VARIANTS = {"per tile (default)": (),
            "u4 b1": ("-DOPFACADE_DECODE_UNROLL=4", "-DOPFACADE_DECODE_MIN_BLOCKS=1"),
            "u4 b5": ("-DOPFACADE_DECODE_UNROLL=4", "-DOPFACADE_DECODE_MIN_BLOCKS=5"),
            "u2 b1": ("-DOPFACADE_DECODE_UNROLL=2", "-DOPFACADE_DECODE_MIN_BLOCKS=1"),
            "streaming loads": ("-DOPFACADE_STREAMING=1",)}
if "--quick" in sys.argv:
    VARIANTS = {"per tile (default)": ()}
if "--occupancy" in sys.argv:  # more CTAs per SM for the 4-row tiles (fewer registers)
    VARIANTS = {"per tile (default)": (),
                "u4 b6": ("-DOPFACADE_DECODE_UNROLL=4", "-DOPFACADE_DECODE_MIN_BLOCKS=6"),
                "u4 b8": ("-DOPFACADE_DECODE_UNROLL=4", "-DOPFACADE_DECODE_MIN_BLOCKS=8"),
                "u2 b8": ("-DOPFACADE_DECODE_UNROLL=2", "-DOPFACADE_DECODE_MIN_BLOCKS=8")}
if "--streaming" in sys.argv:
    VARIANTS = {"per tile (default)": (), "streaming loads": ("-DOPFACADE_STREAMING=1",)}
# The tensor-core tile at 2 blocks an SM, and the CUDA-core 8-row tiles it replaced for kv heads
# of 5-16 rows (another tile sums in another order: its bits are not compared).
# The merge launched after the partial kernel on the stream, as before programmatic dependent
# launch (same kernels, same bits).
PATCHES = {"cuda-core tiles of 8": {"row_tile": lambda rows, element, dim: kernels.Tile(
               4 if rows <= 4 else 8)},
           "merge after partial": {"OVERLAP_MERGE": False},
           "one chunk a CTA": {"MAX_SPAN": 1}, "one chunk a CTA again": {"MAX_SPAN": 1},
           "kernel before spans": {"MAX_SPAN": 1}, "kernel before spans again": {"MAX_SPAN": 1},
           "span 2 always": {"span_for": lambda ctas, resident: 2},
           "span 2 always again": {"span_for": lambda ctas, resident: 2},
           "span 4 always": {"span_for": lambda ctas, resident: 4},
           "span 4 always again": {"span_for": lambda ctas, resident: 4}}
OTHER_ORDER = {"cuda-core tiles of 8"}  # variants whose sums run in another order
if "--overlap" in sys.argv:
    VARIANTS = {"per tile (default)": (), "merge after partial": (), "overlap again": ()}
if "--mma" in sys.argv:
    VARIANTS = {"per tile (default)": (), "mma b2": ("-DOPFACADE_DECODE_MMA_MIN_BLOCKS=2",),
                "cuda-core tiles of 8": ()}
# CUDA-core CTAs running several chunks (the default, decode.MAX_SPAN) against one chunk a CTA,
# each twice, interleaved (same bits).
# (A variant's "source=PATH" option compiles that file instead of native/decode_attention.cu,
# with the same launches: a kernel from before the spans ignores the span parameter.)
if "--span" in sys.argv:
    BEFORE = "source=.scratch/decode_attention_before_spans.cu"
    VARIANTS = {"spans (default)": (), "one chunk a CTA": (), "kernel before spans": (BEFORE,),
                "spans b4": ("-DOPFACADE_DECODE_MIN_BLOCKS=4",), "spans again": (),
                "one chunk a CTA again": (), "kernel before spans again": (BEFORE,)}
CASES = [(64, 4096, "contiguous", 0), (64, 4096, "paged", 16), (1, 32768, "contiguous", 0),
         (256, 1024, "contiguous", 0), (8, 32768, "paged", 64), (64, 4096, "contiguous4", 0),
         (64, 4096, "paged4", 16), (64, 4096, "contiguous2", 0), (8, 32768, "contiguous4", 0)]
if "--span" in sys.argv:  # the grids of a few waves, where spans apply, and two of many
    CASES = [(1, 32768, "contiguous", 0), (1, 32768, "paged", 16), (2, 32768, "contiguous", 0),
             (4, 16384, "contiguous", 0), (64, 4096, "contiguous", 0), (8, 32768, "paged", 64),
             (256, 1024, "contiguous", 0),
             # 8-row and f32 tiles: group 8 at d 256 in bf16, f32 at d 128 with groups 4 and 8
             (16, 8192, "contiguous", 0, {"heads_q": 64, "head_dim": 256}),
             (1, 32768, "contiguous", 0, {"element": "f32"}),
             (16, 8192, "contiguous", 0, {"element": "f32"}),
             (16, 8192, "contiguous", 0, {"element": "f32", "heads_q": 64})]
# Spans forced on grids of many waves (span_for keeps those at one chunk a CTA): the short caches'
# rows, paged among them, where each CTA's start (length, then page table, then the first keys)
# is paid per chunk. Each variant twice, interleaved by variant (same bits).
if "--span-many" in sys.argv:
    VARIANTS = {"spans (default)": (), "span 2 always": (), "span 4 always": (),
                "spans again": (), "span 2 always again": (), "span 4 always again": ()}
    CASES = [(256, 1024, "contiguous", 0), (256, 1024, "paged", 16), (256, 1024, "paged", 64),
             (64, 4096, "paged", 16), (8, 32768, "paged", 64), (64, 4096, "contiguous", 0)]
# More loads in flight per thread for the 4-row tiles (an H200 reads 43% faster than an H100 and
# its bench rows read at ~80% of a copy, where an H100's read at 90-95%): batches of 8 vectors,
# with the blocks an SM the compiler must fit; the default build twice, first and last.
if "--inflight" in sys.argv:
    six = ("-DOPFACADE_DECODE_UNROLL=2", "-DOPFACADE_DECODE_MIN_BLOCKS=6")
    VARIANTS = {"per tile (default)": (), "u2 b6": six,
                "u8 b4": ("-DOPFACADE_DECODE_UNROLL=8", "-DOPFACADE_DECODE_MIN_BLOCKS=4"),
                "default again": (), "u2 b6 again": six}
    CASES = [(64, 4096, "contiguous", 0), (64, 4096, "paged", 16), (256, 1024, "paged", 16),
             (8, 32768, "paged", 64), (1, 32768, "contiguous", 0)]
# The half types' spans kernels in their dense build (the current source) against the source
# before it (7052625's, kept by the caller at .scratch/decode_before_dense.cu), each twice, on the
# grids that run spans (same bits).
if "--dense-spans" in sys.argv:
    BEFORE_DENSE = "source=.scratch/decode_before_dense.cu"
    VARIANTS = {"current (default)": (), "before dense": (BEFORE_DENSE,), "current again": (),
                "before dense again": (BEFORE_DENSE,)}
    CASES = [(1, 32768, "contiguous", 0), (1, 32768, "paged", 16), (1, 32768, "paged", 64),
             (2, 32768, "contiguous", 0), (4, 16384, "contiguous", 0)]
# Chunks of 512 and 1024 keys against 256 (a chunk's CTA pays its start, softmax pause and end
# once per chunk, and the partials and the merge shrink with the chunks' count): another chunk
# sums in another order, so the bits are not compared. The tensor-core tile holds a chunk's
# scores in registers: at 512 it spills (92 bytes at 3 blocks an SM, 32 at 2).
if "--chunk" in sys.argv:
    def chunk(keys: int, *more: str) -> tuple[str, ...]:
        return (f"-DOPFACADE_DECODE_CHUNK={keys}", *more)
    VARIANTS = {"chunk 256 (default)": (), "chunk 512": chunk(512), "chunk 1024": chunk(1024),
                "chunk 512 mma b2": chunk(512, "-DOPFACADE_DECODE_MMA_MIN_BLOCKS=2"),
                "chunk 256 again": (), "chunk 512 again": chunk(512)}
    PATCHES = {name: {"CHUNK": int(options[0].split("=")[1])}
               for name, options in VARIANTS.items() if options}
    OTHER_ORDER = set(PATCHES)
    CASES = [(64, 4096, "contiguous", 0), (64, 4096, "paged", 16), (256, 1024, "contiguous", 0),
             (256, 1024, "paged", 16), (8, 32768, "paged", 64), (1, 32768, "contiguous", 0),
             (1, 32768, "paged", 16), (64, 4096, "contiguous4", 0)]


def forced_tile(tile, dims: tuple[int, ...], most_rows: int, default=kernels.row_tile):
    """A row_tile that puts kv heads of at most ``most_rows`` rows of a half type at ``dims``
    on ``tile``, and every other on decode.py's choice."""
    def row_tile(rows, element, dim):
        if element.value in ("f16", "bf16") and dim in dims and rows <= most_rows:
            return tile
        return default(rows, element, dim)
    return row_tile


# The tensor-core tile for kv heads of 4 rows too (q_len 1, GQA 4): an H200's CUDA-core tile
# issued an instruction on 73% of its cycles under ncu (72% of the SMs' compute throughput, at
# 62.5% of the DRAM peak), where cuDNN's tensor-core kernel used 22%. The tile sums in another
# order: the bits are not compared. Same cubin for every variant.
if "--mma4" in sys.argv:
    _mma_for_four = forced_tile(kernels.Tile(kernels.MMA_TILE, "mma"), kernels.MMA_DIMS,
                                kernels.MMA_TILE)
    VARIANTS = {"per tile (default)": (), "tensor cores for 4 rows": (), "default again": (),
                "tensor cores for 4 rows again": ()}
    PATCHES = {name: {"row_tile": _mma_for_four} for name in VARIANTS if "tensor" in name}
    OTHER_ORDER = set(PATCHES)
    CASES = [(64, 4096, "contiguous", 0), (64, 4096, "paged", 16), (256, 1024, "contiguous", 0),
             (256, 1024, "paged", 16), (8, 32768, "paged", 64), (1, 32768, "contiguous", 0),
             (1, 32768, "paged", 16), (64, 4096, "contiguous", 0, {"heads_q": 16})]
# Whole waves: every bench shape has 262144 tokens, so 8192 one-chunk CTAs, 10.34 waves of an
# H200's 792 dense slots (12.41 of an H100's 660 default ones). The last, partial wave runs few
# CTAs an SM, each holding its own loads in flight. Batches that fill whole waves, chunks of
# 128 keys (twice the CTAs: a smaller last wave), and seven blocks an SM (8.87 waves).
if "--waves" in sys.argv:
    seven = ("-DOPFACADE_DECODE_UNROLL=2", "-DOPFACADE_DECODE_MIN_BLOCKS=7")
    VARIANTS = {"per tile (default)": (), "chunk 128": ("-DOPFACADE_DECODE_CHUNK=128",),
                "u2 b7": seven, "default again": (), "chunk 128 again":
                ("-DOPFACADE_DECODE_CHUNK=128",)}
    PATCHES = {"chunk 128": {"CHUNK": 128}, "chunk 128 again": {"CHUNK": 128}}
    OTHER_ORDER = {"chunk 128", "chunk 128 again"}
    CASES = [(62, 4096, "contiguous", 0), (64, 4096, "contiguous", 0),
             (66, 4096, "contiguous", 0), (68, 4096, "contiguous", 0),
             (64, 4096, "paged", 16), (256, 1024, "paged", 16), (1, 32768, "contiguous", 0),
             (64, 4096, "contiguous4", 0)]
# Spans on the grids of many waves, on an H200: a chunk's CTA start and end measured at about
# 5 us of the ~29 us a one-chunk CTA holds its slot there (chunks of 128 keys read at 71% of a
# copy, of 256 at 85%: --waves). A spans CTA resolves the next chunk's rows and loads its first
# K batch during this chunk's end. The spans kernel in its default build and in the dense one
# (u2 b6), spans of 2 and 4 (same bits).
if "--span-dense" in sys.argv:
    six = ("-DOPFACADE_DECODE_UNROLL=2", "-DOPFACADE_DECODE_MIN_BLOCKS=6")
    VARIANTS = {"per tile (default)": (), "span 2 always": (), "span 4 always": (),
                "dense span 2": six, "dense span 4": six, "default again": (),
                "dense span 2 again": six}
    two, four = (lambda ctas, resident: 2), (lambda ctas, resident: 4)
    PATCHES = {"span 2 always": {"span_for": two}, "span 4 always": {"span_for": four},
               "dense span 2": {"span_for": two}, "dense span 4": {"span_for": four},
               "dense span 2 again": {"span_for": two}}
    CASES = [(64, 4096, "contiguous", 0), (64, 4096, "paged", 16), (256, 1024, "contiguous", 0),
             (256, 1024, "paged", 16), (8, 32768, "paged", 64), (1, 32768, "contiguous", 0)]
# Chunks of 512 on an H200, where they lost 5 points of a copy on the grids of many waves
# (--chunk) while an H100 read the same or better on every row: the dense build, the default
# one (u4 b5), and seven blocks (u2 b7), at batches filling 4.97, 5.17 and 5.49 waves of 792.
if "--chunk512" in sys.argv:
    c512 = "-DOPFACADE_DECODE_CHUNK=512"
    VARIANTS = {"per tile (default)": (), "512 dense": (c512,), "512 u4 b5": (c512,),
                "512 u2 b7": (c512, "-DOPFACADE_DECODE_UNROLL=2",
                              "-DOPFACADE_DECODE_MIN_BLOCKS=7"),
                "default again": (), "512 dense again": (c512,)}
    PATCHES = {name: {"CHUNK": 512} for name in VARIANTS if name.startswith("512")}
    OTHER_ORDER = set(PATCHES)
    CASES = [(62, 4096, "contiguous", 0), (64, 4096, "contiguous", 0),
             (68, 4096, "contiguous", 0), (8, 32768, "paged", 64), (256, 1024, "paged", 16),
             (1, 32768, "contiguous", 0), (64, 4096, "contiguous4", 0)]
# Chunks of 512 (the default since the twenty-fifth session) against 256 on the tiles and
# types the bench's shapes do not run: f32 and f16, d 64 and 256, 8-row tiles (group 8 at
# d 256), the tensor-core tile at q_len 2, and a grid of a few waves that runs spans.
if "--chunk-other" in sys.argv:
    c256 = ("-DOPFACADE_DECODE_CHUNK=256",)
    VARIANTS = {"chunk 512 (default)": (), "chunk 256": c256, "chunk 512 again": (),
                "chunk 256 again": c256}
    PATCHES = {name: {"CHUNK": 256} for name in VARIANTS if name.startswith("chunk 256")}
    OTHER_ORDER = set(PATCHES)
    CASES = [(64, 4096, "contiguous", 0, {"element": "f32"}),
             (64, 4096, "contiguous", 0, {"element": "f16", "head_dim": 64}),
             (32, 4096, "paged", 16, {"head_dim": 256}),
             (16, 4096, "contiguous", 0, {"heads_q": 64, "head_dim": 256}),
             (64, 4096, "contiguous2", 0, {"element": "f16"}),
             (2, 32768, "contiguous", 0), (4, 16384, "paged", 16),
             (64, 4096, "contiguous", 0)]
# V's first two load batches issued before the softmax (the current source) against one (the
# source before it, kept by the caller at .scratch/decode_head.cu): the softmax's pause holds
# twice the bytes in flight. Same sums, same bits.
if "--v-early" in sys.argv:
    HEAD = "source=.scratch/decode_head.cu"
    VARIANTS = {"current (default)": (), "one V batch": (HEAD,), "current again": (),
                "one V batch again": (HEAD,)}
    CASES = [(64, 4096, "contiguous", 0), (64, 4096, "paged", 16), (256, 1024, "contiguous", 0),
             (256, 1024, "paged", 16), (8, 32768, "paged", 64), (1, 32768, "contiguous", 0),
             (1, 32768, "paged", 16), (2, 32768, "contiguous", 0),
             (64, 4096, "contiguous", 0, {"element": "f32"})]
# The kq tile (decode.py's KQ_DIMS) against the tiles before it (another order: the max
# difference is printed), and each of its two builds forced on every grid (the same order: the
# bits are compared with the default's, which picks a build by the grid).
if "--kq" in sys.argv:
    VARIANTS = {"per tile (default)": (), "tiles before kq": (), "kq 3 CTAs an SM": (),
                "kq 4 CTAs an SM": (), "default again": (), "tiles before kq again": ()}
    PATCHES = {"tiles before kq": {"KQ_DIMS": ()}, "tiles before kq again": {"KQ_DIMS": ()},
               "kq 3 CTAs an SM": {"KQ_FEW_WAVES": 0}, "kq 4 CTAs an SM": {"KQ_FEW_WAVES": 1e9}}
    OTHER_ORDER = {"tiles before kq", "tiles before kq again"}
    CASES = [(64, 4096, "contiguous", 0), (64, 4096, "paged", 16), (256, 1024, "paged", 16),
             (8, 32768, "paged", 64), (1, 32768, "contiguous", 0), (1, 32768, "paged", 16),
             (2, 32768, "contiguous", 0), (4, 16384, "paged", 16), (64, 4096, "contiguous2", 0),
             (64, 4096, "contiguous", 0, {"element": "f16"})]
# The last-use hint on the streamed loads (the default) against evict-first (same bits).
if "--lu" in sys.argv:
    evict_first = ("-DOPFACADE_STREAMING_EVICT_FIRST=1",)
    VARIANTS = {"per tile (default)": (), "evict first": evict_first, "default again": (),
                "evict first again": evict_first}
    CASES = [(64, 4096, "contiguous", 0), (256, 1024, "paged", 16), (8, 32768, "paged", 64),
             (1, 32768, "contiguous", 0), (1, 32768, "paged", 16),
             (64, 4096, "contiguous4", 0), (64, 4096, "paged4", 16),
             (64, 4096, "contiguous", 0, {"element": "f32"}),
             (64, 4096, "contiguous", 0, {"head_dim": 64}),
             (32, 4096, "contiguous", 0, {"head_dim": 256})]
# The kq tile's Q in 16-byte loads (the default) against element loads (same bits).
if "--kq-q" in sys.argv:
    by_element = ("-DOPFACADE_KQ_Q_BY_ELEMENT=1",)
    VARIANTS = {"per tile (default)": (), "q by element": by_element, "default again": (),
                "q by element again": by_element}
    CASES = [(64, 4096, "contiguous", 0), (64, 4096, "paged", 16), (256, 1024, "paged", 16),
             (8, 32768, "paged", 64), (1, 32768, "contiguous", 0), (1, 32768, "paged", 16),
             (64, 4096, "contiguous2", 0)]
# The merge loading each slice's first chunks before the chunks' largest max is known (the
# default) against the merge before it (the source before, kept by the caller at
# .scratch/merge_before.cu with decode_merge.cuh inlined). Same sums in the same order.
if "--merge-early" in sys.argv:
    BEFORE = "source=.scratch/merge_before.cu"
    VARIANTS = {"early loads (default)": (), "merge before": (BEFORE,), "default again": (),
                "merge before again": (BEFORE,)}
    CASES = [(64, 4096, "contiguous", 0), (256, 1024, "paged", 16), (8, 32768, "paged", 64),
             (1, 32768, "contiguous", 0), (1, 32768, "paged", 16), (1, 32768, "paged", 64),
             (64, 4096, "contiguous4", 0), (64, 4096, "paged4", 16),
             (64, 4096, "contiguous", 0, {"element": "f32"})]
    if "--b1" in sys.argv:  # the few-wave rows only, each variant four times
        VARIANTS = {f"{name} {n}": options for n in range(4) for name, options in
                    (("early loads (default)", ()), ("merge before", (BEFORE,)))}
        CASES = [(1, 32768, "contiguous", 0), (1, 32768, "paged", 16), (1, 32768, "paged", 64),
                 (2, 32768, "contiguous", 0)]
# The 16-row tile's staged build (K and V through a ring of load batches in shared memory,
# cp.async; decode.py's MMA_FEW_WAVES picks it) against its register build, and staged on every
# grid. (At exp/staged-both the kq tile's 3-CTA build had one too, which "registers" turned
# off: the q_len 1 and 2 rows.) The same fragments, so the same bits; "ragged" cases
# give each sequence a random length, so chunks end part-way (zeros past the keys).
if "--staged" in sys.argv:
    VARIANTS = {"staged (default)": (), "registers": (), "mma staged always": (),
                "staged again": (), "registers again": ()}
    PATCHES = {name: {"MMA_FEW_WAVES": 1e9} for name in ("registers", "registers again")}
    PATCHES["mma staged always"] = {"MMA_FEW_WAVES": 0}
    CASES = [(64, 4096, "contiguous", 0), (64, 4096, "paged", 16), (256, 1024, "paged", 16),
             (8, 32768, "paged", 64), (1, 32768, "contiguous", 0), (2, 32768, "contiguous", 0),
             (64, 4096, "contiguous2", 0), (64, 4096, "contiguous", 0, {"element": "f16"}),
             (64, 4096, "contiguous4", 0), (64, 4096, "paged4", 16),
             (16, 4096, "contiguous4", 0), (32, 4096, "contiguous4", 0),
             (1, 32768, "contiguous4", 0), (64, 4096, "contiguous4", 0, {"head_dim": 64}),
             (64, 4096, "contiguous4", 0, {"element": "f16"}),
             (64, 4096, "paged4", 16, {"ragged": True}),
             (64, 4096, "contiguous", 0, {"ragged": True})]
# The merge's threads for caches of 33-64 chunks (S32768 at chunks of 512): 256 (the default:
# 8 slices of 8 chunks, 4 loaded early) against 512 (16 slices of 4: every chunk early) and
# 1024 (32 of 2). Another slice count sums in another order: the max difference is printed.
if "--merge-64" in sys.argv:
    at_512 = ((16, 64), (32, 256), (64, 512), (None, 1024))
    at_1024 = ((16, 64), (32, 256), (None, 1024))
    VARIANTS = {"merge 256 (default)": (), "merge 512": (), "merge 1024": (),
                "merge 256 again": (), "merge 512 again": (), "merge 1024 again": ()}
    PATCHES = {name: {"MERGE_THREADS": at_512 if "512" in name else at_1024}
               for name in VARIANTS if "256" not in name}
    OTHER_ORDER = set(PATCHES)
    CASES = [(1, 32768, "contiguous", 0), (1, 32768, "paged", 16), (1, 32768, "paged", 64),
             (2, 32768, "contiguous", 0), (8, 32768, "contiguous", 0), (8, 32768, "paged", 64),
             (8, 32768, "contiguous4", 0), (64, 4096, "contiguous", 0)]
# Kv heads of 9-16 rows (q_len 4 at GQA 4) on two kq tiles of 8 rows each, against the 16-row
# tensor-core tile (the default): each tile's CTA reads its kv head's K and V, and the two
# CTAs of a head are neighbours in the grid, so they run together and the second reads what
# the first brought into L2, if the loads' hint lets it stay there: the last-use hint (the
# default), evict-first, or none (source=: decode_attention.cu with OPFACADE_STREAMING 0, made
# by the caller at .scratch/decode_attention_plain.cu). Another tile sums in another order: the
# largest difference from the default's output is printed.
if "--kq-pairs" in sys.argv:
    kq_for_16 = forced_tile(kernels.Tile(kernels.KQ_ROWS, "kq"), kernels.KQ_DIMS,
                            2 * kernels.KQ_ROWS)
    PLAIN = "source=.scratch/decode_attention_plain.cu"
    VARIANTS = {"16-row tile (default)": (), "kq pairs, last-use": (),
                "kq pairs, evict-first": ("-DOPFACADE_STREAMING_EVICT_FIRST",),
                "kq pairs, no hint": (PLAIN,), "default again": (), "kq pairs, last-use again": (),
                "kq pairs, no hint again": (PLAIN,)}
    PATCHES = {name: {"row_tile": kq_for_16} for name in VARIANTS if name.startswith("kq")}
    OTHER_ORDER = set(PATCHES)
    CASES = [(64, 4096, "contiguous4", 0), (64, 4096, "paged4", 16), (8, 32768, "contiguous4", 0),
             (8, 32768, "paged4", 64), (1, 32768, "contiguous4", 0), (256, 1024, "contiguous4", 0),
             (64, 4096, "contiguous3", 0), (64, 4096, "contiguous4", 0, {"ragged": True})]
# The partials kept in L2 for the merge (the default: decode_common.cuh's store_partial and
# drop_partials) against plain stores whose lines stay (-DOPFACADE_PARTIALS_PLAIN); same bits.
# (Its record, catalog/probes/decode_partials_l2_H200.json, also has each half alone: it ran
# with probe macros for the two halves, before they became the default.)
if "--partials-l2" in sys.argv:
    plain = ("-DOPFACADE_PARTIALS_PLAIN=1",)
    VARIANTS = {"partials in L2 (default)": (), "plain partials": plain, "default again": (),
                "plain partials again": plain}
    CASES = [(64, 4096, "contiguous", 0), (64, 4096, "paged", 16), (256, 1024, "paged", 16),
             (8, 32768, "paged", 64), (1, 32768, "contiguous", 0), (1, 32768, "paged", 16),
             (64, 4096, "contiguous4", 0), (64, 4096, "paged4", 16),
             (64, 4096, "contiguous", 0, {"ragged": True})]
# The rows merge (the default for caches of up to decode.ROWS_CHUNKS chunks: several rows a
# CTA) against the 64-thread merge whose sums it reproduces (decode.MERGE_ROWS off); the same
# bits. Its record's call 6 ran with the rows merge taking caches of up to 16 chunks.
if "--merge-rows" in sys.argv:
    VARIANTS = {"rows merge (default)": (), "64-thread merge": (), "default again": (),
                "64-thread merge again": ()}
    PATCHES = {name: {"MERGE_ROWS": False} for name in VARIANTS if name.startswith("64")}
    CASES = [(256, 1024, "contiguous", 0), (256, 1024, "paged", 16), (64, 4096, "contiguous", 0),
             (64, 4096, "paged", 16), (64, 4096, "contiguous4", 0), (64, 4096, "paged4", 16),
             (64, 4096, "contiguous", 0, {"ragged": True}), (16, 4096, "contiguous", 0),
             (64, 4096, "contiguous2", 0), (64, 4096, "contiguous", 0, {"head_dim": 64}),
             (32, 4096, "contiguous", 0, {"head_dim": 256}),
             (64, 4096, "contiguous", 0, {"element": "f32"})]
# --kq-b4: the kq tile's 4-CTA build (128 registers) on every grid against the default, which
# takes the 3-CTA build (168) past KQ_FEW_WAVES waves; the builds' bits are the same. Measured
# with the 8-row build and the evict-first hint in the twenty-sixth session (1.4-2.4 points
# under); the forty-fourth session's call 1 ran it on the 4-row build with the last-use hint
# (record catalog/probes/decode_kq_b4_H200.json: level). Its --merge-short (the rows merge's
# short form) is in docs/experiments/decode-merge-short.patch.
if "--kq-b4" in sys.argv:
    VARIANTS = interleaved({"kq b4 everywhere": ()})
    PATCHES = {name: {"KQ_FEW_WAVES": 10**6} for name in VARIANTS if name.startswith("kq b4")}
    CASES = [(64, 4096, "contiguous", 0), (64, 4096, "paged", 16), (256, 1024, "contiguous", 0),
             (256, 1024, "paged", 16), (8, 32768, "contiguous", 0), (8, 32768, "paged", 64),
             (64, 8192, "contiguous", 0, {"ragged": True}),
             (64, 4096, "contiguous", 0, {"heads_q": 64})]
# The 16-row tile's rows of many waves (its staged build): q_len 4 (and 3) at GQA 4.
MMA_MANY_WAVES = [(64, 4096, "contiguous4", 0), (64, 4096, "paged4", 16),
                  (8, 32768, "paged4", 64), (128, 4096, "contiguous4", 0),
                  (256, 1024, "paged4", 16), (64, 4096, "contiguous4", 0, {"head_dim": 64}),
                  (64, 4096, "contiguous4", 0, {"element": "f16"}), (64, 4096, "contiguous3", 0)]
# The 16-row tile's batch in two halves on two streams (the default: decode.SPLIT_TILES)
# against one grid for the whole batch; the same bits.
if "--split" in sys.argv:
    VARIANTS = {"two halves (default)": (), "one grid": (), "default again": (),
                "one grid again": ()}
    PATCHES = {name: {"SPLIT_TILES": ()} for name in VARIANTS if name.startswith("one grid")}
    CASES = [(64, 4096, "contiguous4", 0), (64, 4096, "paged4", 16), (32, 4096, "contiguous4", 0),
             (128, 4096, "contiguous4", 0), (8, 32768, "paged4", 64),
             (64, 4096, "contiguous4", 0, {"head_dim": 64}),
             (64, 4096, "contiguous4", 0, {"element": "f16"}),
             (64, 4096, "contiguous3", 0)]
# This tree against another copy of native/ given by --before=DIR, alternating twice, on the
# 16-row tile's rows; their bits are compared. The thirty-fourth session ran it
# with docs/experiments/mma-offsets-once.patch applied here and 0cc2ab6's native/ as DIR (record
# catalog/probes/decode_mma_offsets_H200.json), so its labels name that A/B; the patch was not
# kept.
if "--offsets" in sys.argv:
    before = flag_value("before")
    VARIANTS = {"offsets once (default)": (), "offsets per vector": (f"root={before}",),
                "default again": (), "offsets per vector again": (f"root={before}",)}
    CASES = [*MMA_MANY_WAVES, (64, 4096, "contiguous2", 0, {"heads_q": 64}),
             (64, 4096, "contiguous4", 0, {"ragged": True})]
# The cache's form and layout made compile-time constants in every kernel (kv_append's kernels
# are built that way since the thirty-sixth session): --paged-form=DIR names a copy of native/
# whose kv_cache.cuh make_cache returns kind 1 (paged) and hnd 0, valid for paged nhd caches
# alone, so only those run; the same sums, so its bits are compared.
if flag_value("paged-form"):
    form_root = flag_value("paged-form")
    VARIANTS = {"runtime form (default)": (), "paged nhd constant": (f"root={form_root}",),
                "default again": ()}
    CASES = [(64, 4096, "paged", 16), (8, 32768, "paged", 64), (256, 1024, "paged", 16),
             (64, 4096, "paged4", 16)]
# Two builds of the 16-row tile from another copy of native/ given by --tree=DIR, whose
# decode_mma.cuh takes two probe macros (thirty-seventh session; 43e2ef0's native/ with
# docs/experiments/mma-probe-macros.patch applied): OPFACADE_MMA_Q_REGS holds each
# warp's Q fragments in registers through the scores (the staged build has room), where the
# shipped tile rereads them from shared memory for every key tile (the same words: the same
# bits); OPFACADE_MMA_P_HI_ONLY multiplies V by P's high half alone (P rounded once to the
# element type, as most attention kernels do: another order, so not bitwise).
if flag_value("tree"):
    tree = flag_value("tree")
    q_regs = (f"root={tree}", "-DOPFACADE_MMA_Q_REGS=1")
    hi_only = (f"root={tree}", "-DOPFACADE_MMA_P_HI_ONLY=1")
    VARIANTS = {"16-row tile (default)": (), "Q in registers": q_regs,
                "P high half only": hi_only, "default again": (),
                "Q in registers again": q_regs, "P high half only again": hi_only}
    OTHER_ORDER = {"P high half only", "P high half only again"}
    CASES = MMA_MANY_WAVES
# The staged 16-row tile at 4 CTAs an SM (128 registers: ptxas spills 152 bytes at d 128, 88
# with P's high half alone and Q in registers) on a ring of 2 batches (the shared memory of 4
# CTAs), against 3 CTAs on the shipped ring of 3 and on a ring of 2; --occupancy16=DIR names
# the copy of native/ with --tree's probe macros (its record's default is 033676a's build).
# Staged on every grid (MMA_FEW_WAVES 0).
if flag_value("occupancy16"):
    tree = flag_value("occupancy16")
    staged_2 = {"STAGES": 2, "MMA_FEW_WAVES": 0}
    b3 = (f"root={tree}", "-DOPFACADE_MMA_STAGES=2")
    b4 = (*b3, "-DOPFACADE_DECODE_MMA_MIN_BLOCKS=4")
    b4_lean = (*b4, "-DOPFACADE_MMA_P_HI_ONLY=1", "-DOPFACADE_MMA_Q_REGS=1")
    VARIANTS = {"3 CTAs, ring of 3 (default)": (), "3 CTAs, ring of 2": b3,
                "4 CTAs, ring of 2": b4, "4 CTAs, ring of 2, P high only, Q regs": b4_lean,
                "default again": (), "4 CTAs, ring of 2 again": b4,
                "4 CTAs, ring of 2, P high only, Q regs again": b4_lean}
    # SPLIT_WAVES 6 at 4 CTAs an SM: the batch splits where it does at 3 (8 waves of 396 CTAs
    # on 132 SMs is 6 of 528), so only the occupancy and the ring differ.
    PATCHES = {name: {**staged_2, **({"SPLIT_WAVES": 6} if name.startswith("4") else {})}
               for name in VARIANTS if "ring of 2" in name}
    OTHER_ORDER = {name for name in VARIANTS if "P high" in name}
    CASES = MMA_MANY_WAVES
# The 16-row tile's grids of a few waves (its register build, decode.mma_build) and one of many
# (staged), this tree against --before=DIR; the same bits are compared.
if "--mma-few" in sys.argv:
    VARIANTS = interleaved({"before": (f"root={flag_value('before')}",)})
    CASES = [(16, 4096, "contiguous4", 0), (32, 4096, "contiguous4", 0),
             (1, 32768, "contiguous4", 0), (2, 32768, "paged4", 16),
             (16, 4096, "contiguous4", 0, {"head_dim": 64}),
             (16, 4096, "contiguous4", 0, {"element": "f16"}), (64, 4096, "contiguous4", 0)]
# The 16-row tile's grids of many waves (its staged build), kv heads of 16 rows at GQA 16 and of
# 32 (MQA: two tiles over the same keys), this tree against --before=DIR; the same bits are
# compared. The thirty-ninth session ran it with V's fragments read from the ring by ldmatrix
# (docs/experiments/decode-ring-ldmatrix.patch applied here) against ca87b1a's native/ (record
# catalog/probes/decode_ring_ldmatrix_H200.json; not kept).
if "--mma-many" in sys.argv:
    VARIANTS = interleaved({"before": (f"root={flag_value('before')}",)})
    CASES = [*MMA_MANY_WAVES, (64, 4096, "contiguous", 0, {"heads_q": 128}),
             (64, 32768, "contiguous", 0, {"heads_kv": 1}),
             (8, 32768, "paged", 16, {"heads_kv": 1})]
# The tensor-core tiles' scores masked per key only where a warp's rows do not see all its keys
# (sees_whole, thirty-eighth session), this tree, against --before=DIR (9f54542's native/, which
# tests every key), on the kq tile's grids of many and of few waves and the 16-row tile's, and on
# rows whose chunks end part-way (random lengths) or start in a window; the same bits are
# compared.
# --fast-exp=DIR adds a copy of this tree's native/ whose tiles weigh their scores with __expf
# (ex2.approx of x log2 e) instead of expf: what the softmax's instructions cost (other bits).
if "--masks" in sys.argv:
    before, fast = flag_value("before"), flag_value("fast-exp")
    fast_exp = {"fast exp": (f"root={fast}",)} if fast else {}
    VARIANTS = interleaved({"before": (f"root={before}",), **fast_exp})
    OTHER_ORDER = {"fast exp", "fast exp again"}
    CASES = [(64, 4096, "contiguous", 0), (64, 4096, "paged", 16), (256, 1024, "paged", 16),
             (8, 32768, "paged", 64), (1, 32768, "contiguous", 0), (2, 32768, "paged", 16),
             (64, 4096, "contiguous4", 0), (64, 4096, "paged4", 16), (128, 4096, "contiguous4", 0),
             (64, 4096, "contiguous2", 0), (64, 4096, "contiguous4", 0, {"head_dim": 64}),
             (64, 4096, "contiguous4", 0, {"ragged": True}),
             (64, 4096, "contiguous", 0, {"window": {"left": 1000}})]
# Kv heads of more than 16 rows, which run several 16-row tiles over the same keys (MQA, q_len 8
# at GQA 4, GQA 8 at q_len 4), beside one tile of 16 rows: whether L2 keeps the tiles' second
# reads off DRAM (the figure counts each KV byte once), this tree's build, twice.
# Each --variant=LABEL@DIR adds a copy of native/ (twice, interleaved); a LABEL naming "exp"
# sums in another order (its bits are not compared).
if "--many-rows" in sys.argv:
    trees = dict(arg[len("--variant="):].split("@", 1) for arg in sys.argv
                 if arg.startswith("--variant="))
    VARIANTS = interleaved({label: (f"root={root}",) for label, root in trees.items()})
    OTHER_ORDER = {name for name in VARIANTS if "exp" in name}
    CASES = [(64, 4096, "contiguous4", 0), (64, 4096, "contiguous8", 0),
             (64, 4096, "paged8", 16), (64, 4096, "contiguous4", 0, {"heads_q": 64}),
             (64, 4096, "contiguous2", 0, {"heads_q": 64}),
             (64, 32768, "contiguous", 0, {"heads_kv": 1}),
             (64, 32768, "contiguous4", 0, {"heads_kv": 1}),
             (64, 32768, "contiguous8", 0, {"heads_kv": 1})]
# --wg: the wgmma tile (what sm_90 devices run for kv heads of more than 8 rows at D 128) against
# the 16-row mma.sync tile it replaced there (decode.WG_DIMS emptied), each twice, interleaved;
# another order, so the bits are not compared. The few-wave grids too.
if "--wg" in sys.argv:
    VARIANTS = interleaved({"exp mma.sync tile": ()})
    PATCHES = {name: {"WG_DIMS": ()} for name in VARIANTS if "exp" in name}
    OTHER_ORDER = set(PATCHES)
    CASES = [(64, 4096, "contiguous4", 0), (64, 4096, "paged4", 16),
             (64, 4096, "contiguous", 0, {"heads_q": 128}),
             (64, 4096, "paged", 16, {"heads_q": 128}),
             (64, 4096, "contiguous4", 0, {"element": "f16"}),
             (64, 4096, "contiguous4", 0, {"ragged": True}),
             (128, 4096, "contiguous4", 0), (256, 1024, "paged4", 16),
             (8, 32768, "contiguous4", 0), (8, 32768, "paged4", 64),
             (1, 32768, "contiguous4", 0), (2, 32768, "contiguous4", 0),
             (16, 4096, "contiguous4", 0),
             (64, 4096, "contiguous8", 0), (64, 32768, "contiguous", 0, {"heads_kv": 1})]
# --wg-stages (ready to measure, not yet run): the wgmma tiles' ring depth, by -D flags on
# decode_wg.cu (WG_OPTIONS) and decode.WG_STAGES: the 16-row tile with 2 blocks (3 shipped), the
# 32-row tile with 3 (2 shipped; then one CTA an SM fits). Same sums: the bits are compared.
WG_OPTIONS: dict[str, tuple[str, ...]] = {}
if "--wg-stages" in sys.argv:
    VARIANTS = interleaved({"wg 16 rows s2": (), "wg 32 rows s3": ()})
    WG_OPTIONS = {name: ("-DOPFACADE_WG_STAGES_16=2",) if "16 rows" in name
                  else ("-DOPFACADE_WG_STAGES_32=3",) for name in VARIANTS if "wg " in name}
    PATCHES = {name: {"WG_STAGES": {16: 2, 32: 2} if "16 rows" in name else {16: 3, 32: 3}}
               for name in WG_OPTIONS}
    CASES = [(64, 4096, "contiguous4", 0), (64, 4096, "paged4", 16),
             (64, 4096, "contiguous", 0, {"heads_q": 128}), (1, 32768, "contiguous4", 0),
             (64, 4096, "contiguous8", 0), (64, 32768, "contiguous", 0, {"heads_kv": 1}),
             (8, 32768, "contiguous", 0, {"heads_kv": 1})]
# --tree-vs=DIR: this tree against DIR (another copy of native/), both of its kernel files
# (decode_attention.cu and decode_wg.cu), each twice, interleaved, on the bench's paged and
# contiguous rows of both tensor-core tiles and the 16- and 32-row heads beyond them; the same
# sums, so the bits are compared. The forty-second session ran it with the paged chunks' table
# entries loaded beside the sequence's length (chunk_tile) against 8c237db's native/.
if flag_value("tree-vs"):
    VARIANTS = interleaved({"tree before": (f"root={flag_value('tree-vs')}",)})
    WG_OPTIONS = {name: VARIANTS[name] for name in VARIANTS if name.startswith("tree before")}
    CASES = [(64, 4096, "contiguous", 0), (64, 4096, "paged", 16), (256, 1024, "paged", 16),
             (8, 32768, "paged", 64), (1, 32768, "paged", 16), (64, 4096, "contiguous4", 0),
             (64, 4096, "paged4", 16), (64, 4096, "paged", 16, {"heads_q": 128}),
             (64, 32768, "paged", 16, {"heads_kv": 1}),
             (64, 4096, "contiguous4", 0, {"ragged": True})]
# --wg-spans: the wgmma tiles' spans as decode.wg_span picks them (the 32-row tile's CTAs run
# WG_SPAN[32] = 4 chunks without a window over caches of WG_SPAN_CHUNKS chunks or more, on grids
# of WG_SPAN_WAVES waves or more) against one chunk a CTA and against the 32-row tile at 2; and
# the wgmma tile's batches split only on grids of 8 waves or more ("wg split at 8 waves")
# against at any grid (SPLIT_WAVES_WG = 0, the default). Same sums: the bits are compared. The
# forty-second session's call 3 ran it before WG_SPAN_CHUNKS and the window's rule (every grid
# of 4 waves spanned) and with the split's variant written as SPLIT_WAVES = 8 / 264 (record
# catalog/probes/decode_wg_spans_H200.json).
if "--wg-spans" in sys.argv:
    VARIANTS = interleaved({"wg span 1": (), "wg 32 span 2": (), "wg split at 8 waves": ()})
    PATCHES = {"wg span 1": {"WG_SPAN": {16: 1, 32: 1}},
               "wg 32 span 2": {"WG_SPAN": {16: 1, 32: 2}},
               "wg split at 8 waves": {"SPLIT_WAVES_WG": 8}}
    PATCHES = {**PATCHES, **{f"{name} again": patch for name, patch in PATCHES.items()}}
    CASES = [(64, 32768, "contiguous", 0, {"heads_kv": 1}),
             (64, 32768, "paged", 16, {"heads_kv": 1}),
             (64, 32768, "contiguous", 0, {"heads_kv": 1, "ragged": True}),
             (64, 32768, "contiguous", 0, {"heads_kv": 1, "window": {"left": 1000}}),
             (16, 32768, "contiguous", 0, {"heads_kv": 1}), (64, 4096, "contiguous8", 0),
             (64, 4096, "paged8", 16), (64, 4096, "contiguous8", 0, {"ragged": True}),
             (64, 4096, "contiguous4", 0), (16, 4096, "contiguous4", 0),
             (32, 4096, "contiguous4", 0), (2, 32768, "contiguous4", 0),
             (16, 4096, "paged", 16, {"heads_q": 128}), (8, 32768, "contiguous4", 0)]
# --wg-span-most: the 32-row tile at spans of 8 and 16 chunks against the default's 4, on long
# caches (the same sums: the bits are compared).
if "--wg-span-most" in sys.argv:
    VARIANTS = interleaved({"wg 32 span 8": (), "wg 32 span 16": ()})
    PATCHES = {name: {"WG_SPAN": {16: 1, 32: 8 if "span 8" in name else 16}}
               for name in VARIANTS if "span" in name}
    CASES = [(64, 32768, "contiguous", 0, {"heads_kv": 1}),
             (64, 32768, "paged", 16, {"heads_kv": 1}),
             (64, 32768, "contiguous", 0, {"heads_kv": 1, "ragged": True}),
             (32, 32768, "contiguous", 0, {"heads_kv": 1}), (16, 32768, "contiguous8", 0)]
# --kq-lines: kv heads of up to 4 rows on the kq tile's 4-row build, which reads K in whole
# 128-byte lines (decode.KQ_LINE_ROWS, the default), against its 8-row build ("kq 8 rows",
# the kernel before it: KQ_LINE_ROWS = 0). The scores add two halves of D there, another
# order: the largest difference is printed. The GQA 8 rows run the 8-row build in both.
if "--kq-lines" in sys.argv:
    VARIANTS = interleaved({"kq 8 rows": ()})
    PATCHES = {name: {"KQ_LINE_ROWS": 0} for name in VARIANTS if name.startswith("kq 8")}
    OTHER_ORDER = set(PATCHES)
    CASES = [(64, 4096, "contiguous", 0), (64, 4096, "paged", 16), (256, 1024, "contiguous", 0),
             (256, 1024, "paged", 16), (8, 32768, "contiguous", 0), (8, 32768, "paged", 64),
             (1, 32768, "contiguous", 0), (1, 32768, "paged", 16),
             (64, 8192, "contiguous", 0, {"ragged": True}),
             (64, 4096, "contiguous", 0, {"element": "f16"}),
             (64, 4096, "contiguous2", 0, {"heads_q": 16}),
             (64, 4096, "contiguous", 0, {"heads_q": 64})]
# --kq-hints: the streamed loads' cache hint on the kq tile's 4-row build (K in whole lines),
# whose K loads now ask for whole lines: last-use (the default) against last-use with a 256-byte
# L2 fetch, L1::no_allocate and evict-first (common.cuh's OPFACADE_LOAD16). Hints change no
# value: the bits are compared.
if "--kq-hints" in sys.argv:
    VARIANTS = interleaved({"lu 256B": ("-DOPFACADE_STREAMING_LU_L2_256",),
                            "no allocate": ("-DOPFACADE_STREAMING_NO_ALLOCATE",),
                            "evict-first": ("-DOPFACADE_STREAMING_EVICT_FIRST",)})
    CASES = [(64, 4096, "contiguous", 0), (64, 4096, "paged", 16), (256, 1024, "contiguous", 0),
             (8, 32768, "contiguous", 0), (8, 32768, "paged", 64), (1, 32768, "contiguous", 0),
             (1, 32768, "paged", 16), (64, 8192, "contiguous", 0, {"ragged": True})]
# --kq-cases (with a mode, --tree-vs say): the kq tile's rows instead of the mode's, GQA 4 at one
# and two new tokens and GQA 8 (the 4- and 8-row builds).
if "--kq-cases" in sys.argv:
    CASES = [(64, 4096, "contiguous", 0), (64, 4096, "paged", 16), (256, 1024, "contiguous", 0),
             (8, 32768, "contiguous", 0), (8, 32768, "paged", 64), (1, 32768, "contiguous", 0),
             (1, 32768, "paged", 16), (64, 8192, "contiguous", 0, {"ragged": True}),
             (64, 4096, "contiguous2", 0), (64, 4096, "contiguous", 0, {"heads_q": 64})]
# Modes that name --before's variants themselves.
A_B_MODES = ("--offsets", "--mma-few", "--mma-many", "--masks")
# --parts: every variant runs its batch as one grid (SPLIT_TILES off) and its partial and merge
# launches are also timed alone (thirty-ninth session: the streaming probe's parts).
if "--parts" in sys.argv:
    PATCHES = {name: {**PATCHES.get(name, {}), "SPLIT_TILES": ()} for name in VARIANTS}
# --before=DIR adds another copy of native/ (an earlier commit's, whose kernels take the same
# parameters) as a last variant, with the mode's default settings: its bits are compared too.
BEFORE = flag_value("before")
if BEFORE and not any(mode in sys.argv for mode in A_B_MODES):
    VARIANTS = {**VARIANTS, "before": (f"root={BEFORE}",)}
if "--mma-only" in sys.argv:  # only the cases the tensor-core tile runs (q_len > 1 here)
    CASES = [case for case in CASES if case[2][-1].isdigit()]


def case_tensors(batch, seq, cache, page_size, overrides=None):
    q_len = int(cache[-1]) if cache[-1].isdigit() else 1  # "contiguous4": q_len 4
    form = "paged" if cache.startswith("paged") else "contiguous"
    fields = dict(batch=batch, heads_q=32, heads_kv=8, head_dim=128, element="bf16", cache=form,
                  q_len=q_len)
    overrides = dict(overrides or {})
    ragged = overrides.pop("ragged", False)  # random lengths in [1, seq]: chunks end part-way
    fields.update(overrides)
    hq, hkv, dim = fields["heads_q"], fields["heads_kv"], fields["head_dim"]
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[fields["element"]]
    gen = torch.Generator(device="cuda").manual_seed(0)
    if form == "paged":
        pages = batch * seq // page_size
        fields.update(page_size=page_size, max_pages=seq // page_size)
        k = torch.rand((pages, page_size, hkv, dim), generator=gen, device="cuda").to(dtype)
        table = torch.randperm(pages, generator=gen, device="cuda").int().view(batch, -1)
    else:
        fields.update(max_seq=seq)
        k = torch.rand((batch, seq, hkv, dim), generator=gen, device="cuda").to(dtype)
        table = None
    v = torch.rand(k.shape, generator=gen, device="cuda").to(dtype)
    q = torch.rand((batch, q_len, hq, dim), generator=gen, device="cuda").to(dtype)
    out = torch.empty_like(q)
    lens = torch.full((batch,), seq, dtype=torch.int32, device="cuda")
    if ragged:
        lens = torch.randint(1, seq + 1, (batch,), generator=gen, device="cuda", dtype=torch.int32)
    desc = DecodeAttentionDescriptor(**fields)
    return desc, DecodeAttentionArgs(q, k, v, lens, out, table), 2 * k.numel() * k.element_size()


def case_key(case) -> str:
    batch, seq, cache, page_size, *overrides = case
    key = f"B{batch} S{seq} {cache}" + (f" pages {page_size}" if page_size else "")
    for name, value in (overrides[0] if overrides else {}).items():
        key += f" {name} {value}"
    return key


def gpu_ms(fn, reps=30):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        for _ in range(5):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 5)
    return float(np.median(times))


def host_us(fn, calls=200):
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return float(np.median(samples))


def launch_floor() -> dict[str, float]:
    """Host microseconds of one launch of a kernel that does nothing (kv_cache_check over no
    sequence), packed once (PackedLaunch, as our steps launch), and of one replay of a CUDA
    graph holding it: the floor under any prepared call's host time on this machine."""
    from opfacade._backends.nvrtc.launch import PackedLaunch
    from opfacade._bench.host_floor import replay_floor

    kernel, args, _verdict = noop_kernel(torch)
    stream = torch.cuda.current_stream().cuda_stream
    packed = PackedLaunch(kernel, (1,), (256,), args, stream, 0)
    return {"one packed launch": host_us(packed), "one graph replay": host_us(replay_floor(torch))}


def overlap_ab(copy_tbps: float, rounds: int = 25, calls: int = 20) -> dict[str, dict]:
    """The merge launched while the partial kernel ends (programmatic dependent launch) against
    the merge after it, interleaved batch by batch so that clocks and neighbours weigh on both
    alike: each step as the prepared call replays it (a CUDA graph) and as direct launches.
    Returns % of a copy per case and contestant (median over the rounds)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rows, default = {}, kernels.OVERLAP_MERGE
    for case in CASES:
        desc, args, nbytes = case_tensors(*case)
        plan = DecodeAttentionPlan.select(desc, device=0)
        contestants, bits = {}, {}
        for overlap in (True, False):
            kernels.OVERLAP_MERGE = overlap
            ws = torch.empty(plan.workspace_size, dtype=torch.uint8, device="cuda")
            step = plan.prepare(args, workspace=ws)
            step()
            step()  # the second call builds the graph
            bits[overlap] = args.out.view(torch.int16).clone()
            name = "overlap" if overlap else "after"
            contestants[f"{name} graph"] = step
            contestants[f"{name} direct"] = step._call._launch_direct
        kernels.OVERLAP_MERGE = default
        times = {name: [] for name in contestants}
        for _ in range(rounds):
            for name, fn in contestants.items():
                start.record()
                for _ in range(calls):
                    fn()
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end) / calls)
        key = case_key(case)
        rows[key] = {name: nbytes / float(np.median(t)) / 1e9 / copy_tbps
                     for name, t in times.items()}
        rows[key]["same bits"] = bool(torch.equal(bits[True], bits[False]))
        print(f"{key:28s} " + "  ".join(f"{name} {value:6.1%}" for name, value in rows[key].items()
                                        if name != "same bits")
              + ("" if rows[key]["same bits"] else "  OUTPUT BITS DIFFER"))
        plan.free()
    return rows


def set_aside() -> None:
    """Prints the L2 set aside for persisting lines, and with --set-aside=BYTES (or =max) sets
    it first: whether the partials' evict-last stores (decode_common.cuh's store_partial) need
    one. On an H200 they did not: with 0 bytes set aside they kept their gain (record
    catalog/probes/decode_partials_l2_H200.json, set_aside)."""
    import cupy

    runtime = cupy.cuda.runtime
    limit = 0x06  # cudaLimitPersistingL2CacheSize (driver_types.h)
    wanted = flag_value("set-aside")
    if wanted is not None:
        most = runtime.deviceGetAttribute(108, 0)  # cudaDevAttrMaxPersistingL2CacheSize
        runtime.deviceSetLimit(limit, most if wanted == "max" else int(wanted))
    print(f"L2 set aside for persisting lines: {runtime.deviceGetLimit(limit)} bytes")


def main() -> None:
    set_aside()
    floor = launch_floor()
    print("host floor:", ", ".join(f"{k} {v:.1f} us" for k, v in floor.items()))
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_tbps = 2 * src.numel() / gpu_ms(lambda: dst.copy_(src)) / 1e9
    print(f"device copy {copy_tbps:.2f} TB/s")
    state = device_state(0)  # after the copy: the clocks under load (the bench records them too)
    print(format_state(state))
    if "--overlap-ab" in sys.argv:
        rows = overlap_ab(copy_tbps)
        write_to_argument(dict(copy_tbps=copy_tbps, host_floor_us=floor, rows=rows))
        return
    results, reference = {}, {}
    original = kernels.get_kernel
    defaults = {"row_tile": kernels.row_tile, "OVERLAP_MERGE": kernels.OVERLAP_MERGE,
                "MAX_SPAN": kernels.MAX_SPAN, "span_for": kernels.span_for,
                "CHUNK": kernels.CHUNK, "KQ_DIMS": kernels.KQ_DIMS,
                "KQ_FEW_WAVES": kernels.KQ_FEW_WAVES, "MMA_FEW_WAVES": kernels.MMA_FEW_WAVES,
                "MERGE_THREADS": kernels.MERGE_THREADS, "MERGE_ROWS": kernels.MERGE_ROWS,
                "SPLIT_TILES": kernels.SPLIT_TILES, "STAGES": kernels.STAGES,
                "SPLIT_WAVES": kernels.SPLIT_WAVES, "WG_DIMS": kernels.WG_DIMS,
                "WG_STAGES": kernels.WG_STAGES, "WG_SPAN": kernels.WG_SPAN,
                "WG_SPAN_WAVES": kernels.WG_SPAN_WAVES, "WG_SPAN_CHUNKS": kernels.WG_SPAN_CHUNKS,
                "SPLIT_WAVES_WG": kernels.SPLIT_WAVES_WG, "KQ_LINE_ROWS": kernels.KQ_LINE_ROWS}
    for name, options in VARIANTS.items():
        use_module(load_build(options), load_build(WG_OPTIONS[name], kernels.WG_SOURCE)
                   if name in WG_OPTIONS else None)
        for attribute, value in {**defaults, **PATCHES.get(name, {})}.items():
            setattr(kernels, attribute, value)
        for case in CASES:
            desc, args, nbytes = case_tensors(*case)
            plan = DecodeAttentionPlan.select(desc, device=0)
            ws = torch.empty(plan.workspace_size, dtype=torch.uint8, device="cuda")
            step = plan.prepare(args, workspace=ws)
            ms = gpu_ms(step)
            key = case_key(case)
            bits = args.out.view(torch.int16).clone()
            if (key in reference and not torch.equal(reference[key], bits)
                    and name not in OTHER_ORDER):
                print(f"  {name} {key}: output bits differ from the default build's")
            if key in reference and name in OTHER_ORDER:  # another order: how far, not bits
                diff = (args.out.float() - reference[key].view(args.out.dtype).float()).abs()
                print(f"  {name} {key}: max |difference| from the default build's "
                      f"{diff.max().item():.3g}")
            reference.setdefault(key, bits)
            row = dict(ms=ms, tbps=nbytes / ms / 1e9, of_copy=nbytes / ms / 1e9 / copy_tbps)
            if name.endswith("(default)") or "--parts" in sys.argv:
                # The step's two kernels alone (its direct launches), to place the gap (a
                # batch split in halves has a fork, two of each and a join: not timed apart).
                if len(step._call._direct) == 2:
                    partial, merge = step._call._direct
                    row["partial_ms"], row["merge_ms"] = gpu_ms(partial), gpu_ms(merge)
                row["host_us_step"] = host_us(step)
                row["host_us_run"] = host_us(lambda p=plan, a=args, w=ws: p.run(a, workspace=w))
            results[f"{name} | {key}"] = row
            print(f"{name:16s} {key:26s} {ms:7.3f} ms {row['tbps']:5.2f} TB/s "
                  f"{row['of_copy']:6.1%} of copy" + (
                      f"  partial {row['partial_ms']:.3f} merge {row['merge_ms']:.3f} ms"
                      if "partial_ms" in row else "") + (
                      f"  host step {row['host_us_step']:.1f} us, run {row['host_us_run']:.1f}"
                      " us" if "host_us_step" in row else ""))
            plan.free()
    kernels.get_kernel = original
    for attribute, value in defaults.items():
        setattr(kernels, attribute, value)
    write_to_argument(dict(copy_tbps=copy_tbps, host_floor_us=floor, device_state=state,
                           rows=results))


if __name__ == "__main__":
    main()
