// The true-f32 deterministic backward: Delta, then dK and dV per key block with dQ added in
// key-block turns (flash_f32_bwd_*; the scores on FMA, or on sm_90's FP64 tensor cores);
// instantiated by flash_f32.cu, whose header states what every kernel computes.
#pragma once
#include "flash_f32_products.cuh"

namespace {

// Query block qb's turn counter (head h of sequence b): workspace [B][Hq][query blocks].
__device__ __forceinline__ int* turn_counter(int* turns, const Problem& p, int heads_q, int b,
                                             int h, int qb) {
    const int blocks = (p.max_q + kDkdvRows - 1) / kDkdvRows;
    return turns + ((i64)b * heads_q + h) * blocks + qb;
}

// Delta_i = sum_d dO[i][d] * O[i][d]: one warp a row, lanes over d, then a fixed butterfly. The
// same CTA zeroes its rows of dQ, which the dK/dV kernel adds into, and their turn counters.
__device__ __forceinline__ void backward_delta(const Rows<const float>& out,
                                               const Rows<const float>& dout,
                                               const Rows<float>& delta, const Rows<float>& dq,
                                               int* turns, const Problem& p, int dim,
                                               int dim_v) {
    constexpr int kWarps = kDeltaThreads / 32;
    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kDeltaRows;
    if (threadIdx.x < kDeltaRows / kDkdvRows) {
        const int qb = i0 / kDkdvRows + threadIdx.x;
        if (qb * kDkdvRows < p.max_q) *turn_counter(turns, p, gridDim.y, b, h, qb) = 0;
    }
    const Span sq = sequence(p.cu_q, b, p.max_q, p.total_q);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = i0 + warp; i < min(i0 + kDeltaRows, sq.len); i += kWarps) {
        const i64 t = sq.row0 + i;
        const float* o = out.at(b, h, t);
        const float* g = dout.at(b, h, t);
        float sum = 0.0f;
        for (int d = lane; d < dim_v; d += 32) sum = fmaf(o[d], g[d], sum);
        sum = warp_sum(sum);
        if (lane == 0) *delta.at(b, h, t) = sum;
        float* dq_row = dq.at(b, h, t);
        for (int d = lane; d < dim; d += 32) dq_row[d] = 0.0f;
    }
}

// P and dS of one score tile, in place of the scores s and of dP = dO V^T: P = exp(scale s -
// lse) and dS = P (dP - Delta) where key j is allowed for row i. Under MASKED they are exactly 0
// (a select, not a product, so whatever dP holds there) where it is not, and on rows whose lse
// is -inf. A block whole for every row (whole_block) goes without the selects: there each row
// in the sequence has keys, so a finite lse, and a row past it reads nothing and takes lse =
// +inf, so P = 0 and dS = 0 * dP, where its zero-filled dO makes dP = 0.
// Row r is query first + r, column c key j0 + tx + 16 c.
template <bool MASKED, int R, int C>
__device__ __forceinline__ void probabilities(float (&s)[R][C], float (&dp)[R][C],
                                              const Mask& mask, const Rows<const float>& lse,
                                              const Rows<const float>& delta, int b, int h,
                                              const Span& sq, int first, int j0, int tx,
                                              float scale) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = first + r;
        const int lo = MASKED ? mask.lo(i) : 0, hi = MASKED ? mask.hi(i) : 0;
        // Rows past the sequence have no keys (hi = -1), and nothing of theirs is read.
        const bool any = MASKED ? hi >= lo : i < sq.len;
        const float none = MASKED ? minus_infinity() : -minus_infinity();
        const float row_lse = any ? *lse.at(b, h, sq.row0 + i) : none;
        const float row_delta = any ? *delta.at(b, h, sq.row0 + i) : 0.0f;
        const float scale2 = scale * kLog2e, lse2 = row_lse * kLog2e;  // base 2, as forward
#pragma unroll
        for (int c = 0; c < C; ++c) {
            if (MASKED) {
                const int j = j0 + tx + 16 * c;
                const bool keep = j >= lo && j <= hi && row_lse != minus_infinity();
                const float prob = keep ? exp2f(fmaf(s[r][c], scale2, -lse2)) : 0.0f;
                dp[r][c] = keep ? prob * (dp[r][c] - row_delta) : 0.0f;
                s[r][c] = prob;
            } else {
                s[r][c] = exp2f(fmaf(s[r][c], scale2, -lse2));
                dp[r][c] = s[r][c] * (dp[r][c] - row_delta);
            }
        }
    }
}

