// The decode partial over a tile of up to 8 query rows on tensor cores, with K and V as mma's A
// operand and Q and P as its B operand: S^T = K Q^T, then O^T = V^T P^T (docs/DECODE.md, "The
// kq tile"; scripts/decode_kq_tile_model.py models its fragments lane by lane). Every product
// row is a key (scores) or a head dimension (output), so none is padding, and a lane's 16-byte
// loads are its fragments as they arrive. Counted from the design, under 0.5 thread
// instructions a byte, where ncu measured 5.5 for the CUDA-core 4-row tile on an H200, whose
// SMs could not issue them fast enough to keep up with its memory. f16 and bf16 at D 128 (the
// output's d mapping below is written for D 128).
// The CTA's prologue is written out, as in the other tiles: shared helpers for it and the
// pipelines measured 2-3 points of a copy slower on the 16-row tile (decode_mma.cuh). K's and
// V's pipelines share one lambda (pipeline) whose kernels' SASS is that of the two loops
// written out, instruction for instruction (nvdisasm).
//
// Kv heads of up to 4 rows (R 4: GQA 4 at one new token, the common case) load K in whole
// 128-byte lines: docs/DECODE.md, "The kq tile's K in whole lines". The scores' m16n8k16 takes
// 16 keys a warp and 4 lanes a key row, so a 16-byte load a lane reads 8 keys x 64 bytes an
// instruction, two L2 requests of half a line each for every line of K (V's loads read 4
// keys x 128 bytes). At R 4 B's columns 4-7 are free: the lanes of column n >= 4 hold query
// row n - 4 again, over other quarters of D. Lane (gid, tig), a = gid / 4, loads quarters a
// and 2 + a of its keys (vectors 4 (2 p + a) + tig), so the 8 lanes of gid and gid ^ 4 read
// one key's line together, and its product rows meet the query row in column 4 a + row: every
// product is one key's dot with one row over two quarters, and each score is the sum of two
// (quarters 0 and 2, then 1 and 3), taken across lanes by shuffles into the R 8 layout.
#pragma once
#include "decode_mma.cuh"

namespace {

// The reduce of a paired (R 4) tile's two halves of a score block (the C fragment of keys
// 8 block + gid % 4 + 4 h over quarters 0 and 2 in lanes gid < 4, columns 0-3, over quarters 1
// and 3 in lanes gid >= 4, columns 4-7): into lane (gid, tig) the scores of key 8 block + gid
// for rows 2 tig and 2 tig + 1 (tig < 2; the others hold padding rows), quarters 0 and 2 first.
// Lane (b, t), b < 4, t < 2 adds its own c0, c1 and those of lane (4 + b, t + 2) (lane ^ 18),
// and the same for c2, c3 (key 4 + b), which lane (4 + b, t) takes from it (lane ^ 16).
__device__ __forceinline__ void pair_scores(const float (&c)[4], bool upper, float* score) {
    float sum[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) sum[e] = c[e] + __shfl_xor_sync(0xffffffffu, c[e], 18);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const float high = __shfl_xor_sync(0xffffffffu, sum[2 + e], 16);
        score[e] = upper ? high : sum[e];
    }
}

