"""Where a contiguous kv_append's time above a copy goes: the spread of its stores over the
caches, and whether touching a sequence's slot before its length returns hides it.

    python3 scripts/kv_append_spread_probe.py [out.json]

kv_append_variants.py's floors showed (forty-ninth session, H200) that a store of the same bytes
with no load before it, spread as kv_append spreads them (one 2 KiB key and value row per new
token, a sequence's slot every 8 MiB of a 2 GiB cache), already takes 0.08-0.25 us more than a
copy of one dense buffer: 1.66-1.72 us against 1.45 at 1 MB. One guess is address translation:
a copy's stores fall in one or two pages, kv_append's in a page of their own per sequence, whose
translation an SM's small TLB misses, and the store cannot issue before it. If so, the cost
falls with the spread, and an access to the slot's pages issued with the length's load (its
position unknown yet, the slot's pages known from the sequence alone) would pay that miss while
the length is in flight.

Contestants, every one from CUDA graphs in rotating interleaved rounds (graph_timing, as the
bench), on the bench's contiguous cases (bf16, Hkv 8, d 128, capacity 4096: B64, B256, B64
q_len 4):
  copy                      torch's device copy of the written bytes (the bench's divisor)
  spread S                  a store of every token's rows at a fixed pseudo-random position in a
                            slot of S tokens per sequence (no load before it): S = 4096 (the
                            case's, 8 MiB a slot), 1024 (2 MiB), 256, 32, and dense (rows
                            packed, one buffer)
  spread 4096 + <touch>     the same, after a touch of the slot's pages (its cost alone)
  1 dep                     the store's position from seq_lens (a contiguous append's floor)
  1 dep + <touch>           with the slot's pages touched beside the length's load
  shipped                   native/kv_append.cu
(The first run, at 3a4df4e, also timed that kernel with the touch written in before the token's
load: "shipped + <touch>" in catalog/probes/kv_append_spread_H200.json.)
Touches, by the first 16 threads of each side of a CTA, one per 2 MiB of the key's slot and of
the value's, each at the start of the slot's part in that 2 MiB:
  prefetch       prefetch.global.L2 (fetches the line into L2)
  priority       applypriority.global.L2::evict_normal (names the line, fetches nothing)
Every touched kernel's caches are compared bitwise with the untouched one's.

Found (fiftieth session, one H200, record catalog/probes/kv_append_spread_H200.json): slots of
4096, 1024, 256 and 32 tokens took 1.42-1.45 us at B64 and 1.70-1.76 at B256 (no step at 2 MiB);
dense rows 1.37 and 1.62. No touch made a store or the one-load floor faster (+0.01 to +0.04 us),
nor the shipped kernel (+0.11 to +0.14). So the spread is not what costs: the one-load floor,
its length loaded right after the data, took 1.368 / 1.739 / 1.708 us where the shipped kernel
of then took 1.494 / 1.898 / 1.870 (scripts/kv_append_shape_probe.py and the kv split that
followed, in docs/DECODE.md).
"""

from __future__ import annotations

import functools
import sys

import numpy as np
import torch

from opfacade._backends.nvrtc.kv_cache import DecodeCache, append_shape
from opfacade._bench.kv_append import AppendCase, append_problem, cases
from opfacade.types import ElementKind

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from kv_append_variants import add_times, case_args, launcher, module, write_rows  # noqa: E402

TOUCHES = {"prefetch": 1, "priority": 2}

# A 2 MiB page is the unit the touches assume (the driver's large page for allocations this
# size); the spreads below test whether the cost follows it.
TOUCH_SOURCE = r"""
#define OPFACADE_TOUCH_PAGE (1ull << 21)
// The pages of [start, start + bytes): thread i touches the i-th (i < 16). Called after the
// length's load: the branch keeps ptxas from sinking the touch past the length's use (which a
// predicated touch was, in SASS), and the load stays before it.
__device__ __forceinline__ void touch_slot(const void* start, unsigned long long bytes, int i,
                                           bool toucher, int how) {
    const unsigned long long first = reinterpret_cast<unsigned long long>(start);
    const unsigned long long page = (first & ~(OPFACADE_TOUCH_PAGE - 1)) + i * OPFACADE_TOUCH_PAGE;
    const unsigned long long at = (page > first ? page : first) & ~127ull;
    if (!(toucher && i < 16 && at < first + bytes)) return;
    if (how == 1) asm volatile("prefetch.global.L2 [%0];" :: "l"(at));
    if (how == 2) asm volatile("applypriority.global.L2::evict_normal [%0], 128;" :: "l"(at));
}
"""

