// The linear forward's activation as its own pass, for the activations cuBLASLt has no epilogue
// for (exact GELU, SiLU): out = act(pre), where a cublasLtMatmul has just written
// pre = x @ W + bias (+ residual) either into out itself (in place) or into the saved aux.
//
// Rows are batch * M rows of N columns; row r of batch entry b starts at b * batch + r * ld (in
// elements), so padded rows and gapped batch entries work. A block covers one tile of 32 packs of
// columns (16 bytes of T per lane); its 8 warps take rows round robin, the grid's y blocks striding
// over all rows. Each element is read and written by the same thread, so in place is safe (no
// __restrict__). act runs in float on pre as stored (already rounded to T), then rounds once to T.
#include "common.cuh"
#include "activations.cuh"

#define OPFACADE_WARPS 8

template <typename T, typename Act>
__device__ __forceinline__ void activation_forward(const T* pre, T* out, i64 rows, i64 m, int n,
                                                   i64 ld_pre, i64 batch_pre, i64 ld_out,
                                                   i64 batch_out, int vec) {
    constexpr int P = Pack<T>::N;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j0 = (blockIdx.x * 32 + lane) * P;
    if (j0 >= n) return;
    for (i64 row = (i64)blockIdx.y * OPFACADE_WARPS + warp; row < rows;
         row += (i64)gridDim.y * OPFACADE_WARPS) {
        const i64 b = row / m, r = row - b * m;
        Pack<T> x;
        load_pack(x, pre + b * batch_pre + r * ld_pre, j0, n, vec);
#pragma unroll
        for (int e = 0; e < P; ++e) x.v[e] = Math<T>::down(Act::value(Math<T>::up(x.v[e])));
        store_pack(x, out + b * batch_out + r * ld_out, j0, n, vec);
    }
}

// One kernel per (activation, element): linear_<activation>_<element>.
#define OPFACADE_ACT_KERNEL(NAME, SUFFIX, T, ACT)                                               \
    extern "C" __global__ void __launch_bounds__(256) linear_##NAME##_##SUFFIX(                  \
        const T* pre, T* out, i64 rows, i64 m, int n, i64 ld_pre, i64 batch_pre, i64 ld_out,    \
        i64 batch_out, int vec) {                                                               \
        activation_forward<T, ACT>(pre, out, rows, m, n, ld_pre, batch_pre, ld_out, batch_out,  \
                                   vec);                                                        \
    }

#define OPFACADE_LINEAR_ACT_KERNELS(SUFFIX, T)                                                  \
    OPFACADE_ACT_KERNEL(gelu_erf, SUFFIX, T, GeluErf)                                           \
    OPFACADE_ACT_KERNEL(silu, SUFFIX, T, Silu)

OPFACADE_LINEAR_ACT_KERNELS(f32, float)
OPFACADE_LINEAR_ACT_KERNELS(f16, f16_t)
OPFACADE_LINEAR_ACT_KERNELS(bf16, bf16_t)