// R: the tile's query rows, 8 (B's columns) or 4 (K in whole lines, above). kAhead: groups of
// 16 keys a warp has loaded or in flight as it consumes one; 2 in the builds for 3 and 4 CTAs
// an SM, 4 in the one-wave build (_d4), below.
template <typename T, int D, int R, int kAhead>
__device__ void partial_kq(const T* __restrict__ q, i64 q_sb, i64 q_st, i64 q_sh, const Cache& c,
                           const int* __restrict__ seq_lens, float* __restrict__ ws_acc,
                           float* __restrict__ ws_ml, int q_len, int group, int tiles, int chunks,
                           float scale, int left) {
    constexpr int kP = D / 32;              // vectors of a key row a lane loads for the scores
    // R 4: K in whole lines (above): a lane's Q words and K vectors cover half of D.
    constexpr bool kPaired = R <= 4;
    constexpr int kQ = kPaired ? kP / 2 : kP;  // Q's vectors a lane holds
    constexpr int kGroups = kWarpKeys / 16;  // a warp's groups of 16 keys
    constexpr int kMTiles = D / 16;          // the output's m-tiles of 16 d
    static_assert(D == 128, "the kq tile's d mapping is written for D 128");
    extern __shared__ float shared[];
    ChunkTile t;
    if (!chunk_tile<D, R>(c, seq_lens, q_len, group, tiles, chunks, left, ws_acc, ws_ml, t)) return;
    const int g = t.g, chunk = t.chunk, s = t.s, rows = t.rows, r0 = t.r0, nr = t.nr;
    const int len = t.len, k0 = t.k0, keys = t.keys;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int gid = lane >> 2, tig = lane & 3;
    const int warp_key0 = warp * kWarpKeys;

    // Shared: row offsets [kChunk] i64, row maxima and sums [kWarps][R], the warps'
    // accumulators [kWarps][R][D]. (At R 4, lanes with tig >= 2 hold padding rows 4-7.)
    i64* row_off = reinterpret_cast<i64*>(shared);
    float* warp_m = shared + 2 * kChunk;
    float* warp_l = warp_m + kWarps * R;
    float* sums = warp_l + kWarps * R;

    // Q's B words: query row gid's vectors 4 p + tig (zeros past the tile's rows), unscaled; at
    // R 4 row gid % 4's vectors 4 (2 p + a) + tig.
    // Each is one 16-byte load where q's rows are 16-byte aligned (the same for the whole grid),
    // else two elements a word: the same words. On an H200 the vectors read 0-1 point of a copy
    // better on most rows (scripts/decode_variants.py --kq-q, record
    // catalog/probes/decode_kq_q_H200.json); Q's element loads were a fifth of the tile's loads.
    const int upper = gid >> 2;  // a, at R 4: this lane's quarters of D are a and 2 + a
    auto q_vector = [&](int p) { return kPaired ? 4 * (2 * p + upper) + tig : 4 * p + tig; };
    unsigned qw[kQ][4];
    {
        const int b_row = kPaired ? gid & 3 : gid;  // the tile row of this lane's B column
        const int row = r0 + b_row;
        const T* q_row = q + s * q_sb + (row / group) * q_st + (g * group + row % group) * q_sh;
#ifdef OPFACADE_KQ_Q_BY_ELEMENT  // the element loads only, for the variants script
        const bool vectors = false;
#else
        const bool vectors =
            ((reinterpret_cast<unsigned long long>(q) & 15) | ((q_sb | q_st | q_sh) & 7)) == 0;
#endif
        const u16* q_elements = reinterpret_cast<const u16*>(q_row);
#pragma unroll
        for (int p = 0; p < kQ; ++p) {
            if (vectors) {
                const uint4 v = b_row < nr
                                    ? *reinterpret_cast<const uint4*>(q_row + q_vector(p) * 8)
                                    : make_uint4(0, 0, 0, 0);
                qw[p][0] = v.x, qw[p][1] = v.y, qw[p][2] = v.z, qw[p][3] = v.w;
                continue;
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int d = q_vector(p) * 8 + 2 * i;
                qw[p][i] = b_row < nr
                               ? (unsigned)q_elements[d] | ((unsigned)q_elements[d + 1] << 16)
                               : 0u;
            }
        }
    }
    // The positions of this lane's two score columns, rows 2 tig and 2 tig + 1 (-1: past nr).
    int pos[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int rr = 2 * tig + h;
        pos[h] = rr < nr ? OPFACADE_ROW_POSITION(len, q_len, r0 + rr, group) : -1;
    }

    const T *k_base, *v_base;
    sequence_bases(c, s, k_base, v_base);
    chunk_rows<D>(c, t, row_off);
    __syncthreads();  // row_off

    // Scores: group gi's keys warp_key0 + 16 gi + gid (+ 8), vectors 4 p + tig, as raw[h][p];
    // at R 4 keys warp_key0 + 16 gi + 8 block + gid % 4 + 4 h, vectors 4 (2 p + a) + tig, as
    // raw[block][2 h + p]. Zeros past the chunk's keys (never loaded).
    auto load_k = [&](uint4 (&raw)[2][kP], int gi) {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
#pragma unroll
            for (int y = 0; y < kP; ++y) {
                const int h = kPaired ? y / kQ : x, p = kPaired ? y % kQ : y;
                const int j = warp_key0 + 16 * gi +
                              (kPaired ? 8 * x + (gid & 3) + 4 * h : gid + 8 * h);
                raw[x][y] = j < keys ? load16(k_base + row_off[j] + q_vector(p) * 8)
                                     : make_uint4(0, 0, 0, 0);
            }
        }
    };
    // K or V through consume(group's loads, group): the groups load into a and b in turn, one
    // flying while the other is consumed (the first already in a).
    auto pipeline = [&](auto& a, auto& b, auto&& load, auto&& consume) {
#pragma unroll
        for (int gi = 0; gi < kGroups; gi += 2) {
            load(b, gi + 1);
            consume(a, gi);
            if (gi + 2 < kGroups) load(a, gi + 2);
            consume(b, gi + 1);
        }
    };
    // The one-wave build: on a grid of few CTAs an SM (decode.py's KQ_DEEP_GRIDS) each CTA
    // streams its chunk nearly alone, at what its warps' loads in flight allow (256 KiB in
    // about 9 us on an H200, where the device streams 4.3 TB/s: docs/DECODE.md, "Small
    // grids"), and its registers need not leave room for more CTAs. The groups then stream
    // through a ring of kAhead buffers, kAhead - 1 of them in flight while one is consumed: the
    // same loads, consumed in the same order, so the bits are the other builds'.
    auto ring = [&](auto& buffers, auto&& load, auto&& consume) {
#pragma unroll
        for (int gi = 0; gi < kGroups; ++gi) {
            const int ahead = gi + kAhead - 1;
            if (ahead < kGroups) load(buffers[ahead % kAhead], ahead);
            consume(buffers[gi % kAhead], gi);
        }
    };
    float sc[kGroups][4];
    auto score = [&](const uint4 (&raw)[2][kP], int gi) {
        if constexpr (kPaired) {
#pragma unroll
            for (int block = 0; block < 2; ++block) {
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int p = 0; p < kQ; ++p) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {  // k-steps: words 2 h and 2 h + 1
                        const uint4 &row = raw[block][p], &row8 = raw[block][kQ + p];
                        Mma<T>::run(c, word(row, 2 * h), word(row8, 2 * h), word(row, 2 * h + 1),
                                    word(row8, 2 * h + 1), qw[p][2 * h], qw[p][2 * h + 1]);
                    }
                }
                pair_scores(c, upper, &sc[gi][2 * block]);
            }
            return;
        }
        sc[gi][0] = sc[gi][1] = sc[gi][2] = sc[gi][3] = 0.0f;
