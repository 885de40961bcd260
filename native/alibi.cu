// ALiBi forward and backward over [B, H, Q, K] tensors with unit stride along K.
//
//   forward   Y[b,h,i,j] = A[b,h,i,j] + slope[h] * (j - i)       (Y may be A: in place)
//   backward  dA = dY;  dslope[h] = sum over b,i,j of dY[b,h,i,j] * (j - i)
//
// Both are memory bound: one warp walks one row at a time in 16-byte packs, UNROLL packs in flight
// per lane. The dslope reduction is deterministic and bit-stable: block (chunk, h) sums a fixed
// range of rows of head h in a fixed per-thread order, writes one partial to the workspace, and a
// second kernel adds each head's partials in a fixed tree. Launch shapes depend only on the
// problem (never on the device or the pointers), and no atomics are used.
#include "common.cuh"

#ifndef UNROLL
// 16-byte packs in flight per lane. Measured on an H100 (B8 H32 2048x2048): 8 gives 91-93% of
// copy bandwidth where 4 gave 89-91%; the evict-first hint (OPFACADE_STREAMING) gave no
// consistent gain and stays off. -DUNROLL=N overrides it for tuning runs.
#define UNROLL 8
#endif

template <typename T>
__device__ __forceinline__ void alibi_forward(
    const T* __restrict__ in_base, T* out_base, const typename Math<T>::compute* slopes,
    i64 rows, int heads, int qlen, int klen,
    i64 in_sb, i64 in_sh, i64 in_sq, i64 out_sb, i64 out_sh, i64 out_sq, int vec) {
    typedef typename Math<T>::compute C;
    constexpr int V = Pack<T>::N;
    const int lane = threadIdx.x & 31;
    const i64 first_warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const i64 warp_stride = ((i64)gridDim.x * blockDim.x) >> 5;
    const int packs = (klen + V - 1) / V;
    for (i64 row = first_warp; row < rows; row += warp_stride) {
        const int i = (int)(row % qlen);
        const i64 bh = row / qlen;
        const int h = (int)(bh % heads);
        const i64 b = bh / heads;
        const T* src = in_base + b * in_sb + h * in_sh + i * in_sq;
        T* dst = out_base + b * out_sb + h * out_sh + i * out_sq;
        const C slope = slopes[h];
        for (int p0 = lane; p0 < packs; p0 += 32 * UNROLL) {
            Pack<T> buf[UNROLL];
            load_lane_packs(buf, src, p0, packs, klen, vec);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int p = p0 + 32 * u;
                if (p >= packs) continue;
                // One int-to-float per pack; the rest are exact adds (|j - i| < 2^24).
                const C first = (C)(p * V - i);
#pragma unroll
                for (int n = 0; n < V; ++n) {
                    const C distance = first + (C)n;
                    buf[u].v[n] = Math<T>::down(fma(slope, distance, Math<T>::up(buf[u].v[n])));
                }
                store_pack(buf[u], dst, p * V, klen, vec);
            }
        }
    }
}

