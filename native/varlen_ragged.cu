// What cuDNN's ragged (THD) attention graphs need around them, for the varlen_attention cuDNN
// SKUs (_backends/cudnn/varlen.py). cuDNN 9.19 takes the batch and the longest sequence as graph
// dimensions, element offsets per sequence, lengths as [B, 1, 1, 1] int32 and the softmax stats
// padded [B, Hq, S_q, 1]; the contract hands over cu_seqlens and wants lse [Hq, Tq].
//
//   ragged_prepare        from cu_seqlens_q/kv: each sequence's start row and length (q side,
//                         then kv side) and the element offsets cuDNN reads, one array per
//                         distinct (side, token stride), for the graph's B sequences;
//   ragged_forward_rows_<T>  after a forward: lse[h, row] from the padded stats, and rows with no
//                         allowed key get out 0 and lse -inf (the contract's edge, whatever
//                         cuDNN left there);
//   ragged_gather_stats   before a backward: the padded stats from lse; a row with no key reads
//                         +inf, so exp(score - stat) is 0 rather than exp(-inf + inf) = NaN;
//   ragged_backward_rows_<T>  after a backward: grad_q 0 on query rows with no allowed key,
//                         grad_k and grad_v 0 on key rows no query sees.
//
// Everything reads cu_seqlens on the device (no host sync, capture-safe). Garbage offsets are
// clamped: a start into [0, tokens], a length into [0, min(max_seqlen, next start - start)], so
// every row any kernel (or the graph) touches lies inside the tensors. Sequences past the call's
// b (the graph's batch is a bucket) start at the last offset with length 0.
#include "common.cuh"

#define OPFACADE_RAGGED_GROUPS 8

// Row `i` of a sequence with `len_q` queries and `len_kv` keys under the mask: keys
// i + d - left <= j <= i + d + right (a negative side unbounded), d = len_kv - len_q when
// aligned bottom-right, else 0. In 64 bits: i + d + right may pass 2^31.
__device__ __forceinline__ bool row_has_key(i64 i, i64 len_q, i64 len_kv, int bottom_right,
                                            i64 left, i64 right) {
    if (len_kv <= 0) return false;
    const i64 d = bottom_right ? len_kv - len_q : 0;
    const i64 lo = left < 0 ? 0 : max((i64)0, i + d - left);
    const i64 hi = right < 0 ? len_kv - 1 : min(len_kv - 1, i + d + right);
    return lo <= hi;
}

// Key `j` is seen by some query row i in [0, len_q): i >= j - d - right and i <= j - d + left.
__device__ __forceinline__ bool key_has_row(i64 j, i64 len_q, i64 len_kv, int bottom_right,
                                            i64 left, i64 right) {
    if (len_q <= 0) return false;
    const i64 d = bottom_right ? len_kv - len_q : 0;
    const i64 lo = right < 0 ? 0 : max((i64)0, j - d - right);
    const i64 hi = left < 0 ? len_q - 1 : min(len_q - 1, j - d + left);
    return lo <= hi;
}

__device__ __forceinline__ int clamped_start(const int* __restrict__ cu, int entries, int b,
                                             int tokens) {
    const int at = cu[min(b, entries - 1)];
    return min(max(at, 0), tokens);
}

// Grid-stride over b in [0, batch]. starts/lens: int32 [2][batch] (q side, then kv side);
// lens is what cuDNN reads as seq_len_q (lens) and seq_len_kv (lens + batch). offsets: i64
// [groups][batch + 1]; group g holds `stride g` elements per token of side (kv_sides >> g) & 1.
// The strides come as eight scalars (unused ones 0) rather than a struct, so the launch packs
// plain integers.
extern "C" __global__ void __launch_bounds__(256) ragged_prepare(
    const int* __restrict__ cu_q, const int* __restrict__ cu_kv, int entries, int tokens_q,
    int tokens_kv, int batch, int max_q, int max_kv, int* __restrict__ starts,
    int* __restrict__ lens, i64* __restrict__ offsets, int groups, int kv_sides, i64 stride0,
    i64 stride1, i64 stride2, i64 stride3, i64 stride4, i64 stride5, i64 stride6, i64 stride7) {
    const i64 strides[OPFACADE_RAGGED_GROUPS] = {stride0, stride1, stride2, stride3,
                                                 stride4, stride5, stride6, stride7};
    for (int b = blockIdx.x * blockDim.x + threadIdx.x; b <= batch; b += gridDim.x * blockDim.x) {
        int start[2];
        for (int side = 0; side < 2; ++side) {
            const int* cu = side ? cu_kv : cu_q;
            const int tokens = side ? tokens_kv : tokens_q;
            const int longest = side ? max_kv : max_q;
            start[side] = clamped_start(cu, entries, b, tokens);
            int len = 0;
            if (b + 1 < entries) {
                const int next = clamped_start(cu, entries, b + 1, tokens);
                len = min(max(next - start[side], 0), longest);
            }
            if (b < batch) {
                starts[side * batch + b] = start[side];
                lens[side * batch + b] = len;
            }
        }
        for (int g = 0; g < groups && g < OPFACADE_RAGGED_GROUPS; ++g) {
            offsets[(i64)g * (batch + 1) + b] = (i64)start[(kv_sides >> g) & 1] * strides[g];
        }
    }
}

