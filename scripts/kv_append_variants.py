"""Times native/kv_append.cu against a device copy of the same bytes, each replayed from a CUDA
graph (the bench's way: both are a few microseconds of latency), on the bench's kv_append cases,
beside floor kernels that show what the dependent loads cost. Every variant's caches are
compared bitwise with the shipped kernel's, and the shipped kernel's with torch's index_put.

    python3 scripts/kv_append_variants.py [--before=DIR] [--tree=NAME=DIR ...] [out.json]

Variants:
  shipped        native/kv_append.cu: a CTA per (sequence, token, head group, key or value),
                 threads (16-byte vector, kv head; keys and values in CTAs of their own since
                 the fiftieth session), a kernel per cache form and layout (since 2026-11-29; its
                 record catalog/probes/kv_append_forms_H200.json). (Before 2026-11-25: a
                 grid-stride loop, one thread per 16 bytes, placed by 32-bit division;
                 catalog/probes/kv_append_variants_H100.json has both.)
  shipped plain  the same with plain (not evict-first) loads and stores.
  shipped programmatic  the shipped kernel launched as the product launches it on sm_90 (since
                 the fifty-second session): a programmatic dependent of the stream's previous
                 kernel, which in a graph of its calls is the call before it.
  token late     the shipped kernel with its token's load a plain ld.global.lu, which ptxas
                 moves after the length's test (the form before the forty-ninth session's
                 volatile load): what loading the token after the length costs.
  any page size  paged cases: the shipped kernel that reads the page size (the shipped one for
                 pages of 16, 32 and 64 has it compiled in, since the forty-ninth session).
  before         with --before=DIR: DIR's kv_append.cu and kv_cache.cuh (a baseline tree's
                 native/, e.g. from `git archive`), compiled as the shipped one is. --tree=NAME=DIR
                 adds another such tree under NAME (a candidate's native/, say), DIR:H launches
                 it with H kv heads a CTA.
  specialized    the same with more of the cache description made constant (8 kv heads, and
                 for paged cases pages of 16 tokens): what the rest of the runtime description
                 costs. Paged cases also each alone: "specialized heads", "specialized pages".
Floors (one thread per 16 bytes, a CTA per 4 KB, the same bytes; no cache addressing):
  floor copy     load, store: a copy kernel of our own.
  floor 1 dep    load the data and seq_lens[s], store only if the length is non-negative: the
                 store waits for one dependent load, as a contiguous cache's does.
  floor 2 deps   also a page-table entry indexed by that length: two, as a paged cache's.
  floor ... programmatic  each floor waiting first for the previous kernel, as kv_append does,
                 and launched as its programmatic dependent: the like-for-like yardstick of
                 "shipped programmatic" (the device copy cannot launch so).
Scattered floors (a CTA per new token, its 2 KiB key and 2 KiB value stored into the case's own
caches, as kv_append stores them; no cache description):
  scatter 0 deps   each token's row from arithmetic alone (a fixed pseudo-random position, or
                   page and slot): the caches' spread, without a load before the store.
  scatter 1 dep    the position from seq_lens, as a contiguous cache's append (contiguous).
  scatter 2 deps   then the page from the table, as a paged cache's append (paged).
  split scatter ...  the same in kv_append's shape since the fiftieth session: a CTA of 128
                   threads per new token and side (grid.z 2, keys then values).
  What the dense floors leave out: kv_append's stores land all over caches of 0.5-2 GiB (one
  sequence's slot every 8 MiB, or pages spread over the pool), where a copy writes one dense
  buffer.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np
import torch

from opfacade._backends.nvrtc import compiler
from opfacade._backends.nvrtc.kv_cache import DecodeCache, append_shape
from opfacade._backends.nvrtc.launch import PackedLaunch
from opfacade._bench.graph_timing import MAX_REPLAY_ROUNDS, time_in_cuda_graphs
from opfacade._bench.kv_append import AppendCase, append_problem, cases
from opfacade._internal.streams import cupy_stream
from opfacade.types import ArchSku, ElementKind

FLOOR_SOURCE = r"""
// Each store is one predicated instruction (common.cuh's store16_where, plain without
// OPFACADE_STREAMING): a store behind an early return lets ptxas move the data's load past the
// return, after the loads the return tests (seen in this file's first form, whose floors thus
// waited on their loads one after the other).
#include "common.cuh"

