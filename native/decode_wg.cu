// The decode partial over a tile of R = 16 or 32 rows on Hopper's warpgroup MMA (wgmma; f16 and
// bf16, D 128): decode_partial_<T>_128_<R>wg, the same CTA, workspace and sums' contract as
// decode_attention.cu's partial kernels (whose merge it feeds). decode.py puts every kv head
// of more than 8 rows at D 128 on it on sm_90 devices (tiles of 16 up to 16 rows, of 32 past
// that); this file is compiled for sm_90a there (compiler.py's ARCH_SPECIFIC), and elsewhere
// its kernels trap.
//
// Why: under ncu (docs/DECODE.md, "The 16-row tile against cuDNN's kernel") the mma.sync tile
// (decode_mma.cuh) spent 42 instructions a key and warp where cuDNN's kernel spent 18: its
// per-lane ring, V's transposes and the cross-warp sums. Here the CTA's one warpgroup runs
// both products from shared memory, and on an H200 the step read 94% of a device copy at
// q_len 4 where that tile read 88-89% (docs/DECODE.md, "The wgmma tile").
// - S^T = K Q^T (m64nRk16): A = a block of 64 keys (K-major), B = the tile's R query rows
//   (K-major). The scores' accumulators are R / 2 registers a thread.
// - O^T = V^T [P_hi | P_lo]^T (m64n(2R)k16, 2 m-tiles): A = the same block of V, read M-major
//   (trans-a); B = the weights, keys-major with the rows contiguous (trans-b), their high and
//   low halves of T side by side as 2R columns (P = hi + lo to ~2^-16, as the mma.sync tile
//   keeps them).
// Layouts (strides checked on an H200 by scripts/wgmma_layout_probe.py and by the outputs):
// - K and V land by cp.async (16 bytes a thread, around L1) in a ring of blocks, each block
//   [2 column blocks of 64 d][64 keys][128 bytes] with the 128-byte swizzle (16-byte chunk c
//   of key r at chunk c ^ (r % 8)): K-major for K (stride 1024 bytes between 8-key groups),
//   M-major for V (leading offset 8192 bytes between column blocks, stride 1024 between
//   8-key groups).
// - Q and P in no-swizzle core matrices (8 rows of 16 bytes, 128 contiguous bytes): the
//   leading byte offset steps along K, the stride byte offset along M or N.
// The softmax runs online over the chunk's 8 blocks of 64 keys, in base 2 (a running max a row;
// sums and accumulators rescaled by 2^(m_old - m_new); the partial's max goes out in base e, as
// every tile's): another order and rounding than the mma.sync tile's, fixed by D alone, so the
// batch invariance argument of decode_attention.cu holds on every sm_90 device.
#define OPFACADE_STREAMING 1
#include "decode_mma.cuh"  // Mma<T> (packing the weights), kWarps

