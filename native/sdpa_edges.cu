// SDPA's edges around cuDNN's fused attention graphs: what the graphs leave to the caller.
//
//   sdpa_dropout_draw        offset[0] = counter[0]; counter[0] += stride
//                            (a dropout state's draw: the call reads `offset`, the state moves on)
//   sdpa_padding_rows_<T>    after a padded forward, in every (batch b, head): rows
//                            i >= seq_len_q[b]: out = 0, stats = 0, so what the forward leaves
//                            is finite for the backward to read; and when seq_len_kv[b] == 0,
//                            rows i < seq_len_q[b]: out = 0, stats = -inf, as every other row
//                            without keys (cuDNN leaves those unwritten). Rows of any [B, H, S, D]
//                            tensor with unit stride along D; stats optional.
//
// Both read what they act on from device memory (the counter, the lengths), so a CUDA graph that
// captured them stays right when those change between replays; neither synchronises the host.
#include "common.cuh"

// One thread: the counter and the offset are distinct int64 [1] tensors (checked on the host).
// The add wraps modulo 2^64 (unsigned arithmetic) rather than overflowing a signed integer.
extern "C" __global__ void __launch_bounds__(32) sdpa_dropout_draw(i64* counter, i64* offset,
                                                                  i64 stride) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        const i64 taken = counter[0];
        offset[0] = taken;
        counter[0] = (i64)((unsigned long long)taken + (unsigned long long)stride);
    }
}

// Block-stride over (batch, head) pairs; the lengths are two ints read by every thread of the
// block, so the branches are uniform, and a pair with keys and no padded rows leaves at once.
// `rows` is [B, H, S, D] with unit stride along D and the given strides in elements; `stats` (may
// be null) is [B, H, S, 1] f32 with the given strides. Zero is the all-zero bit pattern of T.
template <typename T>
__device__ __forceinline__ void padding_rows(
    T* __restrict__ rows, float* __restrict__ stats, const int* __restrict__ seq_len_q,
    const int* __restrict__ seq_len_kv, int batch, int heads, int seq, int dim, i64 r_sb,
    i64 r_sh, i64 r_ss, i64 s_sb, i64 s_sh, i64 s_ss) {
    const i64 pairs = (i64)batch * heads;
    const float minus_inf = __int_as_float(0xff800000);
    for (i64 bh = blockIdx.x; bh < pairs; bh += gridDim.x) {
        const i64 b = bh / heads;
        const i64 h = bh - b * heads;
        const int len_q = min(max(seq_len_q[b], 0), seq);
        const int first = seq_len_kv[b] == 0 ? 0 : len_q;  // rows [first, seq) are written
        if (first >= seq) continue;
        T* base = rows + b * r_sb + h * r_sh;
        const i64 count = (i64)(seq - first) * dim;
        for (i64 e = threadIdx.x; e < count; e += blockDim.x) {
            const i64 i = first + e / dim;
            base[i * r_ss + e % dim] = T();
        }
        if (stats != nullptr) {
            float* row_stats = stats + b * s_sb + h * s_sh;
            for (int i = first + threadIdx.x; i < seq; i += blockDim.x) {
                row_stats[(i64)i * s_ss] = i < len_q ? minus_inf : 0.0f;
            }
        }
    }
}

#define OPFACADE_SDPA_PADDING_ROWS(SUFFIX, T)                                                    \
    extern "C" __global__ void __launch_bounds__(256) sdpa_padding_rows_##SUFFIX(                \
        T* rows, float* stats, const int* seq_len_q, const int* seq_len_kv, int batch,           \
        int heads, int seq, int dim, i64 r_sb, i64 r_sh, i64 r_ss, i64 s_sb, i64 s_sh,            \
        i64 s_ss) {                                                                              \
        padding_rows<T>(rows, stats, seq_len_q, seq_len_kv, batch, heads, seq, dim, r_sb, r_sh,  \
                        r_ss, s_sb, s_sh, s_ss);                                                 \
    }

OPFACADE_SDPA_PADDING_ROWS(f32, float)
OPFACADE_SDPA_PADDING_ROWS(f16, f16_t)
OPFACADE_SDPA_PADDING_ROWS(bf16, bf16_t)
