// The KV caches the decode_attention and kv_append kernels address (issue 13): their forms,
// where a position's row starts, and which lengths and pages count (decode_attention.cu,
// kv_append.cu). The kernels' cache parameters are OPFACADE_CACHE_PARAMS, passed on as a Cache
// by OPFACADE_CACHE_ARGS.
//
// Caches (element (row, token, kv head, d); `row` the sequence or the page):
//   kind 0 contiguous   nhd [B, cap, Hkv, D]          hnd [B, Hkv, cap, D]
//   kind 1 paged        nhd [pages, psize, Hkv, D]    hnd [pages, Hkv, psize, D]
//                       page of position p = table[s * max_pages + p / psize]
//   kind 2 pointers     per-sequence base addresses (int64 [b]), each [cap, Hkv, D] (hnd:
//                       [Hkv, cap, D])
// Every cache is dense in its own layout, 16-byte aligned (checked on the host; a per-sequence
// address is checked here: a null or unaligned one makes its sequence empty). Reads clamp
// garbage lengths and page indices into the caches; writes skip them. Unchecked runs therefore
// never touch memory outside the caches (pointers excepted: an address is the caller's word).
#pragma once

#include "common.cuh"

// New token t of a sequence of len tokens, whose last q_len are the new ones, sits at position
// len - q_len + t: where kv_append writes it and up to where decode_attention's row of it
// attends. A macro, not a function: written as a call, the same arithmetic gave the decode
// partial kernels other SASS (other register choices, and 40 more instructions in the
// tensor-core tile).
#define OPFACADE_TOKEN_POSITION(len, q_len, t) ((len) - (q_len) + (t))

namespace kv_cache {

struct Cache {
    const void* k;  // kind 0/1: the tensor; kind 2: const i64* of per-sequence addresses
    const void* v;
    const int* table;  // kind 1
    int kind, hnd;
    int capacity;  // tokens a sequence may hold
    int page_size, max_pages, pages;  // kind 1
    int heads_kv, dim, dim_v;
};

// Element offset of (row, token, kv head) in a dense cache block of `tokens` tokens.
__device__ __forceinline__ i64 offset(const Cache& c, i64 row, int token, int g, int tokens,
                                      int dim) {
    return c.hnd ? ((row * c.heads_kv + g) * (i64)tokens + token) * dim
                 : ((row * tokens + token) * (i64)c.heads_kv + g) * dim;
}

__device__ __forceinline__ bool usable_address(i64 address) {
    return address != 0 && (address & 15) == 0;
}

// Tokens sequence s holds, clamped to [0, capacity]; 0 where its cache address is unusable.
__device__ __forceinline__ int sequence_length(const Cache& c, const int* seq_lens, int s) {
    if (c.kind == 2 && !(usable_address(static_cast<const i64*>(c.k)[s]) &&
                         usable_address(static_cast<const i64*>(c.v)[s]))) {
        return 0;
    }
    return min(max(seq_lens[s], 0), c.capacity);
}

// p / page_size and p % page_size: a shift and a mask for the usual power-of-two page sizes.
// A division by a runtime int is a long dependent instruction sequence, and kv_append is a few
// microseconds of latency. On an H100 (scripts/kv_append_variants.py) its paged calls took
// 0.35 us less in one run with the page size a compile-time constant; this shift moved them
// from 0.61 to 0.62-0.64 of a copy, within run-to-run noise. The branch is uniform.
__device__ __forceinline__ int page_index(const Cache& c, int p) {
    const int size = c.page_size;
    return (size & (size - 1)) == 0 ? p >> (__ffs(size) - 1) : p / size;
}

__device__ __forceinline__ int page_slot(const Cache& c, int p) {
    const int size = c.page_size;
    return (size & (size - 1)) == 0 ? p & (size - 1) : p % size;
}

// The table's entry for position p of sequence s, as written (p below the capacity). Loaded
// in asm so that the compiler keeps it where it is written: decode's chunk_tile issues it
// beside the sequence's length, ahead of the branch on that length.
__device__ __forceinline__ int table_entry(const Cache& c, int s, int p) {
    int page;
    asm volatile("ld.global.b32 %0, [%1];"
                 : "=r"(page) : "l"(c.table + ((i64)s * c.max_pages + page_index(c, p))));
    return page;
}

// A table entry as a page of the pool, or -1 where it is outside the pool.
__device__ __forceinline__ int pool_page(const Cache& c, int entry) {
    return entry >= 0 && entry < c.pages ? entry : -1;
}

// The page of position p of sequence s, or -1 where the table's entry is outside the pool.
__device__ __forceinline__ int page_of(const Cache& c, int s, int p) {
    return pool_page(c, c.table[(i64)s * c.max_pages + page_index(c, p)]);
}

__device__ __forceinline__ Cache make_cache(const void* k, const void* v, const int* table,
                                            int kind, int hnd, int capacity, int page_size,
                                            int max_pages, int pages, int heads_kv, int dim,
                                            int dim_v) {
    return {k, v, table, kind, hnd, capacity, page_size, max_pages, pages, heads_kv, dim, dim_v};
}

}  // namespace kv_cache

#define OPFACADE_CACHE_PARAMS                                                                    \
    const void *k, const void *v, const int *table, int kind, int hnd, int capacity,            \
        int page_size, int max_pages, int pages, int heads_kv, int dim, int dim_v
#define OPFACADE_CACHE_ARGS                                                                      \
    kv_cache::make_cache(k, v, table, kind, hnd, capacity, page_size, max_pages, pages,          \
                         heads_kv, dim, dim_v)

