// Decode attention over KV caches, split over fixed chunks of keys (issue 13). The caches'
// forms and addressing are kv_cache.cuh's; kv_append and checked mode's check are kv_append.cu's.
//
//   decode_partial_<T>_<D>_<R>  CTA = (kv head g x row tile, chunk c of kChunk keys, sequence
//                        s). A tile holds R of the rows of g's group (its query heads times the
//                        q_len new tokens), so each K and V byte of the chunk is read once per
//                        tile; the tiles of one chunk are neighbours in the grid and share it
//                        through L2. Per row it writes the chunk's max score m, its sum l of
//                        exp(s - m) and acc = sum exp(s - m) v into the workspace.
//                        The CUDA-core tiles (R 4 or 8) are this file's.
//   decode_partial_<T>_<D>_16  The same CTA over a tile of 16 rows on tensor cores (f16, bf16;
//                        D 64, 128), for kv heads of more than 4 rows: decode_mma.cuh.
//   decode_partial_<T>_128_<4|8>kq_<b3|b4|d4>  The same CTA over up to 4 or 8 rows on
//                        tensor cores with K and V as mma's A operand (f16, bf16; D 128), for
//                        every kv head of up to 8 rows there: decode_kq.cuh.
//   (decode_partial_<T>_128_<16|32>wg, the same CTA on Hopper's wgmma for kv heads of more
//                        than 8 rows at D 128 on sm_90 devices, is decode_wg.cu's: an sm_90a
//                        program of its own, whose partials this file's merge reads.)
//   decode_merge_<T>_<threads>  CTA = (sequence, query head, new token): merges the sequence's
//                        chunks into out and lse in slices of chunks added in a fixed order
//                        (decode_merge.cuh). Built with 64, 256, 512 and 1024 threads; the
//                        launcher picks one from the cache's capacity (decode.py), never from
//                        the batch.
//   decode_merge_<T>_rows  The 64-thread merge's sums, several rows a CTA, for caches of up to
//                        4 chunks (decode_merge.cuh's merge_rows).
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
// Both kernels launch as programmatic dependents (sm_90, decode.py). The partial kernel follows
// the stream's previous kernel (kv_append, the step before's merge, a caller's kernel): each CTA
// first waits for that grid (follow_previous_grid: griddepcontrol.wait, complete and its writes
// visible), then lets the merge launch. So the merge's CTAs are resident when the last partial
// ends, and each waits for the partial grid before it reads a partial. The merge reads seq_lens
// before that wait: sound, because it launches only once every partial CTA has let it, which
// each does after its own wait, so the kernel before the step has completed by then. The merge
// lets the stream's next kernel launch as it starts (kv_append, or a caller's kernel launched
// so, waits for it). Without the launch attribute these are no-ops (common.cuh).
//
// K and V are read once per step: their 16-byte loads carry a streaming cache hint
// (common.cuh's load16). The evict-first hint read at 95% of a device copy on an H100 against
// 93% without; on an H200 the last-use hint, now the one, read up to 10 points above
// evict-first (scripts/decode_variants.py --lu). No H100 has run the last-use hint.
#define OPFACADE_STREAMING 1
#include "decode_common.cuh"
#include "decode_mma.cuh"
#include "decode_kq.cuh"
#include "decode_merge.cuh"

