// The true-f32 flash kernels' tile products: on CUDA cores (f32 FMA) and, for sm_90, on the
// FP64 tensor cores (dmma_16x8x16). Used by the forward and backward headers beside it.
#pragma once
#include "flash_f32_common.cuh"

namespace {

// ---------------------------------------------------------------------------------- products

// The N / 16 columns of an N-wide row that thread tx owns in output-shaped products: M groups
// of VW adjacent columns at VW * tx + 16 * VW * m, so 16 threads read one contiguous span.
template <int N>
struct Cols {
    static constexpr int VW = N % 64 == 0 ? 4 : 2;
    static constexpr int M = N / (16 * VW);
    static __device__ __forceinline__ int col(int tx, int m) { return VW * tx + 16 * VW * m; }
};

template <int N>
__device__ __forceinline__ void load_cols(float (&x)[N / 16], const float* row, int tx) {
#pragma unroll
    for (int m = 0; m < Cols<N>::M; ++m) {
        const float* p = row + Cols<N>::col(tx, m);
        if constexpr (Cols<N>::VW == 4) {
            const float4 v = *reinterpret_cast<const float4*>(p);
            x[4 * m] = v.x, x[4 * m + 1] = v.y, x[4 * m + 2] = v.z, x[4 * m + 3] = v.w;
        } else {
            const float2 v = *reinterpret_cast<const float2*>(p);
            x[2 * m] = v.x, x[2 * m + 1] = v.y;
        }
    }
}

// Writes this thread's columns of one output row to global memory.
template <int N>
__device__ __forceinline__ void store_cols(float* row, const float (&x)[N / 16], int tx,
                                           bool vec) {
#pragma unroll
    for (int m = 0; m < Cols<N>::M; ++m) {
        float* p = row + Cols<N>::col(tx, m);
        const float* y = x + Cols<N>::VW * m;
        if (vec && Cols<N>::VW == 4) {
            *reinterpret_cast<float4*>(p) = make_float4(y[0], y[1], y[2], y[3]);
        } else if (vec) {
            *reinterpret_cast<float2*>(p) = make_float2(y[0], y[1]);
        } else {
#pragma unroll
            for (int v = 0; v < Cols<N>::VW; ++v) p[v] = y[v];
        }
    }
}

// x *= factor, element by element: the softmax scale of dQ and dK, applied once at the end.
template <int N>
__device__ __forceinline__ void scale_cols(float (&x)[N], float factor) {
#pragma unroll
    for (int n = 0; n < N; ++n) x[n] *= factor;
}

// Writes an R x C register tile (rows a_row + r, columns tx + 16 c) into a shared tile of
// row stride LD: the layout the score-shaped products produce.
template <int R, int C, int LD>
__device__ __forceinline__ void store_scores(float* tile, const float (&x)[R][C], int a_row,
                                             int tx) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int c = 0; c < C; ++c) tile[(a_row + r) * LD + tx + 16 * c] = x[r][c];
    }
}

__device__ __forceinline__ void fma4(float& acc, const float4& a, const float4& b) {
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    acc = fmaf(a.w, b.w, acc);
}

// acc[r][c] += A[a_row + r] . B[tx + 16 c] over K: the score-shaped products (Q K^T, dO V^T),
// both operands row-major tiles of K columns. Every element is one fma chain in k order, so
// the same scores come out bit for bit whatever R and C the kernel uses.
template <int R, int C, int K>
__device__ __forceinline__ void dot_rows(float (&acc)[R][C], const float* a, const float* b,
                                         int a_row, int tx) {
    constexpr int LD = K + kPad;
#pragma unroll 4
    for (int k = 0; k < K; k += 4) {
        float4 av[R], bv[C];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            av[r] = *reinterpret_cast<const float4*>(a + (a_row + r) * LD + k);
        }
#pragma unroll
        for (int c = 0; c < C; ++c) {
            bv[c] = *reinterpret_cast<const float4*>(b + (tx + 16 * c) * LD + k);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int c = 0; c < C; ++c) fma4(acc[r][c], av[r], bv[c]);
        }
    }
}

// Products on sm_90's FP64 tensor cores (the DMMA forward, the backward's *_mma kernels). An
// m16n8k16 f64 product runs at the rate of f32 FMA on CUDA cores (66 TFLOP/s each on an H100,
// scripts/dmma_probe.py), but in one issue slot where FFMA takes 64. The f32 inputs are exact in
// f64 and every product and sum is f64, rounded once to f32: at least as accurate as the FFMA
// chains, but not the same bits.
__device__ __forceinline__ void dmma_16x8x16(double (&c)[4], const double (&a)[8],
                                             const double (&b)[4]) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, {%0,%1,%2,%3};\n"
        : "+d"(c[0]), "+d"(c[1]), "+d"(c[2]), "+d"(c[3])
        : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]), "d"(a[7]),
          "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
#else
    __trap();  // the host launches MMA kernels on sm_90 only
#endif
}

