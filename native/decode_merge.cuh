// The decode merge, for decode_attention.cu, which instantiates it (decode_merge_<T>_<threads>):
// one CTA per (sequence, query head, new token) merges the sequence's chunk partials into out
// and lse.
#pragma once
#include "decode_common.cuh"

namespace {

// Where a merge writes: out [b, q_len, Hq, Dv] by element strides, and lse [b, q_len, Hq] or null.
template <typename T>
struct Outputs {
    T* out;
    i64 o_sb, o_st, o_sh;
    float* lse;
};

// One output row (sequence s, new token t, query head h) as both merges read and write it: its
// chunks' (m, l) and accumulators, `ml_step` and `acc_step` floats from one chunk's to the
// next's, the n chunks it merges (none for a token before position 0), and where its output
// and lse (or null) go. The partials are not __restrict__ here or in the merges: with it the
// compiler reads them on the non-coherent path and may hoist those loads above the wait for
// the partial grid (griddepcontrol.wait), which nvdisasm showed it doing in one form of the rows
// merge (thirty-second session: wrong sums on a GPU).
template <typename T>
struct MergeRow {
    const float* ml;
    const float* acc;
    i64 ml_step, acc_step;
    int n;
    T* out;
    float* lse;
};

template <typename T>
__device__ __forceinline__ MergeRow<T> merge_row(const Outputs<T>& o, const float* ws_acc,
                                                 const float* ws_ml, const Cache& c, int len,
                                                 int s, int t, int h, int group, int q_len,
                                                 int chunks, bool valid) {
    const int rows = group * q_len;
    const i64 at = partial_index(s, h / group, 0, t * group + h % group, c.heads_kv, chunks, rows);
    const int n = valid && OPFACADE_TOKEN_POSITION(len, q_len, t) >= 0
                      ? min((len + kChunk - 1) / kChunk, chunks)
                      : 0;
    const i64 heads_q = (i64)c.heads_kv * group;
    return {ws_ml + 2 * at, ws_acc + at * c.dim_v, 2 * (i64)rows, (i64)rows * c.dim_v, n,
            o.out + s * o.o_sb + t * o.o_st + h * o.o_sh,
            o.lse == nullptr ? nullptr : o.lse + ((i64)s * q_len + t) * heads_q + h};
}

// One chunk's partial (max mk, sum lk, accumulator x) added into a float4 of columns and the
// row's sum, weighted exp(mk - base); a chunk no key of the row reached (mk = -inf) weighs 0.
__device__ __forceinline__ void add_weighted(float4& acc, float& l, float base, float mk,
                                             float lk, const float4& x) {
    const float w = mk == minus_infinity() ? 0.0f : expf(mk - base);
    acc.x = fmaf(x.x, w, acc.x);
    acc.y = fmaf(x.y, w, acc.y);
    acc.z = fmaf(x.z, w, acc.z);
    acc.w = fmaf(x.w, w, acc.w);
    l = fmaf(lk, w, l);
}

// A row's merged float4 at col (acc / l, zeros where no key was seen) and, from the thread of
// column 0, its lse (m + log l, -inf where no key was seen).
template <typename T>
__device__ __forceinline__ void write_merged(const MergeRow<T>& row, int col, const float4& acc,
                                             float l, float m) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    T* out = row.out + col;
    out[0] = Math<T>::down(acc.x * inv);
    out[1] = Math<T>::down(acc.y * inv);
    out[2] = Math<T>::down(acc.z * inv);
    out[3] = Math<T>::down(acc.w * inv);
    if (row.lse != nullptr && col == 0) *row.lse = l > 0.0f ? m + logf(l) : minus_infinity();
}

// The merge: the block's threads form slices of Dv / 4 threads (a float4 of columns each); slice
// k adds chunks k, k + slices, ... in turn, then the slices' sums are added in slice order. The
// order depends on the sequence's own chunk count alone, so the result stays batch-invariant,
// and each slice's loads are independent of one another (several in flight, where one thread
// walking every chunk would wait on each). A slice's first kMergeEarly chunks are loaded before
// the chunks' largest max is known, with the loads that find it, so the merge waits on one
// round trip to the partials where it waited on two; the sums are the same, in the same order.
constexpr int kMergeEarly = 4;

