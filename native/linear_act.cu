// The linear forward's activation as its own pass, for the activations cuBLASLt has no epilogue
// for (exact GELU, SiLU): out = act(pre), where a cublasLtMatmul has just written
// pre = x @ W + bias (+ residual) either into out itself (in place) or into the saved aux.
//
// `batch` entries of `m` rows of `n` columns; row r of entry b starts at b * batch_* + r * ld_*
// (in elements), so padded rows and gapped batch entries work (the host folds a contiguous batch
// into rows). A block's threads are split into rows of 2^row_shift lanes (the host picks 32-256
// lanes, the row's width in 16-byte packs, so a block reads long contiguous runs); lane l of a
// row covers pack (blockIdx.x << row_shift) + l. The grid's y blocks stride over the rows, its z
// blocks over the batch. One row per step: more loads in flight per thread measured slower on an
// H100, and no integer division (a 64-bit one per row cost as much as the activation). Each
// element is read and written by the same thread, so in place is safe (no __restrict__). act runs
// in float on pre as stored (already rounded to T), then rounds once to T.
#include "common.cuh"
#include "activations.cuh"

template <typename T, typename Act>
__device__ __forceinline__ void activation_forward(const T* pre, T* out, i64 batch, i64 m, int n,
                                                   i64 ld_pre, i64 batch_pre, i64 ld_out,
                                                   i64 batch_out, int row_shift, int vec) {
    constexpr int P = Pack<T>::N;
    const int lane = threadIdx.x & ((1 << row_shift) - 1);
    const int j0 = ((blockIdx.x << row_shift) + lane) * P;
    if (j0 >= n) return;
    const int rows_per_block = blockDim.x >> row_shift;
    const i64 step = (i64)gridDim.y * rows_per_block;
    const i64 start = (i64)blockIdx.y * rows_per_block + (threadIdx.x >> row_shift);
    for (i64 b = blockIdx.z; b < batch; b += gridDim.z) {
        const T* pre_b = pre + b * batch_pre;
        T* out_b = out + b * batch_out;
        for (i64 r = start; r < m; r += step) {
            Pack<T> x;
            load_pack(x, pre_b + r * ld_pre, j0, n, vec);
#pragma unroll
            for (int e = 0; e < P; ++e) x.v[e] = Math<T>::down(Act::value(Math<T>::up(x.v[e])));
            store_pack(x, out_b + r * ld_out, j0, n, vec);
        }
    }
}

// One kernel per (activation, element): linear_<activation>_<element>. The list is the linear
// contract's activation table's `act_pass` entries (tests/test_linear.py checks they agree).
#define OPFACADE_ACT_KERNEL(NAME, SUFFIX, T, ACT)                                               \
    extern "C" __global__ void __launch_bounds__(256) linear_##NAME##_##SUFFIX(                  \
        const T* pre, T* out, i64 batch, i64 m, int n, i64 ld_pre, i64 batch_pre, i64 ld_out,   \
        i64 batch_out, int row_shift, int vec) {                                                \
        activation_forward<T, ACT>(pre, out, batch, m, n, ld_pre, batch_pre, ld_out, batch_out, \
                                   row_shift, vec);                                             \
    }

#define OPFACADE_LINEAR_ACT_KERNELS(SUFFIX, T)                                                  \
    OPFACADE_ACT_KERNEL(gelu_erf, SUFFIX, T, GeluErf)                                           \
    OPFACADE_ACT_KERNEL(silu, SUFFIX, T, Silu)

OPFACADE_LINEAR_ACT_KERNELS(f32, float)
OPFACADE_LINEAR_ACT_KERNELS(f16, f16_t)
OPFACADE_LINEAR_ACT_KERNELS(bf16, bf16_t)
