// sm_90's true-f32 forward with both products on the FP64 tensor cores
// (flash_f32_fwd_dmma_*, instantiated by flash_f32.cu, whose header states what every kernel
// computes).
#pragma once
#include "flash_f32_products.cuh"

namespace {

// ------------------------------------------------------------- forward, both products on DMMA

// The forward with Q K^T and P V both on sm_90's FP64 tensor cores (flash_f32_fwd_dmma_*): CTA =
// (32 query rows, head, sequence) of 128 threads, two or three CTAs an SM (dmma_ctas). Warp w
// owns rows 16 (w % 2).. and half w / 2 of each 64-key block for the scores and of Dv for P V
// (at Dv = 128 all 32 rows and quarter w of Dv: dmma_pv_quarters), so its f64 output fragment
// is 16 x Dv/2 (or 32 x Dv/4; 64 registers a lane at Dv = 128). The two warps of a
// row group exchange their rows' maxima and sums through shared memory and compute the same
// running max bit for bit. Several CTAs an SM, so that one's softmax can run while another's
// mma does: on an H100 at d128 two ran 3.13 ms against 3.22 for one CTA of 64 rows and 256
// threads (causal 1.61 against 1.70), though each K and V block now serves 32 rows instead of
// 64. P goes through its own tile (f32, every warp reads all 64 keys of its rows), and K and V
// have tiles of their own, so the next K streams in under the softmax and P V, the next V under
// the next scores. Operands are widened from f32 as they are loaded (dmma_16x8x16 says why that
// is exact); P V sums in f64 and the output is divided and rounded once.
//
// Operands load as vectors. An mma sums over its 16 k-indices in an order of its own, so which
// element a lane's fragment slot holds along k is free as long as A and B agree: in Q K^T lane t
// holds d = 4t..4t+3 of each k-step (one float4 a row of Q or K, where the PTX order, t + 4i,
// takes four scalar loads), and in P V keys 2t, 2t+1, 2t+8, 2t+9 (two float2 of P). The output
// columns are permuted the same way: B's column g of 8-column tile n is the warp's column
// dmma_column(n, g), so a lane's V values of four tiles are one float4.
constexpr int kDmmaRows = 32, kDmmaThreads = 128, kDmmaKeys = 64;
// Measured on an H100 (B4 H16 S2048; flash_f32.py's MMA_ARCHES has the times): at D and
// Dv <= 64 the registers allow three CTAs an SM (168, with about 100 bytes of spills at d64,
// and still faster than two), wider pairs fit two. The P V loop runs unrolled 4 (d96 2.58 ms
// against 2.73 with 2); the Q K^T loop 4 at the wide dims (d128 3.06-3.10 against 3.13-3.16)
// and 2 at the small ones, where 4 lost.
constexpr bool dmma_small(int d, int dv) { return d <= 64 && dv <= 64; }
constexpr int dmma_ctas(int d, int dv) { return dmma_small(d, dv) ? 3 : 2; }
constexpr int dmma_qk_unroll(int d, int dv) { return dmma_small(d, dv) ? 2 : 4; }
constexpr int kDmmaPvUnroll = 4;
// At Dv = 128 each warp's P V covers all 32 rows and a quarter of Dv (dmma_pv_quarters): V's
// widenings halve (each V value is widened by one warp instead of two) and P's double, 128 a
// lane and block instead of 160. On an H100 d128 ran 3.068 ms against 3.079 (causal 1.580 against
// 1.595; at S4096 5.97 against 6.04), the same bits. At d64 it spilled more and lost (1.587
// against 1.557), so the smaller Dv keep warps of 16 rows and half of Dv.
constexpr bool dmma_pv_quarters(int dv) { return dv == 128; }
constexpr int kDmmaRowGroups = kDmmaRows / 16;  // the warps of each half
// Row pads, each the one that makes its loads conflict-free: Q and K rows are D + 16 floats (16
// mod 32 banks: rows g and g + 1 of a quarter-warp's float4 loads fill 32 banks), V's Dv + 4
// (lanes t read rows 2t apart, 8 banks), P's 64 + 8 (rows g 8 banks apart, for the float2
// loads and stores).
constexpr int kDmmaQkPad = 16, kVPad = 4, kDmmaPPad = 8;

// Tile n's B column c (c = g) or output column c (c = 2t + e) is this column of the warp's part
// of Dv (a half, or a quarter at Dv = 128): tiles go in chunks of 4 (2 where fewer are left),
// and lane g holds chunk columns w g .. w g + w - 1, one vector.
template <int NT>
__device__ __forceinline__ constexpr int dmma_column(int n, int c) {
    return 32 * (n / 4) + (NT - n / 4 * 4 >= 4 ? 4 : NT - n / 4 * 4) * c + n % 4;
}

template <int D, int DV>
struct DmmaTiles {
    static constexpr int Q = kDmmaRows * (D + kDmmaQkPad), K = kDmmaKeys * (D + kDmmaQkPad);
    static constexpr int V = kDmmaKeys * (DV + kVPad), P = kDmmaRows * (kDmmaKeys + kDmmaPPad);
    // Each half's row maxima (at the end its row sums), then with quarters each row's rescale.
    static constexpr int STATS = (dmma_pv_quarters(DV) ? 3 : 2) * kDmmaRows;
    static constexpr int FLOATS = Q + K + V + P + STATS;
};

template <int D, int DV>
__device__ __forceinline__ void forward_dmma(const Rows<const float>& q,
                                             const Rows<const float>& k,
                                             const Rows<const float>& v, const Rows<float>& out,
                                             const Rows<float>& lse, const Problem& p) {
    static_assert(D % 16 == 0 && DV % 32 == 0, "k-steps of 16, output tiles in pairs");
    typedef DmmaTiles<D, DV> T;
    constexpr int NT = DV / 16;  // a warp's 8-column output tiles: half of Dv
    constexpr int LQ = D + kDmmaQkPad, LV = DV + kVPad, LP = kDmmaKeys + kDmmaPPad;
    const auto [b, h, hk, i0, sq] = query_block(kDmmaRows, p);
    if (i0 >= sq.len) return;
    const Span skv = sequence(p.cu_kv, b, p.max_kv, p.total_kv);
    const Mask mask = make_mask(p, sq.len, skv.len);
    float* q_tile = shared_tiles<T::FLOATS>();
    float* k_tile = q_tile + T::Q;
    float* v_tile = k_tile + T::K;
    float* p_tile = v_tile + T::V;
    float* stats = p_tile + T::P;  // [2][rows]: each half's row maxima, at the end its row sums
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, w = threadIdx.x >> 5;
    const int half = w / kDmmaRowGroups, row0 = (w % kDmmaRowGroups) * 16;  // rows row0 + g, + 8
    const int i_a = i0 + row0 + g, i_b = i_a + 8;
    const float scale = p.scale * kLog2e;
    constexpr bool QUARTERS = dmma_pv_quarters(DV);
    constexpr int MT = QUARTERS ? 2 : 1;         // 16-row tiles of a warp's P V
    constexpr int NO = QUARTERS ? DV / 32 : NT;  // its 8-column output tiles
    float* alphas = stats + 2 * kDmmaRows;  // QUARTERS: each row's rescale for this block
    // The first row and column of this warp's P V. Evaluated where used: held in registers from
    // here, they changed d64's SASS (spills there), and d64 measured 2-3% slower.
    const auto pv_row0 = [&] { return QUARTERS ? 0 : row0; };
    const auto pv_col0 = [&] { return QUARTERS ? w * (DV / 4) : half * (DV / 2); };

    double o[MT][NO][4] = {};
    float m[2] = {minus_infinity(), minus_infinity()}, l[2] = {0.0f, 0.0f};
    const int i_last = min(i0 + kDmmaRows, sq.len) - 1;
    const int2 blocks = key_blocks(mask, i0, i_last, kDmmaKeys);
    if (blocks.x <= blocks.y) {
        load_tile<kDmmaRows, D, kDmmaThreads, kDmmaQkPad>(q_tile, q, b, h, sq, i0, p.vec);
        load_tile<kDmmaKeys, D, kDmmaThreads, kDmmaQkPad>(k_tile, k, b, hk, skv,
                                                          blocks.x * kDmmaKeys, p.vec);
        copy_commit();
        load_tile<kDmmaKeys, DV, kDmmaThreads, kVPad>(v_tile, v, b, hk, skv,
                                                       blocks.x * kDmmaKeys, p.vec);
        copy_commit();
    }
    for (int kb = blocks.x; kb <= blocks.y; ++kb) {
        const int j0 = kb * kDmmaKeys;
        copy_wait<1>();  // Q and this K have landed; V may still be in flight
        __syncthreads();
        // Scores of rows i_a, i_b against keys j0 + 32 half + 8n + 2t (+1).
        double acc[4][4] = {};
        {
            const float* qa = q_tile + (row0 + g) * LQ + 4 * t;
            const float* kb_ = k_tile + (half * 32 + g) * LQ + 4 * t;
#pragma unroll(dmma_qk_unroll(D, DV))
            for (int kk = 0; kk < D; kk += 16) {
                const float4 x = *reinterpret_cast<const float4*>(qa + kk);
                const float4 y = *reinterpret_cast<const float4*>(qa + 8 * LQ + kk);
                const double a[8] = {x.x, y.x, x.y, y.y, x.z, y.z, x.w, y.w};
#pragma unroll
                for (int n = 0; n < 4; ++n) {
                    const float4 z = *reinterpret_cast<const float4*>(kb_ + n * 8 * LQ + kk);
                    const double bf[4] = {z.x, z.y, z.z, z.w};
                    dmma_16x8x16(acc[n], a, bf);
                }
            }
        }
        float s[2][8];  // [row a or b][n * 2 + e]
        const bool whole = whole_block(mask, i0, i_last, j0, kDmmaKeys);
        const int lo_a = mask.lo(i_a), hi_a = mask.hi(i_a);
        const int lo_b = mask.lo(i_b), hi_b = mask.hi(i_b);
        float block_max[2] = {minus_infinity(), minus_infinity()};
#pragma unroll
        for (int n = 0; n < 4; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = j0 + half * 32 + 8 * n + 2 * t + e;
                float sa = (float)acc[n][e] * scale, sb = (float)acc[n][2 + e] * scale;
                if (!whole) {
                    sa = j >= lo_a && j <= hi_a ? sa : minus_infinity();
                    sb = j >= lo_b && j <= hi_b ? sb : minus_infinity();
                }
                s[0][2 * n + e] = sa, s[1][2 * n + e] = sb;
                block_max[0] = fmaxf(block_max[0], sa), block_max[1] = fmaxf(block_max[1], sb);
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {  // over the row's 4 lanes, in a fixed butterfly
            block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 1));
            block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 2));
        }
        if (t == 0) {
            stats[half * kDmmaRows + row0 + g] = block_max[0];
            stats[half * kDmmaRows + row0 + g + 8] = block_max[1];
        }
        __syncthreads();  // both halves' maxima are in, and every warp is done with this K
        if (kb < blocks.y) {
            load_tile<kDmmaKeys, D, kDmmaThreads, kDmmaQkPad>(k_tile, k, b, hk, skv,
                                                              j0 + kDmmaKeys, p.vec);
            copy_commit();
        }
        double alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + g + 8 * r;
            const float m_new = fmaxf(m[r], fmaxf(stats[row], stats[kDmmaRows + row]));
            alpha[r] = fold_block<double>(s[r], m[r], l[r], m_new);
        }
        if constexpr (QUARTERS) {
            if (half == 0 && t == 0) {
                alphas[row0 + g] = (float)alpha[0];
                alphas[row0 + g + 8] = (float)alpha[1];
            }
        } else {
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                o[0][n][0] *= alpha[0], o[0][n][1] *= alpha[0];
                o[0][n][2] *= alpha[1], o[0][n][3] *= alpha[1];
            }
        }
