// The true-f32 forward on CUDA cores (flash_f32_fwd_* and flash_f32_fwd_wide_*: f32 FMA
// products and an online softmax), which GPUs other than sm_90 run; instantiated by
// flash_f32.cu, whose header states what every kernel computes.
#pragma once
#include "flash_f32_products.cuh"

namespace {

// The forward's query rows and keys a block, threads and CTAs an SM. A thread's score tile is
// (ROWS / (THREADS / 16)) x (KEYS / 16). A 16-byte shared load costs 2 wavefronts when a
// half-warp reads one address (a score tile's row side) and 4 when it reads 16 (its key side;
// scripts/lds_wavefront_probe.py), so an R x C tile needs 2R + 4C wavefronts per 4RC FMAs: 8 x 4
// needs one per 4 FMAs, the very rate an SM issues them at, and 8 x 8 one per 5.3. D = Dv = 128
// also has a WIDE kernel with the 8 x 8 tiles: blocks of 128 x 128 and 256 threads, one CTA an
// SM in 198 KiB, which sm_90 and sm_100 give a block (sm_80, sm_86, sm_89 and sm_120 do not,
// and run the other). On an H100 it ran 7% faster (3.648 -> 3.392 ms at B4 H16 S2048; causal the
// same); at d 64 the non-causal forward gained 2% and the causal lost 1.5%, so no other head
// dims have one.
template <int D, int DV, bool WIDE>
struct ForwardShape {
    static constexpr int ROWS = WIDE ? 128 : 64, KEYS = WIDE ? 128 : 64;
    static constexpr int THREADS = WIDE ? 256 : 128, CTAS = WIDE ? 1 : ctas_per_sm(D, DV);
};

template <int D, int DV, bool WIDE>
struct ForwardTiles {
    typedef ForwardShape<D, DV, WIDE> S;
    // Each thread: R query rows (S::THREADS / 16 threads down the block) by C keys.
    static constexpr int R = S::ROWS / (S::THREADS / 16), C = S::KEYS / 16;
    static constexpr int Q = S::ROWS * (D + kPad);
    // K's tile, then P's once the scores are taken.
    static constexpr int KP = S::KEYS * (D + kPad) > S::ROWS * (S::KEYS + kPad)
                                  ? S::KEYS * (D + kPad)
                                  : S::ROWS * (S::KEYS + kPad);
    static constexpr int V = S::KEYS * (DV + kPad);
    static constexpr int FLOATS = Q + KP + V;
};

// Folds one key block's scores of a row into its running max m, this thread's share l of the
// sum and acc = sum p v; s becomes p = exp(s - m). Under MASKED, keys outside the row's mask
// score -inf and become 0, and a row without keys so far keeps m = -inf and l = 0. A block the
// mask leaves whole for every row goes without (the kept scores' bits are the same either way).
template <bool MASKED, int C, int NV>
__device__ __forceinline__ void softmax_step(float (&s)[C], float& m, float& l, float (&acc)[NV],
                                             const Mask& mask, int i, int j0, int tx,
                                             float scale) {
    const int lo = MASKED ? mask.lo(i) : 0, hi = MASKED ? mask.hi(i) : 0;
    float block_max = minus_infinity();
    scale *= kLog2e;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        s[c] *= scale;
        if (MASKED) {
            const int j = j0 + tx + 16 * c;
            s[c] = j >= lo && j <= hi ? s[c] : minus_infinity();
        }
        block_max = fmaxf(block_max, s[c]);
    }
    const float alpha = fold_block<float>(s, m, l, fmaxf(m, half_warp_max(block_max)));
#pragma unroll
    for (int n = 0; n < NV; ++n) acc[n] *= alpha;
}

