// Decode attention over KV caches, split over fixed chunks of keys (issue 13). The caches'
// forms and addressing are kv_cache.cuh's; kv_append and checked mode's check are kv_append.cu's.
//
//   decode_partial_<T>_<D>_<R>  CTA = (kv head g x row tile, chunk c of kChunk keys, sequence
//                        s). A tile holds R of the rows of g's group (its query heads times the
//                        q_len new tokens), so each K and V byte of the chunk is read once per
//                        tile; the tiles of one chunk are neighbours in the grid and share it
//                        through L2. Per row it writes the chunk's max score m, its sum l of
//                        exp(s - m) and acc = sum exp(s - m) v into the workspace.
//   decode_partial_<T>_<D>_16  The same CTA over a tile of 16 rows on tensor cores (f16, bf16;
//                        D 64, 128), for kv heads of more than 4 rows: see "Tiles of 16 rows".
//   decode_merge_<T>_<threads>  CTA = (sequence, query head, new token): merges the sequence's
//                        chunks into out and lse in slices of chunks added in a fixed order.
//                        Built with 64, 256 and 1024 threads; the launcher picks one from the
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
// The merge is launched as a programmatic dependent of the partial kernel (sm_90, decode.py):
// the partial's CTAs let it launch as soon as they start, so the merge's CTAs are resident when
// the last partial ends, and each waits (griddepcontrol.wait: the partial grid complete, its
// writes visible) before it reads a partial. Without the launch attribute both are no-ops.
//
// K and V are read once per step: their 16-byte loads carry the
// evict-first hint (common.cuh), measured on an H100 at 95% of a device copy's bandwidth
// against 93% without (scripts/decode_variants.py).
#define OPFACADE_STREAMING 1
#include "kv_cache.cuh"

namespace {

using namespace kv_cache;

__device__ __forceinline__ void let_dependents_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Tuning, measured on an H100 (scripts/decode_variants.py, docs/PERF-NOTES.md): 16-byte loads a
// thread has in flight per batch (two batches alternate), and the blocks per SM the compiler
// must fit. A 4-row tile holding one vector per lane fits five blocks an SM (92% of a device
// copy's bandwidth against 84% at the compiler's own choice of four); 8-row tiles hold twice
// the accumulators and stream best with batches of two; held to four blocks an SM, as the
// compiler chose for them before the spans' loop (docs/DECODE.md). Neither changes any sum's
// order, so the results are the same bits whatever they are. OPFACADE_DECODE_UNROLL and
// OPFACADE_DECODE_MIN_BLOCKS override both, for the variants script.
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

constexpr int kChunk = 256;   // keys per chunk: fixed, never chosen from the batch
constexpr int kThreads = 128;

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
        ws_acc[partial_index(s, g, chunk, r0 + r, c.heads_kv, chunks, rows) * D + e - r * D] = 0.0f;
    }
    if (threadIdx.x < nr) {
        const i64 at = partial_index(s, g, chunk, r0 + threadIdx.x, c.heads_kv, chunks, rows);
        ws_ml[2 * at] = minus_infinity();
        ws_ml[2 * at + 1] = 0.0f;
    }
}

// Whether no row of the tile sees a key of this chunk; then it writes the chunk's partial
// (write_unseen).
template <int D>
__device__ bool unseen_chunk(const Cache& c, int s, int g, int chunk, int r0, int nr, int len,
                             int keys, int q_len, int group, int chunks, int left,
                             float* __restrict__ ws_acc, float* __restrict__ ws_ml) {
    const int first_pos = len - q_len + r0 / group, last_pos = len - q_len + (r0 + nr - 1) / group;
    if (!chunk_unseen(chunk * kChunk, keys, first_pos, last_pos, left)) return false;
    write_unseen<D>(c, s, g, chunk, r0, nr, q_len, group, chunks, ws_acc, ws_ml);
    return true;
}

