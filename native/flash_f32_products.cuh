// The true-f32 flash kernels' tile products: on CUDA cores (f32 FMA) and, for sm_90, on the
// FP64 tensor cores (dmma_16x8x16, dot_rows_dmma). Used by flash_f32.cu and flash_f32_dmma.cuh.
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

// The scores on sm_90's FP64 tensor cores (the MMA forwards). An m16n8k16 f64 product runs at
// the rate of f32 FMA on CUDA cores (66 TFLOP/s each on an H100, scripts/dmma_probe.py), but in
// one issue slot where FFMA takes 64: Q K^T moves off the FMA pipe, which is left to P V and the
// softmax. The f32 inputs are exact in f64 and every product and sum of a score is f64, rounded
// once to f32: at least as accurate as the FFMA chain of dot_rows, but not the same bits.
constexpr int kScorePass = 32;               // keys a warp's pass covers: four 16 x 8 tiles
constexpr int kExchangeLd = kScorePass + 2;  // = 2 mod 4: half-warps read rows 8 apart, no
                                             // bank conflict
constexpr int kExchangeFloats = 16 * kExchangeLd;  // a warp's tile of 16 rows x one pass

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

// How many 32-key passes share each k-step's Q operands (GROUP: all of them where D <= 64),
// and how far the k-steps unroll. H100, B4 H16 S2048 (scripts/f32_time.py, one call): at d64
// all passes at once, unrolled 4, ran 1.636 ms against 1.748 for one pass at a time, unrolled 2
// (causal 0.841 against 0.873); at d128 that lost (3.364 against 3.288 ms), as did unrolling 4 or
// 8 alone (3.435, 3.377).
template <int C, int D>
struct DmmaPasses {
    static constexpr int GROUP = D <= 64 ? C / 2 : 1, UNROLL = D <= 64 ? 4 : 2;
};

// s[r][c] = Q[row0 + r] . K[tx + 16 c] over D, in dot_rows's layout (thread (ty, tx), row0 =
// ty * R), for CTAs whose warp w holds rows 16w..16w+15 (R = 8: half-warp h of it rows 8h..).
// Warp w multiplies its 16 rows by the keys in passes of 32 (16 f64 accumulators a lane; lane
// (g, t) = (lane / 4, lane % 4) holds rows g and g + 8, keys 8n + 2t and 8n + 2t + 1 of tile n,
// the PTX fragment layout) and hands each pass's scores to the lanes that own them through its
// own exchange tile in shared memory. Operands are read as f32 from the row-major Q and K tiles
// (row stride D + kPad: the 32 lanes of each load hit 32 banks) and widened to f64.
template <int R, int C, int D>
__device__ __forceinline__ void dot_rows_dmma(float (&s)[R][C], const float* q, const float* k,
                                              float* exchange) {
    static_assert(R == 8 && C % 2 == 0 && D % 16 == 0, "16-row warps, 32-key passes");
    constexpr int LD = D + kPad, G = DmmaPasses<C, D>::GROUP, U = DmmaPasses<C, D>::UNROLL;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int h = lane >> 4, tx = lane & 15;
    const float* qa = q + ((threadIdx.x >> 5) * 16 + g) * LD + t;
    float* ex = exchange + (threadIdx.x >> 5) * kExchangeFloats;
#pragma unroll
    for (int first = 0; first < C / 2; first += G) {
        const float* kb = k + (first * kScorePass + g) * LD + t;
        double acc[4 * G][4] = {};
#pragma unroll U
        for (int kk = 0; kk < D; kk += 16) dmma_k_step<4 * G, LD>(acc, qa, kb, kk);
#pragma unroll
        for (int p = 0; p < G; ++p) {
#pragma unroll
            for (int n = 0; n < 4; ++n) {
                *reinterpret_cast<float2*>(ex + g * kExchangeLd + 8 * n + 2 * t) =
                    make_float2((float)acc[4 * p + n][0], (float)acc[4 * p + n][1]);
                *reinterpret_cast<float2*>(ex + (g + 8) * kExchangeLd + 8 * n + 2 * t) =
                    make_float2((float)acc[4 * p + n][2], (float)acc[4 * p + n][3]);
            }
            __syncwarp();
            const int pass = first + p;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                s[r][2 * pass] = ex[(8 * h + r) * kExchangeLd + tx];
                s[r][2 * pass + 1] = ex[(8 * h + r) * kExchangeLd + 16 + tx];
            }
            __syncwarp();  // read before the next pass overwrites it
        }
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
