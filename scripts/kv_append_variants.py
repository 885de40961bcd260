"""Times variants of native/kv_append.cu against a device copy of the same bytes, each replayed
from a CUDA graph (the bench's way: both are a few microseconds of latency), on the bench's
kv_append cases. Every variant's caches are compared bitwise with the shipped kernel's.

    python3 scripts/kv_append_variants.py [out.json]

Variants:
  shipped        native/kv_append.cu: a grid-stride loop, one thread per 16 bytes, indices by
                 32-bit division.
  shipped plain  the same with plain (not evict-first) loads and stores.
  tile           one CTA per (head group, new token, sequence): threads (16-byte vector, kv head),
                 so no division finds a thread's place, and the token's length and page are one
                 broadcast load per CTA.
  tile plain     the tile with plain loads and stores.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys

import numpy as np
import torch

from opfacade._backends.nvrtc import compiler
from opfacade._backends.nvrtc.decode import DecodeCache
from opfacade._bench.kv_append import AppendCase, append_problem, cases
from opfacade.types import ArchSku

TILE_SOURCE = r"""
#include "kv_cache.cuh"
namespace {
using namespace kv_cache;
template <typename T>
__device__ void append_tile(const T* __restrict__ k_new, i64 k_sb, i64 k_st, i64 k_sh,
                            const T* __restrict__ v_new, i64 v_sb, i64 v_st, i64 v_sh,
                            const Cache& c, const int* __restrict__ seq_lens, int q_len) {
    constexpr int kVec = 16 / sizeof(T);
    const int key_vecs = c.dim / kVec;
    const int e = threadIdx.x;  // blockDim.x: the vectors of one head's key and value
    const int g = blockIdx.x * blockDim.y + threadIdx.y;
    const int t = blockIdx.y, s = blockIdx.z;
    if (g >= c.heads_kv) return;
    const bool is_key = e < key_vecs;
    const int col = (is_key ? e : e - key_vecs) * kVec;
    const uint4 bytes = load16(is_key ? k_new + s * k_sb + t * k_st + g * k_sh + col
                                      : v_new + s * v_sb + t * v_st + g * v_sh + col);
    const int pos = seq_lens[s] - q_len + t;
    if (pos < 0 || pos >= c.capacity) return;
    if (c.kind == 2 && sequence_length(c, seq_lens, s) == 0) return;
    int page = -1;
    if (c.kind == 1 && (page = page_of(c, s, pos)) < 0) return;
    T* dst = const_cast<T*>(is_key ? row_at<T>(c, c.k, s, pos, g, c.dim, page)
                                   : row_at<T>(c, c.v, s, pos, g, c.dim_v, page)) + col;
    store16(dst, bytes);
}
}  // namespace
extern "C" __global__ void __launch_bounds__(1024) kv_append_tile_bf16(
    const bf16_t* k_new, i64 k_sb, i64 k_st, i64 k_sh, const bf16_t* v_new, i64 v_sb, i64 v_st,
    i64 v_sh, OPFACADE_CACHE_PARAMS, const int* seq_lens, int sequences, int q_len) {
    append_tile<bf16_t>(k_new, k_sb, k_st, k_sh, v_new, v_sb, v_st, v_sh, OPFACADE_CACHE_ARGS,
                        seq_lens, q_len);
}
"""


def module(name: str, source: str | None, streaming: bool):
    import cupy

    text = compiler.read_native(name) if source is None else source
    if source is not None:
        text = ("#define OPFACADE_STREAMING 1\n" if streaming else "") + text
    else:
        text = text.replace("#define OPFACADE_STREAMING 1", "#define OPFACADE_STREAMING "
                            + ("1" if streaming else "0"))
    cubin = compiler.compile_cubin(f"variant_{name}", ArchSku.sm90, source=text,
                                   use_cache=False).cubin
    loaded = cupy.cuda.function.Module()
    loaded.load(cubin)
    return loaded


def case_args(case: AppendCase, p) -> tuple:
    cache = DecodeCache("paged" if case.paged else "contiguous", False, case.capacity, 8, 128,
                        128, case.page_size or 0, case.max_pages if case.paged else 0,
                        p.k_cache.shape[0] if case.paged else 0)
    k_strides = p.k_new.stride()[:3]
    v_strides = p.v_new.stride()[:3]
    table = 0 if p.table is None else p.table.data_ptr()
    return (np.uint64(p.k_new.data_ptr()), *(np.int64(x) for x in k_strides),
            np.uint64(p.v_new.data_ptr()), *(np.int64(x) for x in v_strides),
            *cache.args(p.k_cache.data_ptr(), p.v_cache.data_ptr(), table),
            np.uint64(p.seq_lens.data_ptr()), np.int32(case.batch), np.int32(case.q_len))


def launcher(function, grid, block, args):
    import cupy

    def call() -> None:
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        function(grid, block, args, stream=stream)

    return call


def graph_us(call, reps: int = 20, replays: int = 30) -> float:
    """Microseconds per call, from a CUDA graph of ``reps`` calls replayed ``replays`` times."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(reps):
            call()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def main(out_path: str | None) -> int:
    shipped = {streaming: module("kv_append.cu", None, streaming) for streaming in (True, False)}
    tile = {streaming: module("kv_append_tile.cu", TILE_SOURCE, streaming)
            for streaming in (True, False)}
    results = []
    for case in cases():
        p = append_problem(torch, case)
        args = case_args(case, p)
        nbytes = case.written_bytes()
        vectors = nbytes // 16
        grid = (max(1, min(132 * 8, -(-vectors // 128))),)
        per_head = 2 * 128 * 2 // 16
        heads_per_cta = min(8, 1024 // per_head)
        tile_grid = (-(-8 // heads_per_cta), case.q_len, case.batch)
        calls = {
            "shipped": launcher(shipped[True].get_function("kv_append_bf16"), grid, (128,), args),
            "shipped plain": launcher(shipped[False].get_function("kv_append_bf16"), grid,
                                      (128,), args),
            "tile": launcher(tile[True].get_function("kv_append_tile_bf16"), tile_grid,
                             (per_head, heads_per_cta), args),
            "tile plain": launcher(tile[False].get_function("kv_append_tile_bf16"), tile_grid,
                                   (per_head, heads_per_cta), args),
        }
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        copy = functools.partial(torch.empty_like(src).copy_, src)
        reference = None
        row = {"case": case.label, "bytes": nbytes}
        for name, call in calls.items():
            p.k_cache.zero_()
            p.v_cache.zero_()
            call()
            torch.cuda.synchronize()
            written = (p.k_cache.clone(), p.v_cache.clone())
            if reference is None:
                reference = written
                expected_k = torch.zeros_like(p.k_cache)
                expected_k.index_put_(p.index, p.k_new)
                row["shipped equals index_put"] = bool(torch.equal(expected_k, written[0]))
            else:
                row[f"{name} equals shipped"] = bool(torch.equal(reference[0], written[0])
                                                     and torch.equal(reference[1], written[1]))
        copy_us = graph_us(copy)
        row["copy us"] = round(copy_us, 3)
        for name, call in calls.items():
            us = graph_us(call)
            row[f"{name} us"] = round(us, 3)
            row[f"{name} of copy"] = round(copy_us / us, 3)
        row["copy again us"] = round(graph_us(copy), 3)
        print(json.dumps(row))
        results.append(row)
    if out_path:
        with open(out_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
