// Decode attention over KV caches, split over fixed chunks of keys (issue 13). The caches'
// forms and addressing are kv_cache.cuh's; kv_append and checked mode's check are kv_append.cu's.
//
//   decode_partial_<T>_<D>_<R>  CTA = (kv head g x row tile, chunk c of kChunk keys, sequence
//                        s). A tile holds R of the rows of g's group (its query heads times the
//                        q_len new tokens), so each K and V byte of the chunk is read once per
//                        tile; the tiles of one chunk are neighbours in the grid and share it
//                        through L2. Per row it writes the chunk's max score m, its sum l of
//                        exp(s - m) and acc = sum exp(s - m) v into the workspace.
//   decode_merge_<T>_<threads>  CTA = (sequence, query head, new token): merges the sequence's
//                        chunks into out and lse in slices of chunks added in a fixed order.
//                        Built with 128 and 256 threads; the launcher picks one from the
//                        cache's capacity (decode.py), never from the batch.
//
// Batch invariance: the chunk size is a constant, a chunk's work reads its own sequence's data
// only, and every sum runs in an order fixed by D and R (which the descriptor fixes): a
// sequence's out and lse are bitwise the same whatever else is in the batch. Nothing uses
// atomics: runs repeat bitwise.
//
// Positions: new token t of sequence s is at pos = len - q_len + t (len = seq_lens[s], clamped to
// [0, capacity]). It sees keys p with p <= pos and, with a window, p >= pos - left; pos < 0
// sees none (out 0, lse -inf).
//
// K and V are read once per step: their 16-byte loads carry the
// evict-first hint (common.cuh), measured on an H100 at 95% of a device copy's bandwidth
// against 93% without (scripts/decode_variants.py).
#define OPFACADE_STREAMING 1
#include "kv_cache.cuh"

namespace {

using namespace kv_cache;

// Tuning, measured on an H100 (scripts/decode_variants.py, docs/PERF-NOTES.md): 16-byte loads a
// thread has in flight per batch (two batches alternate), and the blocks per SM the compiler
// must fit. A 4-row tile holding one vector per lane fits five blocks an SM (92% of a device
// copy's bandwidth against 84% at the compiler's own choice of four); 8-row tiles hold twice
// the accumulators and stream best with batches of two. Neither changes any sum's order, so the
// results are the same bits whatever they are. OPFACADE_DECODE_UNROLL and
// OPFACADE_DECODE_MIN_BLOCKS override both, for the variants script.
#ifdef OPFACADE_DECODE_UNROLL
template <int R, int PER> constexpr int kUnrollOf = OPFACADE_DECODE_UNROLL;
#else
template <int R, int PER> constexpr int kUnrollOf = R <= 4 ? 4 : 2;
#endif
#ifdef OPFACADE_DECODE_MIN_BLOCKS
#define OPFACADE_MIN_BLOCKS(R, PER) OPFACADE_DECODE_MIN_BLOCKS
#else
#define OPFACADE_MIN_BLOCKS(R, PER) ((R) <= 4 && (PER) == 1 ? 5 : 1)
#endif

constexpr int kChunk = 256;   // keys per chunk: fixed, never chosen from the batch
constexpr int kThreads = 128;

// A row of D elements of T as 16-byte vectors: kLanes consecutive threads share a row, each
// loading kPerLane vectors; kGroups rows are read by one CTA pass.
template <typename T, int D>
struct Row {
    static constexpr int kVec = 16 / sizeof(T);
    static constexpr int kVecs = D / kVec;
    static constexpr int kLanes = kVecs < 32 ? kVecs : 32;
    static constexpr int kPerLane = kVecs / kLanes;
    static constexpr int kGroups = kThreads / kLanes;
    static constexpr int kPasses = kChunk / kGroups;
    static_assert(kVecs % kLanes == 0 && kPasses % 8 == 0, "D must be 64, 128 or 256");
};

// The kVec floats of a 16-byte vector of T.
template <typename T> __device__ __forceinline__ void unpack(const uint4& raw, float* out);

template <> __device__ __forceinline__ void unpack<float>(const uint4& raw, float* out) {
    out[0] = __uint_as_float(raw.x);
    out[1] = __uint_as_float(raw.y);
    out[2] = __uint_as_float(raw.z);
    out[3] = __uint_as_float(raw.w);
}

template <> __device__ __forceinline__ void unpack<bf16_t>(const uint4& raw, float* out) {
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = __uint_as_float(words[i] << 16);
        out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
}

template <> __device__ __forceinline__ void unpack<f16_t>(const uint4& raw, float* out) {
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = Math<f16_t>::up(f16_t{(u16)(words[i] & 0xffffu)});
        out[2 * i + 1] = Math<f16_t>::up(f16_t{(u16)(words[i] >> 16)});
    }
}