// out = acc / l and lse = m + log(l) for the thread's rows below the sequence's length; rows
// without keys (l = 0) get 0 and -inf.
template <int R, int DV>
__device__ __forceinline__ void forward_write(const float (&m)[R], const float (&l)[R],
                                              float (&acc)[R][DV / 16], const Rows<float>& out,
                                              const Rows<float>& lse, int b, int h,
                                              const Span& sq, int first, int tx, bool vec) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float sum = half_warp_sum(l[r]);
        const int i = first + r;
        if (i >= sq.len) continue;
        const i64 t = sq.row0 + i;
#pragma unroll
        for (int n = 0; n < DV / 16; ++n) acc[r][n] = sum > 0.0f ? acc[r][n] / sum : 0.0f;
        store_cols<DV>(out.at(b, h, t), acc[r], tx, vec);
        // lse in natural log: m counts in base 2.
        if (tx == 0) {
            *lse.at(b, h, t) = row_lse(m[r], sum);
        }
    }
}

template <int D, int DV, bool WIDE>
__device__ __forceinline__ void forward(const Rows<const float>& q, const Rows<const float>& k,
                                        const Rows<const float>& v, const Rows<float>& out,
                                        const Rows<float>& lse, const Problem& p) {
    typedef ForwardTiles<D, DV, WIDE> T;
    constexpr int R = T::R, C = T::C, NV = DV / 16, BC = T::S::KEYS;
    constexpr int ROWS = T::S::ROWS, THREADS = T::S::THREADS;
    const auto [b, h, hk, i0, sq] = query_block(ROWS, p);
    if (i0 >= sq.len) return;
    const Span skv = sequence(p.cu_kv, b, p.max_kv, p.total_kv);
    const Mask mask = make_mask(p, sq.len, skv.len);
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4, first = i0 + ty * R;
    float* q_tile = shared_tiles<T::FLOATS>();
    float* kp_tile = q_tile + T::Q;
    float* v_tile = kp_tile + T::KP;

    float m[R], l[R], acc[R][NV] = {};
#pragma unroll
    for (int r = 0; r < R; ++r) m[r] = minus_infinity(), l[r] = 0.0f;
    const int i_last = min(i0 + ROWS, sq.len) - 1;
    const int2 blocks = key_blocks(mask, i0, i_last, BC);
    if (blocks.x <= blocks.y) {
        load_tile<ROWS, D, THREADS>(q_tile, q, b, h, sq, i0, p.vec);
        load_tile<BC, D, THREADS>(kp_tile, k, b, hk, skv, blocks.x * BC, p.vec);
        copy_commit();
        load_tile<BC, DV, THREADS>(v_tile, v, b, hk, skv, blocks.x * BC, p.vec);
        copy_commit();
    }
    for (int kb = blocks.x; kb <= blocks.y; ++kb) {
        copy_wait<1>();  // Q and K have landed; V may still be in flight
        __syncthreads();
        float s[R][C] = {};
        dot_rows<R, C, D>(s, q_tile, kp_tile, ty * R, tx);
        with_mask(whole_block(mask, i0, i_last, kb * BC, BC), [&](auto masked) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                softmax_step<decltype(masked)::value, C, NV>(s[r], m[r], l[r], acc[r], mask,
                                                             first + r, kb * BC, tx, p.scale);
            }
        });
        __syncthreads();  // every thread is done with K: P takes its place
        store_scores<R, C, BC + kPad>(kp_tile, s, ty * R, tx);
        copy_wait<0>();
        __syncthreads();
        mul_rows<R, DV, BC, BC + kPad>(acc, kp_tile, v_tile, ty * R, tx);
        __syncthreads();  // P and V are consumed: the next block's K and V may land
        if (kb < blocks.y) {
            load_tile<BC, D, THREADS>(kp_tile, k, b, hk, skv, (kb + 1) * BC, p.vec);
            copy_commit();
            load_tile<BC, DV, THREADS>(v_tile, v, b, hk, skv, (kb + 1) * BC, p.vec);
            copy_commit();
        }
    }
    forward_write<R, DV>(m, l, acc, out, lse, b, h, sq, first, tx, p.vec);
}

}  // namespace