namespace {

// Built for D 128 (at D 64 an early form read 4 points under the mma.sync tile).
constexpr int kWgDim = 128;

// wgmma is sm_90a's: built elsewhere (sm_80 in CI), the kernels trap.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int kWgKeys = 64;  // keys a block: wgmma's M for S^T

// Blocks of K and V in the ring (32 KiB each at d 128): 3 for tiles of 16 rows; 2 for 32, whose
// larger Q and P would otherwise leave room for one CTA an SM. (3 and 2 read alike in the first,
// unswizzled form of the 16-row tile on an H200.) The kernel's shared memory, decode.py's
// shared_bytes: 1024 bytes of alignment slack, the ring, Q's core matrices, P's, the row
// offsets, two buffers of the warps' row maxima, and their sums.
// OPFACADE_WG_STAGES_16 and _32 override them for scripts/decode_variants.py --wg-stages.
#ifndef OPFACADE_WG_STAGES_16
#define OPFACADE_WG_STAGES_16 3
#endif
#ifndef OPFACADE_WG_STAGES_32
#define OPFACADE_WG_STAGES_32 2
#endif
template <int R> constexpr int kWgStages = R == 16 ? OPFACADE_WG_STAGES_16 : OPFACADE_WG_STAGES_32;

typedef unsigned long long u64;
constexpr u64 kSwizzle128 = 1ull << 62;  // a descriptor's layout: 128-byte swizzle

// A shared-memory matrix descriptor without swizzle (| kSwizzle128 for the 128-byte one): start
// address, leading byte offset (along K), stride byte offset (along M or N), in 16-byte units.
__device__ __forceinline__ u64 wg_descriptor(const void* at, unsigned along_k, unsigned along_mn) {
    const unsigned address = (unsigned)__cvta_generic_to_shared(at);
    return (u64)((address & 0x3FFFF) >> 4) | ((u64)(along_k >> 4) << 16) |
           ((u64)(along_mn >> 4) << 32);
}

// The softmax runs in base 2: scores scaled by scale x log2(e), weights by one ex2.approx
// (relative error about 2^-22, far under the SKUs' bounds) where expf took a dozen instructions.
// On an H200 that alone gave the 32-row tile 3-6 points of a copy (docs/DECODE.md, "The wgmma
// tile's instructions").
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float wg_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Keeps the compiler from moving a use of an accumulator across the asynchronous products.
__device__ __forceinline__ void wg_hold(float& x) { asm volatile("" : "+f"(x)::"memory"); }

// Wg<T>::mma<N, kTrans>(d, a, b, add): one wgmma.m64nNk16 of T with f32 accumulators (d holds
// N / 2 a thread), d = a b (+ d where add), trans-a and trans-b both kTrans; N 16, 32 or 64.
#define OPFACADE_WG_R8(d)                                                                        \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define OPFACADE_WG_R16(d) OPFACADE_WG_R8(d), OPFACADE_WG_R8((d + 8))
#define OPFACADE_WG_R32(d) OPFACADE_WG_R16(d), OPFACADE_WG_R16((d + 16))
#define OPFACADE_WG_OPS(TYPE)                                                                    \
    template <int kN, int kTrans>                                                                \
    static __device__ __forceinline__ void mma(float* d, u64 a, u64 b, int add) {                \
        if constexpr (kN == 16) {                                                                \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %8, 0;\n"                             \
                         "wgmma.mma_async.sync.aligned.m64n16k16.f32." TYPE "." TYPE             \
                         " {%0, %1, %2, %3, %4, %5, %6, %7}, %9, %10, p, 1, 1, %11, %11;\n}"     \
                         : OPFACADE_WG_R8(d) : "r"(add), "l"(a), "l"(b), "n"(kTrans));          \
        } else if constexpr (kN == 32) {                                                         \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %16, 0;\n"                            \
                         "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE             \
                         " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14,"    \
                         " %15}, %17, %18, p, 1, 1, %19, %19;\n}"                                \
                         : OPFACADE_WG_R16(d) : "r"(add), "l"(a), "l"(b), "n"(kTrans));         \
        } else {                                                                                 \
            static_assert(kN == 64, "wgmma of N 16, 32 or 64");                                  \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %32, 0;\n"                            \
                         "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE             \
                         " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14,"    \
                         " %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27,"     \
                         " %28, %29, %30, %31}, %33, %34, p, 1, 1, %35, %35;\n}"                 \
                         : OPFACADE_WG_R32(d) : "r"(add), "l"(a), "l"(b), "n"(kTrans));         \
        }                                                                                        \
    }