// Each key's row of the chunk, as an element offset from its sequence's K (and V) base, into
// row_off[0, keys): a paged cache's table lookup and page arithmetic leave the load loops, whose
// addresses then need no dependent load. The caller syncs before reading it.
template <int D>
__device__ __forceinline__ void chunk_rows(const Cache& c, int s, int g, int k0, int keys,
                                           i64* row_off) {
#pragma unroll
    for (int u = 0; u < kChunk / kThreads; ++u) {  // unrolled: the table loads fly together
        const int j = threadIdx.x + u * kThreads, key = k0 + j;
        if (j < keys) {
            row_off[j] = c.kind == 1
                             ? offset(c, max(page_of(c, s, key), 0), page_slot(c, key), g,
                                      c.page_size, D)
                             : offset(c, c.kind == 2 ? 0 : s, key, g, c.capacity, D);
        }
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
    constexpr int kUnroll = kUnrollOf<R, L::kPerLane>;
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
    const int first_pos = len - q_len + r0 / group, last_pos = len - q_len + (r0 + nr - 1) / group;
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
                    const int key_pos = k0 + j, pos = len - q_len + (r0 + r) / group;
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
            ws_acc[partial_index(s, g, chunk, r0 + r, c.heads_kv, chunks, rows) * D + d] = total;
        }
    }
}

// ---- Tiles of 16 rows on tensor cores (f16 and bf16, D 64 and 128) ----
//
// Kv heads of more than 4 rows (q_len > 1, or groups over 4) made the FMA tiles above
// compute-bound: on an H100 (scripts/decode_variants.py) B64 S4096 q_len 4 (16 rows) read at
// 38% of a device copy with two 8-row tiles, 78% with one of these; q_len 2 (8 rows) 72%
// with an 8-row FMA tile, 86% with these. These tiles run both
// products as mma.sync m16n8k16 with f32 accumulators, the same memory stream as the tiles
// above. The fragment layouts are PTX's ("Matrix fragments for mma.m16n8k16"): lane = 4 fr + fc
// holds A's rows fr and fr + 8, B's column fr, and columns 2 fc, 2 fc + 1 (and + 8) of both.
//
// K and V are not staged in shared memory: each lane loads 16-byte vectors straight from the
// cache, and the layouts are made to fit them.
// - Q K^T sums over d in any order both operands agree on. A lane's vector j of a key row holds
//   d = 32 j + 8 fc ... + 7, which it uses as its B words of two k-steps; its Q vectors of rows
//   fr and fr + 8 cover the same d, as its A words.
// - P V needs V's columns in B's layout (a lane holds one column, two keys). movmatrix
//   transposes each 8x8 block (8 keys x 4 lanes' word p) in registers. Output column n of block
//   (j, p) is then d = 32 j + 8 (n / 2) + 2 p + n % 2, so a lane's accumulators of row fr are
//   again d = 32 j + 8 fc ... + 7.
// - P's A fragment is the scores' C fragment of two key tiles (FlashAttention-2's reuse), split
//   into a high and a low half of T (P = hi + lo to ~2^-16): two products keep the weights' f32
//   precision where one rounding to bf16 would cost 2^-9 per weight. Tensor work is cheap here;
//   the kernel is memory-bound.
// The warps split the chunk's keys (64 each), then add their accumulators in warp order. Every
// sum's order is fixed by D alone, so the batch invariance argument above holds unchanged.
// The CTA's prologue and its two load pipelines are written out as in the CUDA-core tile:
// shared helpers for them (a struct of the CTA's tile and chunk, a lambda for both pipelines)
// measured 2-3 points of a copy slower on this tile on an H100 (docs/DECODE.md).