template <typename T, int kMergeThreads>
__device__ void merge(const Outputs<T>& o, const float* ws_acc, const float* ws_ml,
                      const Cache& c, const int* __restrict__ seq_lens, int group, int q_len,
                      int chunks) {
    __shared__ float4 slice_acc[kMergeThreads];
    __shared__ float slice_l[kMergeThreads];
    __shared__ float warp_max[kMergeThreads / 32];
    const int s = blockIdx.x, h = blockIdx.y, t = blockIdx.z, tid = threadIdx.x;
    const MergeRow<T> row = merge_row(o, ws_acc, ws_ml, c, sequence_length(c, seq_lens, s), s,
                                      t, h, group, q_len, chunks, true);
    const float* ml = row.ml;
    const i64 ml_step = row.ml_step;  // from one chunk's (m, l) of this row to the next's
    const int n = row.n, width = c.dim_v / 4, slices = kMergeThreads / width;  // Dv 64-256
    const int slice = tid / width, col = (tid % width) * 4;
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
            early_acc[u] = *reinterpret_cast<const float4*>(row.acc + k * row.acc_step + col);
        }
    }

    // The largest chunk max (a max is the same in any order).
    float m = minus_infinity();
    for (int k = tid; k < n; k += kMergeThreads) m = fmaxf(m, ml[k * ml_step]);
    for (int lanes = 16; lanes > 0; lanes >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, lanes));
    }
    if ((tid & 31) == 0) warp_max[tid >> 5] = m;
    __syncthreads();
    for (int w = 0; w < kMergeThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
    const float base = m == minus_infinity() ? 0.0f : m;

    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float l = 0.0f;
    if (slice < slices) {
#pragma unroll
        for (int u = 0; u < kMergeEarly; ++u) {
            if (slice + u * slices < n) add_weighted(acc, l, base, early_m[u], early_l[u],
                                                     early_acc[u]);
        }
#pragma unroll 8
        for (int k = slice + kMergeEarly * slices; k < n; k += slices) {
            add_weighted(acc, l, base, ml[k * ml_step], ml[k * ml_step + 1],
                         *reinterpret_cast<const float4*>(row.acc + k * row.acc_step + col));
        }
        slice_acc[tid] = acc;
        slice_l[tid] = l;
    }
    __syncthreads();
    drop_partials(row.acc, row.acc_step, n, c.dim_v, tid, kMergeThreads);  // every row is read
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
        write_merged(row, col, acc, l, m);
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
__device__ void merge_row_slices(const MergeRow<T>& row, int col, bool valid) {
    const float* ml = row.ml;
    const float* acc_row = row.acc;
    const i64 ml_step = row.ml_step, acc_step = row.acc_step;
    const int n = row.n;
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
#pragma unroll
    for (int k = 0; k < kRowsEarly; ++k) {  // chunk k is slice k % kSlices's
        if (k < n) {
            add_weighted(slice_acc[k % kSlices], slice_l[k % kSlices], base, early_m[k],
                         early_l[k], early_acc[k]);
        }
    }
    // The rest, kSlices chunks at a time: chunk k0 + j is slice j's (kRowsEarly is a multiple
    // of kSlices).
#pragma unroll 1
    for (int k0 = kRowsEarly; k0 < n; k0 += kSlices) {
#pragma unroll
        for (int j = 0; j < kSlices; ++j) {
            const int k = k0 + j;
            if (k < n) {
                add_weighted(slice_acc[j], slice_l[j], base, ml[k * ml_step],
                             ml[k * ml_step + 1],
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
    if (valid) write_merged(row, col, acc, l, m);
}

template <typename T>
__device__ void merge_rows(const Outputs<T>& o, const float* ws_acc, const float* ws_ml,
                           const Cache& c, const int* __restrict__ seq_lens, int group,
                           int q_len, int chunks, int sequences) {
    const int dim_v = c.dim_v, width = dim_v / 4;  // Dv in {64, 128, 256}
    const int heads_q = c.heads_kv * group, tid = threadIdx.x;
    const i64 index = (i64)blockIdx.x * (kRowsThreads / width) + tid / width;
    const bool valid = index < (i64)sequences * q_len * heads_q;
    // Rows in (sequence, new token, query head) order: a CTA's rows share their (m, l) lines.
    const int h = valid ? (int)(index % heads_q) : 0;
    const int t = valid ? (int)(index / heads_q % q_len) : 0;
    const int s = valid ? (int)(index / ((i64)heads_q * q_len)) : 0;
    const MergeRow<T> row = merge_row(o, ws_acc, ws_ml, c, sequence_length(c, seq_lens, s), s,
                                      t, h, group, q_len, chunks, valid);
    const int col = (tid % width) * 4;
    wait_for_prerequisite_grid();  // the partials (seq_lens came before the partial kernel)
    switch (64 / width) {  // the 64-thread merge's slices
        case 1: merge_row_slices<1>(row, col, valid); break;
        case 2: merge_row_slices<2>(row, col, valid); break;
        default: merge_row_slices<4>(row, col, valid);
    }
    __syncthreads();  // every row's loads consumed (a row of Dv 256 spans two warps)
    if (valid && tid % width < 32) {  // a row's first warp drops its lines
        drop_partials(row.acc, row.acc_step, row.n, dim_v, tid % width, min(width, 32));
    }
}

}  // namespace