template <typename T> struct Wg;
template <> struct Wg<bf16_t> { OPFACADE_WG_OPS("bf16") };
template <> struct Wg<f16_t> { OPFACADE_WG_OPS("f16") };

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wg_wait_all() {
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
// Makes this thread's generic-proxy writes to shared memory (stores, cp.async) visible to the
// async proxy that wgmma reads through.
__device__ __forceinline__ void wg_publish() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// kSpans: the CTA runs the chunks [span y, span (y + 1)) of its sequence, kv head and tile, one
// partial each, computed exactly as a CTA of one chunk computes it (the same bits). The ring
// runs on from one chunk into the next: the next chunk's row offsets are written and its first
// blocks copied during the last blocks of this one, so its copies wait neither on a CTA's start
// nor on this chunk's epilogue.
template <typename T, int D, int R, bool kSpans>
__device__ void partial_wg(const T* __restrict__ q, i64 q_sb, i64 q_st, i64 q_sh,
                           const Cache& c, const int* __restrict__ seq_lens,
                           float* __restrict__ ws_acc, float* __restrict__ ws_ml, int q_len,
                           int group, int tiles, int chunks, float scale, int left, int span) {
    constexpr int S = kWgStages<R>;
    constexpr int kRows = R / 4;  // a thread's accumulator rows (of the scores' N = R columns)
    constexpr int kCores = D / 8;                  // core matrices along d (16 bytes each)
    constexpr int kBlockBytes = kWgKeys * D * 2;   // one block of K or of V
    constexpr int kVectors = kWgKeys * kCores / kThreads;  // a thread's copies a block and tensor
    constexpr int kBlocks = kChunk / kWgKeys;
    static_assert(D == 64 || D == 128, "column blocks of 64 d: D 64 or 128");
    static_assert(R == 16 || R == 32, "tiles of 16 or 32 rows (wgmma N 16 or 32, 32 or 64)");
    extern __shared__ uint4 wg_shared[];
    // The span's first chunk that a row sees (chunk_tile writes the partials of those no row
    // sees); none where the span starts past the sequence's length.
    const int first = kSpans ? blockIdx.y * span : blockIdx.y;
    const int last = kSpans ? min(first + span, chunks) : first + 1;
    ChunkTile t;
    for (int chunk = first;
         !chunk_tile<D, R>(c, seq_lens, q_len, group, tiles, chunks, left, ws_acc, ws_ml, t, chunk);
         ++chunk) {
        if (!kSpans || t.k0 >= t.len || t.nr <= 0 || chunk + 1 >= last) return;
    }
    const int g = t.g, s = t.s, rows = t.rows, r0 = t.r0, nr = t.nr, len = t.len;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int quad = lane >> 2, pair = lane & 3;  // accumulator row group, column pair
    // This thread's accumulator row r (of kRows): column 8 (r / 2) + 2 pair + r % 2 of the
    // scores, the same row's columns of the output (register i holds row (i / 4, i % 2)).
    auto row_of = [&](int r) { return 8 * (r >> 1) + 2 * pair + (r & 1); };

    // The ring starts on a 1024-byte boundary (the swizzle's pattern repeats every 1024 bytes
    // from one: descriptors with base offset 0); the size asks for the slack.
    unsigned char* ring = reinterpret_cast<unsigned char*>(wg_shared);
    ring += (1024 - ((unsigned)__cvta_generic_to_shared(ring) & 1023)) & 1023;
    u16* q_s = reinterpret_cast<u16*>(ring + S * 2 * kBlockBytes);
    unsigned* p_s = reinterpret_cast<unsigned*>(q_s + R * D);
    i64* row_off = reinterpret_cast<i64*>(p_s + kWgKeys * R);  // P: 64 keys x 2 R halves
    float* red_m = reinterpret_cast<float*>(row_off + kChunk);  // [2][warps][R]
    float* red_l = red_m + 2 * kWarps * R;                      // [warps][R]

    // Q's core matrices [row / 8][d / 8][row % 8][d % 8], rows past the tile's zeros: each row's
    // kThreads / R threads load kPer of its d, every load independent (a loop of dependent
    // rounds cost a CTA several DRAM latencies). Loaded here, stored to q_s once the first
    // blocks' copies are issued: the CTA's first KV reads then wait on no Q load (under ncu the
    // 32-row tile's prologue stalled a fifth of its samples on them).
    constexpr int kPer = D * R / kThreads, kAcross = kThreads / R;
    const int q_hr = tid / kAcross, q_d0 = (tid % kAcross) * kPer;
    unsigned q_words[kPer / 2];
    {
        const int row = r0 + q_hr;
        const u16* q_row = reinterpret_cast<const u16*>(
            q + s * q_sb + (row / group) * q_st + (g * group + row % group) * q_sh);
#pragma unroll
        for (int i = 0; i < kPer / 2; ++i) {
            q_words[i] = q_hr < nr ? (unsigned)q_row[q_d0 + 2 * i] |
                                         ((unsigned)q_row[q_d0 + 2 * i + 1] << 16)
                                   : 0u;
        }
    }
    // This thread's rows' positions (-1: a row past the tile's, which sees no key).
    int pos[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        pos[r] = row_of(r) < nr ? OPFACADE_ROW_POSITION(len, q_len, r0 + row_of(r), group) : -1;
    }
    const float scale2 = scale * kLog2e;
    const T *k_base, *v_base;
    sequence_bases(c, s, k_base, v_base);
    chunk_rows<D>(c, t, row_off);
    __syncthreads();  // row_off
    const int first_pos = OPFACADE_ROW_POSITION(len, q_len, r0, group);
    const int last_pos = OPFACADE_ROW_POSITION(len, q_len, r0 + nr - 1, group);

    // A block's K and V into a ring stage, each [D / 64 column blocks][64 keys][128 bytes]
    // with the 16-byte chunks of each key's row swizzled (chunk c of key r at c ^ (r % 8), the
    // 128-byte swizzle wgmma reads): vector v = tid + kThreads u is chunk v % 8 of key
    // (v / 8) % 64, column block v / 512. So each 8 lanes copy one key's 128 contiguous bytes
    // (whole sectors: with 8 keys of 16 bytes each, the first form read every sector twice
    // through L2, at 48% of a copy) into one 128-byte row, every bank once. Keys past the
    // chunk's are zeros, never loaded.
    auto slot = [&](int v) { return (v >> 9) * 8192 + ((v >> 3) & 63) * 128 +
                                    (((v & 7) ^ ((v >> 3) & 7)) << 4); };
    // Block b (of a chunk of `keys` keys whose row offsets row_off holds) into ring stage
    // `stage`; the caller commits the group.
    auto copy_block = [&](int b, int stage, int keys) {
        unsigned char* k_stage = ring + stage * 2 * kBlockBytes;
        i64 off[kVectors];
        bool valid[kVectors];
#pragma unroll
        for (int u = 0; u < kVectors; ++u) {
            const int v = tid + kThreads * u;
            const int j = b * kWgKeys + ((v >> 3) & 63);
            valid[u] = j < keys;
            off[u] = (valid[u] ? row_off[j] : 0) + 64 * (v >> 9) + 8 * (v & 7);
        }
#pragma unroll
        for (int u = 0; u < kVectors; ++u) {
            const int v = tid + kThreads * u;
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const unsigned to = (unsigned)__cvta_generic_to_shared(
                    k_stage + t * kBlockBytes + slot(v));
                const T* from = (t ? v_base : k_base) + off[u];
                // A key past the chunk's copies no byte and fills its 16 with zeros. (No L2
                // evict-first policy: with one, ptxas of NVRTC 13.0 for sm_90a emitted
                // copies addressed [R + UR0] with their descriptor in UR1, which faulted as
                // illegal instructions on an H200.)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                             :: "r"(to), "l"(valid[u] ? from : k_base),
                                "r"(valid[u] ? 16 : 0) : "memory");
            }
        }
    };
    auto commit = [] { asm volatile("cp.async.commit_group;" ::: "memory"); };