// Mma<T>: d += a b for one m16n8k16 product of T (f32 accumulators), packing two floats into a
// word of two T (x0 in the low half, rounded to nearest), and each half back as a float. The
// PTX differs only in the type's name.
#define OPFACADE_MMA_OPS(T, TYPE)                                                                \
    static __device__ __forceinline__ void run(float (&d)[4], unsigned a0, unsigned a1,          \
                                               unsigned a2, unsigned a3, unsigned b0,            \
                                               unsigned b1) {                                    \
        asm("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 {%0, %1, %2, %3}, "     \
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                                      \
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                     \
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));                             \
    }                                                                                            \
    static __device__ __forceinline__ unsigned pack(float x0, float x1) {                        \
        unsigned r;                                                                              \
        asm("cvt.rn." TYPE "x2.f32 %0, %1, %2;" : "=r"(r) : "f"(x1), "f"(x0));                   \
        return r;                                                                                \
    }                                                                                            \
    static __device__ __forceinline__ float low(unsigned w) {                                    \
        return Math<T>::up(T{(u16)(w & 0xffffu)});                                               \
    }                                                                                            \
    static __device__ __forceinline__ float high(unsigned w) {                                   \
        return Math<T>::up(T{(u16)(w >> 16)});                                                   \
    }

template <typename T> struct Mma;

template <> struct Mma<bf16_t> { OPFACADE_MMA_OPS(bf16_t, "bf16") };
template <> struct Mma<f16_t> { OPFACADE_MMA_OPS(f16_t, "f16") };

// The 8x8 matrix of 16-bit elements a warp holds (lane 4 r + c: row r, columns 2c, 2c + 1),
// transposed into the same layout.
__device__ __forceinline__ unsigned transposed(unsigned x) {
    unsigned r;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
    return r;
}

__device__ __forceinline__ unsigned word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

constexpr int kMmaRows = 16;
constexpr int kWarps = kThreads / 32;
constexpr int kWarpKeys = kChunk / kWarps;  // 64: 8 key tiles of 8

#ifdef OPFACADE_DECODE_MMA_MIN_BLOCKS
#define OPFACADE_MMA_MIN_BLOCKS OPFACADE_DECODE_MMA_MIN_BLOCKS
#else
#define OPFACADE_MMA_MIN_BLOCKS 3
#endif