// Block (chunk, h): rows [chunk * rows_per_chunk, ...) of head h, row r = b * Q + i. Writes
// dA for those rows when d_in is given, and one partial of dslope[h] when partials is given.
template <typename T>
__device__ __forceinline__ void alibi_backward_partials(
    const T* __restrict__ dy_base, T* __restrict__ din_base,
    typename Math<T>::compute* __restrict__ partials,
    int qlen, int klen, i64 rows_per_head, int rows_per_chunk,
    i64 dy_sb, i64 dy_sh, i64 dy_sq, i64 din_sb, i64 din_sh, i64 din_sq, int vec) {
    typedef typename Math<T>::compute C;
    constexpr int V = Pack<T>::N;
    __shared__ C scratch[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int chunk = blockIdx.x, h = blockIdx.y;
    const i64 row_begin = (i64)chunk * rows_per_chunk;
    const i64 row_end = min(row_begin + rows_per_chunk, rows_per_head);
    const int packs = (klen + V - 1) / V;
    // One accumulator per unrolled pack: independent fma chains, so the next loads issue sooner.
    // They are added in a fixed order at the end, which keeps the sum bit-stable.
    C acc[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc[u] = C(0);
    for (i64 row = row_begin + warp; row < row_end; row += warps) {
        const i64 b = row / qlen;
        const int i = (int)(row - b * qlen);
        const T* src = dy_base + b * dy_sb + h * dy_sh + i * dy_sq;
        T* dst = din_base ? din_base + b * din_sb + h * din_sh + i * din_sq : nullptr;
        for (int p0 = lane; p0 < packs; p0 += 32 * UNROLL) {
            Pack<T> buf[UNROLL];
            load_lane_packs(buf, src, p0, packs, klen, vec);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int p = p0 + 32 * u;
                if (p >= packs) continue;
                if (dst) store_pack(buf[u], dst, p * V, klen, vec);
                if (partials) {
                    const C first = (C)(p * V - i);
#pragma unroll
                    for (int n = 0; n < V; ++n) {
                        // Columns past klen were zero-filled by load_pack: they add nothing.
                        acc[u] = fma(Math<T>::up(buf[u].v[n]), first + (C)n, acc[u]);
                    }
                }
            }
        }
    }
    if (partials) {
        C sum = acc[0];
#pragma unroll
        for (int u = 1; u < UNROLL; ++u) sum += acc[u];
        const C total = block_sum(sum, scratch);
        if (threadIdx.x == 0) partials[(i64)h * gridDim.x + chunk] = total;
    }
}

// One block per head adds that head's `chunks` partials: thread t takes t, t + blockDim.x, ...
// in order, then the block sums in a fixed tree.
template <typename C>
__device__ __forceinline__ void alibi_backward_finalize(
    const C* __restrict__ partials, C* __restrict__ d_slopes, int chunks) {
    __shared__ C scratch[32];
    const int h = blockIdx.x;
    C acc = C(0);
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) acc += partials[(i64)h * chunks + c];
    const C total = block_sum(acc, scratch);
    if (threadIdx.x == 0) d_slopes[h] = total;
}

#define OPFACADE_ALIBI_KERNELS(SUFFIX, T)                                                        \
    extern "C" __global__ void __launch_bounds__(256) alibi_forward_##SUFFIX(                    \
        const T* in, T* out, const Math<T>::compute* slopes, i64 rows, int heads, int qlen,       \
        int klen, i64 in_sb, i64 in_sh, i64 in_sq, i64 out_sb, i64 out_sh, i64 out_sq, int vec) { \
        alibi_forward<T>(in, out, slopes, rows, heads, qlen, klen, in_sb, in_sh, in_sq, out_sb,  \
                         out_sh, out_sq, vec);                                                    \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(256) alibi_backward_partials_##SUFFIX(          \
        const T* dy, T* din, Math<T>::compute* partials, int qlen, int klen, i64 rows_per_head,  \
        int rows_per_chunk, i64 dy_sb, i64 dy_sh, i64 dy_sq, i64 din_sb, i64 din_sh,            \
        i64 din_sq, int vec) {                                                                    \
        alibi_backward_partials<T>(dy, din, partials, qlen, klen, rows_per_head, rows_per_chunk, \
                                   dy_sb, dy_sh, dy_sq, din_sb, din_sh, din_sq, vec);            \
    }

OPFACADE_ALIBI_KERNELS(f64, double)
OPFACADE_ALIBI_KERNELS(f32, float)
OPFACADE_ALIBI_KERNELS(f16, f16_t)
OPFACADE_ALIBI_KERNELS(bf16, bf16_t)

extern "C" __global__ void __launch_bounds__(256) alibi_backward_finalize_f64(
    const double* partials, double* d_slopes, int chunks) {
    alibi_backward_finalize<double>(partials, d_slopes, chunks);
}

extern "C" __global__ void __launch_bounds__(256) alibi_backward_finalize_f32(
    const float* partials, float* d_slopes, int chunks) {
    alibi_backward_finalize<float>(partials, d_slopes, chunks);
}