#pragma unroll
    for (int b = 0; b < S - 1; ++b) {
        if (b < kBlocks) copy_block(b, b, t.keys);
        commit();
    }
#pragma unroll
    for (int c8 = 0; c8 < kPer / 8; ++c8) {
        *reinterpret_cast<uint4*>(q_s + ((q_hr >> 3) * kCores + q_d0 / 8 + c8) * 64 +
                                  (q_hr & 7) * 8) =
            make_uint4(q_words[4 * c8], q_words[4 * c8 + 1], q_words[4 * c8 + 2],
                       q_words[4 * c8 + 3]);
    }
    // (The loop's first barrier, after its proxy fence, publishes q_s to the products.)

    // Descriptors (leading byte offset along K, stride along M or N): Q K-major in core
    // matrices (128 bytes apart along d, kCores x 128 along rows); P N-major in core matrices
    // (R / 4 x 128 along keys, 128 along its 2 R columns). Each block's K (K-major) and V
    // (M-major) take theirs in the loop: 128-byte swizzle, 1024 bytes between 8-key groups,
    // V's 64-d column blocks 8192 apart.
    const u64 q_desc = wg_descriptor(q_s, 128, kCores * 128);
    const u64 p_desc = wg_descriptor(p_s, R / 4 * 128, 128);
    int stage = 0;  // the ring stage of the block being consumed