// row[cols of tx] += scale * x by L2 reductions (red.global.add), in 4-wide pieces where sm_90
// and the rows allow. A reduction needs no reply, where reading, adding and writing back waited
// an L2 round trip (ncu had put 12% of dK/dV's stall samples on those reads). Each addition is
// rounded twice (scale * x, then the sum) where the read-add-write's fma rounded once; only the
// turn's holder adds into a row, so the order, and with it every bit, stays fixed.
template <int N>
__device__ __forceinline__ void add_cols_l2(float* row, const float (&x)[N / 16], float scale,
                                            int tx, bool vec) {
    constexpr int VW = Cols<N>::VW;
#pragma unroll
    for (int m = 0; m < Cols<N>::M; ++m) {
        float* p = row + Cols<N>::col(tx, m);
        float y[VW];
#pragma unroll
        for (int v = 0; v < VW; ++v) y[v] = scale * x[VW * m + v];
#if __CUDA_ARCH__ >= 900
        if (VW == 4 && vec) {
            asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(y[0]),
                         "f"(y[1]), "f"(y[2]), "f"(y[3]) : "memory");
            continue;
        }
#endif
#pragma unroll
        for (int v = 0; v < VW; ++v) {
            asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p + v), "f"(y[v]) : "memory");
        }
    }
}

// The query blocks [first, first + count) whose rows can see key block [j0, j0 + kDkdvKeys):
// one function for a CTA's own range and for its predecessor's, so both agree.
__device__ __forceinline__ int2 query_blocks(const Mask& mask, int j0) {
    const int i_lo = mask.first_row(j0);
    const int i_hi = mask.last_row(min(j0 + kDkdvKeys, mask.len_kv) - 1);
    const int first = i_lo / kDkdvRows;
    return make_int2(first, i_hi >= i_lo ? i_hi / kDkdvRows - first + 1 : 0);
}

template <int D, int DV>
struct DkdvTiles {
    // Each thread: R query rows by 4 keys of the score tiles, and RK key rows of dK and dV.
    static constexpr int R = kDkdvRows / (kDkdvThreads / 16);
    static constexpr int RK = kDkdvKeys / (kDkdvThreads / 16);
    static constexpr int K = kDkdvKeys * (D + kPad), V = kDkdvKeys * (DV + kPad);
    static constexpr int Q = kDkdvRows * (D + kPad), DO = kDkdvRows * (DV + kPad);
    static constexpr int PS = kDkdvRows * (kDkdvKeys + kPad);  // P, then dS
    static constexpr int FLOATS = K + V + Q + DO + PS;
};

// The tensors the backward reads, and the Delta workspace.
struct BackwardInputs {
    Rows<const float> q, k, v, dout, lse, delta;
};

__device__ __forceinline__ unsigned long long global_nanoseconds() {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return ns;
}

// Thread 0 waits until the turn counter reaches `value`; the barrier after it passes what it
// acquired on to the rest of the CTA (in PTX's memory model a barrier synchronizes the CTA's
// threads, so their additions follow the holder's; a full fence after the load ordered nothing
// more). The CTA waited on has a lower index, so it started first and the wait ends. Were that
// ever untrue, a minute without the turn stops the kernel with an error (a launch failure the
// caller sees) rather than hanging the process.
__device__ __forceinline__ void wait_turn(const int* turn, int value) {
    constexpr unsigned long long kPatience = 60ull * 1000 * 1000 * 1000;  // ns
    const unsigned long long start = global_nanoseconds();
    int seen;
    for (;;) {
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(turn) : "memory");
        if (seen >= value) break;
        if (global_nanoseconds() - start > kPatience) __trap();
    }
}

// Thread 0 passes the turn on, once a barrier has seen every thread's dQ additions issued: the
// barrier orders them before this release, which makes them visible at GPU scope before the
// counter moves. An acquire-release fence is all that needs; __threadfence's sequentially
// consistent one (with the fence after the wait) cost the d 128 backward 1.5% on an H100.
__device__ __forceinline__ void pass_turn(int* turn, int value) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(turn), "r"(value) : "memory");
}