namespace {

// Tuning, measured on an H100 (scripts/decode_variants.py, docs/PERF-NOTES.md): 16-byte loads a
// thread has in flight per batch (two batches alternate), and the blocks per SM the compiler
// must fit. A 4-row tile holding one vector per lane fits five blocks an SM (92% of a device
// copy's bandwidth against 84% at the compiler's own choice of four); 8-row tiles hold twice
// the accumulators and stream best with batches of two; held to four blocks an SM, as the
// compiler chose for them before the spans' loop (docs/DECODE.md). Neither changes any sum's
// order, so the results are the same bits whatever they are. With chunks of 256 an H200 read
// 3-4 points better with six blocks an SM and batches of two (a build it ran until chunks of
// 512, where that build lost 3-6 points and this one matched it: decode.py's CHUNK).
// OPFACADE_DECODE_UNROLL and OPFACADE_DECODE_MIN_BLOCKS override both, for the variants script.
#ifdef OPFACADE_DECODE_UNROLL
template <int R, int PER> constexpr int kUnrollOf = OPFACADE_DECODE_UNROLL;
#else
template <int R, int PER> constexpr int kUnrollOf = R <= 4 ? 4 : 2;
#endif
#ifdef OPFACADE_DECODE_MIN_BLOCKS
#define OPFACADE_MIN_BLOCKS(R, PER) OPFACADE_DECODE_MIN_BLOCKS
#else
#define OPFACADE_MIN_BLOCKS(R, PER) ((PER) > 1 ? 1 : (R) <= 4 ? 5 : 4)
#endif

// Where a CUDA-core tile's two buffers of row offsets start in its shared memory (in floats):
// past both the scores [kChunk][R] and the key groups' sums [groups][R][D] that reuse them;
// the scaled queries [R][D] follow them (decode.py's shared_bytes).
template <int D, int R, int GROUPS>
constexpr int kRowOffsAt = kChunk * R > GROUPS * R * D ? kChunk * R : GROUPS * R * D;

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

// SPANS: the CTA runs `span` consecutive chunks of its sequence (the decode_partial_*_spans
// kernels, for grids of a few waves: decode.py's span_for); otherwise one chunk, blockIdx.y.
// Either way each chunk's partial is computed the same way, to the same bits.
template <typename T, int D, int R, bool SPANS>
__device__ void partial(const T* __restrict__ q, i64 q_sb, i64 q_st, i64 q_sh, const Cache& c,
                        const int* __restrict__ seq_lens, float* __restrict__ ws_acc,
                        float* __restrict__ ws_ml, int q_len, int group, int tiles, int chunks,
                        float scale, int left, int span) {
    using L = Row<T, D>;
    static_assert(R <= L::kLanes, "a row tile is split among a row's lanes");
    extern __shared__ float shared[];
    // x runs over (kv head, tile) fastest: CTAs resident together read the same keys of every
    // kv head, whole token rows of a token-major cache, rather than one head's slice of many.
    const int tile = blockIdx.x % tiles, g = blockIdx.x / tiles, s = blockIdx.z;
    const int rows = group * q_len, r0 = tile * R, nr = min(R, rows - r0);
    const int len = sequence_length(c, seq_lens, s);
    // This CTA's chunks, one after another: [first, end), those the merge reads (below
    // ceil(len / kChunk)).
    const int first = SPANS ? blockIdx.y * span : blockIdx.y;
    const int end = min(SPANS ? first + span : first + 1, (len + kChunk - 1) / kChunk);
    if (first >= end || nr <= 0) return;
    const int tid = threadIdx.x;
    const int lane = tid % L::kLanes, key_group = tid / L::kLanes;
    constexpr int kCols = L::kPerLane * L::kVec;  // the columns this thread holds of a row
    constexpr int kUnroll = kUnrollOf<R, L::kPerLane>;  // vectors a thread loads per batch
    constexpr int kBatch = 2 * kUnroll;           // passes per loop turn: two load batches

    // The tile's queries, scaled: this lane's columns of each row, in registers. A CTA of one
    // chunk loads them here; a CTA of several reads them for each chunk from shared memory
    // (q_scaled, [R][D] f32), so that they hold no registers while V is summed.
    float qr[R][kCols];
    auto query = [&](int r, int d) {  // zeros for rows past the tile's own
        const int row = r0 + r;
        const T* q_row = q + s * q_sb + (row / group) * q_st + (g * group + row % group) * q_sh;
        return r < nr ? Math<T>::up(q_row[d]) * scale : 0.0f;
    };
    if constexpr (!SPANS) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int i = 0; i < L::kPerLane; ++i) {
#pragma unroll
                for (int e = 0; e < L::kVec; ++e) {
                    qr[r][i * L::kVec + e] = query(r, (lane + i * L::kLanes) * L::kVec + e);
                }
            }
        }
    }

    // Each key's row offset, resolved once per chunk, while the queries' loads above fly, into
    // one of two buffers past the scores' and sums' space: a CTA of several chunks resolves the
    // next chunk's while this one runs, so that its first loads fly during this chunk's end.
    i64* row_offs = reinterpret_cast<i64*>(shared + kRowOffsAt<D, R, L::kGroups>);
    float* q_scaled = reinterpret_cast<float*>(row_offs + 2 * kChunk);
    const T *k_base, *v_base;
    sequence_bases(c, s, k_base, v_base);
    const int first_pos = OPFACADE_ROW_POSITION(len, q_len, r0, group);
    const int last_pos = OPFACADE_ROW_POSITION(len, q_len, r0 + nr - 1, group);
    auto unseen = [&](int chunk) {
        return chunk_unseen(chunk * kChunk, min(kChunk, len - chunk * kChunk), first_pos,
                            last_pos, left);
    };
    chunk_rows<D>(c, s, g, first * kChunk, min(kChunk, len - first * kChunk), row_offs);

    // kUnroll passes' 16-byte vectors of `base`'s rows, zeros past the chunk's keys (never
    // loaded: their content, NaN included, never meets a weight).
    auto load = [&](uint4 (&raw)[kUnroll][L::kPerLane], const T* base, int pass,
                    const i64* row_off, int keys) {
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

    uint4 raw_a[kUnroll][L::kPerLane], raw_b[kUnroll][L::kPerLane];
    bool k_loaded = false;  // raw_a holds the chunk's first K batch, loaded ahead
    if constexpr (SPANS) {
        // The first chunk's first K batch flies while the queries go to shared memory.
        __syncthreads();  // row_offs
        if (!unseen(first)) {
            load(raw_a, k_base, 0, row_offs, min(kChunk, len - first * kChunk));
            k_loaded = true;
        }
        for (int e = tid; e < R * D; e += kThreads) q_scaled[e] = query(e / D, e % D);
    }
    // (A trip count the compiler sees is 1 without spans: otherwise the queries, loaded before
    // the loop, would hold registers through it.)
    for (int i = 0; i < (SPANS ? end - first : 1); ++i) {
        const int chunk = first + i;
        const int k0 = chunk * kChunk, keys = min(kChunk, len - k0);
        const i64* row_off = row_offs + ((chunk - first) & 1) * kChunk;
        const bool next = SPANS && chunk + 1 < end && !unseen(chunk + 1);
        if (next) {
            chunk_rows<D>(c, s, g, k0 + kChunk, min(kChunk, len - k0 - kChunk),
                          row_offs + ((chunk + 1 - first) & 1) * kChunk);
        }
        __syncthreads();  // row_off and q_scaled (and the last chunk's sums are read)
        if (unseen(chunk)) {
            write_unseen<D>(c, s, g, chunk, r0, nr, q_len, group, chunks, ws_acc, ws_ml);
            continue;
        }
        if constexpr (SPANS) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
#pragma unroll
                for (int i = 0; i < L::kPerLane; ++i) {
#pragma unroll
                    for (int e = 0; e < L::kVec; ++e) {
                        qr[r][i * L::kVec + e] =
                            q_scaled[r * D + (lane + i * L::kLanes) * L::kVec + e];
                    }
                }
            }
        }

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
                    const int key_pos = k0 + j;
                    const int pos = OPFACADE_ROW_POSITION(len, q_len, r0 + r, group);
                    const bool seen = j < keys && r < nr && key_pos <= pos &&
                                      (left < 0 || key_pos >= pos - left);
                    // Rows past the tile's own get weight 0 (the softmax below skips them).
                    p[j * R + r] = seen ? dot[0] : r < nr ? minus_infinity() : 0.0f;
                }
            }
        };

        // Two load batches alternate, so one is in flight while the other is computed.
        if (!k_loaded) load(raw_a, k_base, 0, row_off, keys);
        for (int pass = 0; pass < L::kPasses; pass += kBatch) {
            load(raw_b, k_base, pass + kUnroll, row_off, keys);
            score(raw_a, pass);
            if (pass + kBatch < L::kPasses) load(raw_a, k_base, pass + kBatch, row_off, keys);
            score(raw_b, pass + kUnroll);
        }
        load(raw_a, v_base, 0, row_off, keys);  // V's first batch flies while the softmax runs
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
                store_partial(ws_ml + 2 * at, m);
                store_partial(ws_ml + 2 * at + 1, l);
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
                            acc[r][i * L::kVec + e] =
                                fmaf(w[r], v_cols[e], acc[r][i * L::kVec + e]);
                        }
                    }
                }
            }
        };
        for (int pass = 0; pass < L::kPasses; pass += kBatch) {
            load(raw_b, v_base, pass + kUnroll, row_off, keys);
            accumulate(raw_a, pass);
            if (pass + kBatch < L::kPasses) load(raw_a, v_base, pass + kBatch, row_off, keys);
            accumulate(raw_b, pass + kUnroll);
        }
        // The next chunk's first K batch flies while this chunk's sums are added and written.
        k_loaded = next;
        if (next) {
            load(raw_a, k_base, 0, row_offs + ((chunk + 1 - first) & 1) * kChunk,
                 min(kChunk, len - k0 - kChunk));
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
            const i64 at = partial_index(s, g, chunk, r0 + r, c.heads_kv, chunks, rows);
            store_partial(ws_acc + (at * D + d), total);
        }
    }
}

}  // namespace