#pragma unroll
        for (int n = 0; n < 4; ++n) {
            const int col = half * 32 + 8 * n + 2 * t;
            *reinterpret_cast<float2*>(p_tile + (row0 + g) * LP + col) =
                make_float2(s[0][2 * n], s[0][2 * n + 1]);
            *reinterpret_cast<float2*>(p_tile + (row0 + g + 8) * LP + col) =
                make_float2(s[1][2 * n], s[1][2 * n + 1]);
        }
        if (kb < blocks.y) {
            copy_wait<1>();  // this V has landed; the next K may still be in flight
        } else {
            copy_wait<0>();  // no next K: this V is the newest group
        }
        __syncthreads();  // P is whole
        {
            // Slot t + 4i of a k-step holds key 2t + (i & 1) + 8 (i >> 1).
            const float* vb = v_tile + 2 * t * LV + pv_col0();
            if constexpr (QUARTERS) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    const double al = alphas[16 * mt + g], bl = alphas[16 * mt + g + 8];
#pragma unroll
                    for (int n = 0; n < NO; ++n) {
                        o[mt][n][0] *= al, o[mt][n][1] *= al, o[mt][n][2] *= bl, o[mt][n][3] *= bl;
                    }
                }
            }
#pragma unroll(kDmmaPvUnroll)
            for (int kk = 0; kk < kDmmaKeys; kk += 16) {
                double a[MT][8];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    const float* pa = p_tile + (pv_row0() + 16 * mt + g) * LP + 2 * t;
                    const float2 x0 = *reinterpret_cast<const float2*>(pa + kk);
                    const float2 x1 = *reinterpret_cast<const float2*>(pa + kk + 8);
                    const float2 y0 = *reinterpret_cast<const float2*>(pa + 8 * LP + kk);
                    const float2 y1 = *reinterpret_cast<const float2*>(pa + 8 * LP + kk + 8);
                    a[mt][0] = x0.x, a[mt][1] = y0.x, a[mt][2] = x0.y, a[mt][3] = y0.y;
                    a[mt][4] = x1.x, a[mt][5] = y1.x, a[mt][6] = x1.y, a[mt][7] = y1.y;
                }
                float bv[4][NO];  // [slot i][tile n]: V[key of slot i][dmma_column(n, g)]
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float* row = vb + (kk + (i & 1) + 8 * (i >> 1)) * LV;
#pragma unroll
                    for (int n = 0; n < NO; n += 4) {
                        if (NO - n >= 4) {
                            const float4 z =
                                *reinterpret_cast<const float4*>(row + dmma_column<NO>(n, g));
                            bv[i][n] = z.x, bv[i][n + 1] = z.y, bv[i][n + 2] = z.z;
                            bv[i][n + 3] = z.w;
                        } else {
                            const float2 z =
                                *reinterpret_cast<const float2*>(row + dmma_column<NO>(n, g));
                            bv[i][n] = z.x, bv[i][n + 1] = z.y;
                        }
                    }
                }