// Where a dK/dV CTA's step adds into dQ: the dQ rows, this query block's turn counter, the
// CTA's key block (its turn comes when the counter reaches it), and whether the key block before
// it sees the query block too (and so must add first).
struct DqTurn {
    Rows<float> dq;
    int* turn;
    int key_block;
    bool wait;
};

// One query block's contribution to a key block's dV and dK, and its dS K into dQ in this key
// block's turn (the tiles of Q and dO are in shared memory). Loads the next step's dO, then Q,
// as soon as their tiles are free.
template <int D, int DV, bool MMA>
__device__ __forceinline__ void dkdv_step(float (&dk)[DkdvTiles<D, DV>::RK][D / 16],
                                          float (&dv)[DkdvTiles<D, DV>::RK][DV / 16],
                                          const BackwardInputs& in, const Problem& p,
                                          const Mask& mask, const Span& sq, int b, int h, int i0,
                                          int j0, float* tiles, int next_h, int next_i0,
                                          const DqTurn& dq) {
    typedef DkdvTiles<D, DV> T;
    constexpr int R = T::R, RK = T::RK, C = kDkdvKeys / 16, LD = kDkdvKeys + kPad;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    float* k_tile = tiles;
    float* v_tile = k_tile + T::K;
    float* q_tile = v_tile + T::V;
    float* do_tile = q_tile + T::Q;
    float* ps_tile = do_tile + T::DO;
    float s[R][C] = {}, dp[R][C] = {};
    if constexpr (MMA) {
        scores_dmma<R, C, D>(s, q_tile, k_tile, ps_tile);  // ps_tile is free until P is stored
        scores_dmma<R, C, DV>(dp, do_tile, v_tile, ps_tile);
    } else {
        dot_rows<R, C, D>(s, q_tile, k_tile, ty * R, tx);
        dot_rows<R, C, DV>(dp, do_tile, v_tile, ty * R, tx);
    }
    with_mask(whole_block(mask, i0, min(i0 + kDkdvRows, sq.len) - 1, j0, kDkdvKeys),
              [&](auto masked) {
                  probabilities<decltype(masked)::value, R, C>(s, dp, mask, in.lse, in.delta, b, h,
                                                               sq, i0 + ty * R, j0, tx, p.scale);
              });
    store_scores<R, C, LD>(ps_tile, s, ty * R, tx);
    __syncthreads();
    mul_cols<RK, DV, kDkdvRows, LD>(dv, ps_tile, do_tile, ty * RK, tx);  // dV += P^T dO
    __syncthreads();  // P and dO are consumed
    if (next_i0 >= 0) {
        load_tile<kDkdvRows, DV, kDkdvThreads>(do_tile, in.dout, b, next_h, sq, next_i0, p.vec);
        copy_commit();
    }
    store_scores<R, C, LD>(ps_tile, dp, ty * R, tx);
    __syncthreads();
    mul_cols<RK, D, kDkdvRows, LD>(dk, ps_tile, q_tile, ty * RK, tx);  // dK += dS^T Q
    float dq_part[R][D / 16] = {};
    mul_rows<R, D, kDkdvKeys, LD>(dq_part, ps_tile, k_tile, ty * R, tx);  // dS K
    if (threadIdx.x == 0 && dq.wait) wait_turn(dq.turn, dq.key_block);
    __syncthreads();  // dS and Q are consumed, and the key block before ours has added
    if (next_i0 >= 0) {
        load_tile<kDkdvRows, D, kDkdvThreads>(q_tile, in.q, b, next_h, sq, next_i0, p.vec);
        copy_commit();
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = i0 + ty * R + r;
        if (i < sq.len) {
            add_cols_l2<D>(dq.dq.at(b, h, sq.row0 + i), dq_part[r], p.scale, tx, p.vec);
        }
    }
    // The turn passes on after the next barrier, once every thread's rows are added.
}