#define OPFACADE_PARTIAL(SUFFIX, T, D, R)                                                        \
    extern "C" __global__ void __launch_bounds__(                                                \
        kThreads, OPFACADE_MIN_BLOCKS(R, (Row<T, D>::kPerLane)))                                 \
        decode_partial_##SUFFIX##_##D##_##R(                                                     \
        OPFACADE_PARTIAL_PARAMS(T)) {                                                            \
        follow_previous_grid();  /* a programmatic dependent */                                  \
        partial<T, D, R, false>(q, q_sb, q_st, q_sh, OPFACADE_CACHE_ARGS, seq_lens, ws_acc,      \
                                ws_ml, q_len, group, tiles, chunks, scale, left, 1);             \
    }

// The 4-row tiles also run spans of chunks (8-row tiles lost occupancy to the loop's registers).
#define OPFACADE_PARTIAL_SPANS(SUFFIX, T, D)                                                     \
    extern "C" __global__ void __launch_bounds__(                                                \
        kThreads, OPFACADE_MIN_BLOCKS(4, (Row<T, D>::kPerLane)))                                 \
        decode_partial_##SUFFIX##_##D##_4_spans(OPFACADE_PARTIAL_PARAMS(T), int span) {          \
        follow_previous_grid();  /* a programmatic dependent */                                  \
        partial<T, D, 4, true>(q, q_sb, q_st, q_sh, OPFACADE_CACHE_ARGS, seq_lens, ws_acc,       \
                               ws_ml, q_len, group, tiles, chunks, scale, left, span);           \
    }

