// The linear backward's activation step: d_pre = grad_out * act'(pre), with the bias gradient
// (the column sums of d_pre) reduced in a fixed order, no atomics.
//
// Rows are the batch's rows one after another (the host checks the batch is contiguous), N
// columns, row strides in elements (in bytes for the ReLU bit-mask). A block covers one tile of
// 32 packs of columns (16 bytes of T per lane) and one chunk of rows; its 8 warps take the
// chunk's rows round robin, each lane keeping f32 column sums for its pack. The warps' sums are
// added in warp order into one partial per (chunk, column); a second kernel adds each column's
// partials in chunk order. The chunking is a function of the problem alone (chosen on the host),
// so the bias gradient has the same bits on every run and every device.
//
// The sums take d_pre before it is rounded to T: dbias is then the exact column sum of what the
// activation's derivative gives, to f32 accumulation.
#include "common.cuh"
#include "activations.cuh"

#define OPFACADE_WARPS 8

// act'(pre) for the pack's columns j0 .. j0 + N - 1 of one row (zeros past the end), from the
// saved pre-activation.
template <typename Act>
struct FromPre {
    template <typename T>
    static __device__ __forceinline__ void slopes(float (&slope)[Pack<T>::N], const void* aux,
                                                  i64 r, i64 ld_aux, int j0, int n, bool vec) {
        Pack<T> pre;
        load_pack(pre, static_cast<const T*>(aux) + r * ld_aux, j0, n, vec);
#pragma unroll
        for (int e = 0; e < Pack<T>::N; ++e) slope[e] = Act::derivative(Math<T>::up(pre.v[e]));
    }
};

// cuBLASLt's ReLU aux: bit j of a row is bit (j % 8) of byte j / 8 (row stride in bytes); set
// where pre > 0.
struct FromReluMask {
    template <typename T>
    static __device__ __forceinline__ void slopes(float (&slope)[Pack<T>::N], const void* aux,
                                                  i64 r, i64 ld_aux, int j0, int n, bool) {
        const unsigned char* mask_row = static_cast<const unsigned char*>(aux) + r * ld_aux;
#pragma unroll
        for (int e = 0; e < Pack<T>::N; ++e) {
            const int j = j0 + e;
            slope[e] = (j < n && ((mask_row[j >> 3] >> (j & 7)) & 1)) ? 1.0f : 0.0f;
        }
    }
};

template <typename T, typename Slopes>
__device__ __forceinline__ void activation_grad(
    const T* __restrict__ grad_out, const void* __restrict__ aux, T* __restrict__ d_pre,
    float* __restrict__ partials, i64 rows, int n, i64 ld_grad, i64 ld_aux, i64 ld_pre,
    int rows_per_chunk, int vec) {
    constexpr int P = Pack<T>::N;
    __shared__ float scratch[OPFACADE_WARPS][32 * P];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j0 = (blockIdx.x * 32 + lane) * P;
    const i64 first = (i64)blockIdx.y * rows_per_chunk;
    const i64 last = min(first + (i64)rows_per_chunk, rows);
    float sum[P];
#pragma unroll
    for (int e = 0; e < P; ++e) sum[e] = 0.0f;
    if (j0 < n) {
        for (i64 r = first + warp; r < last; r += OPFACADE_WARPS) {
            Pack<T> g, d;
            load_pack(g, grad_out + r * ld_grad, j0, n, vec);
            float slope[P];
            Slopes::template slopes<T>(slope, aux, r, ld_aux, j0, n, vec);
#pragma unroll
            for (int e = 0; e < P; ++e) {
                const float value = Math<T>::up(g.v[e]) * slope[e];
                sum[e] += value;
                d.v[e] = Math<T>::down(value);
            }
            store_pack(d, d_pre + r * ld_pre, j0, n, vec);
        }
    }
    if (partials == nullptr) return;
#pragma unroll
    for (int e = 0; e < P; ++e) scratch[warp][lane * P + e] = sum[e];
    __syncthreads();
    for (int c = threadIdx.x; c < 32 * P; c += blockDim.x) {
        const int j = blockIdx.x * 32 * P + c;
        if (j >= n) continue;
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < OPFACADE_WARPS; ++w) total += scratch[w][c];
        partials[(i64)blockIdx.y * n + j] = total;
    }
}

// Thread j adds column j's partials in chunk order, then rounds once to T.
template <typename T>
__device__ __forceinline__ void bias_grad_finalize(const float* __restrict__ partials,
                                                   T* __restrict__ grad_bias, int n, int chunks) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    float total = 0.0f;
    for (int c = 0; c < chunks; ++c) total += partials[(i64)c * n + j];
    grad_bias[j] = Math<T>::down(total);
}

// One d_pre kernel per (activation, element): linear_d<activation>_<element>. The list is the
// linear contract's activation table's `d_pre` entries (tests/test_linear.py checks they agree).
#define OPFACADE_D_PRE_KERNEL(NAME, SUFFIX, T, SLOPES)                                         \
    extern "C" __global__ void __launch_bounds__(256) linear_d##NAME##_##SUFFIX(                 \
        const T* grad_out, const void* aux, T* d_pre, float* partials, i64 rows, int n,          \
        i64 ld_grad, i64 ld_aux, i64 ld_pre, int rows_per_chunk, int vec) {                       \
        activation_grad<T, SLOPES>(grad_out, aux, d_pre, partials, rows, n, ld_grad, ld_aux,     \
                                   ld_pre, rows_per_chunk, vec);                                 \
    }

#define OPFACADE_LINEAR_GRAD_KERNELS(SUFFIX, T)                                                  \
    OPFACADE_D_PRE_KERNEL(gelu_tanh, SUFFIX, T, FromPre<GeluTanh>)                               \
    OPFACADE_D_PRE_KERNEL(gelu_erf, SUFFIX, T, FromPre<GeluErf>)                                 \
    OPFACADE_D_PRE_KERNEL(silu, SUFFIX, T, FromPre<Silu>)                                        \
    OPFACADE_D_PRE_KERNEL(relu, SUFFIX, T, FromReluMask)                                         \
    extern "C" __global__ void __launch_bounds__(256) linear_bias_grad_finalize_##SUFFIX(        \
        const float* partials, T* grad_bias, int n, int chunks) {                                 \
        bias_grad_finalize<T>(partials, grad_bias, n, chunks);                                    \
    }

OPFACADE_LINEAR_GRAD_KERNELS(f32, float)
OPFACADE_LINEAR_GRAD_KERNELS(f16, f16_t)
OPFACADE_LINEAR_GRAD_KERNELS(bf16, bf16_t)