// CTA (kv head, sequence, key block): dV = sum P^T dO and dK = scale sum dS^T Q over the group's
// query heads in increasing order, then the query blocks that can see these keys from the last
// down; each step adds scale dS K into its query block's dQ rows in turn.
//
// The grid puts the key block slowest, so a CTA starts a whole row of heads after the one it
// waits on, which by then is a step or more ahead: with key blocks fastest, the CTAs of one head
// all started together and the j-th waited j steps. Query blocks go from the last down because
// under a causal mask every block's first turn is key block 0's, which sees all of them: the
// last blocks are the ones every later key block sees too, so key block j's first step waits
// only on key block j - 1's first step. In the other order, its first step waited on key block
// 0's (2j + 1)-th, and a CTA of two steps sat through most of key block 0's sixty-four.
template <int D, int DV, bool MMA>
__device__ __forceinline__ void backward_dkdv(const BackwardInputs& in, const Rows<float>& dk,
                                              const Rows<float>& dv, const Rows<float>& dq,
                                              int* turns, const Problem& p) {
    typedef DkdvTiles<D, DV> T;
    const int hk = blockIdx.x, b = blockIdx.y, kb = blockIdx.z, j0 = kb * kDkdvKeys;
    const Span skv = sequence(p.cu_kv, b, p.max_kv, p.total_kv);
    if (j0 >= skv.len) return;
    const Span sq = sequence(p.cu_q, b, p.max_q, p.total_q);
    const Mask mask = make_mask(p, sq.len, skv.len);
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    float* tiles = shared_tiles<T::FLOATS>();
    float* q_tile = tiles + T::K + T::V;

    const int2 mine = query_blocks(mask, j0);
    // The query blocks the key block before this one adds into first (none for the first).
    const int2 before = j0 > 0 ? query_blocks(mask, j0 - kDkdvKeys) : make_int2(0, 0);
    const int qb_last = mine.x + mine.y - 1, blocks = mine.y;
    const int steps = blocks * p.group;
    if (steps > 0) {
        const int i0 = qb_last * kDkdvRows;
        load_tile<kDkdvKeys, D, kDkdvThreads>(tiles, in.k, b, hk, skv, j0, p.vec);
        load_tile<kDkdvKeys, DV, kDkdvThreads>(tiles + T::K, in.v, b, hk, skv, j0, p.vec);
        load_tile<kDkdvRows, D, kDkdvThreads>(q_tile, in.q, b, hk * p.group, sq, i0, p.vec);
        load_tile<kDkdvRows, DV, kDkdvThreads>(q_tile + T::Q, in.dout, b, hk * p.group, sq, i0,
                                               p.vec);
        copy_commit();
    }
    float dk_acc[T::RK][D / 16] = {}, dv_acc[T::RK][DV / 16] = {};
    int* added = nullptr;  // the turn counter of the query block the last step added into
    for (int step = 0; step < steps; ++step) {
        const int h = hk * p.group + step / blocks;
        const int qb = qb_last - step % blocks;
        const int next = step + 1;
        const int next_h = hk * p.group + next / blocks;
        const int next_i0 = next < steps ? (qb_last - next % blocks) * kDkdvRows : -1;
        const DqTurn turn{dq, turn_counter(turns, p, gridDim.x * p.group, b, h, qb), kb,
                          qb >= before.x && qb < before.x + before.y};
        copy_wait<0>();
        __syncthreads();  // also: every thread's dQ rows of the last step are added
        // Passing the last step's turn here rather than after a barrier of its own saves one
        // of a step's six; the next key block needs it no sooner than at the end of its step.
        if (threadIdx.x == 0 && added != nullptr) pass_turn(added, kb + 1);
        dkdv_step<D, DV, MMA>(dk_acc, dv_acc, in, p, mask, sq, b, h, qb * kDkdvRows, j0, tiles,
                         next_h, next_i0, turn);
        added = turn.turn;
    }
    if (added != nullptr) {
        __syncthreads();
        if (threadIdx.x == 0) pass_turn(added, kb + 1);
    }
#pragma unroll
    for (int r = 0; r < T::RK; ++r) {
        const int j = j0 + ty * T::RK + r;
        if (j >= skv.len) continue;
        scale_cols(dk_acc[r], p.scale);
        store_cols<D>(dk.at(b, hk, skv.row0 + j), dk_acc[r], tx, p.vec);
        store_cols<DV>(dv.at(b, hk, skv.row0 + j), dv_acc[r], tx, p.vec);
    }
}

}  // namespace
