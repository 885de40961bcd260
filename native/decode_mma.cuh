// The decode partial over a tile of 16 rows on tensor cores (f16 and bf16, D 64 and 128), for
// decode_attention.cu, which instantiates it (decode_partial_<T>_<D>_16).
#pragma once
#include "decode_common.cuh"

namespace {

// Kv heads of more than 4 rows (q_len > 1, or groups over 4) made decode_attention.cu's FMA
// tiles compute-bound: on an H100 (scripts/decode_variants.py) B64 S4096 q_len 4 (16 rows) read
// at 38% of a device copy with two 8-row tiles, 78% with one of these; q_len 2 (8 rows) 72%
// with an 8-row FMA tile, 86% with these. These tiles run both products as mma.sync m16n8k16
// with f32 accumulators, the same memory stream as the FMA tiles. The fragment layouts are
// PTX's ("Matrix fragments for mma.m16n8k16"): lane = 4 fr + fc holds A's rows fr and fr + 8,
// B's column fr, and columns 2 fc, 2 fc + 1 (and + 8) of both.
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
// The warps split the chunk's keys (kWarpKeys each), then add their accumulators in warp
// order. Every sum's order is fixed by D alone, so decode_attention.cu's batch invariance
// argument holds.
// The CTA's prologue is written out as in the CUDA-core tile: shared helpers for it and the
// load pipelines (a struct of the CTA's tile and chunk, a lambda for both pipelines) measured
// 2-3 points of a copy slower on this tile on an H100 (docs/DECODE.md). K's and V's pipelines
// now share one lambda a build (pipeline, stream) whose kernels' SASS is that of the pipelines
// written out, instruction for instruction (nvdisasm, every kernel of decode_attention.cu).

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

// A warp's ring of load batches in shared memory for the staged build, each batch kVectors
// 16-byte vectors a lane, laid out [stage][vector][lane]. Each lane copies (cp.async, around
// L1) only the vectors it reads back itself, in its own fragments' layout, so the sums and
// their order are the register pipeline's, no barrier guards a stage, and
// cp.async.wait_group alone makes a lane's copies visible to it. A tile streams K's batches
// then V's through one ring, kStages - 1 ahead of the batch it reads, so V's first batches fly
// through the softmax. The copies bypass L1, which the register pipeline's loads fill, and
// carry an L2 evict-first policy: on an H200 the 16-row tile read 0-1 points of a copy more
// with it at d 128, 3-4 more at d 64 (scripts/decode_variants.py --ring-hint at 9891cbc,
// record catalog/probes/decode_staged_H200.json). With the hint the copy takes no src-size operand
// (that form faulted as an illegal instruction there), so a vector past the keys is not copied
// and read() gives its zeros.
template <int kStages, int kVectors>
struct WarpRing {
    static constexpr int kWarpBytes = kStages * kVectors * 32 * 16;
    uint4* lane_base;  // the warp's ring, at this lane's column
    unsigned long long policy;  // the copies' L2 policy: evict_first()

    static __device__ __forceinline__ unsigned long long evict_first() {
        unsigned long long made;
        asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(made));
        return made;
    }
    // Vector i of `batch` from `from`, where valid (else nothing: no byte of `from` is read).
    __device__ __forceinline__ void copy(int batch, int i, const void* from, bool valid) const {
        if (valid) {
            asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;"
                         :: "r"((unsigned)__cvta_generic_to_shared(at(batch, i))), "l"(from),
                            "l"(policy) : "memory");
        }
    }
    // Vector i of `batch`, or zeros where !valid (past the keys: never copied).
    __device__ __forceinline__ uint4 read(int batch, int i, bool valid) const {
        return valid ? *at(batch, i) : make_uint4(0, 0, 0, 0);
    }
    // Closes a batch's copies as one group; a batch past the stream commits an empty group, so
    // wait_oldest's count holds to the end.
    static __device__ __forceinline__ void commit() {
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    // Waits until at most kStages - 1 groups (the batches ahead) are in flight.
    static __device__ __forceinline__ void wait_oldest() {
        asm volatile("cp.async.wait_group %0;" :: "n"(kStages - 1) : "memory");
    }

  private:
    __device__ __forceinline__ uint4* at(int batch, int i) const {
        return lane_base + ((batch % kStages) * kVectors + i) * 32;
    }
};

constexpr int kMmaRows = 16;
constexpr int kWarps = kThreads / 32;
// Each warp's keys of the chunk: 128, 16 key tiles of 8, whose scores stay in registers. At
// chunks of 512 the tile holds 168 registers and spills 92 bytes (ptxas), and still read 0.6-3.6
// points of a copy above chunks of 256 on q_len 4 (decode.py's CHUNK); at 2 blocks an SM, with
// room for them, it lost 13-17 points (catalog/probes/decode_chunk_H100.json, _H200.json).
constexpr int kWarpKeys = kChunk / kWarps;