#define OPFACADE_FLOOR_PARAMS                                                                   \
    const uint4 *__restrict__ src, uint4 *__restrict__ dst, const int *__restrict__ lens,      \
        const int *__restrict__ table, int sequences, int deps

__device__ __forceinline__ void floor_body(OPFACADE_FLOOR_PARAMS) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const uint4 v = src[i];
    bool write = true;
    if (deps >= 1) {
        const int s = blockIdx.x % sequences;
        const int len = lens[s];
        write = len >= 0;
        if (deps >= 2) write = write & (table[s * 257 + max(len, 0) / 16] >= 0);
    }
    store16_where(dst + i, v, write);
}

extern "C" __global__ void __launch_bounds__(256) floor_copy(OPFACADE_FLOOR_PARAMS) {
    floor_body(src, dst, lens, table, sequences, deps);
}

// The same, first waiting for the stream's previous kernel as kv_append does (common.cuh's
// follow_previous_grid), to be launched as its programmatic dependent.
extern "C" __global__ void __launch_bounds__(256) floor_copy_follows(OPFACADE_FLOOR_PARAMS) {
    follow_previous_grid();
    floor_body(src, dst, lens, table, sequences, deps);
}

// Thread i of a token's key (key) or value row (2 KiB: 8 kv heads of d 128 in bf16), stored into
// caches nhd of rows of `tokens` tokens (a sequence's capacity, or a page's size).
__device__ __forceinline__ void scatter_row(
        bool key, int i, const uint4* __restrict__ k_new, const uint4* __restrict__ v_new,
        uint4* k_cache, uint4* v_cache, const int* __restrict__ lens,
        const int* __restrict__ table, int q_len, int capacity, int tokens, int max_pages,
        int rows, int paged, int deps) {
    const int s = blockIdx.x, t = blockIdx.y;
    const long long token = (long long)s * q_len + t;
    const uint4 v = (key ? k_new : v_new)[token * 128 + i];
    long long row;
    bool write = true;
    if (deps == 0) {
        const unsigned hash = (unsigned)(s * q_len + t) * 2654435761u;
        row = paged ? (long long)(hash % (unsigned)rows) * tokens + (hash >> 7) % tokens
                    : (long long)s * capacity + hash % (unsigned)capacity;
    } else {
        const int pos = lens[s] - q_len + t;
        write = pos >= 0;
        const int at = max(pos, 0);
        row = paged ? (long long)table[s * max_pages + at / tokens] * tokens + at % tokens
                    : (long long)s * capacity + at;
    }
    store16_where((key ? k_cache : v_cache) + row * 128 + i, v, write);
}

#define OPFACADE_SCATTER_PARAMS                                                                 \
    const uint4 *__restrict__ k_new, const uint4 *__restrict__ v_new, uint4 *k_cache,          \
        uint4 *v_cache, const int *__restrict__ lens, const int *__restrict__ table, int q_len, \
        int capacity, int tokens, int max_pages, int rows, int paged, int deps
#define OPFACADE_SCATTER_ARGS                                                                   \
    k_new, v_new, k_cache, v_cache, lens, table, q_len, capacity, tokens, max_pages, rows,     \
        paged, deps

// kv_append's shape before the fiftieth session: blockDim 256, threads 0-127 the token's key,
// 128-255 its value; grid (sequences, q_len).
extern "C" __global__ void __launch_bounds__(256) floor_scatter(OPFACADE_SCATTER_PARAMS) {
    scatter_row(threadIdx.x < 128, threadIdx.x & 127, OPFACADE_SCATTER_ARGS);
}