#pragma unroll
        for (int p = 0; p < kP; ++p) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // k-steps 2 p and 2 p + 1: words 2 h and 2 h + 1
                Mma<T>::run(sc[gi], word(raw[0][p], 2 * h), word(raw[1][p], 2 * h),
                            word(raw[0][p], 2 * h + 1), word(raw[1][p], 2 * h + 1),
                            qw[p][2 * h], qw[p][2 * h + 1]);
            }
        }
    };
    if constexpr (kAhead == 2) {
        uint4 raw_a[2][kP], raw_b[2][kP];
        load_k(raw_a, 0);
        pipeline(raw_a, raw_b, load_k, score);
    } else {
        uint4 raw[kAhead][2][kP];
#pragma unroll
        for (int gi = 0; gi < kAhead - 1; ++gi) load_k(raw[gi], gi);
        ring(raw, load_k, score);
    }

    // V: group gi's keys 2 tig, 2 tig + 1, 2 tig + 8, 2 tig + 9 (of warp_key0 + 16 gi), vectors
    // gid and gid + 8. The first group's loads fly while the softmax runs.
    auto load_v = [&](uint4 (&raw)[4][2], int gi) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int j = warp_key0 + 16 * gi + 2 * tig + (k & 1) + 8 * (k >> 1);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                raw[k][h] = j < keys ? load16(v_base + row_off[j] + (gid + 8 * h) * 8)
                                     : make_uint4(0, 0, 0, 0);
            }
        }
    };
    uint4 v_a[4][2], v_b[4][2];
    uint4 v_ring[kAhead][4][2];  // the one-wave build's (kAhead - 1 groups fly through it)
    if constexpr (kAhead == 2) {
        load_v(v_a, 0);
    } else {
#pragma unroll
        for (int gi = 0; gi < kAhead - 1; ++gi) load_v(v_ring[gi], gi);
    }

    // Scale and mask; each row's max over the warp's keys (the 8 lanes of one tig), then over
    // the warps.
    float m[2] = {minus_infinity(), minus_infinity()};
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int j = warp_key0 + 16 * gi + gid + 8 * (e >> 1), key_pos = k0 + j;
            const int p = pos[e & 1];
            const bool seen = j < keys && key_pos <= p && (left < 0 || key_pos >= p - left);
            sc[gi][e] = seen ? sc[gi][e] * scale : minus_infinity();
            m[e & 1] = fmaxf(m[e & 1], sc[gi][e]);
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) m[h] = fmaxf(m[h], __shfl_xor_sync(0xffffffffu, m[h], o));
        if (gid == 0 && 2 * tig + h < R) warp_m[warp * R + 2 * tig + h] = m[h];
    }
    __syncthreads();  // warp_m
    float base[2], l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (2 * tig + h < R) {
            for (int w = 0; w < kWarps; ++w) m[h] = fmaxf(m[h], warp_m[w * R + 2 * tig + h]);
        }
        base[h] = m[h] == minus_infinity() ? 0.0f : m[h];
    }

    // Weights exp(s - m), this lane's sums, and P^T's B words: the scores' words of keys gid
    // and gid + 8 transposed (movmatrix), as a high and a low half of T.
    unsigned p_hi[kGroups][2], p_lo[kGroups][2];
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            sc[gi][e] = expf(sc[gi][e] - base[e & 1]);
            l[e & 1] += sc[gi][e];
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // keys gid (h 0) and gid + 8 (h 1)
            const float x0 = sc[gi][2 * h], x1 = sc[gi][2 * h + 1];
            const unsigned hi = Mma<T>::pack(x0, x1);
            const unsigned lo = Mma<T>::pack(x0 - Mma<T>::low(hi), x1 - Mma<T>::high(hi));
            p_hi[gi][h] = transposed(hi);
            p_lo[gi][h] = transposed(lo);
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) l[h] += __shfl_xor_sync(0xffffffffu, l[h], o);
        if (gid == 0 && 2 * tig + h < R) warp_l[warp * R + 2 * tig + h] = l[h];
    }

    // O^T = V^T P^T: m-tile mt's rows are d = 8 gid + mt and 64 + 8 gid + mt; its A words pair
    // keys (2 tig, 2 tig + 1) and (2 tig + 8, 2 tig + 9) at one d (a byte permute of two words).
    float acc[kMTiles][4] = {};
    auto accumulate = [&](const uint4 (&raw)[4][2], int gi) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
            const unsigned selector = (mt & 1) ? 0x7632u : 0x5410u;  // high or low halves
            unsigned a[4];