__device__ __forceinline__ float minus_infinity() { return __int_as_float(0xff800000); }

// Workspace of the partials: acc [b, Hkv, chunks, rows, Dv] then (m, l) [b, Hkv, chunks, rows, 2],
// rows = group * q_len, row r = t * group + (h - g * group).
__device__ __forceinline__ i64 partial_index(int s, int g, int chunk, int r, int heads_kv,
                                             int chunks, int rows) {
    return (((i64)s * heads_kv + g) * chunks + chunk) * rows + r;
}

// Sums v over the O*2 lanes of a row group, splitting the rows among them: at each level a lane
// keeps half of its rows and sends the other half to its partner, so a warp issues R - 1 + the
// remaining levels shuffles instead of R per level. Afterwards v[0] holds the full sum of row
// `first` (the rows' order is fixed by the lane, so every run adds in the same order).
template <int COUNT, int O>
struct SplitSum {
    template <int R>
    static __device__ __forceinline__ void run(float (&v)[R], int lane, int& first) {
        if constexpr (O == 0) {
            return;
        } else if constexpr (COUNT == 1) {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
            SplitSum<1, O / 2>::run(v, lane, first);
        } else {
            constexpr int half = COUNT / 2;
            const bool upper = (lane & O) != 0;
#pragma unroll
            for (int i = 0; i < half; ++i) {
                const float send = upper ? v[i] : v[i + half];
                const float keep = upper ? v[i + half] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
            }
            if (upper) first += half;
            SplitSum<half, O / 2>::run(v, lane, first);
        }
    }
};

template <typename T, int D, int R>
__device__ void partial(const T* __restrict__ q, i64 q_sb, i64 q_st, i64 q_sh, const Cache& c,
                        const int* __restrict__ seq_lens, float* __restrict__ ws_acc,
                        float* __restrict__ ws_ml, int q_len, int group, int tiles, int chunks,
                        float scale, int left) {
    using L = Row<T, D>;
    static_assert(R <= L::kLanes, "a row tile is split among a row's lanes");
    extern __shared__ float shared[];
    // x runs over (kv head, tile) fastest: CTAs resident together read the same keys of every
    // kv head, whole token rows of a token-major cache, rather than one head's slice of many.
    const int tile = blockIdx.x % tiles, g = blockIdx.x / tiles;
    const int chunk = blockIdx.y, s = blockIdx.z;
    const int rows = group * q_len, r0 = tile * R, nr = min(R, rows - r0);
    const int len = sequence_length(c, seq_lens, s);
    const int k0 = chunk * kChunk;
    if (k0 >= len || nr <= 0) return;  // the merge reads chunks below ceil(len / kChunk) only
    const int keys = min(kChunk, len - k0);
    const int first_pos = len - q_len + r0 / group, last_pos = len - q_len + (r0 + nr - 1) / group;
    const int tid = threadIdx.x;
    if (k0 > last_pos || (left >= 0 && k0 + keys - 1 < first_pos - left)) {
        // No row of the tile sees a key of this chunk: m = -inf, l = 0 and acc = 0 (so the
        // merge reads only values written this run, weighted 0).
        for (int e = tid; e < nr * D; e += kThreads) {
            const int r = e / D;
            ws_acc[partial_index(s, g, chunk, r0 + r, c.heads_kv, chunks, rows) * D + e - r * D] =
                0.0f;
        }
        if (tid < nr) {
            const i64 at = partial_index(s, g, chunk, r0 + tid, c.heads_kv, chunks, rows);
            ws_ml[2 * at] = minus_infinity();
            ws_ml[2 * at + 1] = 0.0f;
        }
        return;
    }
    const int lane = tid % L::kLanes, key_group = tid / L::kLanes;
    constexpr int kCols = L::kPerLane * L::kVec;  // the columns this thread holds of a row
    constexpr int kUnroll = kUnrollOf<R, L::kPerLane>;
    constexpr int kBatch = 2 * kUnroll;           // passes per loop turn: two load batches

    // The tile's queries, scaled, in registers: this lane's columns of each row.
    float qr[R][kCols];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = r0 + r;
        const T* q_row = q + s * q_sb + (row / group) * q_st + (g * group + row % group) * q_sh;
#pragma unroll
        for (int i = 0; i < L::kPerLane; ++i) {
#pragma unroll
            for (int e = 0; e < L::kVec; ++e) {
                qr[r][i * L::kVec + e] =
                    r < nr ? Math<T>::up(q_row[(lane + i * L::kLanes) * L::kVec + e]) * scale
                           : 0.0f;
            }
        }
    }

    // Each key's row, as an element offset from this sequence's K (and V) base, resolved once
    // per chunk: a paged cache's table lookup and page arithmetic leave the load loops, whose
    // addresses then need no dependent load. The queries' loads above are in flight meanwhile.
    i64* row_off = reinterpret_cast<i64*>(shared + kChunk * R);
    const T* k_base = static_cast<const T*>(c.k);
    const T* v_base = static_cast<const T*>(c.v);
    if (c.kind == 2) {
        k_base = reinterpret_cast<const T*>(static_cast<const i64*>(c.k)[s]);
        v_base = reinterpret_cast<const T*>(static_cast<const i64*>(c.v)[s]);
    }