// Its shape since: blockDim 128, grid (sequences, q_len, 2), z 0 the keys and z 1 the values.
extern "C" __global__ void __launch_bounds__(128) floor_scatter_split(OPFACADE_SCATTER_PARAMS) {
    scatter_row(blockIdx.z == 0, threadIdx.x, OPFACADE_SCATTER_ARGS);
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
            np.uint64(p.seq_lens.data_ptr()), np.int32(case.q_len))


def launcher(function, grid, block, args):
    def call() -> None:
        stream = cupy_stream(torch.cuda.current_stream().cuda_stream, torch.cuda.current_device())
        function(grid, block, args, stream=stream)

    return call


def programmatic_launcher(function, grid, block, args):
    """A launch as the product makes kv_append's on sm_90: a programmatic dependent of the
    stream's previous kernel (PackedLaunch's overlap_previous), on torch's current stream (one
    PackedLaunch a stream, made at its first call there)."""
    made = {}

    def call() -> None:
        stream = torch.cuda.current_stream().cuda_stream
        if stream not in made:
            made[stream] = PackedLaunch(function, grid, block, args, stream,
                                        torch.cuda.current_device(), overlap_previous=True)
        made[stream]()

    return call


def interleaved_us(calls: dict, reps: int = 20) -> dict[str, float]:
    """Each call's microseconds from a CUDA graph of ``reps`` calls, the graphs replayed in
    rounds whose order rotates, as the bench replays its own (``graph_timing``): one pass in a
    fixed order had moved a copy's time by 14% within a row on an H200. (The thirty-sixth
    session's records were timed by this script's own loop before it used the bench's: 7
    rounds, each the median of 30 replays.)"""
    times, failed = time_in_cuda_graphs(calls, {}, dict.fromkeys(calls, reps), MAX_REPLAY_ROUNDS)
    if failed:
        raise RuntimeError(f"not captured: {failed}")
    return {name: ms * 1e3 for name, ms in times.items()}


def add_times(row: dict, copy, calls: dict) -> dict:
    """``row`` with each of ``calls`` timed beside ``copy`` (interleaved_us): its us a call and
    its fraction of the copy's (copy us / its us); printed as a JSON line."""
    times = interleaved_us({"copy": copy, **calls})
    copy_us = times.pop("copy")
    row["copy us"] = round(copy_us, 3)
    for name, us in times.items():
        row[f"{name} us"] = round(us, 3)
        row[f"{name} of copy"] = round(copy_us / us, 3)
    print(json.dumps(row), flush=True)
    return row


