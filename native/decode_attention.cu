// Decode attention over KV caches, split over fixed chunks of keys (issue 13), and kv_append.
// NOT YET RUN ON A GPU: compiled and parameter-checked on the host only (tests/
// test_decode_kernels.py); the next GPU session verifies it before any SKU is registered.
//
//   decode_partial_<T>   CTA = (chunk c of kChunk keys, kv head g and row tile, sequence s). Its
//                        rows are the query heads of g's group times the q_len new tokens (up to
//                        kRows of them), so each K and V byte of the chunk is read once per
//                        tile. It writes, per row, the chunk's max score m, its sum l of
//                        exp(s - m) and acc = sum exp(s - m) v into the workspace.
//   decode_merge_<T>     CTA = (sequence, query head, new token): merges the sequence's chunks
//                        in order 0, 1, ... into out and lse.
//   kv_append_<T>        CTA = (sequence, new token, kv head): writes k_new and v_new at the
//                        token's position.
//
// Batch invariance: the chunk size is a constant, a chunk's work depends on its own sequence's
// data only, and the merge runs in chunk order, so a sequence's out and lse are bitwise the same
// whatever else is in the batch. Nothing uses atomics: runs repeat bitwise.
//
// Positions: new token t of sequence s is at pos = len - q_len + t (len = seq_lens[s], clamped to
// [0, capacity]). It sees keys p with p <= pos and, with a window, p >= pos - left; pos < 0
// sees none (out 0, lse -inf).
//
// Caches (element (row, token, kv head, d); `row` the sequence or the page):
//   kind 0 contiguous   nhd [B, cap, Hkv, D]          hnd [B, Hkv, cap, D]
//   kind 1 paged        nhd [pages, psize, Hkv, D]    hnd [pages, Hkv, psize, D]
//                       page of position p = table[s * max_pages + p / psize] clamped into
//                       [0, pages), slot p % psize
//   kind 2 pointers     per-sequence base addresses (int64 [b]), each [cap, Hkv, D] (hnd:
//                       [Hkv, cap, D])
// Every cache is dense in its own layout (checked on the host). Garbage lengths and page indices
// are clamped, so unchecked runs never read or write outside the caches (pointers excepted: an
// address is the caller's word).
#include "common.cuh"