template <typename T, int D>
__device__ void partial_mma(const T* __restrict__ q, i64 q_sb, i64 q_st, i64 q_sh,
                            const Cache& c, const int* __restrict__ seq_lens,
                            float* __restrict__ ws_acc, float* __restrict__ ws_ml, int q_len,
                            int group, int tiles, int chunks, float scale, int left) {
    constexpr int R = kMmaRows;
    constexpr int kVecs = D / 32;         // a lane's 16-byte vectors of a row (4 lanes a row)
    constexpr int kTiles = kWarpKeys / 8;  // key tiles of 8 per warp
    constexpr int kBatch = 256 / D;        // key tiles per load batch: 2 or 4 (even: k-steps)
    static_assert(D == 64 || D == 128, "tensor-core tiles are built for D 64 and 128");
    extern __shared__ float shared[];
    const int tile = blockIdx.x % tiles, g = blockIdx.x / tiles;
    const int chunk = blockIdx.y, s = blockIdx.z;
    const int rows = group * q_len, r0 = tile * R, nr = min(R, rows - r0);
    const int len = sequence_length(c, seq_lens, s);
    const int k0 = chunk * kChunk;
    if (k0 >= len || nr <= 0) return;  // the merge reads chunks below ceil(len / kChunk) only
    const int keys = min(kChunk, len - k0);
    if (unseen_chunk<D>(c, s, g, chunk, r0, nr, len, keys, q_len, group, chunks, left, ws_acc,
                        ws_ml)) {
        return;
    }
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int fr = lane >> 2, fc = lane & 3;
    const int warp_key0 = warp * kWarpKeys;

    // Shared: row offsets [kChunk] i64, row maxima and sums [kWarps][R], Q's fragments
    // [kVecs][2][32] (16 bytes each), the warps' accumulators [kWarps][R][D].
    i64* row_off = reinterpret_cast<i64*>(shared);
    float* warp_m = shared + 2 * kChunk;
    float* warp_l = warp_m + kWarps * R;
    uint4* q_frag = reinterpret_cast<uint4*>(warp_l + kWarps * R);
    float* sums = reinterpret_cast<float*>(q_frag + 2 * kVecs * 32);

    // Q's A words, q_frag[j][half][lane]: rows fr + 8 half, vector j's d = 32 j + 8 fc ... + 7,
    // unscaled (the scale multiplies the f32 scores); rows past the tile's are zeros. Every
    // warp reads the same words, so warp 0 loads them (here) and stores them once its first
    // keys' loads are in flight (below): the keys never wait for Q. Shared memory, not
    // registers: at D 128 the registers are the occupancy (168 a thread, 3 CTAs an SM).
    int pos[2];  // the two rows' positions (-1: a row past the tile's, which sees no key)
    unsigned q_words[2][kVecs][4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int hr = fr + 8 * half, row = r0 + hr;
        pos[half] = hr < nr ? len - q_len + row / group : -1;
        const u16* q_row = reinterpret_cast<const u16*>(
            q + s * q_sb + (row / group) * q_st + (g * group + row % group) * q_sh);
#pragma unroll
        for (int j = 0; j < kVecs; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int d = 32 * j + 8 * fc + 2 * i;
                q_words[half][j][i] = warp == 0 && hr < nr
                                          ? (unsigned)q_row[d] | ((unsigned)q_row[d + 1] << 16)
                                          : 0u;
            }
        }
    }

    const T *k_base, *v_base;
    sequence_bases(c, s, k_base, v_base);
    chunk_rows<D>(c, s, g, k0, keys, row_off);
    __syncthreads();  // row_off

    // Key tiles [t0, t0 + kBatch) of this warp: lane (fr, fc) loads key 8 t + fr's vectors;
    // zeros past the chunk's keys (never loaded: their content, NaN included, meets no weight).
    auto load = [&](uint4 (&raw)[kBatch][kVecs], const T* base, int t0) {
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
            const int j = warp_key0 + 8 * (t0 + u) + fr;
#pragma unroll
            for (int v = 0; v < kVecs; ++v) {
                raw[u][v] = j < keys ? load16(base + row_off[j] + 32 * v + 8 * fc)
                                     : make_uint4(0, 0, 0, 0);
            }
        }
    };

    // Scores: sc[t] is key tile t's C fragment (rows fr, fr + 8; keys 8 t + 2 fc, + 1).
    float sc[kTiles][4];
    auto score = [&](const uint4 (&raw)[kBatch][kVecs], int t0) {
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
            float* d = sc[t0 + u];
            d[0] = d[1] = d[2] = d[3] = 0.0f;
#pragma unroll
            for (int v = 0; v < kVecs; ++v) {
                const uint4 qa = q_frag[2 * v * 32 + lane], qb = q_frag[(2 * v + 1) * 32 + lane];
                Mma<T>::run(sc[t0 + u], qa.x, qb.x, qa.y, qb.y, raw[u][v].x, raw[u][v].y);
                Mma<T>::run(sc[t0 + u], qa.z, qb.z, qa.w, qb.w, raw[u][v].z, raw[u][v].w);
            }
        }
    };

    uint4 raw_a[kBatch][kVecs], raw_b[kBatch][kVecs];
    load(raw_a, k_base, 0);
    if (warp == 0) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
            for (int j = 0; j < kVecs; ++j) {
                const unsigned* w = q_words[half][j];
                q_frag[(2 * j + half) * 32 + lane] = make_uint4(w[0], w[1], w[2], w[3]);
            }
        }
    }
    __syncthreads();  // q_frag