#pragma unroll 1
    for (;;) {  // the span's chunks that a row sees, t's first
        const int chunk = t.chunk, k0 = t.k0, keys = t.keys;
        // The next chunk, where this CTA runs one and a row sees it (then this one is whole).
        ChunkTile next = t;
        next.chunk = chunk + 1;
        next.k0 = k0 + kChunk;
        next.keys = min(kChunk, len - next.k0);
        const bool has_next = kSpans && next.chunk < last && next.k0 < len &&
                              !chunk_unseen(next.k0, next.keys, first_pos, last_pos, left);
        if (has_next) chunk_pages(c, next);
        float o[D / 64][R];
#pragma unroll
        for (int mt = 0; mt < D / 64; ++mt) {
#pragma unroll
            for (int i = 0; i < R; ++i) o[mt][i] = 0.0f;
        }
        float m_run[kRows], l[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            m_run[r] = minus_infinity();
            l[r] = 0.0f;
        }

#pragma unroll 1
        for (int b = 0; b < kBlocks; ++b) {
            const int kb = b * kWgKeys;
            if (kb >= keys) break;  // every thread alike: the rest of the chunk is past its keys
            asm volatile("cp.async.wait_group %0;" :: "n"(S - 2) : "memory");
            wg_publish();
            __syncthreads();  // block b landed for every thread; block b - 1's products are done
            // This turn copies block b + S - 1: this chunk's, else the next chunk's. Its first
            // (nb == kBlocks) waits for the next chunk's row offsets, written below over this
            // chunk's (whose last reader was the turn before, behind the barrier above).
            const int nb = b + S - 1, copy_stage = stage == 0 ? S - 1 : stage - 1;
            if (nb < kBlocks) {
                copy_block(nb, copy_stage, keys);
                commit();
            } else if (!has_next) {
                commit();
            } else if (nb > kBlocks) {
                copy_block(nb - kBlocks, copy_stage, next.keys);
                commit();
            }
            unsigned char* k_stage = ring + stage * 2 * kBlockBytes;
            const u64 k_desc = wg_descriptor(k_stage, 16, 1024) | kSwizzle128;
            const u64 v_desc = wg_descriptor(k_stage + kBlockBytes, 8192, 1024) | kSwizzle128;

            float sc[R / 2];
#pragma unroll
            for (int i = 0; i < R / 2; ++i) sc[i] = 0.0f;
            wg_fence();
#pragma unroll
            for (int k = 0; k < D / 16; ++k) {  // 16 d a step: 32 bytes of a row; Q's 256
                Wg<T>::template mma<R, 0>(sc, k_desc + ((k >> 2) * 8192 + (k & 3) * 32 >> 4),
                                          q_desc + 16 * k, k);
            }
            wg_commit();
            wg_wait_all();
#pragma unroll
            for (int i = 0; i < R / 2; ++i) wg_hold(sc[i]);

            // Register i: key kb + 16 warp + quad + 8 ((i / 2) % 2), row (i / 4, i % 2) of pos.
            float mx[kRows];
#pragma unroll
            for (int r = 0; r < kRows; ++r) mx[r] = minus_infinity();
#pragma unroll
            for (int i = 0; i < R / 2; ++i) {
                const int r = 2 * (i >> 2) + (i & 1);
                const int j = kb + 16 * warp + quad + 8 * ((i >> 1) & 1), key_pos = k0 + j;
                const int p = pos[r];
                const bool seen = j < keys && key_pos <= p && (left < 0 || key_pos >= p - left);
                sc[i] = seen ? sc[i] * scale2 : minus_infinity();
                mx[r] = fmaxf(mx[r], sc[i]);
            }
            float* block_m = red_m + (b & 1) * kWarps * R;
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 4));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 8));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 16));
                if (quad == 0) block_m[warp * R + row_of(r)] = mx[r];
            }
            if (has_next && nb == kBlocks) chunk_rows<D>(c, next, row_off);
            __syncthreads();  // block_m (and the next chunk's row offsets)
            if (has_next && nb == kBlocks) {
                copy_block(0, copy_stage, next.keys);
                commit();
            }
            float base[kRows], alpha[kRows];
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                float m_new = m_run[r];
                for (int w = 0; w < kWarps; ++w) m_new = fmaxf(m_new, block_m[w * R + row_of(r)]);
                const bool none = m_new == minus_infinity();
                base[r] = none ? 0.0f : m_new;
                alpha[r] = none ? 1.0f : wg_exp2(m_run[r] - m_new);
                m_run[r] = m_new;
            }
            // Weights, this thread's sums of them, and P's words: key k = 16 warp + quad + 8 h
            // holds rows (2 pair, 2 pair + 1) of row group rg as one word of T, hi at column group
            // rg and lo at R / 8 + rg of P's R / 4: word ((k / 8) x R / 4 + group) x 32 +
            // (k % 8) x 4 + pair.