#pragma unroll
    for (int u = 0; u < kChunk / kThreads; ++u) {  // unrolled: the table loads fly together
        const int j = tid + u * kThreads, key = k0 + j;
        if (j < keys) {
            row_off[j] = c.kind == 1
                             ? offset(c, max(page_of(c, s, key), 0), page_slot(c, key), g,
                                      c.page_size, D)
                             : offset(c, c.kind == 2 ? 0 : s, key, g, c.capacity, D);
        }
    }
    __syncthreads();  // row_off

    // kUnroll passes' 16-byte vectors of `base`'s rows, zeros past the chunk's keys (never
    // loaded: their content, NaN included, never meets a weight).
    auto load = [&](uint4 (&raw)[kUnroll][L::kPerLane], const T* base, int pass) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int j = (pass + u) * L::kGroups + key_group;
#pragma unroll
            for (int i = 0; i < L::kPerLane; ++i) {
                raw[u][i] = j < keys ? load16(base + row_off[j] + (lane + i * L::kLanes) * L::kVec)
                                     : make_uint4(0, 0, 0, 0);
            }
        }
    };

    // Scores [kChunk][R]: a row group's lanes each dot their columns, then split the sum.
    float* p = shared;
    auto score = [&](const uint4 (&raw)[kUnroll][L::kPerLane], int pass) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            float dot[R];
#pragma unroll
            for (int r = 0; r < R; ++r) dot[r] = 0.0f;
#pragma unroll
            for (int i = 0; i < L::kPerLane; ++i) {
                float k_cols[L::kVec];
                unpack<T>(raw[u][i], k_cols);
#pragma unroll
                for (int e = 0; e < L::kVec; ++e) {
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        dot[r] = fmaf(qr[r][i * L::kVec + e], k_cols[e], dot[r]);
                    }
                }
            }
            int r = 0;
            SplitSum<R, L::kLanes / 2>::run(dot, lane, r);
            if ((lane & (L::kLanes / R - 1)) == 0) {
                const int j = (pass + u) * L::kGroups + key_group;
                const int key_pos = k0 + j, pos = len - q_len + (r0 + r) / group;
                const bool seen = j < keys && r < nr && key_pos <= pos &&
                                  (left < 0 || key_pos >= pos - left);
                // Rows past the tile's own get weight 0 (the softmax below skips them).
                p[j * R + r] = seen ? dot[0] : r < nr ? minus_infinity() : 0.0f;
            }
        }
    };

    // Two load batches alternate, so one is in flight while the other is computed.
    uint4 raw_a[kUnroll][L::kPerLane], raw_b[kUnroll][L::kPerLane];
    load(raw_a, k_base, 0);
    for (int pass = 0; pass < L::kPasses; pass += kBatch) {
        load(raw_b, k_base, pass + kUnroll);
        score(raw_a, pass);
        if (pass + kBatch < L::kPasses) load(raw_a, k_base, pass + kBatch);
        score(raw_b, pass + kUnroll);
    }
    load(raw_a, v_base, 0);  // V's first batch flies while the softmax runs
    __syncthreads();

    // Per row: max and sum over the chunk in a fixed butterfly; scores become exp(s - m).
    const int warp = tid >> 5, warp_lane = tid & 31;
    for (int r = warp; r < nr; r += kThreads / 32) {
        float m = minus_infinity();
        for (int j = warp_lane; j < kChunk; j += 32) m = fmaxf(m, p[j * R + r]);
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float base = m == minus_infinity() ? 0.0f : m;
        float l = 0.0f;
        for (int j = warp_lane; j < kChunk; j += 32) {
            const float e = expf(p[j * R + r] - base);
            p[j * R + r] = e;
            l += e;
        }
        l = warp_sum(l);
        if (warp_lane == 0) {
            const i64 at = partial_index(s, g, chunk, r0 + r, c.heads_kv, chunks, rows);
            ws_ml[2 * at] = m;
            ws_ml[2 * at + 1] = l;
        }
    }
    __syncthreads();

    // acc[r][col] over this key group's keys, in order.
    float acc[R][kCols];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int e = 0; e < kCols; ++e) acc[r][e] = 0.0f;
    }
    auto accumulate = [&](const uint4 (&raw)[kUnroll][L::kPerLane], int pass) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int j = (pass + u) * L::kGroups + key_group;
            float w[R];
