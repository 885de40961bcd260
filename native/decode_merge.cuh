// The decode merge, for decode_attention.cu, which instantiates it (decode_merge_<T>_<threads>):
// one CTA per (sequence, query head, new token) merges the sequence's chunk partials into out
// and lse.
#pragma once
#include "decode_common.cuh"

namespace {

// The merge: the block's threads form slices of Dv / 4 threads (a float4 of columns each); slice
// k adds chunks k, k + slices, ... in turn, then the slices' sums are added in slice order. The
// order depends on the sequence's own chunk count alone, so the result stays batch-invariant,
// and each slice's loads are independent of one another (several in flight, where one thread
// walking every chunk would wait on each). A slice's first kMergeEarly chunks are loaded before
// the chunks' largest max is known, with the loads that find it, so the merge waits on one
// round trip to the partials where it waited on two; the sums are the same, in the same order.
constexpr int kMergeEarly = 4;

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
    const int n =
        OPFACADE_TOKEN_POSITION(len, q_len, t) >= 0 ? min((len + kChunk - 1) / kChunk, chunks) : 0;
    const float* ml = ws_ml + 2 * partial_index(s, g, 0, r, c.heads_kv, chunks, rows);
    const i64 ml_step = 2 * (i64)rows;  // from one chunk's (m, l) of this row to the next's
    const int width = dim_v / 4, slices = kMergeThreads / width;  // Dv in {64, 128, 256}
    const int slice = tid / width, col = (tid % width) * 4;
    const float* acc_row = ws_acc + partial_index(s, g, 0, r, c.heads_kv, chunks, rows) * dim_v;
    const i64 acc_step = (i64)rows * dim_v;
    wait_for_prerequisite_grid();  // the partials (seq_lens came before the partial kernel)

    // This slice's first chunks: k = slice + u * slices.
    float4 early_acc[kMergeEarly];
    float early_m[kMergeEarly], early_l[kMergeEarly];
#pragma unroll
    for (int u = 0; u < kMergeEarly; ++u) {
        const int k = slice + u * slices;
        if (slice < slices && k < n) {
            early_m[u] = ml[k * ml_step];
            early_l[u] = ml[k * ml_step + 1];
            early_acc[u] = *reinterpret_cast<const float4*>(acc_row + k * acc_step + col);
        }
    }