// One k-step (columns kk.. kk + 15) of a warp's 16 rows against N 8-key tiles: A's rows g and
// g + 8 from `qa` (row stride LD), B's key g of tile n from `kb` + 8 n LD, k-slot t + 4i at
// column kk + 4i (both pointers already offset by t), the PTX fragment order.
template <int N, int LD>
__device__ __forceinline__ void dmma_k_step(double (&acc)[N][4], const float* qa,
                                            const float* kb, int kk) {
    double a[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        a[2 * i] = qa[kk + 4 * i];
        a[2 * i + 1] = qa[8 * LD + kk + 4 * i];
    }
#pragma unroll
    for (int n = 0; n < N; ++n) {
        double b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) b[i] = kb[n * 8 * LD + kk + 4 * i];
        dmma_16x8x16(acc[n], a, b);
    }
}

// The backward's S = Q K^T and dP = dO V^T (the dK/dV CTA's 32 x 64 tile) on sm_90's FP64
// tensor cores, for its *_mma kernels: the FMA pipe is left to dV, dK and dQ, and each score is
// an f64 sum of exact products rounded once to f32, as the DMMA forward takes it. Warp w
// multiplies rows 16 (w % 2).. by keys 32 (w / 2).. (lane (g, t) holds rows g and g + 8, keys
// 8n + 2t and 8n + 2t + 1 of tile n, the PTX layout; k-slot t + 4i holds column kk + t + 4i:
// scalar loads without bank conflicts at row stride D + kPad), then hands the tile to dot_rows's
// owners (thread (ty, tx): rows ty R.., keys tx + 16c) through `tile` (rows of kDkdvKeys + kPad
// floats), which must be free; it is free again on return. scripts/emulate_dkdv_scores.py
// transcribes the indexing.
template <int R, int C, int D>
__device__ __forceinline__ void scores_dmma(float (&s)[R][C], const float* a_tile,
                                            const float* b_tile, float* tile) {
    static_assert(kDkdvRows == 32 && kDkdvKeys == 64 && kDkdvThreads == 128 && C == 4,
                  "four warps over a 32 x 64 tile");
    constexpr int LD = D + kPad, LS = kDkdvKeys + kPad;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, w = threadIdx.x >> 5;
    const int row0 = (w % 2) * 16, key0 = (w / 2) * 32;
    const float* qa = a_tile + (row0 + g) * LD + t;
    const float* kb = b_tile + (key0 + g) * LD + t;
    double acc[4][4] = {};
#pragma unroll 2
    for (int kk = 0; kk < D; kk += 16) dmma_k_step<4, LD>(acc, qa, kb, kk);
#pragma unroll
    for (int n = 0; n < 4; ++n) {
        const int col = key0 + 8 * n + 2 * t;
        *reinterpret_cast<float2*>(tile + (row0 + g) * LS + col) =
            make_float2((float)acc[n][0], (float)acc[n][1]);
        *reinterpret_cast<float2*>(tile + (row0 + g + 8) * LS + col) =
            make_float2((float)acc[n][2], (float)acc[n][3]);
    }
    __syncthreads();
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int c = 0; c < C; ++c) s[r][c] = tile[(ty * R + r) * LS + tx + 16 * c];
    }
    __syncthreads();
}

// acc[r][n] += sum over k of A[a_row + r][k] * B[k][col n]: A row-major with row stride LDA
// (P or dS, rows = queries), B a row-major tile of N columns (V, or K for dQ).
template <int R, int N, int K, int LDA>
__device__ __forceinline__ void mul_rows(float (&acc)[R][N / 16], const float* a, const float* b,
                                         int a_row, int tx) {
#pragma unroll 4
    for (int k = 0; k < K; k += 4) {
        float av[R][4];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float4 v = *reinterpret_cast<const float4*>(a + (a_row + r) * LDA + k);
            av[r][0] = v.x, av[r][1] = v.y, av[r][2] = v.z, av[r][3] = v.w;
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            float bv[N / 16];
            load_cols<N>(bv, b + (k + kk) * (N + kPad), tx);
#pragma unroll
            for (int r = 0; r < R; ++r) {
#pragma unroll
                for (int n = 0; n < N / 16; ++n) acc[r][n] = fmaf(av[r][kk], bv[n], acc[r][n]);
            }
        }
    }
}

// acc[r][n] += sum over k of A[k][a_col + r] * B[k][col n] for r < R (a multiple of 4): A
// row-major with row stride LDA read down its columns (P^T, dS^T: rows = keys), B a row-major
// tile of N columns.
template <int R, int N, int K, int LDA>
__device__ __forceinline__ void mul_cols(float (&acc)[R][N / 16], const float* a, const float* b,
                                         int a_col, int tx) {
#pragma unroll 8
    for (int k = 0; k < K; ++k) {
        float av[R];
#pragma unroll
        for (int r = 0; r < R; r += 4) {
            const float4 v = *reinterpret_cast<const float4*>(a + k * LDA + a_col + r);
            av[r] = v.x, av[r + 1] = v.y, av[r + 2] = v.z, av[r + 3] = v.w;
        }
        float bv[N / 16];
        load_cols<N>(bv, b + k * (N + kPad), tx);
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int n = 0; n < N / 16; ++n) acc[r][n] = fmaf(av[r], bv[n], acc[r][n]);
        }
    }
}

// Reductions over the 16 threads of a half-warp (one row of scores), in a fixed butterfly:
// every lane ends with the same bits.
__device__ __forceinline__ float half_warp_max(float x) {
#pragma unroll
    for (int offset = 8; offset > 0; offset >>= 1) {
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    }
    return x;
}

__device__ __forceinline__ float half_warp_sum(float x) {
#pragma unroll
    for (int offset = 8; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

}  // namespace