#pragma unroll
            for (int r = 0; r < R; ++r) w[r] = p[j * R + r];
#pragma unroll
            for (int i = 0; i < L::kPerLane; ++i) {
                float v_cols[L::kVec];
                unpack<T>(raw[u][i], v_cols);
#pragma unroll
                for (int e = 0; e < L::kVec; ++e) {
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        acc[r][i * L::kVec + e] = fmaf(w[r], v_cols[e], acc[r][i * L::kVec + e]);
                    }
                }
            }
        }
    };
    for (int pass = 0; pass < L::kPasses; pass += kBatch) {
        load(raw_b, v_base, pass + kUnroll);
        accumulate(raw_a, pass);
        if (pass + kBatch < L::kPasses) load(raw_a, v_base, pass + kBatch);
        accumulate(raw_b, pass + kUnroll);
    }
    __syncthreads();  // the scores are spent: the shared buffer takes the key groups' sums

    // [kGroups][R][D], summed over the key groups in order.
    float* sums = shared;
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int i = 0; i < L::kPerLane; ++i) {
#pragma unroll
            for (int e = 0; e < L::kVec; ++e) {
                sums[(key_group * R + r) * D + (lane + i * L::kLanes) * L::kVec + e] =
                    acc[r][i * L::kVec + e];
            }
        }
    }
    __syncthreads();
    for (int e = tid; e < nr * D; e += kThreads) {
        const int r = e / D, d = e - r * D;
        float total = 0.0f;
#pragma unroll 8
        for (int k = 0; k < L::kGroups; ++k) total += sums[(k * R + r) * D + d];
        ws_acc[partial_index(s, g, chunk, r0 + r, c.heads_kv, chunks, rows) * D + d] = total;
    }
}