#pragma unroll
                for (int n = 0; n < NO; ++n) {
                    const double bf[4] = {bv[0][n], bv[1][n], bv[2][n], bv[3][n]};
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) dmma_16x8x16(o[mt][n], a[mt], bf);
                }
            }
        }
        __syncthreads();  // P and V are consumed: the next V may land
        if (kb < blocks.y) {
            load_tile<kDmmaKeys, DV, kDmmaThreads, kVPad>(v_tile, v, b, hk, skv, j0 + kDmmaKeys,
                                                           p.vec);
            copy_commit();
        }
    }
    // Row sums: this lane's share over the row's 4 lanes, then the two halves in order.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    __syncthreads();  // every warp is past its last read of the maxima
    if (t == 0) {
        stats[half * kDmmaRows + row0 + g] = l[0];
        stats[half * kDmmaRows + row0 + g + 8] = l[1];
    }
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = pv_row0() + 16 * mt + g + 8 * r, i = i0 + row;
            if (i >= sq.len) continue;
            const float sum = stats[row] + stats[kDmmaRows + row];
            const i64 tok = sq.row0 + i;
            float* out_row = out.at(b, h, tok) + pv_col0();
#pragma unroll
            for (int n = 0; n < NO; ++n) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    out_row[dmma_column<NO>(n, 2 * t + e)] =
                        sum > 0.0f ? (float)(o[mt][n][2 * r + e] / sum) : 0.0f;
                }
            }
            // lse in natural log: m counts in base 2. Without quarters these are the warp's rows.
            // (One lse loop for both forms, after this one, changed d64's SASS the same way.)
            if (!QUARTERS && half == 0 && t == 0) {
                *lse.at(b, h, tok) = row_lse(m[r], sum);
            }
        }
    }
    if constexpr (QUARTERS) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + g + 8 * r, i = i0 + row;
            if (i < sq.len && half == 0 && t == 0) {
                *lse.at(b, h, sq.row0 + i) = row_lse(m[r], stats[row] + stats[kDmmaRows + row]);
            }
        }
    }
}

}  // namespace