#pragma unroll
            // r: (low d, keys 2 tig, 2 tig + 1), (high d, ...), (low d, 2 tig + 8, ...), (high...)
            for (int r = 0; r < 4; ++r) {
                const int k = 2 * (r >> 1), h = r & 1;
                a[r] = __byte_perm(word(raw[k][h], mt >> 1), word(raw[k + 1][h], mt >> 1),
                                   selector);
            }
            Mma<T>::run(acc[mt], a[0], a[1], a[2], a[3], p_hi[gi][0], p_hi[gi][1]);
            Mma<T>::run(acc[mt], a[0], a[1], a[2], a[3], p_lo[gi][0], p_lo[gi][1]);
        }
    };
    if constexpr (kAhead == 2) {
        pipeline(v_a, v_b, load_v, accumulate);
    } else {
        ring(v_ring, load_v, accumulate);
    }

    // The warps' accumulators [warp][row][d], then their sum in warp order.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int rr = 2 * tig + (e & 1), d = 8 * gid + mt + 64 * (e >> 1);
            if (rr < nr) sums[(warp * R + rr) * D + d] = acc[mt][e];
        }
    }
    __syncthreads();  // sums, warp_l
    for (int e = tid; e < nr * D; e += kThreads) {
        const int r = e / D, d = e - r * D;
        float total = sums[r * D + d];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) total += sums[(w * R + r) * D + d];
        const i64 at = partial_index(s, g, chunk, r0 + r, c.heads_kv, chunks, rows);
        store_partial(ws_acc + (at * D + d), total);
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
