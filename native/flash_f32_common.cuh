// What every true-f32 flash kernel shares (flash_f32.cu, which lists the kernels and states
// the layouts, masks and precision; flash_f32_dmma.cuh): the problem as the kernels receive it,
// addressing and masks, shared-memory tiles and their copies, the products on CUDA cores and on
// sm_90's FP64 tensor cores, and the online softmax's fold and block tests.
#pragma once
#include "common.cuh"

namespace {

// Threads a CTA. The dK/dV CTAs (and the forward's but the wide one: ForwardShape) run
// 128 threads, each with twice the outputs a 256-thread CTA's threads hold: a third fewer
// shared-memory loads per FMA, and up to 255 registers where two 256-thread CTAs an SM allow 128.
constexpr int kDkdvThreads = 128, kDeltaThreads = 256;

// CTAs of the forward and of dK/dV an SM holds: three where D and Dv are at most 64 (registers
// capped at 168), else two. On an H100 three made the d64 forward 5% faster and the d64 backward
// 4% (12% causal); at d128 they spilled and ran 5-25% slower, and from d96 up three CTAs do not
// fit in shared memory.
constexpr int ctas_per_sm(int d, int dv) { return d <= 64 && dv <= 64 ? 3 : 2; }
constexpr int kPad = 4;  // floats appended to every shared row

// The query and key blocks of each kernel (the forward's: ForwardShape).
constexpr int kDkdvKeys = 64, kDkdvRows = 32;
constexpr int kDeltaRows = 64;

// A tensor's rows: element (b, h, token t, d) is at at(b, h, t)[d].
template <typename T>
struct Rows {
    T* base;
    i64 batch, tok, head;
    __device__ __forceinline__ T* at(int b, int h, i64 t) const {
        return base + t * tok + h * head + b * batch;
    }
};

// What every kernel is told about the problem (host ints and floats, and the offsets arrays).
struct Problem {
    const int* cu_q;   // null for dense
    const int* cu_kv;  // null for dense
    int group;         // Hq / Hkv
    int max_q, max_kv;  // dense: Sq and Skv; varlen: the bucket (rows past it are not computed)
    i64 total_q, total_kv;  // varlen: rows of the packed q and k tensors
    float scale;
    int causal;  // 0 none, 1 top-left, 2 bottom-right
    int left, right;  // window sides, negative for unbounded
    int vec;  // every base and row stride allows 16-byte copies (checked on the host)
};

// One sequence's rows of a tensor: row0 is where it starts, len how many rows it has.
struct Span {
    i64 row0;
    int len;
};

// Sequence b: dense rows [0, max_len) of batch entry b, or varlen rows cu[b]..cu[b+1]-1 clamped
// into [0, total) and to max_len (64-bit, so no offsets can overflow the arithmetic).
__device__ __forceinline__ Span sequence(const int* cu, int b, int max_len, i64 total) {
    if (cu == nullptr) return {0, max_len};
    const i64 first = min(max((i64)cu[b], (i64)0), total);
    const i64 len = min(min((i64)cu[b + 1] - first, total - first), (i64)max_len);
    return {first, (int)max(len, (i64)0)};
}

// The keys row i may attend to form [lo(i), hi(i)], empty when hi < lo. Both bounds never
// decrease with i, so a block of rows needs keys [lo(first row), hi(last row)] only.
struct Mask {
    int len_q, len_kv;
    i64 diag;  // the diagonal offset d
    bool causal;
    int left, right;

