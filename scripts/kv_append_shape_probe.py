"""What shape of grid a few-microsecond store of kv_append's bytes is fastest in: threads per
CTA, 16-byte vectors per thread, with and without a length loaded before the store.

    python3 scripts/kv_append_shape_probe.py [out.json]

scripts/kv_append_spread_probe.py (fiftieth session, H200) found that the spread of kv_append's
stores over its caches costs nothing measurable, and that a dense store of the same bytes in
kv_append's grid (a CTA of 256 threads per token, one vector each) already takes 0.08-0.19 us
more than the device copy the bench divides by. This times that store in other shapes:
  dense vV tT dD   T threads a CTA, V vectors a thread (its V loads issued before any store),
                   D = 0: no load but the data's, D = 1: a length loaded with the data, and the
                   stores predicated on it (a contiguous append's one dependent load)
  empty            a one-thread kernel that does nothing: what a graph's kernel node costs
  copy             torch's device copy of the bytes (the bench's divisor)
at 262 KB and 1 MB (the bench's B64 and B256 / q_len 4 rows), every contestant from CUDA graphs
in rotating interleaved rounds (graph_timing, as the bench).

Found (fiftieth session, one H200, record catalog/probes/kv_append_shape_H200.json): a graph's
empty kernel node 0.79 us; the copy 1.30 / 1.48 us (262 KB / 1 MB); one vector a thread in CTAs
of 256 or 128 threads was fastest, 1.30-1.35 / 1.53-1.54 us with no length and 1.39-1.50 /
1.65-1.67 with one (this kernel loads the length late, after a branch on deps); more vectors a
thread or CTAs of 512 and 1024 threads were slower everywhere (up to 2.76 us). kv_append's grid
of then (256 threads, one vector each) was already that shape: its cost above the floors was not
the grid's size but what each thread ran before its loads (see kv_append_variants.py's trees).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from kv_append_variants import add_times, launcher, module, write_rows  # noqa: E402

VECTORS = (1, 2, 4)
THREADS = (128, 256, 512, 1024)
SIZES = (262144, 1048576)

SOURCE = r"""
#include "common.cuh"

// Thread i of the grid moves vectors i, i + n, ..., i + (V - 1) n of n = the grid's threads (so
// a warp's accesses stay dense), loading all of them before storing any.
template <int V>
__device__ void dense_store(const uint4* __restrict__ src, uint4* dst,
                            const int* __restrict__ lens, int sequences, int deps) {
    const int n = gridDim.x * blockDim.x;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    uint4 v[V];
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = src[i + k * n];
    const bool write = deps == 0 || lens[blockIdx.x % sequences] >= 0;
#pragma unroll
    for (int k = 0; k < V; ++k) store16_where(dst + i + k * n, v[k], write);
}

#define OPFACADE_DENSE(V)                                                                       \
    extern "C" __global__ void dense_store_v##V(const uint4* src, uint4* dst, const int* lens, \
                                                int sequences, int deps) {                      \
        dense_store<V>(src, dst, lens, sequences, deps);                                        \
    }
OPFACADE_DENSE(1)
OPFACADE_DENSE(2)
OPFACADE_DENSE(4)

extern "C" __global__ void empty_kernel() {}
"""


def main(out_path: str | None) -> int:
    loaded = module("shape.cu", SOURCE, False)
    empty = loaded.get_function("empty_kernel")
    lens = torch.arange(64, dtype=torch.int32, device="cuda")
    results = []
    for size in SIZES:
        src = torch.randint(0, 255, (size,), dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        calls = {"empty": launcher(empty, (1,), (1,), ())}
        vectors = size // 16
        for v in VECTORS:
            function = loaded.get_function(f"dense_store_v{v}")
            for t in THREADS:
                for deps in (0, 1):
                    calls[f"dense v{v} t{t} d{deps}"] = launcher(
                        function, (vectors // (v * t),), (t,),
                        (np.uint64(src.data_ptr()), np.uint64(dst.data_ptr()),
                         np.uint64(lens.data_ptr()), np.int32(64), np.int32(deps)))
        row = {"bytes": size}
        for name, call in calls.items():
            if name == "empty":
                continue
            dst.zero_()
            call()
            torch.cuda.synchronize()
            if not torch.equal(dst, src):
                row[f"{name} wrong"] = True
        results.append(add_times(row, functools.partial(dst.copy_, src), calls))
    write_rows(out_path, results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