#pragma unroll
            for (int r = 0; r < kRows; ++r) l[r] *= alpha[r];
#pragma unroll
            for (int rg = 0; rg < R / 8; ++rg) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int i = 4 * rg + 2 * h;
                    const float x0 = wg_exp2(sc[i] - base[2 * rg]);
                    const float x1 = wg_exp2(sc[i + 1] - base[2 * rg + 1]);
                    l[2 * rg] += x0;
                    l[2 * rg + 1] += x1;
                    const unsigned hi = Mma<T>::pack(x0, x1);
                    const unsigned lo = Mma<T>::pack(x0 - Mma<T>::low(hi), x1 - Mma<T>::high(hi));
                    const int kg = 2 * warp + h;
                    p_s[(kg * (R / 4) + rg) * 32 + quad * 4 + pair] = hi;
                    p_s[(kg * (R / 4) + R / 8 + rg) * 32 + quad * 4 + pair] = lo;
                }
            }
            // Accumulator i of o[mt]: column 8 (i / 4) + 2 pair + i % 2, the row (column % R).
#pragma unroll
            for (int mt = 0; mt < D / 64; ++mt) {
#pragma unroll
                for (int i = 0; i < R; ++i) o[mt][i] *= alpha[2 * ((i >> 2) % (R / 8)) + (i & 1)];
            }
            wg_publish();  // without it the products read stale weights (NaN on an H200)
            __syncthreads();  // p_s
#pragma unroll
            for (int mt = 0; mt < D / 64; ++mt) {
#pragma unroll
                for (int i = 0; i < R; ++i) wg_hold(o[mt][i]);
            }
            wg_fence();
#pragma unroll
            for (int mt = 0; mt < D / 64; ++mt) {
#pragma unroll
                for (int k = 0; k < kWgKeys / 16; ++k) {
                    // A: keys 16 k.. (two 1024-byte groups of 8 rows), d 64 mt.. (column block mt);
                    // B: the same keys (key groups 2 k, 2 k + 1), all of P's 2 R columns.
                    Wg<T>::template mma<2 * R, 1>(o[mt], v_desc + (mt * 8192 + k * 2048 >> 4),
                                                  p_desc + (2 * k * (R / 4) * 128 >> 4), 1);
                }
            }
            wg_commit();
            wg_wait_all();