    __device__ __forceinline__ int lo(int i) const {
        if (left < 0) return 0;
        return (int)min(max((i64)i + diag - left, (i64)0), (i64)len_kv);
    }
    __device__ __forceinline__ int hi(int i) const {
        if (i >= len_q) return -1;
        i64 last = len_kv - 1;
        if (causal) last = min(last, (i64)i + diag);
        if (right >= 0) last = min(last, (i64)i + diag + right);
        return (int)max(last, (i64)-1);
    }
    // The first row whose keys reach key j0 (hi(i) >= j0), and the last whose keys start at or
    // before key j1 (lo(i) <= j1): the rows a key block [j0, j1] can receive gradient from.
    __device__ __forceinline__ int first_row(int j0) const {
        i64 first = 0;
        if (causal) first = max(first, (i64)j0 - diag);
        if (right >= 0) first = max(first, (i64)j0 - diag - right);
        return (int)min(first, (i64)len_q);
    }
    __device__ __forceinline__ int last_row(int j1) const {
        i64 last = len_q - 1;
        if (left >= 0) last = min(last, (i64)j1 + left - diag);
        return (int)max(last, (i64)-1);
    }
};

__device__ __forceinline__ Mask make_mask(const Problem& p, int len_q, int len_kv) {
    const i64 diag = p.causal == 2 ? (i64)len_kv - len_q : 0;
    return {len_q, len_kv, diag, p.causal != 0, p.left, p.right};
}

__device__ __forceinline__ float minus_infinity() { return __int_as_float(0xff800000); }

// The softmax works in base 2: scores are scaled by scale * log2(e), so each exponential is
// one exp2f (an FSETP, a MUFU.EX2 and two guarded FMULs for the denormal range, where expf takes
// eight instructions). On an H100 that made the forward 7-10% faster; the results moved by at
// most 2e-6 of their largest magnitude, and the float64 checks hold as before.
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// The tiles live in dynamic shared memory sized by the launcher; one launched with less than
// the kernel carves up would corrupt silently, so it stops the kernel instead.
template <int FLOATS>
__device__ __forceinline__ float* shared_tiles() {
    extern __shared__ float4 shared[];
    unsigned bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    if (bytes < FLOATS * sizeof(float)) __trap();
    return reinterpret_cast<float*>(shared);
}

// The first query row of a forward CTA. The grid is (heads, batch, query blocks) and the GPU
// starts CTAs in linear index order, x fastest, so with the query block slowest and the last
// first, every head's late query blocks, which under a causal mask see the most keys, start
// before any earlier block. With the query block in x, the blocks were ordered within each head
// only, and the heaviest CTAs of the last heads started at the grid's end.
__device__ __forceinline__ int query_block_start(int rows) {
    return (gridDim.z - 1 - blockIdx.z) * rows;
}

// A forward CTA's rows: sequence b, query head h and its kv head hk, first row i0 of query
// sequence sq (grid (heads, batch, query blocks), as the launcher builds it).
struct QueryBlock {
    int b, h, hk, i0;
    Span sq;
};

__device__ __forceinline__ QueryBlock query_block(int rows, const Problem& p) {
    const int b = blockIdx.y, h = blockIdx.x;
    return {b, h, h / p.group, query_block_start(rows), sequence(p.cu_q, b, p.max_q, p.total_q)};
}

// ---------------------------------------------------------------------------------- copies

__device__ __forceinline__ unsigned shared_address(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void copy_async16(float* dst, const float* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(dst)),
                 "l"(src) : "memory");
}

__device__ __forceinline__ void copy_async4(float* dst, const float* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(shared_address(dst)),
                 "l"(src) : "memory");
}

__device__ __forceinline__ void copy_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most `pending` of this thread's newest copy groups are still in flight.
template <int pending>
__device__ __forceinline__ void copy_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