    // The largest chunk max (a max is the same in any order).
    float m = minus_infinity();
    for (int k = tid; k < n; k += kMergeThreads) m = fmaxf(m, ml[k * ml_step]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((tid & 31) == 0) warp_max[tid >> 5] = m;
    __syncthreads();
    for (int w = 0; w < kMergeThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
    const float base = m == minus_infinity() ? 0.0f : m;

    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float l = 0.0f;
    auto add = [&](float mk, float lk, const float4& x) {
        const float w = mk == minus_infinity() ? 0.0f : expf(mk - base);
        acc.x = fmaf(x.x, w, acc.x);
        acc.y = fmaf(x.y, w, acc.y);
        acc.z = fmaf(x.z, w, acc.z);
        acc.w = fmaf(x.w, w, acc.w);
        l = fmaf(lk, w, l);
    };
    if (slice < slices) {
#pragma unroll
        for (int u = 0; u < kMergeEarly; ++u) {
            if (slice + u * slices < n) add(early_m[u], early_l[u], early_acc[u]);
        }
#pragma unroll 8
        for (int k = slice + kMergeEarly * slices; k < n; k += slices) {
            add(ml[k * ml_step], ml[k * ml_step + 1],
                *reinterpret_cast<const float4*>(acc_row + k * acc_step + col));
        }
        slice_acc[tid] = acc;
        slice_l[tid] = l;
    }
    __syncthreads();
    drop_partials(acc_row, acc_step, n, dim_v, tid, kMergeThreads);  // every chunk's row is read
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

// The merge in rows, for caches of up to kRowsEarly chunks (decode.py's ROWS_CHUNKS): a row
// (sequence, query head, new token) takes Dv / 4 threads (a float4 of columns each), so a
// 128-thread CTA merges 128 / (Dv / 4) rows, and each thread adds every slice of the 64-thread
// merge above itself: slice j's chunks j, j + slices, ... in order, then the slices in order,
// with the same weights. Its sums are the 64-thread merge's, bit for bit (a GPU test and
// scripts/decode_variants.py --merge-rows compare them). That merge spends a CTA and 64
// threads on a row (48 registers each), so a batch of many short rows (B256 S1024: 8192 rows
// of 2 chunks) took three waves of its CTAs on an H200; this one holds a third more rows at
// once, and no barrier orders its sums. Past kRowsEarly chunks its threads would wait on a
// second round trip where that merge's slices wait on one (decode.py has the figures; a form
// with two float4 a thread and 8 chunks loaded early did not beat that merge at 8 chunks), so
// it merges any count of chunks but is given only those.
constexpr int kRowsThreads = 128;
constexpr int kRowsEarly = 4;  // chunks a thread loads before the chunks' largest max is known
static_assert(kRowsEarly % 4 == 0, "chunk k0 + j of the loop after them is slice j's");

template <int kSlices, typename T>
__device__ void merge_row_slices(T* __restrict__ row_out, float* __restrict__ lse_at,
                                 const float* __restrict__ ml, i64 ml_step,
                                 const float* __restrict__ acc_row, i64 acc_step, int col, int n,
                                 bool valid) {
    // This thread's first chunks, loaded with the chunks' maxima.
    float4 early_acc[kRowsEarly];
    float early_m[kRowsEarly], early_l[kRowsEarly];
#pragma unroll
    for (int k = 0; k < kRowsEarly; ++k) {
        if (k < n) {
            early_m[k] = ml[k * ml_step];
            early_l[k] = ml[k * ml_step + 1];
            early_acc[k] = *reinterpret_cast<const float4*>(acc_row + k * acc_step + col);
        }
    }
    float m = minus_infinity();
#pragma unroll
    for (int k = 0; k < kRowsEarly; ++k) {
        if (k < n) m = fmaxf(m, early_m[k]);
    }
#pragma unroll 1
    for (int k = kRowsEarly; k < n; ++k) m = fmaxf(m, ml[k * ml_step]);
    const float base = m == minus_infinity() ? 0.0f : m;

    float4 slice_acc[kSlices];
    float slice_l[kSlices];
#pragma unroll
    for (int j = 0; j < kSlices; ++j) {
        slice_acc[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        slice_l[j] = 0.0f;
    }
    auto add = [&](int j, float mk, float lk, const float4& x) {  // to slice j
        const float w = mk == minus_infinity() ? 0.0f : expf(mk - base);
        slice_acc[j].x = fmaf(x.x, w, slice_acc[j].x);
        slice_acc[j].y = fmaf(x.y, w, slice_acc[j].y);
        slice_acc[j].z = fmaf(x.z, w, slice_acc[j].z);
        slice_acc[j].w = fmaf(x.w, w, slice_acc[j].w);
        slice_l[j] = fmaf(lk, w, slice_l[j]);
    };
#pragma unroll
    for (int k = 0; k < kRowsEarly; ++k) {
        if (k < n) add(k % kSlices, early_m[k], early_l[k], early_acc[k]);
    }
    // The rest, kSlices chunks at a time: chunk k0 + j is slice j's (kRowsEarly is a multiple
    // of kSlices).
#pragma unroll 1
    for (int k0 = kRowsEarly; k0 < n; k0 += kSlices) {
#pragma unroll
        for (int j = 0; j < kSlices; ++j) {
            const int k = k0 + j;
            if (k < n) {
                add(j, ml[k * ml_step], ml[k * ml_step + 1],
                    *reinterpret_cast<const float4*>(acc_row + k * acc_step + col));
            }
        }
    }
    float4 acc = slice_acc[0];
    float l = slice_l[0];
#pragma unroll
    for (int j = 1; j < kSlices; ++j) {
        acc.x += slice_acc[j].x;
        acc.y += slice_acc[j].y;
        acc.z += slice_acc[j].z;
        acc.w += slice_acc[j].w;
        l += slice_l[j];
    }
    if (valid) {
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        row_out[0] = Math<T>::down(acc.x * inv);
        row_out[1] = Math<T>::down(acc.y * inv);
        row_out[2] = Math<T>::down(acc.z * inv);
        row_out[3] = Math<T>::down(acc.w * inv);
        if (lse_at != nullptr && col == 0) *lse_at = l > 0.0f ? m + logf(l) : minus_infinity();
    }
}

template <typename T>
__device__ void merge_rows(T* __restrict__ out, i64 o_sb, i64 o_st, i64 o_sh,
                           float* __restrict__ lse, const float* __restrict__ ws_acc,
                           const float* __restrict__ ws_ml, const Cache& c,
                           const int* __restrict__ seq_lens, int group, int q_len, int chunks,
                           int sequences) {
    const int dim_v = c.dim_v, width = dim_v / 4;  // Dv in {64, 128, 256}
    const int heads_q = c.heads_kv * group, tid = threadIdx.x;
    const i64 row = (i64)blockIdx.x * (kRowsThreads / width) + tid / width;
    const bool valid = row < (i64)sequences * q_len * heads_q;
    // Rows in (sequence, new token, query head) order: a CTA's rows share their (m, l) lines.
    const int h = valid ? (int)(row % heads_q) : 0;
    const int t = valid ? (int)(row / heads_q % q_len) : 0;
    const int s = valid ? (int)(row / ((i64)heads_q * q_len)) : 0;
    const int g = h / group, rows = group * q_len, r = t * group + h % group;
    const int len = sequence_length(c, seq_lens, s);
    const int n = valid && OPFACADE_TOKEN_POSITION(len, q_len, t) >= 0
                      ? min((len + kChunk - 1) / kChunk, chunks)
                      : 0;
    const float* ml = ws_ml + 2 * partial_index(s, g, 0, r, c.heads_kv, chunks, rows);
    const float* acc_row = ws_acc + partial_index(s, g, 0, r, c.heads_kv, chunks, rows) * dim_v;
    const i64 ml_step = 2 * (i64)rows, acc_step = (i64)rows * dim_v;
    const int col = (tid % width) * 4;
    T* row_out = out + s * o_sb + t * o_st + h * o_sh + col;
    float* lse_at = lse == nullptr ? nullptr : lse + ((i64)s * q_len + t) * heads_q + h;
    wait_for_prerequisite_grid();  // the partials (seq_lens came before the partial kernel)
    switch (64 / width) {  // the 64-thread merge's slices
        case 1: merge_row_slices<1>(row_out, lse_at, ml, ml_step, acc_row, acc_step, col, n,
                                    valid); break;
        case 2: merge_row_slices<2>(row_out, lse_at, ml, ml_step, acc_row, acc_step, col, n,
                                    valid); break;
        default: merge_row_slices<4>(row_out, lse_at, ml, ml_step, acc_row, acc_step, col, n,
                                     valid);
    }
    __syncthreads();  // every row's loads consumed (a row of Dv 256 spans two warps)
    if (valid && tid % width < 32) {  // a row's first warp drops its lines
        drop_partials(acc_row, acc_step, n, dim_v, tid % width, min(width, 32));
    }
}

}  // namespace