// The 16-row tile's builds (decode_mma.cuh): the register pipeline (_16) and K and V staged
// through shared memory (_16_staged), which decode.py's mma_build picks by the grid.
#define OPFACADE_PARTIAL_MMA(SUFFIX, T, D, STAGES, BUILD)                                        \
    extern "C" __global__ void __launch_bounds__(kThreads, OPFACADE_MMA_MIN_BLOCKS)              \
        decode_partial_##SUFFIX##_##D##_16##BUILD(OPFACADE_PARTIAL_PARAMS(T)) {                  \
        follow_previous_grid();  /* a programmatic dependent */                                  \
        partial_mma<T, D, STAGES>(q, q_sb, q_st, q_sh, OPFACADE_CACHE_ARGS, seq_lens, ws_acc,    \
                                  ws_ml, q_len, group, tiles, chunks, scale, left);              \
    }

// The kq tile (decode_kq.cuh): kv heads of up to R rows, D 128 (R 8, and R 4 with K read in
// whole lines), built for 3 CTAs an SM (grids of many waves) and for 4 (grids of a few:
// decode.py's KQ_FEW_WAVES). The builds differ in registers only; their arithmetic, and so
// their bits, are the same.
#define OPFACADE_PARTIAL_KQ_AS(NAME, T, D, R, AHEAD, BLOCKS)                                     \
    extern "C" __global__ void __launch_bounds__(kThreads, BLOCKS)                               \
        NAME(OPFACADE_PARTIAL_PARAMS(T)) {                                                       \
        follow_previous_grid();  /* a programmatic dependent */                                  \
        partial_kq<T, D, R, AHEAD>(q, q_sb, q_st, q_sh, OPFACADE_CACHE_ARGS, seq_lens, ws_acc,   \
                                   ws_ml, q_len, group, tiles, chunks, scale, left);             \
    }
#define OPFACADE_PARTIAL_KQ(SUFFIX, T, D, R, BLOCKS)                                             \
    OPFACADE_PARTIAL_KQ_AS(decode_partial_##SUFFIX##_##D##_##R##kq_b##BLOCKS, T, D, R, 2, BLOCKS)
// The one-wave build (decode_kq.cuh's kAhead > 2): AHEAD groups in a warp's ring, the
// registers of CTAS CTAs an SM. A ring of 3 (two CTAs an SM) read -2.8% to +3.1% against the
// ring of 4 on grids of 16-128 CTAs, slower on 12 of 13 (H200, docs/DECODE.md): not built.
#define OPFACADE_PARTIAL_KQ_DEEP(SUFFIX, T, D, R, AHEAD, CTAS)                                   \
    OPFACADE_PARTIAL_KQ_AS(decode_partial_##SUFFIX##_##D##_##R##kq_d##AHEAD, T, D, R, AHEAD, CTAS)

// The merge kernels' parameters, and their Outputs.
#define OPFACADE_MERGE_PARAMS(T)                                                                 \
    T *out, i64 o_sb, i64 o_st, i64 o_sh, float *lse, const float *ws_acc, const float *ws_ml,  \
        OPFACADE_CACHE_PARAMS, const int *seq_lens, int group, int q_len, int chunks
#define OPFACADE_MERGE_OUTPUTS(T) (Outputs<T>{out, o_sb, o_st, o_sh, lse})

#define OPFACADE_MERGE(SUFFIX, T, THREADS)                                                       \
    extern "C" __global__ void __launch_bounds__(THREADS)                                        \
        decode_merge_##SUFFIX##_##THREADS(OPFACADE_MERGE_PARAMS(T)) {                            \
        let_dependents_launch();  /* the next kernel may launch */                               \
        merge<T, THREADS>(OPFACADE_MERGE_OUTPUTS(T), ws_acc, ws_ml, OPFACADE_CACHE_ARGS,         \
                          seq_lens, group, q_len, chunks);                                       \
    }

#define OPFACADE_MERGE_ROWS(SUFFIX, T)                                                           \
    extern "C" __global__ void __launch_bounds__(kRowsThreads)                                   \
        decode_merge_##SUFFIX##_rows(OPFACADE_MERGE_PARAMS(T), int sequences) {                  \
        let_dependents_launch();  /* the next kernel may launch */                               \
        merge_rows<T>(OPFACADE_MERGE_OUTPUTS(T), ws_acc, ws_ml, OPFACADE_CACHE_ARGS, seq_lens,   \
                      group, q_len, chunks, sequences);                                          \
    }

