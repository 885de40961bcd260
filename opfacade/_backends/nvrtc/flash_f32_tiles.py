"""The true-f32 flash kernels' blocks, threads and shared-memory tiles, as the host mirrors them
from native/ (kPad in flash_f32_common.cuh, ForwardShape in flash_f32_forward.cuh, DmmaTiles in
flash_f32_dmma.cuh, DkdvTiles in flash_f32_backward.cuh), and the shared memory each kernel
needs. Every tile is row-major with PAD floats added to each row. A kernel launched with less
shared memory than its tiles need stops (__trap) rather than corrupt memory, so a fact that
drifts from its kernel fails loudly; ``tests/test_flash_f32_compile.py`` pins the sizes.
"""

from __future__ import annotations

from ...types import ArchSku

# Threads a CTA (kFwdThreads, kDkdvThreads, kDeltaThreads).
FORWARD_THREADS, DKDV_THREADS, DELTA_THREADS = 128, 128, 256
WIDE_FORWARD_THREADS = 256
PAD = 4
FORWARD_ROWS, FORWARD_KEYS = 64, 64
WIDE_FORWARD_ROWS = WIDE_FORWARD_KEYS = 128  # the wide forward's blocks
# The DMMA forward runs 32 rows and 64 keys a block in 128 threads (three CTAs an SM at head dims
# up to 64, two above), rows padded by 16 floats (Q, K), 4 (V) and 8 (P).
DMMA_ROWS, DMMA_KEYS, DMMA_THREADS = 32, 64, 128
DMMA_QK_PAD, DMMA_V_PAD, DMMA_P_PAD = 16, 4, 8
DMMA_PV_QUARTERS_DV = (128,)  # Dv where each warp's P V takes all rows and a quarter of Dv
QUERY_BLOCK_ROWS = min(FORWARD_ROWS, WIDE_FORWARD_ROWS, DMMA_ROWS)  # the smallest forward block
DKDV_KEYS, DKDV_ROWS = 64, 32
DELTA_ROWS = 64
# Dynamic shared memory one block may opt into, per architecture (CUDA programming guide,
# compute capabilities table): sm_86, sm_89 and sm_120 stop at 99 KiB, which D = Dv = 128 needs
# more than; sm_90 and sm_100 give the wide forward its 198 KiB.
SHARED_PER_BLOCK = {ArchSku.sm80: 163 << 10, ArchSku.sm86: 99 << 10, ArchSku.sm89: 99 << 10,
                    ArchSku.sm90: 227 << 10, ArchSku.sm100: 227 << 10, ArchSku.sm120: 99 << 10}
FLOAT_BYTES = 4


def tile(rows: int, cols: int) -> int:
    return rows * (cols + PAD)


def forward_shared(d: int, dv: int, wide: bool = False) -> int:
    # Q, then K's tile (which P reuses), then V.
    rows, keys = (WIDE_FORWARD_ROWS, WIDE_FORWARD_KEYS) if wide else (FORWARD_ROWS, FORWARD_KEYS)
    k_or_p = max(tile(keys, d), tile(rows, keys))
    return FLOAT_BYTES * (tile(rows, d) + k_or_p + tile(keys, dv))


def dmma_forward_shared(d: int, dv: int) -> int:
    # Q, K, V, P, one value a row from each half of the keys, and where P V runs in quarters of
    # Dv (dmma_pv_quarters) each row's rescale (DmmaTiles).
    rows, keys = DMMA_ROWS, DMMA_KEYS
    stats = 3 if dv in DMMA_PV_QUARTERS_DV else 2
    return FLOAT_BYTES * ((rows + keys) * (d + DMMA_QK_PAD) + keys * (dv + DMMA_V_PAD)
                     + rows * (keys + DMMA_P_PAD) + stats * rows)


def dkdv_shared(d: int, dv: int) -> int:
    return FLOAT_BYTES * (tile(DKDV_KEYS, d) + tile(DKDV_KEYS, dv) + tile(DKDV_ROWS, d)
                     + tile(DKDV_ROWS, dv) + tile(DKDV_ROWS, DKDV_KEYS))


def shared_bytes(d: int, dv: int) -> int:
    """The most dynamic shared memory the FMA kernels for (d, dv) need (the wide and DMMA
    forwards run only where the device allows theirs)."""
    return max(forward_shared(d, dv), dkdv_shared(d, dv))