// The merge: the block's threads form slices of Dv / 4 threads (a float4 of columns each); slice
// k adds chunks k, k + slices, ... in turn, then the slices' sums are added in slice order. The
// order depends on the sequence's own chunk count alone, so the result stays batch-invariant,
// and each slice's loads are independent of one another (several in flight, where one thread
// walking every chunk would wait on each).
template <typename T, int kMergeThreads>
__device__ void merge(T* __restrict__ out, i64 o_sb, i64 o_st, i64 o_sh, float* __restrict__ lse,
                      const float* __restrict__ ws_acc, const float* __restrict__ ws_ml,
                      const Cache& c, const int* __restrict__ seq_lens, int group, int q_len,
                      int chunks) {
    __shared__ float4 slice_acc[kMergeThreads];
    __shared__ float slice_l[kMergeThreads];
    __shared__ float warp_max[kMergeThreads / 32];
    const int s = blockIdx.x, h = blockIdx.y, t = blockIdx.z, tid = threadIdx.x;
    const int g = h / group, rows = group * q_len, r = t * group + h % group, dim_v = c.dim_v;
    const int len = sequence_length(c, seq_lens, s);
    const int n = len - q_len + t >= 0 ? min((len + kChunk - 1) / kChunk, chunks) : 0;
    const float* ml = ws_ml + 2 * partial_index(s, g, 0, r, c.heads_kv, chunks, rows);
    const i64 ml_step = 2 * (i64)rows;  // from one chunk's (m, l) of this row to the next's

    // The largest chunk max (a max is the same in any order).
    float m = minus_infinity();
    for (int k = tid; k < n; k += kMergeThreads) m = fmaxf(m, ml[k * ml_step]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((tid & 31) == 0) warp_max[tid >> 5] = m;
    __syncthreads();
    for (int w = 0; w < kMergeThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
    const float base = m == minus_infinity() ? 0.0f : m;

    const int width = dim_v / 4, slices = kMergeThreads / width;  // Dv in {64, 128, 256}
    const int slice = tid / width, col = (tid % width) * 4;
    const float* acc_row = ws_acc + partial_index(s, g, 0, r, c.heads_kv, chunks, rows) * dim_v;
    const i64 acc_step = (i64)rows * dim_v;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float l = 0.0f;
    if (slice < slices) {
#pragma unroll 8
        for (int k = slice; k < n; k += slices) {
            const float mk = ml[k * ml_step];
            const float w = mk == minus_infinity() ? 0.0f : expf(mk - base);
            const float4 x = *reinterpret_cast<const float4*>(acc_row + k * acc_step + col);
            acc.x = fmaf(x.x, w, acc.x);
            acc.y = fmaf(x.y, w, acc.y);
            acc.z = fmaf(x.z, w, acc.z);
            acc.w = fmaf(x.w, w, acc.w);
            l = fmaf(ml[k * ml_step + 1], w, l);
        }
        slice_acc[tid] = acc;
        slice_l[tid] = l;
    }
    __syncthreads();
    if (tid < width) {
        acc = slice_acc[tid];
        l = slice_l[tid];
        for (int k = 1; k < slices; ++k) {
            const float4 x = slice_acc[k * width + tid];
            acc.x += x.x;
            acc.y += x.y;
            acc.z += x.z;
            acc.w += x.w;
            l += slice_l[k * width + tid];
        }
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        T* row = out + s * o_sb + t * o_st + h * o_sh + col;
        row[0] = Math<T>::down(acc.x * inv);
        row[1] = Math<T>::down(acc.y * inv);
        row[2] = Math<T>::down(acc.z * inv);
        row[3] = Math<T>::down(acc.w * inv);
        if (lse != nullptr && tid == 0) {
            lse[((i64)s * q_len + t) * (c.heads_kv * group) + h] =
                l > 0.0f ? m + logf(l) : minus_infinity();
        }
    }
}

}  // namespace

#define OPFACADE_PARTIAL(SUFFIX, T, D, R)                                                        \
    extern "C" __global__ void __launch_bounds__(                                                \
        kThreads, OPFACADE_MIN_BLOCKS(R, (Row<T, D>::kPerLane)))                                 \
        decode_partial_##SUFFIX##_##D##_##R(                                                     \
        const T* q, i64 q_sb, i64 q_st, i64 q_sh, OPFACADE_CACHE_PARAMS, const int* seq_lens,    \
        float* ws_acc, float* ws_ml, int q_len, int group, int tiles, int chunks, float scale,   \
        int left) {                                                                              \
        partial<T, D, R>(q, q_sb, q_st, q_sh, OPFACADE_CACHE_ARGS, seq_lens, ws_acc, ws_ml,      \
                         q_len, group, tiles, chunks, scale, left);                              \
    }

#define OPFACADE_MERGE(SUFFIX, T, THREADS)                                                       \
    extern "C" __global__ void __launch_bounds__(THREADS) decode_merge_##SUFFIX##_##THREADS(     \
        T* out, i64 o_sb, i64 o_st, i64 o_sh, float* lse, const float* ws_acc,                   \
        const float* ws_ml, OPFACADE_CACHE_PARAMS, const int* seq_lens, int group, int q_len,    \
        int chunks) {                                                                            \
        merge<T, THREADS>(out, o_sb, o_st, o_sh, lse, ws_acc, ws_ml, OPFACADE_CACHE_ARGS,        \
                          seq_lens, group, q_len, chunks);                                       \
    }

#define OPFACADE_DECODE(SUFFIX, T)                                                               \
    OPFACADE_PARTIAL(SUFFIX, T, 64, 4)                                                           \
    OPFACADE_PARTIAL(SUFFIX, T, 64, 8)                                                           \
    OPFACADE_PARTIAL(SUFFIX, T, 128, 4)                                                          \
    OPFACADE_PARTIAL(SUFFIX, T, 128, 8)                                                          \
    OPFACADE_PARTIAL(SUFFIX, T, 256, 4)                                                          \
    OPFACADE_PARTIAL(SUFFIX, T, 256, 8)                                                          \
    OPFACADE_MERGE(SUFFIX, T, 128)                                                               \
    OPFACADE_MERGE(SUFFIX, T, 256)

OPFACADE_DECODE(f32, float)
OPFACADE_DECODE(f16, f16_t)
OPFACADE_DECODE(bf16, bf16_t)