namespace {

constexpr int kChunk = 256;   // keys per chunk: fixed, never chosen from the batch
constexpr int kRows = 16;     // query rows per CTA tile
constexpr int kThreads = 128;
constexpr int kMaxDim = 256;

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

// Where key/value position p of sequence s, kv head g, starts.
template <typename T>
__device__ __forceinline__ const T* row_at(const Cache& c, const void* base, int s, int p, int g,
                                           int dim) {
    if (c.kind == 1) {
        int page = c.table[(i64)s * c.max_pages + p / c.page_size];
        page = min(max(page, 0), c.pages - 1);
        return static_cast<const T*>(base) + offset(c, page, p % c.page_size, g, c.page_size, dim);
    }
    if (c.kind == 2) {
        const T* own = reinterpret_cast<const T*>(static_cast<const i64*>(base)[s]);
        return own + offset(c, 0, p, g, c.capacity, dim);
    }
    return static_cast<const T*>(base) + offset(c, s, p, g, c.capacity, dim);
}

__device__ __forceinline__ int clamped_length(const int* seq_lens, int s, int capacity) {
    return min(max(seq_lens[s], 0), capacity);
}

__device__ __forceinline__ float minus_infinity() { return __int_as_float(0xff800000); }

// Workspace of the partials: acc [b, Hkv, chunks, rows, Dv] then (m, l) [b, Hkv, chunks, rows, 2],
// rows = group * q_len, row r = t * group + (h - g * group).
__device__ __forceinline__ i64 partial_index(int s, int g, int chunk, int r, int heads_kv,
                                             int chunks, int rows) {
    return (((i64)s * heads_kv + g) * chunks + chunk) * rows + r;
}

template <typename T>
__device__ void partial(const T* __restrict__ q, i64 q_sb, i64 q_st, i64 q_sh, Cache c,
                        const int* __restrict__ seq_lens, float* __restrict__ ws_acc,
                        float* __restrict__ ws_ml, int q_len, int group, int chunks, float scale,
                        int left) {
    extern __shared__ float shared[];
    const int chunk = blockIdx.x, s = blockIdx.z;
    const int tiles = (group * q_len + kRows - 1) / kRows;
    const int g = blockIdx.y / tiles, tile = blockIdx.y % tiles;
    const int rows = group * q_len, r0 = tile * kRows, nr = min(kRows, rows - r0);
    const int len = clamped_length(seq_lens, s, c.capacity);
    const int k0 = chunk * kChunk;
    if (k0 >= len) return;  // the merge reads chunks below ceil(len / kChunk) only
    const int keys = min(kChunk, len - k0);
    const int dim = c.dim, dim_v = c.dim_v;
    float* q_tile = shared;                    // [kRows][dim]
    float* scores = shared + kRows * kMaxDim;  // [kRows][kChunk]

    for (int e = threadIdx.x; e < nr * dim; e += kThreads) {
        const int r = e / dim, d = e - r * dim;
        const int row = r0 + r, t = row / group, h = g * group + row % group;
        q_tile[r * dim + d] = Math<T>::up(q[s * q_sb + t * q_st + h * q_sh + d]);
    }
    __syncthreads();

    // Scores: one key per thread, every row of the tile; a row's dot product runs over d in
    // order, so the same inputs give the same bits.
    for (int j = threadIdx.x; j < kChunk; j += kThreads) {
        float acc[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
        if (j < keys) {
            const T* key = row_at<T>(c, c.k, s, k0 + j, g, dim);
            for (int d = 0; d < dim; ++d) {
                const float kd = Math<T>::up(key[d]);
#pragma unroll
                for (int r = 0; r < kRows; ++r) acc[r] = fmaf(q_tile[r * dim + d], kd, acc[r]);
            }
        }
        const int p = k0 + j;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const int pos = len - q_len + (r0 + r) / group;
            const bool seen = j < keys && r < nr && p <= pos && (left < 0 || p >= pos - left);
            scores[r * kChunk + j] = seen ? acc[r] * scale : minus_infinity();
        }
    }
    __syncthreads();

    // Per row: max and sum over the chunk, in a fixed butterfly; scores become exp(s - m).
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int r = warp; r < nr; r += kThreads / 32) {
        float* row = scores + r * kChunk;
        float m = minus_infinity();
        for (int j = lane; j < kChunk; j += 32) m = fmaxf(m, row[j]);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float base = m == minus_infinity() ? 0.0f : m;
        float l = 0.0f;
        for (int j = lane; j < kChunk; j += 32) {
            const float e = expf(row[j] - base);
            row[j] = e;
            l += e;
        }
        for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
        if (lane == 0) {
            const i64 at = partial_index(s, g, chunk, r0 + r, c.heads_kv, chunks, rows);
            ws_ml[2 * at] = m;
            ws_ml[2 * at + 1] = l;
        }
    }
    __syncthreads();