#pragma unroll
    for (int t = 0; t < kTiles; t += 2 * kBatch) {
        load(raw_b, k_base, t + kBatch);
        score(raw_a, t);
        if (t + 2 * kBatch < kTiles) load(raw_a, k_base, t + 2 * kBatch);
        score(raw_b, t + kBatch);
    }
    load(raw_a, v_base, 0);  // V's first batch flies while the softmax runs

    // Scale and mask; each row's max over the warp's keys, then over the warps.
    float m[2] = {minus_infinity(), minus_infinity()};
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int j = warp_key0 + 8 * t + 2 * fc + (e & 1), key_pos = k0 + j;
            const int p = pos[e >> 1];
            const bool seen = j < keys && key_pos <= p && (left < 0 || key_pos >= p - left);
            sc[t][e] = seen ? sc[t][e] * scale : minus_infinity();
            m[e >> 1] = fmaxf(m[e >> 1], sc[t][e]);
        }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        m[half] = fmaxf(m[half], __shfl_xor_sync(0xffffffffu, m[half], 1));
        m[half] = fmaxf(m[half], __shfl_xor_sync(0xffffffffu, m[half], 2));
        if (fc == 0) warp_m[warp * R + fr + 8 * half] = m[half];
    }
    __syncthreads();  // warp_m
    float base[2], l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        for (int w = 0; w < kWarps; ++w) m[half] = fmaxf(m[half], warp_m[w * R + fr + 8 * half]);
        base[half] = m[half] == minus_infinity() ? 0.0f : m[half];  // the base exp subtracts
    }

    // Weights exp(s - m), this lane's sums of them, and P's A words (high and low halves) of
    // each k-step of 16 keys (key tiles 2i and 2i + 1).
    unsigned p_hi[kTiles / 2][4], p_lo[kTiles / 2][4];
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            sc[t][e] = expf(sc[t][e] - base[e >> 1]);
            l[e >> 1] += sc[t][e];
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float x0 = sc[t][2 * half], x1 = sc[t][2 * half + 1];
            const unsigned hi = Mma<T>::pack(x0, x1);
            const unsigned lo = Mma<T>::pack(x0 - Mma<T>::low(hi), x1 - Mma<T>::high(hi));
            // a0, a1: tile 2i's rows fr and fr + 8; a2, a3: tile 2i + 1's.
            p_hi[t / 2][2 * (t % 2) + half] = hi;
            p_lo[t / 2][2 * (t % 2) + half] = lo;
        }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
        l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
        if (fc == 0) warp_l[warp * R + fr + 8 * half] = l[half];
    }

    // acc[v][p]: the C fragment of V block (v, p), columns 32 v + 8 fc + 2 p, + 1.
    float acc[kVecs][4][4] = {};
    auto accumulate = [&](const uint4 (&raw)[kBatch][kVecs], int t0) {
#pragma unroll
        for (int u = 0; u < kBatch; u += 2) {
            const int i = (t0 + u) / 2;  // the k-step: key tiles t0 + u and t0 + u + 1
#pragma unroll
            for (int v = 0; v < kVecs; ++v) {
#pragma unroll
                for (int p = 0; p < 4; ++p) {
                    const unsigned b0 = transposed(word(raw[u][v], p));
                    const unsigned b1 = transposed(word(raw[u + 1][v], p));
                    Mma<T>::run(acc[v][p], p_hi[i][0], p_hi[i][1], p_hi[i][2], p_hi[i][3], b0, b1);
                    Mma<T>::run(acc[v][p], p_lo[i][0], p_lo[i][1], p_lo[i][2], p_lo[i][3], b0, b1);
                }
            }
        }
    };
#pragma unroll
    for (int t = 0; t < kTiles; t += 2 * kBatch) {
        load(raw_b, v_base, t + kBatch);
        accumulate(raw_a, t);
        if (t + 2 * kBatch < kTiles) load(raw_a, v_base, t + 2 * kBatch);
        accumulate(raw_b, t + kBatch);
    }

    // The warps' accumulators, then their sum in warp order.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        float* row = sums + (warp * R + fr + 8 * half) * D + 8 * fc;
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
#pragma unroll
            for (int p = 0; p < 4; ++p) {
                *reinterpret_cast<float2*>(row + 32 * v + 2 * p) =
                    make_float2(acc[v][p][2 * half], acc[v][p][2 * half + 1]);
            }
        }
    }
    __syncthreads();  // sums, warp_l
    for (int e = 4 * tid; e < nr * D; e += 4 * kThreads) {
        const int r = e / D, d = e - r * D;
        float4 total = *reinterpret_cast<const float4*>(sums + r * D + d);
#pragma unroll
        for (int w = 1; w < kWarps; ++w) {
            const float4 x = *reinterpret_cast<const float4*>(sums + (w * R + r) * D + d);
            total.x += x.x;
            total.y += x.y;
            total.z += x.z;
            total.w += x.w;
        }
        *reinterpret_cast<float4*>(
            ws_acc + partial_index(s, g, chunk, r0 + r, c.heads_kv, chunks, rows) * D + d) = total;
    }
    if (tid < nr) {
        float row_m = minus_infinity(), row_l = 0.0f;
        for (int w = 0; w < kWarps; ++w) row_m = fmaxf(row_m, warp_m[w * R + tid]);
        for (int w = 0; w < kWarps; ++w) row_l += warp_l[w * R + tid];
        const i64 at = partial_index(s, g, chunk, r0 + tid, c.heads_kv, chunks, rows);
        ws_ml[2 * at] = row_m;
        ws_ml[2 * at + 1] = row_l;
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
    wait_for_prerequisite_grid();  // the partials (seq_lens came before the partial kernel)
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
        let_dependents_launch();                                                                 \
        partial<T, D, R, false>(q, q_sb, q_st, q_sh, OPFACADE_CACHE_ARGS, seq_lens, ws_acc,      \
                                ws_ml, q_len, group, tiles, chunks, scale, left, 1);             \
    }