#ifdef OPFACADE_DECODE_MMA_MIN_BLOCKS
#define OPFACADE_MMA_MIN_BLOCKS OPFACADE_DECODE_MMA_MIN_BLOCKS
#else
#define OPFACADE_MMA_MIN_BLOCKS 3
#endif
// Load batches a warp's ring holds in the staged build (its shared memory: 16 KiB a batch and
// CTA). H200, B64 S4096 q_len 4: 3 and 4 read alike (scripts/decode_variants.py --staged).
#ifndef OPFACADE_MMA_STAGES
#define OPFACADE_MMA_STAGES 3
#endif

// kStages 0: the register pipeline (two load batches in registers); else K and V staged through
// a ring of kStages batches a warp (WarpRing). The same fragments, so the same sums and bits;
// decode.py's mma_build picks the build from the grid.
template <typename T, int D, int kStages>
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
    // [kVecs][2][32] (16 bytes each), then the warps' accumulators [kWarps][R][D] or, staged,
    // the warps' rings, each holding its warp's accumulators once its last batch is read.
    i64* row_off = reinterpret_cast<i64*>(shared);
    float* warp_m = shared + 2 * kChunk;
    float* warp_l = warp_m + kWarps * R;
    uint4* q_frag = reinterpret_cast<uint4*>(warp_l + kWarps * R);
    float* sums = reinterpret_cast<float*>(q_frag + 2 * kVecs * 32);
    using Ring = WarpRing<kStages ? kStages : 1, kBatch * kVecs>;
    const Ring ring{reinterpret_cast<uint4*>(sums) + warp * (Ring::kWarpBytes / 16) + lane,
                    kStages ? Ring::evict_first() : 0};
    constexpr int kSumsStride = kStages ? Ring::kWarpBytes / 4 : R * D;  // floats a warp
    static_assert(!kStages || Ring::kWarpBytes >= R * D * 4, "a warp's ring holds its sums");

    // Q's A words, q_frag[j][half][lane]: rows fr + 8 half, vector j's d = 32 j + 8 fc ... + 7,
    // unscaled (the scale multiplies the f32 scores); rows past the tile's are zeros. Every
    // warp reads the same words, so warp 0 loads them (here) and stores them once its first
    // keys' loads are in flight (below): the keys never wait for Q. The scores reread them from
    // shared memory for every key tile, except in d 64's staged build (kQHeld below).
    int pos[2];  // the two rows' positions (-1: a row past the tile's, which sees no key)
    unsigned q_words[2][kVecs][4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int hr = fr + 8 * half, row = r0 + hr;
        pos[half] = hr < nr ? OPFACADE_ROW_POSITION(len, q_len, row, group) : -1;
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

    // Key tiles [t0, t0 + kBatch) of this warp: lane (fr, fc) fetches key 8 t + fr's vectors
    // (fetch(u, v, key, column)); zeros past the chunk's keys (never loaded: their content, NaN
    // included, meets no weight).
    auto vectors = [&](int t0, auto&& fetch) {
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
#pragma unroll
            for (int v = 0; v < kVecs; ++v) {
                fetch(u, v, warp_key0 + 8 * (t0 + u) + fr, 32 * v + 8 * fc);
            }
        }
    };
    auto load = [&](uint4 (&raw)[kBatch][kVecs], const T* base, int t0) {
        vectors(t0, [&](int u, int v, int j, int column) {
            raw[u][v] = j < keys ? load16(base + row_off[j] + column) : make_uint4(0, 0, 0, 0);
        });
    };
    // Staged: batch b of the warp's stream (K's kBatches, then V's) into its ring.
    constexpr int kBatches = kTiles / kBatch;
    auto issue = [&](int b) {
        if (b < 2 * kBatches) {
            const T* base = b < kBatches ? k_base : v_base;
            vectors((b % kBatches) * kBatch, [&](int u, int v, int j, int column) {
                const bool valid = j < keys;
                ring.copy(b, u * kVecs + v, valid ? base + row_off[j] + column : base, valid);
            });
        }
        Ring::commit();
    };
    auto staged = [&](uint4 (&raw)[kBatch][kVecs], int b) {
        vectors((b % kBatches) * kBatch, [&](int u, int v, int j, int) {
            raw[u][v] = ring.read(b, u * kVecs + v, j < keys);
        });
    };
    // The warp's K or V through consume(batch, its first key tile). Registers: `base`'s batches
    // load into raw_a and raw_b in turn, one flying while the other is consumed (the first
    // already in raw_a).
    uint4 raw_a[kBatch][kVecs], raw_b[kBatch][kVecs];
    auto pipeline = [&](const T* base, auto&& consume) {
#pragma unroll
        for (int t = 0; t < kTiles; t += 2 * kBatch) {
            load(raw_b, base, t + kBatch);
            consume(raw_a, t);
            if (t + 2 * kBatch < kTiles) load(raw_a, base, t + 2 * kBatch);
            consume(raw_b, t + kBatch);
        }
    };
    // Staged: the ring's batches [b0, b0 + kBatches) (K's from 0, V's from kBatches), each read
    // once it has landed, after the batch kStages - 1 ahead is issued.
    auto stream = [&](int b0, auto&& consume) {
#pragma unroll
        for (int b = b0; b < b0 + kBatches; ++b) {
            issue(b + kStages - 1);
            Ring::wait_oldest();  // batch b has landed
            staged(raw_a, b);
            consume(raw_a, (b - b0) * kBatch);
        }
    };

    // Scores: sc[t] is key tile t's C fragment (rows fr, fr + 8; keys 8 t + 2 fc, + 1).
    float sc[kTiles][4];
    // kQHeld: each warp copies its lanes' Q words into registers once (q_held[2 v + half]) and
    // the scores read those: the same words, so the same bits. Held through the scores only,
    // they fit the 168 registers of 3 CTAs an SM, and d 64's staged build then stops spilling
    // (ptxas: 4 bytes before): 4-7 points of a copy at q_len 4 on an H200. The d 128 builds
    // and d 64's register build read the same or 0.3-2 points lower with them, so they keep
    // shared memory (scripts/decode_variants.py --tree and --mma-few, thirty-seventh session,
    // catalog/probes/decode_q_regs_H200.json).
    constexpr bool kQHeld = kStages > 0 && D == 64;
    uint4 q_held[kQHeld ? 2 * kVecs : 1];
    auto score = [&](const uint4 (&raw)[kBatch][kVecs], int t0) {
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
            float* d = sc[t0 + u];
            d[0] = d[1] = d[2] = d[3] = 0.0f;
#pragma unroll
            for (int v = 0; v < kVecs; ++v) {
                const uint4 qa = kQHeld ? q_held[2 * v] : q_frag[2 * v * 32 + lane];
                const uint4 qb = kQHeld ? q_held[2 * v + 1] : q_frag[(2 * v + 1) * 32 + lane];
                Mma<T>::run(sc[t0 + u], qa.x, qb.x, qa.y, qb.y, raw[u][v].x, raw[u][v].y);
                Mma<T>::run(sc[t0 + u], qa.z, qb.z, qa.w, qb.w, raw[u][v].z, raw[u][v].w);
            }
        }
    };

    if constexpr (kStages > 0) {
#pragma unroll
        for (int b = 0; b < kStages - 1; ++b) issue(b);
    } else {
        load(raw_a, k_base, 0);
    }
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
    if constexpr (kQHeld) {
#pragma unroll
        for (int i = 0; i < 2 * kVecs; ++i) q_held[i] = q_frag[i * 32 + lane];
    }
    if constexpr (kStages > 0) {
        stream(0, score);
    } else {
        pipeline(k_base, score);
        load(raw_a, v_base, 0);  // V's first batch flies while the softmax runs
    }

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
    if constexpr (kStages > 0) {
        stream(kBatches, accumulate);
        __syncwarp();  // the warp's lanes have read their last batch: its ring takes the sums
    } else {
        pipeline(v_base, accumulate);
    }

    // The warps' accumulators, then their sum in warp order. (The register build keeps its own
    // form of these addresses, the same values: written through kSumsStride, its bf16 d 128
    // kernel spilled 100 bytes where it spills 68, by ptxas.)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        float* row = kStages ? sums + warp * kSumsStride + (fr + 8 * half) * D + 8 * fc
                             : sums + (warp * R + fr + 8 * half) * D + 8 * fc;
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
            const float4 x = *reinterpret_cast<const float4*>(
                kStages ? sums + w * kSumsStride + r * D + d : sums + (w * R + r) * D + d);
            total.x += x.x;
            total.y += x.y;
            total.z += x.z;
            total.w += x.w;
        }
        store_partial(
            ws_acc + partial_index(s, g, chunk, r0 + r, c.heads_kv, chunks, rows) * D + d, total);
    }
    if (tid < nr) {
        float row_m = minus_infinity(), row_l = 0.0f;
        for (int w = 0; w < kWarps; ++w) row_m = fmaxf(row_m, warp_m[w * R + tid]);
        for (int w = 0; w < kWarps; ++w) row_l += warp_l[w * R + tid];
        const i64 at = partial_index(s, g, chunk, r0 + tid, c.heads_kv, chunks, rows);
        store_partial(ws_ml + 2 * at, row_m);
        store_partial(ws_ml + 2 * at + 1, row_l);
    }
}

}  // namespace