// Rows [first, first + ROWS) of a sequence's (b, h) slice into a ROWS x COLS tile (row stride
// COLS + PAD), as this thread's share of cp.async copies. Rows at or past `len` become zeros:
// nothing past the sequence is read, and masked scores meet finite values.
template <int ROWS, int COLS, int THREADS, int PAD = kPad>
__device__ __forceinline__ void load_tile(float* tile, const Rows<const float>& src, int b, int h,
                                          const Span& s, int first, bool vec) {
    constexpr int kChunks = COLS / 4;  // 16-byte copies a row
    if (vec && THREADS % kChunks == 0) {
        // Each thread copies one column chunk of every kStep-th row, so its source and
        // destination only step by constants: a few instructions a copy, where dividing a flat
        // index into row and column took a dozen (the loads were a fifth of the forward's
        // non-FMA instructions).
        constexpr int kStep = THREADS / kChunks;
        const int r0 = threadIdx.x / kChunks, c = (threadIdx.x % kChunks) * 4;
        const float* from = src.at(b, h, s.row0 + first + r0) + c;
        float* to = tile + r0 * (COLS + PAD) + c;
#pragma unroll
        for (int r = 0; r < ROWS; r += kStep) {
            if (ROWS % kStep != 0 && r0 + r >= ROWS) break;
            float* dst = to + r * (COLS + PAD);
            if (first + r0 + r < s.len) {
                copy_async16(dst, from + r * src.tok);
            } else {
                *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
    } else if (vec) {
        for (int e = threadIdx.x; e < ROWS * kChunks; e += THREADS) {
            const int r = e / kChunks, c = (e - r * kChunks) * 4;
            float* dst = tile + r * (COLS + PAD) + c;
            if (first + r < s.len) {
                copy_async16(dst, src.at(b, h, s.row0 + first + r) + c);
            } else {
                *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
    } else {
        for (int e = threadIdx.x; e < ROWS * COLS; e += THREADS) {
            const int r = e / COLS, c = e - r * COLS;
            float* dst = tile + r * (COLS + PAD) + c;
            if (first + r < s.len) copy_async4(dst, src.at(b, h, s.row0 + first + r) + c);
            else *dst = 0.0f;
        }
    }
}

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
        double acc[G][4][4] = {};
#pragma unroll U
        for (int kk = 0; kk < D; kk += 16) {
            double a[8];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                a[2 * i] = qa[kk + 4 * i];
                a[2 * i + 1] = qa[8 * LD + kk + 4 * i];
            }
#pragma unroll
            for (int n = 0; n < 4 * G; ++n) {
                double b[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) b[i] = kb[n * 8 * LD + kk + 4 * i];
                dmma_16x8x16(acc[n / 4][n % 4], a, b);
            }
        }
#pragma unroll
        for (int p = 0; p < G; ++p) {
#pragma unroll
            for (int n = 0; n < 4; ++n) {
                *reinterpret_cast<float2*>(ex + g * kExchangeLd + 8 * n + 2 * t) =
                    make_float2((float)acc[p][n][0], (float)acc[p][n][1]);
                *reinterpret_cast<float2*>(ex + (g + 8) * kExchangeLd + 8 * n + 2 * t) =
                    make_float2((float)acc[p][n][2], (float)acc[p][n][3]);
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

// ------------------------------------------------------------------- softmax folds and masks

// Moves a row's running max m to m_new (this block's scores included) and turns this thread's
// scores s of the block into p = exp2(s - m_new), adding them to its share l of the sum; returns
// alpha, the factor the row's earlier sums p v are to be scaled by, in their type A (f32 in the
// FMA forwards, f64 in the DMMA forward's fragments). A row without keys so far (m_new = -inf)
// keeps l = 0 and gets p = 0, never (-inf) - (-inf).
template <typename A, int C>
__device__ __forceinline__ A fold_block(float (&s)[C], float& m, float& l, float m_new) {
    const float base = m_new == minus_infinity() ? 0.0f : m_new;
    const A alpha = exp2f(m - base);
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        s[c] = exp2f(s[c] - base);
        sum += s[c];
    }
    l = fmaf(l, (float)alpha, sum);
    m = m_new;
    return alpha;
}

// The row's log-sum-exp in natural log from its running max m (base 2) and its sum, -inf for a
// row without keys.
__device__ __forceinline__ float row_lse(float m, float sum) {
    return sum > 0.0f ? fmaf(m, kLn2, logf(sum)) : minus_infinity();
}

// Whether every key of block [j0, j0 + keys) is allowed for every row of [i0, i_last]: the
// bounds never decrease with the row, so the block's first row must reach its last key and its
// last row must start by its first key. Rows past the sequence hold zeros and are never
// written, so they need no mask either.
__device__ __forceinline__ bool whole_block(const Mask& mask, int i0, int i_last, int j0,
                                            int keys) {
    return mask.lo(i_last) <= j0 && mask.hi(i0) >= j0 + keys - 1;
}

// body(Masked<false>()) for a block the mask leaves whole, else body(Masked<true>()): the one
// place a kernel picks the masked or the mask-free instantiation of a block's step.
template <bool B>
struct Masked {
    static constexpr bool value = B;
};

template <typename Body>
__device__ __forceinline__ void with_mask(bool whole, Body&& body) {
    if (whole) {
        body(Masked<false>());
    } else {
        body(Masked<true>());
    }
}

// The key blocks [first, last] that rows [i0, i_last] need (last < first when none).
__device__ __forceinline__ int2 key_blocks(const Mask& mask, int i0, int i_last, int keys) {
    const int j_lo = mask.lo(i0), j_hi = mask.hi(i_last);
    return make_int2(j_lo / keys, j_hi >= j_lo ? j_hi / keys : j_lo / keys - 1);
}

}  // namespace