    // acc[r][d] = sum over the chunk's keys, in order, of p[r][j] v[j][d]: one column a thread.
    for (int d = threadIdx.x; d < dim_v; d += kThreads) {
        float acc[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
        for (int j = 0; j < keys; ++j) {
            const float vd = Math<T>::up(row_at<T>(c, c.v, s, k0 + j, g, dim_v)[d]);
#pragma unroll
            for (int r = 0; r < kRows; ++r) acc[r] = fmaf(scores[r * kChunk + j], vd, acc[r]);
        }
        for (int r = 0; r < nr; ++r) {
            ws_acc[partial_index(s, g, chunk, r0 + r, c.heads_kv, chunks, rows) * dim_v + d] =
                acc[r];
        }
    }
}

template <typename T>
__device__ void merge(T* __restrict__ out, i64 o_sb, i64 o_st, i64 o_sh, float* __restrict__ lse,
                      const float* __restrict__ ws_acc, const float* __restrict__ ws_ml,
                      const int* __restrict__ seq_lens, int capacity, int heads_kv, int group,
                      int q_len, int chunks, int dim_v) {
    const int s = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
    const int g = h / group, rows = group * q_len, r = t * group + h % group;
    const int len = clamped_length(seq_lens, s, capacity);
    const int n = min((len + kChunk - 1) / kChunk, chunks);
    const bool any = len - q_len + t >= 0 && n > 0;
    float m = minus_infinity();
    for (int c = 0; any && c < n; ++c) {
        m = fmaxf(m, ws_ml[2 * partial_index(s, g, c, r, heads_kv, chunks, rows)]);
    }
    const float base = m == minus_infinity() ? 0.0f : m;
    float l = 0.0f;
    for (int c = 0; any && c < n; ++c) {
        const i64 at = partial_index(s, g, c, r, heads_kv, chunks, rows);
        l = fmaf(ws_ml[2 * at + 1], expf(ws_ml[2 * at] - base), l);
    }
    T* row = out + s * o_sb + t * o_st + h * o_sh;
    for (int d = threadIdx.x; d < dim_v; d += kThreads) {
        float acc = 0.0f;
        for (int c = 0; any && c < n; ++c) {
            const i64 at = partial_index(s, g, c, r, heads_kv, chunks, rows);
            acc = fmaf(ws_acc[at * dim_v + d], expf(ws_ml[2 * at] - base), acc);
        }
        row[d] = Math<T>::down(l > 0.0f ? acc / l : 0.0f);
    }
    if (lse != nullptr && threadIdx.x == 0) {
        lse[((i64)s * q_len + t) * (heads_kv * group) + h] =
            l > 0.0f ? m + logf(l) : minus_infinity();
    }
}

template <typename T>
__device__ void append(const T* __restrict__ k_new, const T* __restrict__ v_new, Cache c,
                       const int* __restrict__ seq_lens, int q_len) {
    const int s = blockIdx.x, t = blockIdx.y, g = blockIdx.z;
    const int pos = seq_lens[s] - q_len + t;
    if (pos < 0 || pos >= c.capacity) return;  // checked mode names these; unchecked skips them
    T* key = const_cast<T*>(row_at<T>(c, c.k, s, pos, g, c.dim));
    T* value = const_cast<T*>(row_at<T>(c, c.v, s, pos, g, c.dim_v));
    const i64 src = ((i64)s * q_len + t) * c.heads_kv + g;
    for (int d = threadIdx.x; d < c.dim; d += kThreads) key[d] = k_new[src * c.dim + d];
    for (int d = threadIdx.x; d < c.dim_v; d += kThreads) value[d] = v_new[src * c.dim_v + d];
}

__device__ __forceinline__ Cache make_cache(const void* k, const void* v, const int* table,
                                            int kind, int hnd, int capacity, int page_size,
                                            int max_pages, int pages, int heads_kv, int dim,
                                            int dim_v) {
    return {k, v, table, kind, hnd, capacity, page_size, max_pages, pages, heads_kv, dim, dim_v};
}

}  // namespace

#define OPFACADE_CACHE_PARAMS                                                                    \
    const void *k, const void *v, const int *table, int kind, int hnd, int capacity,            \
        int page_size, int max_pages, int pages, int heads_kv, int dim, int dim_v
#define OPFACADE_CACHE_ARGS                                                                      \
    make_cache(k, v, table, kind, hnd, capacity, page_size, max_pages, pages, heads_kv, dim,     \
               dim_v)

#define OPFACADE_DECODE(SUFFIX, T)                                                               \
    extern "C" __global__ void __launch_bounds__(kThreads) decode_partial_##SUFFIX(              \
        const T* q, i64 q_sb, i64 q_st, i64 q_sh, OPFACADE_CACHE_PARAMS, const int* seq_lens,    \
        float* ws_acc, float* ws_ml, int q_len, int group, int chunks, float scale, int left) {  \
        partial<T>(q, q_sb, q_st, q_sh, OPFACADE_CACHE_ARGS, seq_lens, ws_acc, ws_ml, q_len,     \
                   group, chunks, scale, left);                                                  \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(kThreads) decode_merge_##SUFFIX(                \
        T* out, i64 o_sb, i64 o_st, i64 o_sh, float* lse, const float* ws_acc,                   \
        const float* ws_ml, const int* seq_lens, int capacity, int heads_kv, int group,          \
        int q_len, int chunks, int dim_v) {                                                      \
        merge<T>(out, o_sb, o_st, o_sh, lse, ws_acc, ws_ml, seq_lens, capacity, heads_kv, group, \
                 q_len, chunks, dim_v);                                                          \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(kThreads) kv_append_##SUFFIX(                   \
        const T* k_new, const T* v_new, OPFACADE_CACHE_PARAMS, const int* seq_lens,              \
        int q_len) {                                                                             \
        append<T>(k_new, v_new, OPFACADE_CACHE_ARGS, seq_lens, q_len);                           \
    }

OPFACADE_DECODE(f32, float)
OPFACADE_DECODE(f16, f16_t)
OPFACADE_DECODE(bf16, bf16_t)