#pragma unroll
            for (int mt = 0; mt < D / 64; ++mt) {
#pragma unroll
                for (int i = 0; i < R; ++i) wg_hold(o[mt][i]);
            }
            stage = stage == S - 1 ? 0 : stage + 1;
        }
        if (!has_next) asm volatile("cp.async.wait_group 0;" ::: "memory");

        // Each row's sum: over the quads (fixed xor order), then the warps in order.
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 4);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 8);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 16);
            if (quad == 0) red_l[warp * R + row_of(r)] = l[r];
            // The max in base e, as every tile's partial holds it for the merge.
            if (quad == 0 && warp == 0) red_m[row_of(r)] = m_run[r] * (1.0f / kLog2e);
        }
        // The accumulators: d 64 mt + 16 warp + quad + 8 h, row r's register 4 (r / 2) + 2 h +
        // r % 2 (hi; R / 2 further: the same row's lo). Each row's address once (computed at each
        // store, the 32-row tile spent more instructions here than in a block of keys).
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            if (row_of(r) < nr) {
                const i64 row = partial_index(s, g, chunk, r0 + row_of(r), c.heads_kv, chunks,
                                              rows);
                float* at = ws_acc + row * D + 16 * warp + quad;
#pragma unroll
                for (int mt = 0; mt < D / 64; ++mt) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int i = 4 * (r >> 1) + 2 * h + (r & 1);
                        store_partial(at + 64 * mt + 8 * h, o[mt][i] + o[mt][i + R / 2]);
                    }
                }
            }
        }
        __syncthreads();  // red_l, red_m
        if (tid < nr) {
            float row_l = 0.0f;
            for (int w = 0; w < kWarps; ++w) row_l += red_l[w * R + tid];
            const i64 at = partial_index(s, g, chunk, r0 + tid, c.heads_kv, chunks, rows);
            store_partial(ws_ml + 2 * at, red_m[tid]);
            store_partial(ws_ml + 2 * at + 1, row_l);
        }
        if (!has_next) break;
        t = next;
    }  // the span's chunks
    // The span's chunks after those a row sees, up to the length: none is seen (each row's
    // window only moves later with the chunk, its last position not at all).
    if constexpr (kSpans) {
        for (int chunk = t.chunk + 1; chunk < last && chunk * kChunk < len; ++chunk) {
            write_unseen<D>(c, s, g, chunk, r0, nr, q_len, group, chunks, ws_acc, ws_ml);
        }
    }
}

#else
template <typename T, int D, int R, bool kSpans>
__device__ void partial_wg(const T*, i64, i64, i64, const Cache&, const int*, float*, float*,
                           int, int, int, int, float, int, int) {
    __trap();
}
#endif

}  // namespace

#define OPFACADE_PARTIAL_WG(SUFFIX, T, R)                                                        \
    extern "C" __global__ void __launch_bounds__(kThreads, 2)                                    \
        decode_partial_##SUFFIX##_128_##R##wg(OPFACADE_PARTIAL_PARAMS(T)) {                      \
        follow_previous_grid();  /* a programmatic dependent */                                  \
        partial_wg<T, kWgDim, R, false>(q, q_sb, q_st, q_sh, OPFACADE_CACHE_ARGS, seq_lens,      \
                                        ws_acc, ws_ml, q_len, group, tiles, chunks, scale, left, \
                                        1);                                                      \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(kThreads, 2)                                    \
        decode_partial_##SUFFIX##_128_##R##wg_spans(OPFACADE_PARTIAL_PARAMS(T), int span) {      \
        follow_previous_grid();  /* a programmatic dependent */                                  \
        partial_wg<T, kWgDim, R, true>(q, q_sb, q_st, q_sh, OPFACADE_CACHE_ARGS, seq_lens,       \
                                       ws_acc, ws_ml, q_len, group, tiles, chunks, scale, left,  \
                                       span);                                                    \
    }

OPFACADE_PARTIAL_WG(f16, f16_t, 16)
OPFACADE_PARTIAL_WG(bf16, bf16_t, 16)
OPFACADE_PARTIAL_WG(f16, f16_t, 32)
OPFACADE_PARTIAL_WG(bf16, bf16_t, 32)
