// What decode_attention.cu's partial kernels (its CUDA-core tiles and decode_mma.cuh's tensor-core
// tile) and its merge (decode_merge.cuh) share: the chunk, the workspace's layout, positions, the
// chunks no row sees, and each key's row offset (the programmatic launch's helpers are
// common.cuh's). The includer defines OPFACADE_STREAMING before this file (kv_cache.cuh's
// evict-first loads).
#pragma once
#include "kv_cache.cuh"

namespace {

using namespace kv_cache;

// Keys per chunk: fixed, never chosen from the batch (decode.py's CHUNK, where the figures that
// chose it are). OPFACADE_DECODE_CHUNK overrides it for the variants script.
#ifdef OPFACADE_DECODE_CHUNK
constexpr int kChunk = OPFACADE_DECODE_CHUNK;
#else
constexpr int kChunk = 512;
#endif
constexpr int kThreads = 128;

__device__ __forceinline__ float minus_infinity() { return __int_as_float(0xff800000); }

// Workspace of the partials: acc [b, Hkv, chunks, rows, Dv] then (m, l) [b, Hkv, chunks, rows, 2],
// rows = group * q_len, row r = t * group + (h - g * group).
__device__ __forceinline__ i64 partial_index(int s, int g, int chunk, int r, int heads_kv,
                                             int chunks, int rows) {
    return (((i64)s * heads_kv + g) * chunks + chunk) * rows + r;
}

// The partials' life in L2. The partial kernels store them with an L2 evict-last policy, and
// the merge drops each row's lines once it has read them (drop_partials), so a step's partials
// stay in L2 for its merge, where the KV stream's last-use lines leave first, and never reach
// DRAM. On three H200s the step read 0.4-1.5 points of a copy more on the many-wave rows,
// 2.3-4 more at q_len 4 (82.7-85.6% -> 86.3-88.2%; pages of 16 77.7-83.6% -> 83.5-86.6%), the
// same at B1 S32768 (scripts/decode_variants.py --partials-l2, record
// catalog/probes/decode_partials_l2_H200.json); either alone gained about half of that. Cache
// hints change no value. OPFACADE_PARTIALS_PLAIN (for that script) stores them plainly and
// keeps the lines.
template <typename V>
__device__ __forceinline__ void store_partial(float* p, const V& v) {
#ifdef OPFACADE_PARTIALS_PLAIN
    *reinterpret_cast<V*>(p) = v;
#else
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    if constexpr (sizeof(V) == 16) {
        const float4& x = reinterpret_cast<const float4&>(v);
        asm volatile("st.global.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;"
                     :: "l"(p), "f"(x.x), "f"(x.y), "f"(x.z), "f"(x.w), "l"(policy) : "memory");
    } else {
        asm volatile("st.global.L2::cache_hint.f32 [%0], %1, %2;"
                     :: "l"(p), "f"(v), "l"(policy) : "memory");
    }
#endif
}

// Drops from L2, without a write-back, the accumulator rows the calling CTA's threads have read
// (every load consumed, behind a barrier) and no one else reads this step: `count` rows of
// `width` floats, `step` floats apart. discard's lines hold indeterminate values afterwards,
// which the next step's partials overwrite before any read. Whole 128-byte lines only, so
// nothing is dropped unless the rows start 128-byte aligned and are whole lines long.
// Thread `index` of the `threads` sharing the work drops every threads-th line.
__device__ __forceinline__ void drop_partials(const float* first, i64 step, int count, int width,
                                              int index, int threads) {
#ifndef OPFACADE_PARTIALS_PLAIN
    if ((reinterpret_cast<unsigned long long>(first) & 127) != 0 || width % 32 != 0 ||
        step % 32 != 0) {
        return;
    }
    const int lines = width / 32;
    for (int i = index; i < count * lines; i += threads) {
        asm volatile("discard.global.L2 [%0], 128;"
                     :: "l"(first + (i / lines) * step + (i % lines) * 32) : "memory");
    }
#endif
}

// Every partial kernel's parameters, decode_attention.cu's and decode_wg.cu's (the spans kernels
// add their span): decode.py packs one argument list for all of them.
#define OPFACADE_PARTIAL_PARAMS(T)                                                               \
    const T *q, i64 q_sb, i64 q_st, i64 q_sh, OPFACADE_CACHE_PARAMS, const int *seq_lens,        \
        float *ws_acc, float *ws_ml, int q_len, int group, int tiles, int chunks, float scale,   \
        int left

// Row r of a kv head's rows (r = t * group + the query head's place in its group) belongs to
// new token r / group (its position: kv_cache.cuh's OPFACADE_TOKEN_POSITION). A macro for the
// reason given there.
#define OPFACADE_ROW_POSITION(len, q_len, row, group) \
    OPFACADE_TOKEN_POSITION(len, q_len, (row) / (group))

// Whether no row of a tile whose rows sit at positions [first_pos, last_pos] sees a key of the
// chunk of `keys` keys from k0: all lie after its last position, or before its first row's
// window.
__device__ __forceinline__ bool chunk_unseen(int k0, int keys, int first_pos, int last_pos,
                                             int left) {
    return k0 > last_pos || (left >= 0 && k0 + keys - 1 < first_pos - left);
}

// The partial of a chunk no row of the tile sees: m = -inf, l = 0 and acc = 0, so the merge
// reads only values written this run, weighted 0.
template <int D>
__device__ void write_unseen(const Cache& c, int s, int g, int chunk, int r0, int nr, int q_len,
                             int group, int chunks, float* __restrict__ ws_acc,
                             float* __restrict__ ws_ml) {
    const int rows = group * q_len;
    for (int e = threadIdx.x; e < nr * D; e += kThreads) {
        const int r = e / D;
        const i64 at = partial_index(s, g, chunk, r0 + r, c.heads_kv, chunks, rows);
        store_partial(ws_acc + (at * D + e - r * D), 0.0f);
    }
    if (threadIdx.x < nr) {
        const i64 at = partial_index(s, g, chunk, r0 + threadIdx.x, c.heads_kv, chunks, rows);
        store_partial(ws_ml + 2 * at, minus_infinity());
        store_partial(ws_ml + 2 * at + 1, 0.0f);
    }
}

// Whether no row of the tile sees a key of this chunk; then it writes the chunk's partial
// (write_unseen).
template <int D>
__device__ bool unseen_chunk(const Cache& c, int s, int g, int chunk, int r0, int nr, int len,
                             int keys, int q_len, int group, int chunks, int left,
                             float* __restrict__ ws_acc, float* __restrict__ ws_ml) {
    const int first_pos = OPFACADE_ROW_POSITION(len, q_len, r0, group);
    const int last_pos = OPFACADE_ROW_POSITION(len, q_len, r0 + nr - 1, group);
    if (!chunk_unseen(chunk * kChunk, keys, first_pos, last_pos, left)) return false;
    write_unseen<D>(c, s, g, chunk, r0, nr, q_len, group, chunks, ws_acc, ws_ml);
    return true;
}

// The chunk a kq or wgmma tile's CTA computes (x: kv head and row tile, tile fastest; y: chunk;
// z: sequence) and the rows and keys it holds. chunk_tile returns false where the CTA has
// nothing to read: a chunk the merge does not read (at or past ceil(len / kChunk)), a tile past
// the kv head's rows, or a chunk no row sees (whose partial it writes, unseen_chunk).
struct ChunkTile {
    int g, chunk, s;  // kv head, chunk, sequence
    int rows, r0, nr;  // the kv head's rows, the tile's first and how many it holds
    int len, k0, keys;  // the sequence's length, the chunk's first key and its key count
    int page[kChunk / kThreads];  // paged: the table's entries for this thread's keys (chunk_rows)
};

// A paged chunk's table entries for this thread's keys of the chunk from t.k0 (chunk_rows).
__device__ __forceinline__ void chunk_pages(const Cache& c, ChunkTile& t) {
    if (c.kind == 1) {
#pragma unroll
        for (int u = 0; u < kChunk / kThreads; ++u) {
            const int key = t.k0 + threadIdx.x + u * kThreads;
            t.page[u] = key < c.capacity ? table_entry(c, t.s, key) : -1;
        }
    }
}

template <int D, int R>
__device__ __forceinline__ bool chunk_tile(const Cache& c, const int* __restrict__ seq_lens,
                                           int q_len, int group, int tiles, int chunks, int left,
                                           float* __restrict__ ws_acc,
                                           float* __restrict__ ws_ml, ChunkTile& t,
                                           int chunk = blockIdx.y) {
    const int tile = blockIdx.x % tiles;
    t.g = blockIdx.x / tiles;
    t.chunk = chunk;
    t.s = blockIdx.z;
    t.rows = group * q_len;
    t.r0 = tile * R;
    t.nr = min(R, t.rows - t.r0);
    t.k0 = t.chunk * kChunk;
    // A paged chunk's table entries are loaded beside the length, not after it: every key up
    // to the capacity has an entry inside the table whatever the length, so the CTA's first
    // copies wait on one round trip to memory instead of two. Entries past the length are
    // never used (chunk_rows).
    chunk_pages(c, t);
    t.len = sequence_length(c, seq_lens, t.s);
    if (t.k0 >= t.len || t.nr <= 0) return false;
    t.keys = min(kChunk, t.len - t.k0);
    return !unseen_chunk<D>(c, t.s, t.g, t.chunk, t.r0, t.nr, t.len, t.keys, q_len, group, chunks,
                            left, ws_acc, ws_ml);
}

// Key `key`'s row of sequence s, kv head g, as an element offset from the sequence's K (and V)
// base; `page` is a paged cache's page for it (pool_page's -1, an entry outside the pool, reads
// page 0: garbage in, but inside the cache).
template <int D>
__device__ __forceinline__ i64 key_row(const Cache& c, int s, int g, int key, int page) {
    return c.kind == 1 ? offset(c, max(page, 0), page_slot(c, key), g, c.page_size, D)
                       : offset(c, c.kind == 2 ? 0 : s, key, g, c.capacity, D);
}

// Each key's row of the chunk (key_row) into row_off[0, keys): a paged cache's table lookup and
// page arithmetic leave the load loops, whose addresses then need no dependent load. The
// caller syncs before reading it.
template <int D>
__device__ __forceinline__ void chunk_rows(const Cache& c, int s, int g, int k0, int keys,
                                           i64* row_off) {
#pragma unroll
    for (int u = 0; u < kChunk / kThreads; ++u) {  // unrolled: the table loads fly together
        const int j = threadIdx.x + u * kThreads, key = k0 + j;
        if (j < keys) row_off[j] = key_row<D>(c, s, g, key, c.kind == 1 ? page_of(c, s, key) : 0);
    }
}

// chunk_rows for a chunk_tile's chunk, from the table entries chunk_tile loaded: the same offsets.
template <int D>
__device__ __forceinline__ void chunk_rows(const Cache& c, const ChunkTile& t, i64* row_off) {
#pragma unroll
    for (int u = 0; u < kChunk / kThreads; ++u) {
        const int j = threadIdx.x + u * kThreads, key = t.k0 + j;
        if (j < t.keys) row_off[j] = key_row<D>(c, t.s, t.g, key, pool_page(c, t.page[u]));
    }
}

// A sequence's own K and V bases: the tensors, or its entries of a pointer cache.
template <typename T>
__device__ __forceinline__ void sequence_bases(const Cache& c, int s, const T*& k_base,
                                               const T*& v_base) {
    k_base = static_cast<const T*>(c.k);
    v_base = static_cast<const T*>(c.v);
    if (c.kind == 2) {
        k_base = reinterpret_cast<const T*>(static_cast<const i64*>(c.k)[s]);
        v_base = reinterpret_cast<const T*>(static_cast<const i64*>(c.v)[s]);
    }
}

}  // namespace