// One thread per (row i < S_q, head h, sequence b): grid (ceil(S_q / 128), Hq, batch), blocks
// of 128. `lse` (may be null) is [Hq, Tq] with row stride lse_ld; `stats` [batch, Hq, S_q]
// padded (null when the forward made none); `out` rows: token stride o_st, head stride o_sh.
template <typename T>
__device__ __forceinline__ void forward_rows(
    T* __restrict__ out, float* __restrict__ lse, const float* __restrict__ stats,
    const int* __restrict__ starts, const int* __restrict__ lens, int batch, int heads, int seq_q,
    int dim_v, i64 o_st, i64 o_sh, i64 lse_ld, int bottom_right, i64 left, i64 right) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    const int len_q = lens[b];
    if (i >= len_q) return;
    const i64 row = (i64)starts[b] + i;
    if (row_has_key(i, len_q, lens[batch + b], bottom_right, left, right)) {
        if (lse != nullptr) lse[h * lse_ld + row] = stats[((i64)b * heads + h) * seq_q + i];
        return;
    }
    if (lse != nullptr) lse[h * lse_ld + row] = __int_as_float(0xff800000);
    T* base = out + row * o_st + h * o_sh;
    for (int e = 0; e < dim_v; ++e) base[e] = T();
}

extern "C" __global__ void __launch_bounds__(128) ragged_gather_stats(
    const float* __restrict__ lse, float* __restrict__ stats, const int* __restrict__ starts,
    const int* __restrict__ lens, int heads, int seq_q, i64 lse_ld) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    if (i >= seq_q) return;
    float value = 0.0f;  // rows past the sequence: finite, and masked out by the graph
    if (i < lens[b]) {
        value = lse[h * lse_ld + (i64)starts[b] + i];
        if (value == __int_as_float(0xff800000)) value = __int_as_float(0x7f800000);
    }
    stats[((i64)b * heads + h) * seq_q + i] = value;
}

// grid (ceil(max(S_q, S_kv) / 128), max(Hq, Hkv), batch): the q side zeroes grad_q rows with no
// key, the kv side grad_k and grad_v rows no query sees.
template <typename T>
__device__ __forceinline__ void backward_rows(
    T* __restrict__ dq, T* __restrict__ dk, T* __restrict__ dv, const int* __restrict__ starts,
    const int* __restrict__ lens, int batch, int heads_q, int heads_kv, int dim, int dim_v,
    i64 dq_st, i64 dq_sh, i64 dk_st, i64 dk_sh, i64 dv_st, i64 dv_sh, int bottom_right,
    i64 left, i64 right) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    const int len_q = lens[b], len_kv = lens[batch + b];
    if (h < heads_q && i < len_q && !row_has_key(i, len_q, len_kv, bottom_right, left, right)) {
        T* row = dq + ((i64)starts[b] + i) * dq_st + h * dq_sh;
        for (int e = 0; e < dim; ++e) row[e] = T();
    }
    if (h < heads_kv && i < len_kv && !key_has_row(i, len_q, len_kv, bottom_right, left, right)) {
        const i64 key = (i64)starts[batch + b] + i;
        T* k_row = dk + key * dk_st + h * dk_sh;
        T* v_row = dv + key * dv_st + h * dv_sh;
        for (int e = 0; e < dim; ++e) k_row[e] = T();
        for (int e = 0; e < dim_v; ++e) v_row[e] = T();
    }
}

#define OPFACADE_RAGGED_ROWS(SUFFIX, T)                                                          \
    extern "C" __global__ void __launch_bounds__(128) ragged_forward_rows_##SUFFIX(             \
        T* out, float* lse, const float* stats, const int* starts, const int* lens, int batch,   \
        int heads, int seq_q, int dim_v, i64 o_st, i64 o_sh, i64 lse_ld, int bottom_right,      \
        i64 left, i64 right) {                                                                   \
        forward_rows<T>(out, lse, stats, starts, lens, batch, heads, seq_q, dim_v, o_st, o_sh,   \
                        lse_ld, bottom_right, left, right);                                      \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(128) ragged_backward_rows_##SUFFIX(            \
        T* dq, T* dk, T* dv, const int* starts, const int* lens, int batch, int heads_q,         \
        int heads_kv, int dim, int dim_v, i64 dq_st, i64 dq_sh, i64 dk_st, i64 dk_sh,           \
        i64 dv_st, i64 dv_sh, int bottom_right, i64 left, i64 right) {                           \
        backward_rows<T>(dq, dk, dv, starts, lens, batch, heads_q, heads_kv, dim, dim_v, dq_st, \
                         dq_sh, dk_st, dk_sh, dv_st, dv_sh, bottom_right, left, right);          \
    }

OPFACADE_RAGGED_ROWS(f16, f16_t)
OPFACADE_RAGGED_ROWS(bf16, bf16_t)