#define OPFACADE_DECODE(SUFFIX, T)                                                               \
    OPFACADE_PARTIAL(SUFFIX, T, 64, 4)                                                           \
    OPFACADE_PARTIAL(SUFFIX, T, 64, 8)                                                           \
    OPFACADE_PARTIAL(SUFFIX, T, 128, 4)                                                          \
    OPFACADE_PARTIAL(SUFFIX, T, 128, 8)                                                          \
    OPFACADE_PARTIAL(SUFFIX, T, 256, 4)                                                          \
    OPFACADE_PARTIAL(SUFFIX, T, 256, 8)                                                          \
    OPFACADE_PARTIAL_SPANS(SUFFIX, T, 64)                                                        \
    OPFACADE_PARTIAL_SPANS(SUFFIX, T, 128)                                                       \
    OPFACADE_PARTIAL_SPANS(SUFFIX, T, 256)                                                       \
    OPFACADE_MERGE(SUFFIX, T, 64)                                                                \
    OPFACADE_MERGE(SUFFIX, T, 256)                                                               \
    OPFACADE_MERGE(SUFFIX, T, 512)                                                               \
    OPFACADE_MERGE(SUFFIX, T, 1024)                                                              \
    OPFACADE_MERGE_ROWS(SUFFIX, T)

// Tensor-core tiles of 16 rows: half types, D 64 and 128 (decode.py's row_tile picks them).
#define OPFACADE_DECODE_MMA(SUFFIX, T)                                                           \
    OPFACADE_PARTIAL_MMA(SUFFIX, T, 64, 0, )                                                     \
    OPFACADE_PARTIAL_MMA(SUFFIX, T, 128, 0, )                                                    \
    OPFACADE_PARTIAL_MMA(SUFFIX, T, 64, OPFACADE_MMA_STAGES, _staged)                            \
    OPFACADE_PARTIAL_MMA(SUFFIX, T, 128, OPFACADE_MMA_STAGES, _staged)

OPFACADE_DECODE(f32, float)
OPFACADE_DECODE(f16, f16_t)
OPFACADE_DECODE(bf16, bf16_t)
OPFACADE_DECODE_MMA(f16, f16_t)
OPFACADE_DECODE_MMA(bf16, bf16_t)
OPFACADE_PARTIAL_KQ(f16, f16_t, 128, 4, 3)
OPFACADE_PARTIAL_KQ(f16, f16_t, 128, 4, 4)
OPFACADE_PARTIAL_KQ(f16, f16_t, 128, 8, 3)
OPFACADE_PARTIAL_KQ(f16, f16_t, 128, 8, 4)
OPFACADE_PARTIAL_KQ(bf16, bf16_t, 128, 4, 3)
OPFACADE_PARTIAL_KQ(bf16, bf16_t, 128, 4, 4)
OPFACADE_PARTIAL_KQ(bf16, bf16_t, 128, 8, 3)
OPFACADE_PARTIAL_KQ(bf16, bf16_t, 128, 8, 4)
OPFACADE_PARTIAL_KQ_DEEP(f16, f16_t, 128, 4, 4, 1)
OPFACADE_PARTIAL_KQ_DEEP(f16, f16_t, 128, 8, 4, 1)
OPFACADE_PARTIAL_KQ_DEEP(bf16, bf16_t, 128, 4, 4, 1)
OPFACADE_PARTIAL_KQ_DEEP(bf16, bf16_t, 128, 8, 4, 1)