// The 4-row tiles also run spans of chunks (8-row tiles lost occupancy to the loop's registers).
#define OPFACADE_PARTIAL_SPANS(SUFFIX, T, D)                                                     \
    extern "C" __global__ void __launch_bounds__(                                                \
        kThreads, OPFACADE_MIN_BLOCKS(4, (Row<T, D>::kPerLane)))                                 \
        decode_partial_##SUFFIX##_##D##_4_spans(                                                 \
        const T* q, i64 q_sb, i64 q_st, i64 q_sh, OPFACADE_CACHE_PARAMS, const int* seq_lens,    \
        float* ws_acc, float* ws_ml, int q_len, int group, int tiles, int chunks, float scale,   \
        int left, int span) {                                                                    \
        let_dependents_launch();                                                                 \
        partial<T, D, 4, true>(q, q_sb, q_st, q_sh, OPFACADE_CACHE_ARGS, seq_lens, ws_acc,       \
                               ws_ml, q_len, group, tiles, chunks, scale, left, span);           \
    }

#define OPFACADE_PARTIAL_MMA(SUFFIX, T, D)                                                       \
    extern "C" __global__ void __launch_bounds__(kThreads, OPFACADE_MMA_MIN_BLOCKS)              \
        decode_partial_##SUFFIX##_##D##_16(                                                      \
        const T* q, i64 q_sb, i64 q_st, i64 q_sh, OPFACADE_CACHE_PARAMS, const int* seq_lens,    \
        float* ws_acc, float* ws_ml, int q_len, int group, int tiles, int chunks, float scale,   \
        int left) {                                                                              \
        let_dependents_launch();                                                                 \
        partial_mma<T, D>(q, q_sb, q_st, q_sh, OPFACADE_CACHE_ARGS, seq_lens, ws_acc, ws_ml,     \
                          q_len, group, tiles, chunks, scale, left);                             \
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
    OPFACADE_PARTIAL_SPANS(SUFFIX, T, 64)                                                        \
    OPFACADE_PARTIAL_SPANS(SUFFIX, T, 128)                                                       \
    OPFACADE_PARTIAL_SPANS(SUFFIX, T, 256)                                                       \
    OPFACADE_MERGE(SUFFIX, T, 64)                                                                \
    OPFACADE_MERGE(SUFFIX, T, 256)                                                               \
    OPFACADE_MERGE(SUFFIX, T, 1024)

// Tensor-core tiles of 16 rows: half types, D 64 and 128 (decode.py's row_tile picks them).
#define OPFACADE_DECODE_MMA(SUFFIX, T)                                                           \
    OPFACADE_PARTIAL_MMA(SUFFIX, T, 64)                                                          \
    OPFACADE_PARTIAL_MMA(SUFFIX, T, 128)

OPFACADE_DECODE(f32, float)
OPFACADE_DECODE(f16, f16_t)
OPFACADE_DECODE(bf16, bf16_t)
OPFACADE_DECODE_MMA(f16, f16_t)
OPFACADE_DECODE_MMA(bf16, bf16_t)