def write_rows(out_path: str | None, rows: list[dict]) -> None:
    """The rows and the GPU's name as JSON at ``out_path``, if given."""
    if out_path:
        with open(out_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


def specialized_module(heads8: bool, page16: bool):
    """native/kv_append.cu with its cache header inlined and specialised: with ``heads8`` 8 kv
    heads (the kernels already hold the form and layout as constants), with ``page16`` pages of
    16 tokens: how much of the kernel's time above the floors the rest of the runtime cache
    description costs. Every replacement must take (asserted), so a source that moves on
    fails here instead of timing the shipped kernel under this name."""
    header = compiler.read_native("kv_cache.cuh").replace("#pragma once", "")
    text = compiler.read_native("kv_append.cu").replace('#include "kv_cache.cuh"', header)
    # (the kernels that set their own page size set it to what the swap makes it)
    swaps = ([("c.heads_kv", "8")] if heads8 else []) + ([
        ("if (PAGE > 0) c.page_size = PAGE;", ""), ("c.page_size", "16")] if page16 else [])
    for old, new in swaps:
        assert old in text, old
        text = text.replace(old, new)
    return module(f"kv_append_specialized_{int(heads8)}{int(page16)}.cu", text, True)


def token_late_module():
    """native/kv_append.cu with the token's load plain (ptxas then issues it after the length's
    test, as it did before load16_now)."""
    text = compiler.read_native("kv_append.cu")
    old = "ld.volatile.global.v4.u32"
    assert old in text, old
    return module("kv_append_token_late.cu", text.replace(old, "ld.global.lu.v4.u32"), True)


def tree_module(root: Path, name: str = "before"):
    """``root``'s kv_append.cu with ``root``'s cache header inlined (the shipped header would be
    found by the include otherwise)."""
    header = (root / "kv_cache.cuh").read_text().replace("#pragma once", "")
    text = (root / "kv_append.cu").read_text().replace('#include "kv_cache.cuh"', header)
    return module(f"kv_append_{name.replace(' ', '_')}.cu",
                  text.replace("#define OPFACADE_STREAMING 1", ""), True)


def tree_shape(grid, block, shared_warps: bool, heads: int | None):
    """A tree's launch shape from the shipped one (append_shape's: keys and values in CTAs of
    their own since the fiftieth session): with ``heads`` kv heads a CTA, and for a tree of the
    design before, whose warps held a head's key and value lanes together, grid.z halved and
    twice the threads a head. (8 kv heads of equal key and value dims, as the bench's cases.)"""
    per_cta = heads or block[1]
    sides = 1 if shared_warps else 2
    return ((grid[0], grid[1], sides * -(-8 // per_cta)),
            (block[0] * (2 if shared_warps else 1), per_cta))


def shares_warps(source: str) -> bool:
    """Whether a kv_append.cu is of the design before the fiftieth session (a thread's side,
    key or value, from its lane: ``e < key_vecs``)."""
    return "is_key = e < key_vecs" in source


def kernel_of(loaded, case: AppendCase):
    """``loaded``'s bf16 kv_append kernel for ``case``'s cache (nhd): a kernel a cache form
    since the thirty-sixth session (and since the forty-ninth one a usual page size, whose kernel
    this takes), one for every form before (a --before tree's)."""
    import cupy

    names = [f"kv_append_bf16_paged{case.page_size}_nhd", "kv_append_bf16_paged_nhd"
             ] if case.paged else ["kv_append_bf16_contiguous_nhd"]
    for name in [*names, "kv_append_bf16"]:
        try:
            return loaded.get_function(name)
        except cupy.cuda.driver.CUDADriverError:
            continue
    raise LookupError(names)


def main(out_path: str | None, trees: dict[str, Path]) -> int:
    shipped = {streaming: module("kv_append.cu", None, streaming) for streaming in (True, False)}
    heads = {name: int(root.name.split(":")[1]) for name, root in trees.items()
             if ":" in root.name}
    trees = {name: root.with_name(root.name.split(":")[0]) for name, root in trees.items()}
    loaded_trees = {name: tree_module(root, name) for name, root in trees.items()}
    shared = {name for name, root in trees.items()
              if shares_warps((root / "kv_append.cu").read_text())}
    specialized = {(heads8, page16): specialized_module(heads8, page16)
                   for heads8, page16 in ((True, False), (True, True), (False, True))}
    token_late = token_late_module()
    floors = module("floor.cu", FLOOR_SOURCE, False)
    floor, scatter = floors.get_function("floor_copy"), floors.get_function("floor_scatter")
    floor_follows = floors.get_function("floor_copy_follows")
    scatter_split = floors.get_function("floor_scatter_split")
    results = []
    for case in cases():
        p = append_problem(torch, case)
        args = case_args(case, p)
        nbytes = case.written_bytes()
        cache = DecodeCache("contiguous", False, case.capacity, 8, 128, 128)
        grid, block = append_shape(cache, ElementKind.bf16, case.batch, case.q_len)
        calls = {name: launcher(kernel_of(shipped[streaming], case), grid, block,
                                args)
                 for name, streaming in (("shipped", True), ("shipped plain", False))}
        calls["shipped programmatic"] = programmatic_launcher(
            kernel_of(shipped[True], case), grid, block, args)
        calls["specialized"] = launcher(kernel_of(specialized[True, case.paged], case),
                                        grid, block, args)
        calls["token late"] = launcher(kernel_of(token_late, case), grid, block, args)
        if case.paged:
            calls["specialized heads"] = launcher(kernel_of(specialized[True, False], case),
                                                  grid, block, args)
            calls["specialized pages"] = launcher(kernel_of(specialized[False, True], case),
                                                  grid, block, args)
            calls["any page size"] = launcher(shipped[True].get_function(
                "kv_append_bf16_paged_nhd"), grid, block, args)
        for name, loaded in loaded_trees.items():
            shape = tree_shape(grid, block, name in shared, heads.get(name))
            calls[name] = launcher(kernel_of(loaded, case), *shape, args)
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        table = torch.zeros(case.batch * 257, dtype=torch.int32, device="cuda")
        for deps, name in enumerate(("floor copy", "floor 1 dep", "floor 2 deps")):
            floor_args = (np.uint64(src.data_ptr()), np.uint64(dst.data_ptr()),
                          np.uint64(p.seq_lens.data_ptr()), np.uint64(table.data_ptr()),
                          np.int32(case.batch), np.int32(deps))
            calls[name] = launcher(floor, (nbytes // 16 // 256,), (256,), floor_args)
            calls[f"{name} programmatic"] = programmatic_launcher(
                floor_follows, (nbytes // 16 // 256,), (256,), floor_args)
        k_src, v_src = p.k_new.contiguous(), p.v_new.contiguous()
        table_ptr = 0 if p.table is None else p.table.data_ptr()
        rows = p.k_cache.shape[0]
        kinds = ((0, "scatter 0 deps"), (2, "scatter 2 deps")) if case.paged else (
            (0, "scatter 0 deps"), (1, "scatter 1 dep"))
        for deps, name in kinds:
            scatter_args = (
                np.uint64(k_src.data_ptr()), np.uint64(v_src.data_ptr()),
                np.uint64(p.k_cache.data_ptr()), np.uint64(p.v_cache.data_ptr()),
                np.uint64(p.seq_lens.data_ptr()), np.uint64(table_ptr), np.int32(case.q_len),
                np.int32(case.capacity), np.int32(p.k_cache.shape[1]),
                np.int32(case.max_pages if case.paged else 0), np.int32(rows),
                np.int32(case.paged), np.int32(deps))
            calls[name] = launcher(scatter, (case.batch, case.q_len), (256,), scatter_args)
            calls[f"split {name}"] = launcher(scatter_split, (case.batch, case.q_len, 2),
                                              (128,), scatter_args)
        copy = functools.partial(dst.copy_, src)
        row = {"case": case.label, "bytes": nbytes}
        reference = None
        for name in ("shipped", "shipped plain", "shipped programmatic", "specialized",
                     "specialized heads", "specialized pages", "token late", "any page size",
                     *loaded_trees, "scatter 1 dep", "scatter 2 deps", "split scatter 1 dep",
                     "split scatter 2 deps"):
            if name not in calls:
                continue
            p.k_cache.zero_()
            p.v_cache.zero_()
            calls[name]()
            torch.cuda.synchronize()
            written = (p.k_cache.clone(), p.v_cache.clone())
            if reference is None:
                reference = written
                expected = [torch.zeros_like(p.k_cache), torch.zeros_like(p.v_cache)]
                expected[0].index_put_(p.index, p.k_new)
                expected[1].index_put_(p.index, p.v_new)
                row["shipped equals index_put"] = bool(torch.equal(expected[0], written[0])
                                                       and torch.equal(expected[1], written[1]))
            else:
                row[f"{name} equals shipped"] = bool(torch.equal(reference[0], written[0])
                                                     and torch.equal(reference[1], written[1]))
        results.append(add_times(row, copy, calls))
    write_rows(out_path, results)
    return 0


if __name__ == "__main__":
    trees = {}
    for arg in sys.argv[1:]:
        if arg.startswith("--before="):
            trees["before"] = Path(arg.split("=", 1)[1])
        elif arg.startswith("--tree="):
            name, root = arg.split("=", 1)[1].split("=", 1)
            trees[name] = Path(root)
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    sys.exit(main(paths[0] if paths else None, trees))