FLOOR_SOURCE = TOUCH_SOURCE + r"""
#include "common.cuh"

// blockDim 256: threads 0-127 the token's key (2 KiB: 8 kv heads of d 128 in bf16), 128-255 its
// value; grid (sequences, q_len). Caches nhd of `capacity` tokens a sequence. deps 0: the row at
// a fixed pseudo-random position among the first `spread` tokens of the slot (spread 0: rows
// packed, token after token); deps 1: the position from seq_lens.
extern "C" __global__ void __launch_bounds__(256) spread_store(
        const uint4* __restrict__ k_new, const uint4* __restrict__ v_new, uint4* k_cache,
        uint4* v_cache, const int* __restrict__ lens, int q_len, int capacity, int spread,
        int deps, int touch) {
    const int s = blockIdx.x, t = blockIdx.y, i = threadIdx.x & 127;
    const bool key = threadIdx.x < 128;
    const long long token = (long long)s * q_len + t;
    const uint4 v = (key ? k_new : v_new)[token * 128 + i];
    const int len = deps != 0 ? lens[s] : q_len;
    uint4* cache = key ? k_cache : v_cache;
    touch_slot(cache + (long long)s * capacity * 128, (unsigned long long)capacity * 2048, i,
               touch != 0 && (threadIdx.x & 127) < 16, touch);
    long long row;
    bool write = true;
    if (deps == 0) {
        const unsigned hash = (unsigned)(s * q_len + t) * 2654435761u;
        row = spread == 0 ? token : (long long)s * capacity + hash % (unsigned)spread;
    } else {
        const int pos = len - q_len + t;
        write = pos >= 0;
        row = (long long)s * capacity + max(pos, 0);
    }
    store16_where(cache + row * 128 + i, v, write);
}
"""

def spread_call(floors, case: AppendCase, p, spread: int, deps: int, touch: int):
    """spread_store on ``case``'s tokens and caches (its new tokens are dense already)."""
    return launcher(floors, (case.batch, case.q_len), (256,), (
        np.uint64(p.k_new.data_ptr()), np.uint64(p.v_new.data_ptr()),
        np.uint64(p.k_cache.data_ptr()), np.uint64(p.v_cache.data_ptr()),
        np.uint64(p.seq_lens.data_ptr()), np.int32(case.q_len), np.int32(case.capacity),
        np.int32(spread), np.int32(deps), np.int32(touch)))


def main(out_path: str | None) -> int:
    shipped = module("kv_append.cu", None, True)
    floors = module("spread.cu", FLOOR_SOURCE, False).get_function("spread_store")
    results = []
    for case in (c for c in cases() if not c.paged):
        p = append_problem(torch, case)
        args = case_args(case, p)
        cache = DecodeCache("contiguous", False, case.capacity, 8, 128, 128)
        grid, block = append_shape(cache, ElementKind.bf16, case.batch, case.q_len)
        name = "kv_append_bf16_contiguous_nhd"
        calls = {"shipped": launcher(shipped.get_function(name), grid, block, args)}

        def store(spread: int, deps: int, touch: int, case=case, p=p):
            return spread_call(floors, case, p, spread, deps, touch)

        for spread in (case.capacity, 1024, 256, 32, 0):
            calls[f"spread {spread or 'dense'}"] = store(spread, 0, 0)
        for touch, how in TOUCHES.items():
            calls[f"spread {case.capacity} + {touch}"] = store(case.capacity, 0, how)
        calls["1 dep"] = store(case.capacity, 1, 0)
        for touch, how in TOUCHES.items():
            calls[f"1 dep + {touch}"] = store(case.capacity, 1, how)

        row = {"case": case.label, "bytes": case.written_bytes()}
        written = {}
        for name in ("shipped", "1 dep", *(f"1 dep + {t}" for t in TOUCHES)):
            p.k_cache.zero_()
            p.v_cache.zero_()
            calls[name]()
            torch.cuda.synchronize()
            written[name] = (p.k_cache.clone(), p.v_cache.clone())
        for name, (k, v) in written.items():
            if name != "shipped":
                row[f"{name} equals shipped"] = bool(
                    torch.equal(k, written["shipped"][0]) and torch.equal(v, written["shipped"][1]))
        del written
        src = torch.empty(case.written_bytes(), dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        results.append(add_times(row, functools.partial(dst.copy_, src), calls))
        p = None
        torch.cuda.empty_cache()
    write_rows(out_path, results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
