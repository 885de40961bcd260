// Flash attention in true f32: f32 storage, f32 FMA on CUDA cores (no TF32 or other reduced
// precision anywhere; on sm_90 the forward's scores take f64 products on the FP64 tensor cores,
// and at D = Dv of 32, 64, 96 and 128 its P V too),
// a forward and a deterministic backward, over two layouts that share one address scheme.
//
//   dense   q [B, Hq, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv]   (cu_seqlens null)
//   varlen  q [Tq, Hq, D],    k [Tkv, Hkv, D],    v [Tkv, Hkv, Dv]      (cu_seqlens [B + 1])
//
// Element (b, h, i, d) of a tensor is at base + (row0(b) + i) * tok + h * head + b * batch + d,
// with row0 = cu[b] (batch stride 0) for varlen and row0 = 0 for dense; lse and the backward's
// Delta workspace are addressed the same way with d = 0. Query head h reads kv head h / group.
//
// Masks (per sequence, d = len_kv - len_q bottom-right, else 0): causal keeps j <= i + d; a
// window (left, right) keeps i + d - left <= j <= i + d + right, a negative side unbounded. A
// row with no key gets out = 0, lse = -inf and passes no gradient.
//
// Varlen offsets are not trusted: each sequence's first row and length are clamped into
// [0, total) and to max_seqlen, so garbage cu_seqlens can never move a read or write outside the
// tensors; nothing outside a sequence's clamped rows is read or written.
//
// Kernels (thread t is (ty, tx) = (t / 16, t % 16), so a half-warp shares ty):
//   flash_f32_fwd_d<D>_dv<Dv>       CTA = (64 query rows, head, sequence) of 128 threads; online
//                                   softmax over 64-key blocks, skipping blocks the mask removes
//                                   entirely.
//   flash_f32_fwd_mma_d<D>_dv<Dv>   the same with Q K^T on sm_90's FP64 tensor cores
//                                   (dot_rows_dmma): the FMA pipe is left to P V and the softmax.
//   flash_f32_fwd_dmma_d<D>_dv<D>   Q K^T and P V both on sm_90's FP64 tensor cores, CTAs of 32
//                                   rows and 128 threads, three an SM at D <= 64, else two
//                                   (forward_dmma).
//   flash_f32_fwd_wide_d128_dv128   the 64-row forward over 128 rows and 128-key blocks, 256
//                                   threads, for GPUs other than sm_90 that give a block 198 KiB of
//                                   shared memory (ForwardShape).
//   flash_f32_bwd_delta             Delta_i = rowsum(dO_i * O_i) into the workspace; zeroes dQ
//                                   and the query blocks' turn counters.
//   flash_f32_bwd_dkdv_d<D>_dv<Dv>  CTA = (64 keys, kv head, sequence); loops over the group's
//                                   query heads, then 32-row query blocks, in a fixed order,
//                                   writes dK and dV for its key rows (zeros included) and adds
//                                   each query block's dS K into dQ in its turn.
// dQ sums over key blocks, which different CTAs hold. Rather than recompute the scores in a
// kernel of its own, each CTA adds its share into dQ in key-block order: query block i's turn
// counter holds one past the last key block that added into it, and CTA j waits (spinning on an
// acquire load) until it reaches j, when key block j - 1 also sees block i. The additions are
// L2 reductions, but only one CTA adds into a query block at a time, so the sums run in a fixed
// order and the backward is bitwise reproducible. Waiting on a lower CTA index relies on the GPU
// starting a grid's CTAs in index order (as deterministic FlashAttention 3 does): the CTA waited
// on is then running or done. The backward recomputes the scores as the FMA forwards take them
// (dot_rows, whatever its tile), so there P = exp(s - lse) sees the forward's bits of s; after an
// MMA forward it sees the f32 chain's s against lse from the f64 scores, a few f32 roundings
// apart (the backward's float64 checks hold the same bound).
//
// Shared memory holds row-major tiles padded by 4 floats a row: a float4 read of 16 different
// rows at one column then spreads over all 32 banks. Tiles arrive by cp.async (16-byte copies
// when every base and stride allows, 4-byte copies otherwise), which lets the next V (or K)
// block stream in while the current one is multiplied. At D = Dv = 128 each kernel takes about
// 100 KiB, so two CTAs share an SM; the wide forward takes 198 KiB, one CTA an SM.
//
// NVRTC builds without fast math: exp2f, logf and the divisions here are the precise ones.
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

// ---------------------------------------------------------------------------------- forward

// The forward's query rows and keys a block, threads and CTAs an SM. A thread's score tile is
// (ROWS / (THREADS / 16)) x (KEYS / 16). A 16-byte shared load costs 2 wavefronts when a
// half-warp reads one address (a score tile's row side) and 4 when it reads 16 (its key side;
// scripts/lds_wavefront_probe.py), so an R x C tile needs 2R + 4C wavefronts per 4RC FMAs: 8 x 4
// needs one per 4 FMAs, the very rate an SM issues them at, and 8 x 8 one per 5.3. D = Dv = 128
// also has a WIDE kernel with the 8 x 8 tiles: blocks of 128 x 128 and 256 threads, one CTA an
// SM in 198 KiB, which sm_90 and sm_100 give a block (sm_80, sm_86, sm_89 and sm_120 do not,
// and run the other). On an H100 it ran 7% faster (3.648 -> 3.392 ms at B4 H16 S2048; causal the
// same); at d 64 the non-causal forward gained 2% and the causal lost 1.5%, so no other head
// dims have one.
template <int D, int DV, bool WIDE>
struct ForwardShape {
    static constexpr int ROWS = WIDE ? 128 : 64, KEYS = WIDE ? 128 : 64;
    static constexpr int THREADS = WIDE ? 256 : 128, CTAS = WIDE ? 1 : ctas_per_sm(D, DV);
};

template <int D, int DV, bool WIDE, bool MMA>
struct ForwardTiles {
    typedef ForwardShape<D, DV, WIDE> S;
    // Each thread: R query rows (S::THREADS / 16 threads down the block) by C keys.
    static constexpr int R = S::ROWS / (S::THREADS / 16), C = S::KEYS / 16;
    static constexpr int Q = S::ROWS * (D + kPad);
    // K's tile, then P's once the scores are taken.
    static constexpr int KP = S::KEYS * (D + kPad) > S::ROWS * (S::KEYS + kPad)
                                  ? S::KEYS * (D + kPad)
                                  : S::ROWS * (S::KEYS + kPad);
    static constexpr int V = S::KEYS * (DV + kPad);
    // The MMA forwards' exchange tiles, one a warp (dot_rows_dmma).
    static constexpr int X = MMA ? S::THREADS / 32 * kExchangeFloats : 0;
    static constexpr int FLOATS = Q + KP + V + X;
};

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

// Folds one key block's scores of a row into its running max m, this thread's share l of the
// sum and acc = sum p v; s becomes p = exp(s - m). Under MASKED, keys outside the row's mask
// score -inf and become 0, and a row without keys so far keeps m = -inf and l = 0. A block the
// mask leaves whole for every row goes without (the kept scores' bits are the same either way).
template <bool MASKED, int C, int NV>
__device__ __forceinline__ void softmax_step(float (&s)[C], float& m, float& l, float (&acc)[NV],
                                             const Mask& mask, int i, int j0, int tx,
                                             float scale) {
    const int lo = MASKED ? mask.lo(i) : 0, hi = MASKED ? mask.hi(i) : 0;
    float block_max = minus_infinity();
    scale *= kLog2e;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        s[c] *= scale;
        if (MASKED) {
            const int j = j0 + tx + 16 * c;
            s[c] = j >= lo && j <= hi ? s[c] : minus_infinity();
        }
        block_max = fmaxf(block_max, s[c]);
    }
    const float alpha = fold_block<float>(s, m, l, fmaxf(m, half_warp_max(block_max)));
#pragma unroll
    for (int n = 0; n < NV; ++n) acc[n] *= alpha;
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

// out = acc / l and lse = m + log(l) for the thread's rows below the sequence's length; rows
// without keys (l = 0) get 0 and -inf.
template <int R, int DV>
__device__ __forceinline__ void forward_write(const float (&m)[R], const float (&l)[R],
                                              float (&acc)[R][DV / 16], const Rows<float>& out,
                                              const Rows<float>& lse, int b, int h,
                                              const Span& sq, int first, int tx, bool vec) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float sum = half_warp_sum(l[r]);
        const int i = first + r;
        if (i >= sq.len) continue;
        const i64 t = sq.row0 + i;
#pragma unroll
        for (int n = 0; n < DV / 16; ++n) acc[r][n] = sum > 0.0f ? acc[r][n] / sum : 0.0f;
        store_cols<DV>(out.at(b, h, t), acc[r], tx, vec);
        // lse in natural log: m counts in base 2.
        if (tx == 0) {
            *lse.at(b, h, t) = row_lse(m[r], sum);
        }
    }
}

// The key blocks [first, last] that rows [i0, i_last] need (last < first when none).
__device__ __forceinline__ int2 key_blocks(const Mask& mask, int i0, int i_last, int keys) {
    const int j_lo = mask.lo(i0), j_hi = mask.hi(i_last);
    return make_int2(j_lo / keys, j_hi >= j_lo ? j_hi / keys : j_lo / keys - 1);
}

template <int D, int DV, bool WIDE, bool MMA>
__device__ __forceinline__ void forward(const Rows<const float>& q, const Rows<const float>& k,
                                        const Rows<const float>& v, const Rows<float>& out,
                                        const Rows<float>& lse, const Problem& p) {
    typedef ForwardTiles<D, DV, WIDE, MMA> T;
    constexpr int R = T::R, C = T::C, NV = DV / 16, BC = T::S::KEYS;
    constexpr int ROWS = T::S::ROWS, THREADS = T::S::THREADS;
    const auto [b, h, hk, i0, sq] = query_block(ROWS, p);
    if (i0 >= sq.len) return;
    const Span skv = sequence(p.cu_kv, b, p.max_kv, p.total_kv);
    const Mask mask = make_mask(p, sq.len, skv.len);
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4, first = i0 + ty * R;
    float* q_tile = shared_tiles<T::FLOATS>();
    float* kp_tile = q_tile + T::Q;
    float* v_tile = kp_tile + T::KP;
    float* exchange = v_tile + T::V;

    float m[R], l[R], acc[R][NV] = {};
#pragma unroll
    for (int r = 0; r < R; ++r) m[r] = minus_infinity(), l[r] = 0.0f;
    const int i_last = min(i0 + ROWS, sq.len) - 1;
    const int2 blocks = key_blocks(mask, i0, i_last, BC);
    if (blocks.x <= blocks.y) {
        load_tile<ROWS, D, THREADS>(q_tile, q, b, h, sq, i0, p.vec);
        load_tile<BC, D, THREADS>(kp_tile, k, b, hk, skv, blocks.x * BC, p.vec);
        copy_commit();
        load_tile<BC, DV, THREADS>(v_tile, v, b, hk, skv, blocks.x * BC, p.vec);
        copy_commit();
    }
    for (int kb = blocks.x; kb <= blocks.y; ++kb) {
        copy_wait<1>();  // Q and K have landed; V may still be in flight
        __syncthreads();
        float s[R][C] = {};
        if constexpr (MMA) {
            dot_rows_dmma<R, C, D>(s, q_tile, kp_tile, exchange);
        } else {
            dot_rows<R, C, D>(s, q_tile, kp_tile, ty * R, tx);
        }
        with_mask(whole_block(mask, i0, i_last, kb * BC, BC), [&](auto masked) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                softmax_step<decltype(masked)::value, C, NV>(s[r], m[r], l[r], acc[r], mask,
                                                             first + r, kb * BC, tx, p.scale);
            }
        });
        __syncthreads();  // every thread is done with K: P takes its place
        store_scores<R, C, BC + kPad>(kp_tile, s, ty * R, tx);
        copy_wait<0>();
        __syncthreads();
        mul_rows<R, DV, BC, BC + kPad>(acc, kp_tile, v_tile, ty * R, tx);
        __syncthreads();  // P and V are consumed: the next block's K and V may land
        if (kb < blocks.y) {
            load_tile<BC, D, THREADS>(kp_tile, k, b, hk, skv, (kb + 1) * BC, p.vec);
            copy_commit();
            load_tile<BC, DV, THREADS>(v_tile, v, b, hk, skv, (kb + 1) * BC, p.vec);
            copy_commit();
        }
    }
    forward_write<R, DV>(m, l, acc, out, lse, b, h, sq, first, tx, p.vec);
}

// ------------------------------------------------------------- forward, both products on DMMA

// The forward with Q K^T and P V both on sm_90's FP64 tensor cores (flash_f32_fwd_dmma_*): CTA =
// (32 query rows, head, sequence) of 128 threads, two or three CTAs an SM (dmma_ctas). Warp w
// owns rows 16 (w % 2).. and half w / 2 of each 64-key block for the scores and of Dv for P V
// (at Dv = 128 all 32 rows and quarter w of Dv: dmma_pv_quarters), so its f64 output fragment
// is 16 x Dv/2 (or 32 x Dv/4; 64 registers a lane at Dv = 128). The two warps of a
// row group exchange their rows' maxima and sums through shared memory and compute the same
// running max bit for bit. Several CTAs an SM, so that one's softmax can run while another's
// mma does: on an H100 at d128 two ran 3.13 ms against 3.22 for one CTA of 64 rows and 256
// threads (causal 1.61 against 1.70), though each K and V block now serves 32 rows instead of
// 64. P goes through its own tile (f32, every warp reads all 64 keys of its rows), and K and V
// have tiles of their own, so the next K streams in under the softmax and P V, the next V under
// the next scores. Operands are widened from f32 as they are loaded (dot_rows_dmma says why that
// is exact); P V sums in f64 and the output is divided and rounded once.
//
// Operands load as vectors. An mma sums over its 16 k-indices in an order of its own, so which
// element a lane's fragment slot holds along k is free as long as A and B agree: in Q K^T lane t
// holds d = 4t..4t+3 of each k-step (one float4 a row of Q or K, where the PTX order, t + 4i,
// takes four scalar loads), and in P V keys 2t, 2t+1, 2t+8, 2t+9 (two float2 of P). The output
// columns are permuted the same way: B's column g of 8-column tile n is the warp's column
// dmma_column(n, g), so a lane's V values of four tiles are one float4.
constexpr int kDmmaRows = 32, kDmmaThreads = 128, kDmmaKeys = 64;
// Measured on an H100 (B4 H16 S2048; flash_f32.py's DMMA_FORWARD_DIMS has the times): at D and
// Dv <= 64 the registers allow three CTAs an SM (168, with about 100 bytes of spills at d64,
// and still faster than two), wider pairs fit two. The P V loop runs unrolled 4 (d96 2.58 ms
// against 2.73 with 2); the Q K^T loop 4 at the wide dims (d128 3.06-3.10 against 3.13-3.16)
// and 2 at the small ones, where 4 lost.
constexpr bool dmma_small(int d, int dv) { return d <= 64 && dv <= 64; }
constexpr int dmma_ctas(int d, int dv) { return dmma_small(d, dv) ? 3 : 2; }
constexpr int dmma_qk_unroll(int d, int dv) { return dmma_small(d, dv) ? 2 : 4; }
constexpr int kDmmaPvUnroll = 4;
// At Dv = 128 each warp's P V covers all 32 rows and a quarter of Dv (dmma_pv_quarters): V's
// widenings halve (each V value is widened by one warp instead of two) and P's double, 128 a
// lane and block instead of 160. On an H100 d128 ran 3.068 ms against 3.079 (causal 1.580 against
// 1.595; at S4096 5.97 against 6.04), the same bits. At d64 it spilled more and lost (1.587
// against 1.557), so the smaller Dv keep warps of 16 rows and half of Dv.
constexpr bool dmma_pv_quarters(int dv) { return dv == 128; }
constexpr int kDmmaRowGroups = kDmmaRows / 16;  // the warps of each half
// Row pads, each the one that makes its loads conflict-free: Q and K rows are D + 16 floats (16
// mod 32 banks: rows g and g + 1 of a quarter-warp's float4 loads fill 32 banks), V's Dv + 4
// (lanes t read rows 2t apart, 8 banks), P's 64 + 8 (rows g 8 banks apart, for the float2
// loads and stores).
constexpr int kDmmaQkPad = 16, kVPad = 4, kDmmaPPad = 8;

// Tile n's B column c (c = g) or output column c (c = 2t + e) is this column of the warp's half
// of Dv: tiles go in chunks of 4 (2 where fewer are left), and lane g holds chunk columns
// w g .. w g + w - 1, one vector.
template <int NT>
__device__ __forceinline__ constexpr int dmma_column(int n, int c) {
    return 32 * (n / 4) + (NT - n / 4 * 4 >= 4 ? 4 : NT - n / 4 * 4) * c + n % 4;
}

template <int D, int DV>
struct DmmaTiles {
    static constexpr int Q = kDmmaRows * (D + kDmmaQkPad), K = kDmmaKeys * (D + kDmmaQkPad);
    static constexpr int V = kDmmaKeys * (DV + kVPad), P = kDmmaRows * (kDmmaKeys + kDmmaPPad);
    // Each half's row maxima (at the end its row sums), then with quarters each row's rescale.
    static constexpr int STATS = (dmma_pv_quarters(DV) ? 3 : 2) * kDmmaRows;
    static constexpr int FLOATS = Q + K + V + P + STATS;
};

template <int D, int DV>
__device__ __forceinline__ void forward_dmma(const Rows<const float>& q,
                                             const Rows<const float>& k,
                                             const Rows<const float>& v, const Rows<float>& out,
                                             const Rows<float>& lse, const Problem& p) {
    static_assert(D % 16 == 0 && DV % 32 == 0, "k-steps of 16, output tiles in pairs");
    typedef DmmaTiles<D, DV> T;
    constexpr int NT = DV / 16;  // a warp's 8-column output tiles: half of Dv
    constexpr int LQ = D + kDmmaQkPad, LV = DV + kVPad, LP = kDmmaKeys + kDmmaPPad;
    const auto [b, h, hk, i0, sq] = query_block(kDmmaRows, p);
    if (i0 >= sq.len) return;
    const Span skv = sequence(p.cu_kv, b, p.max_kv, p.total_kv);
    const Mask mask = make_mask(p, sq.len, skv.len);
    float* q_tile = shared_tiles<T::FLOATS>();
    float* k_tile = q_tile + T::Q;
    float* v_tile = k_tile + T::K;
    float* p_tile = v_tile + T::V;
    float* stats = p_tile + T::P;  // [2][rows]: each half's row maxima, at the end its row sums
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, w = threadIdx.x >> 5;
    const int half = w / kDmmaRowGroups, row0 = (w % kDmmaRowGroups) * 16;  // rows row0 + g, + 8
    const int i_a = i0 + row0 + g, i_b = i_a + 8;
    const float scale = p.scale * kLog2e;
    constexpr bool QUARTERS = dmma_pv_quarters(DV);
    constexpr int MT = QUARTERS ? 2 : 1;         // 16-row tiles of a warp's P V
    constexpr int NO = QUARTERS ? DV / 32 : NT;  // its 8-column output tiles
    float* alphas = stats + 2 * kDmmaRows;  // QUARTERS: each row's rescale for this block

    double o[MT][NO][4] = {};
    float m[2] = {minus_infinity(), minus_infinity()}, l[2] = {0.0f, 0.0f};
    const int i_last = min(i0 + kDmmaRows, sq.len) - 1;
    const int2 blocks = key_blocks(mask, i0, i_last, kDmmaKeys);
    if (blocks.x <= blocks.y) {
        load_tile<kDmmaRows, D, kDmmaThreads, kDmmaQkPad>(q_tile, q, b, h, sq, i0, p.vec);
        load_tile<kDmmaKeys, D, kDmmaThreads, kDmmaQkPad>(k_tile, k, b, hk, skv,
                                                          blocks.x * kDmmaKeys, p.vec);
        copy_commit();
        load_tile<kDmmaKeys, DV, kDmmaThreads, kVPad>(v_tile, v, b, hk, skv,
                                                       blocks.x * kDmmaKeys, p.vec);
        copy_commit();
    }
    for (int kb = blocks.x; kb <= blocks.y; ++kb) {
        const int j0 = kb * kDmmaKeys;
        copy_wait<1>();  // Q and this K have landed; V may still be in flight
        __syncthreads();
        // Scores of rows i_a, i_b against keys j0 + 32 half + 8n + 2t (+1).
        double acc[4][4] = {};
        {
            const float* qa = q_tile + (row0 + g) * LQ + 4 * t;
            const float* kb_ = k_tile + (half * 32 + g) * LQ + 4 * t;
#pragma unroll(dmma_qk_unroll(D, DV))
            for (int kk = 0; kk < D; kk += 16) {
                const float4 x = *reinterpret_cast<const float4*>(qa + kk);
                const float4 y = *reinterpret_cast<const float4*>(qa + 8 * LQ + kk);
                const double a[8] = {x.x, y.x, x.y, y.y, x.z, y.z, x.w, y.w};
#pragma unroll
                for (int n = 0; n < 4; ++n) {
                    const float4 z = *reinterpret_cast<const float4*>(kb_ + n * 8 * LQ + kk);
                    const double bf[4] = {z.x, z.y, z.z, z.w};
                    dmma_16x8x16(acc[n], a, bf);
                }
            }
        }
        float s[2][8];  // [row a or b][n * 2 + e]
        const bool whole = whole_block(mask, i0, i_last, j0, kDmmaKeys);
        const int lo_a = mask.lo(i_a), hi_a = mask.hi(i_a);
        const int lo_b = mask.lo(i_b), hi_b = mask.hi(i_b);
        float block_max[2] = {minus_infinity(), minus_infinity()};
#pragma unroll
        for (int n = 0; n < 4; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = j0 + half * 32 + 8 * n + 2 * t + e;
                float sa = (float)acc[n][e] * scale, sb = (float)acc[n][2 + e] * scale;
                if (!whole) {
                    sa = j >= lo_a && j <= hi_a ? sa : minus_infinity();
                    sb = j >= lo_b && j <= hi_b ? sb : minus_infinity();
                }
                s[0][2 * n + e] = sa, s[1][2 * n + e] = sb;
                block_max[0] = fmaxf(block_max[0], sa), block_max[1] = fmaxf(block_max[1], sb);
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {  // over the row's 4 lanes, in a fixed butterfly
            block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 1));
            block_max[r] = fmaxf(block_max[r], __shfl_xor_sync(0xffffffffu, block_max[r], 2));
        }
        if (t == 0) {
            stats[half * kDmmaRows + row0 + g] = block_max[0];
            stats[half * kDmmaRows + row0 + g + 8] = block_max[1];
        }
        __syncthreads();  // both halves' maxima are in, and every warp is done with this K
        if (kb < blocks.y) {
            load_tile<kDmmaKeys, D, kDmmaThreads, kDmmaQkPad>(k_tile, k, b, hk, skv,
                                                              j0 + kDmmaKeys, p.vec);
            copy_commit();
        }
        double alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + g + 8 * r;
            const float m_new = fmaxf(m[r], fmaxf(stats[row], stats[kDmmaRows + row]));
            alpha[r] = fold_block<double>(s[r], m[r], l[r], m_new);
        }
        if constexpr (QUARTERS) {
            if (half == 0 && t == 0) {
                alphas[row0 + g] = (float)alpha[0];
                alphas[row0 + g + 8] = (float)alpha[1];
            }
        } else {
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                o[0][n][0] *= alpha[0], o[0][n][1] *= alpha[0];
                o[0][n][2] *= alpha[1], o[0][n][3] *= alpha[1];
            }
        }
#pragma unroll
        for (int n = 0; n < 4; ++n) {
            const int col = half * 32 + 8 * n + 2 * t;
            *reinterpret_cast<float2*>(p_tile + (row0 + g) * LP + col) =
                make_float2(s[0][2 * n], s[0][2 * n + 1]);
            *reinterpret_cast<float2*>(p_tile + (row0 + g + 8) * LP + col) =
                make_float2(s[1][2 * n], s[1][2 * n + 1]);
        }
        if (kb < blocks.y) {
            copy_wait<1>();  // this V has landed; the next K may still be in flight
        } else {
            copy_wait<0>();  // no next K: this V is the newest group
        }
        __syncthreads();  // P is whole
        {
            // Slot t + 4i of a k-step holds key 2t + (i & 1) + 8 (i >> 1).
            const float* vb =
                v_tile + 2 * t * LV + (QUARTERS ? w * (DV / 4) : half * (DV / 2));
            if constexpr (QUARTERS) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    const double al = alphas[16 * mt + g], bl = alphas[16 * mt + g + 8];
#pragma unroll
                    for (int n = 0; n < NO; ++n) {
                        o[mt][n][0] *= al, o[mt][n][1] *= al, o[mt][n][2] *= bl, o[mt][n][3] *= bl;
                    }
                }
            }
#pragma unroll(kDmmaPvUnroll)
            for (int kk = 0; kk < kDmmaKeys; kk += 16) {
                double a[MT][8];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    const float* pa = p_tile + ((QUARTERS ? 0 : row0) + 16 * mt + g) * LP + 2 * t;
                    const float2 x0 = *reinterpret_cast<const float2*>(pa + kk);
                    const float2 x1 = *reinterpret_cast<const float2*>(pa + kk + 8);
                    const float2 y0 = *reinterpret_cast<const float2*>(pa + 8 * LP + kk);
                    const float2 y1 = *reinterpret_cast<const float2*>(pa + 8 * LP + kk + 8);
                    a[mt][0] = x0.x, a[mt][1] = y0.x, a[mt][2] = x0.y, a[mt][3] = y0.y;
                    a[mt][4] = x1.x, a[mt][5] = y1.x, a[mt][6] = x1.y, a[mt][7] = y1.y;
                }
                float bv[4][NO];  // [slot i][tile n]: V[key of slot i][dmma_column(n, g)]
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float* row = vb + (kk + (i & 1) + 8 * (i >> 1)) * LV;
#pragma unroll
                    for (int n = 0; n < NO; n += 4) {
                        if (NO - n >= 4) {
                            const float4 z =
                                *reinterpret_cast<const float4*>(row + dmma_column<NO>(n, g));
                            bv[i][n] = z.x, bv[i][n + 1] = z.y, bv[i][n + 2] = z.z;
                            bv[i][n + 3] = z.w;
                        } else {
                            const float2 z =
                                *reinterpret_cast<const float2*>(row + dmma_column<NO>(n, g));
                            bv[i][n] = z.x, bv[i][n + 1] = z.y;
                        }
                    }
                }
#pragma unroll
                for (int n = 0; n < NO; ++n) {
                    const double bf[4] = {bv[0][n], bv[1][n], bv[2][n], bv[3][n]};
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) dmma_16x8x16(o[mt][n], a[mt], bf);
                }
            }
        }
        __syncthreads();  // P and V are consumed: the next V may land
        if (kb < blocks.y) {
            load_tile<kDmmaKeys, DV, kDmmaThreads, kVPad>(v_tile, v, b, hk, skv, j0 + kDmmaKeys,
                                                           p.vec);
            copy_commit();
        }
    }
    // Row sums: this lane's share over the row's 4 lanes, then the two halves in order.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    __syncthreads();  // every warp is past its last read of the maxima
    if (t == 0) {
        stats[half * kDmmaRows + row0 + g] = l[0];
        stats[half * kDmmaRows + row0 + g + 8] = l[1];
    }
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = (QUARTERS ? 0 : row0) + 16 * mt + g + 8 * r, i = i0 + row;
            if (i >= sq.len) continue;
            const float sum = stats[row] + stats[kDmmaRows + row];
            const i64 tok = sq.row0 + i;
            float* out_row = out.at(b, h, tok) + (QUARTERS ? w * (DV / 4) : half * (DV / 2));
#pragma unroll
            for (int n = 0; n < NO; ++n) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    out_row[dmma_column<NO>(n, 2 * t + e)] =
                        sum > 0.0f ? (float)(o[mt][n][2 * r + e] / sum) : 0.0f;
                }
            }
            // lse in natural log: m counts in base 2. Without quarters these are the warp's rows.
            if (!QUARTERS && half == 0 && t == 0) {
                *lse.at(b, h, tok) = row_lse(m[r], sum);
            }
        }
    }
    if constexpr (QUARTERS) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + g + 8 * r, i = i0 + row;
            if (i < sq.len && half == 0 && t == 0) {
                *lse.at(b, h, sq.row0 + i) = row_lse(m[r], stats[row] + stats[kDmmaRows + row]);
            }
        }
    }
}

// ---------------------------------------------------------------------------------- backward

// Query block qb's turn counter (head h of sequence b): workspace [B][Hq][query blocks].
__device__ __forceinline__ int* turn_counter(int* turns, const Problem& p, int heads_q, int b,
                                             int h, int qb) {
    const int blocks = (p.max_q + kDkdvRows - 1) / kDkdvRows;
    return turns + ((i64)b * heads_q + h) * blocks + qb;
}

// Delta_i = sum_d dO[i][d] * O[i][d]: one warp a row, lanes over d, then a fixed butterfly. The
// same CTA zeroes its rows of dQ, which the dK/dV kernel adds into, and their turn counters.
__device__ __forceinline__ void backward_delta(const Rows<const float>& out,
                                               const Rows<const float>& dout,
                                               const Rows<float>& delta, const Rows<float>& dq,
                                               int* turns, const Problem& p, int dim,
                                               int dim_v) {
    constexpr int kWarps = kDeltaThreads / 32;
    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kDeltaRows;
    if (threadIdx.x < kDeltaRows / kDkdvRows) {
        const int qb = i0 / kDkdvRows + threadIdx.x;
        if (qb * kDkdvRows < p.max_q) *turn_counter(turns, p, gridDim.y, b, h, qb) = 0;
    }
    const Span sq = sequence(p.cu_q, b, p.max_q, p.total_q);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = i0 + warp; i < min(i0 + kDeltaRows, sq.len); i += kWarps) {
        const i64 t = sq.row0 + i;
        const float* o = out.at(b, h, t);
        const float* g = dout.at(b, h, t);
        float sum = 0.0f;
        for (int d = lane; d < dim_v; d += 32) sum = fmaf(o[d], g[d], sum);
        sum = warp_sum(sum);
        if (lane == 0) *delta.at(b, h, t) = sum;
        float* dq_row = dq.at(b, h, t);
        for (int d = lane; d < dim; d += 32) dq_row[d] = 0.0f;
    }
}

// P and dS of one score tile, in place of the scores s and of dP = dO V^T: P = exp(scale s -
// lse) and dS = P (dP - Delta) where key j is allowed for row i. Under MASKED they are exactly 0
// (a select, not a product, so whatever dP holds there) where it is not, and on rows whose lse
// is -inf. A block whole for every row (whole_block) goes without the selects: there each row
// in the sequence has keys, so a finite lse, and a row past it reads nothing and takes lse =
// +inf, so P = 0 and dS = 0 * dP, where its zero-filled dO makes dP = 0.
// Row r is query first + r, column c key j0 + tx + 16 c.
template <bool MASKED, int R, int C>
__device__ __forceinline__ void probabilities(float (&s)[R][C], float (&dp)[R][C],
                                              const Mask& mask, const Rows<const float>& lse,
                                              const Rows<const float>& delta, int b, int h,
                                              const Span& sq, int first, int j0, int tx,
                                              float scale) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = first + r;
        const int lo = MASKED ? mask.lo(i) : 0, hi = MASKED ? mask.hi(i) : 0;
        // Rows past the sequence have no keys (hi = -1), and nothing of theirs is read.
        const bool any = MASKED ? hi >= lo : i < sq.len;
        const float none = MASKED ? minus_infinity() : -minus_infinity();
        const float row_lse = any ? *lse.at(b, h, sq.row0 + i) : none;
        const float row_delta = any ? *delta.at(b, h, sq.row0 + i) : 0.0f;
        const float scale2 = scale * kLog2e, lse2 = row_lse * kLog2e;  // base 2, as forward
#pragma unroll
        for (int c = 0; c < C; ++c) {
            if (MASKED) {
                const int j = j0 + tx + 16 * c;
                const bool keep = j >= lo && j <= hi && row_lse != minus_infinity();
                const float prob = keep ? exp2f(fmaf(s[r][c], scale2, -lse2)) : 0.0f;
                dp[r][c] = keep ? prob * (dp[r][c] - row_delta) : 0.0f;
                s[r][c] = prob;
            } else {
                s[r][c] = exp2f(fmaf(s[r][c], scale2, -lse2));
                dp[r][c] = s[r][c] * (dp[r][c] - row_delta);
            }
        }
    }
}

// row[cols of tx] += scale * x by L2 reductions (red.global.add), in 4-wide pieces where sm_90
// and the rows allow. A reduction needs no reply, where reading, adding and writing back waited
// an L2 round trip (ncu had put 12% of dK/dV's stall samples on those reads). Each addition is
// rounded twice (scale * x, then the sum) where the read-add-write's fma rounded once; only the
// turn's holder adds into a row, so the order, and with it every bit, stays fixed.
template <int N>
__device__ __forceinline__ void add_cols_l2(float* row, const float (&x)[N / 16], float scale,
                                            int tx, bool vec) {
    constexpr int VW = Cols<N>::VW;
#pragma unroll
    for (int m = 0; m < Cols<N>::M; ++m) {
        float* p = row + Cols<N>::col(tx, m);
        float y[VW];
#pragma unroll
        for (int v = 0; v < VW; ++v) y[v] = scale * x[VW * m + v];
#if __CUDA_ARCH__ >= 900
        if (VW == 4 && vec) {
            asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(y[0]),
                         "f"(y[1]), "f"(y[2]), "f"(y[3]) : "memory");
            continue;
        }
#endif
#pragma unroll
        for (int v = 0; v < VW; ++v) {
            asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p + v), "f"(y[v]) : "memory");
        }
    }
}

// The query blocks [first, first + count) whose rows can see key block [j0, j0 + kDkdvKeys):
// one function for a CTA's own range and for its predecessor's, so both agree.
__device__ __forceinline__ int2 query_blocks(const Mask& mask, int j0) {
    const int i_lo = mask.first_row(j0);
    const int i_hi = mask.last_row(min(j0 + kDkdvKeys, mask.len_kv) - 1);
    const int first = i_lo / kDkdvRows;
    return make_int2(first, i_hi >= i_lo ? i_hi / kDkdvRows - first + 1 : 0);
}

template <int D, int DV>
struct DkdvTiles {
    // Each thread: R query rows by 4 keys of the score tiles, and RK key rows of dK and dV.
    static constexpr int R = kDkdvRows / (kDkdvThreads / 16);
    static constexpr int RK = kDkdvKeys / (kDkdvThreads / 16);
    static constexpr int K = kDkdvKeys * (D + kPad), V = kDkdvKeys * (DV + kPad);
    static constexpr int Q = kDkdvRows * (D + kPad), DO = kDkdvRows * (DV + kPad);
    static constexpr int PS = kDkdvRows * (kDkdvKeys + kPad);  // P, then dS
    static constexpr int FLOATS = K + V + Q + DO + PS;
};

// The tensors the backward reads, and the Delta workspace.
struct BackwardInputs {
    Rows<const float> q, k, v, dout, lse, delta;
};

__device__ __forceinline__ unsigned long long global_nanoseconds() {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return ns;
}

// Thread 0 waits until the turn counter reaches `value`; the barrier after it passes what it
// acquired on to the rest of the CTA (in PTX's memory model a barrier synchronizes the CTA's
// threads, so their additions follow the holder's; a full fence after the load ordered nothing
// more). The CTA waited on has a lower index, so it started first and the wait ends. Were that
// ever untrue, a minute without the turn stops the kernel with an error (a launch failure the
// caller sees) rather than hanging the process.
__device__ __forceinline__ void wait_turn(const int* turn, int value) {
    constexpr unsigned long long kPatience = 60ull * 1000 * 1000 * 1000;  // ns
    const unsigned long long start = global_nanoseconds();
    int seen;
    for (;;) {
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(turn) : "memory");
        if (seen >= value) break;
        if (global_nanoseconds() - start > kPatience) __trap();
    }
}

// Thread 0 passes the turn on, once a barrier has seen every thread's dQ additions issued: the
// barrier orders them before this release, which makes them visible at GPU scope before the
// counter moves. An acquire-release fence is all that needs; __threadfence's sequentially
// consistent one (with the fence after the wait) cost the d 128 backward 1.5% on an H100.
__device__ __forceinline__ void pass_turn(int* turn, int value) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(turn), "r"(value) : "memory");
}

// Where a dK/dV CTA's step adds into dQ: the dQ rows, this query block's turn counter, the
// CTA's key block (its turn comes when the counter reaches it), and whether the key block before
// it sees the query block too (and so must add first).
struct DqTurn {
    Rows<float> dq;
    int* turn;
    int key_block;
    bool wait;
};

// One query block's contribution to a key block's dV and dK, and its dS K into dQ in this key
// block's turn (the tiles of Q and dO are in shared memory). Loads the next step's dO, then Q,
// as soon as their tiles are free.
template <int D, int DV>
__device__ __forceinline__ void dkdv_step(float (&dk)[DkdvTiles<D, DV>::RK][D / 16],
                                          float (&dv)[DkdvTiles<D, DV>::RK][DV / 16],
                                          const BackwardInputs& in, const Problem& p,
                                          const Mask& mask, const Span& sq, int b, int h, int i0,
                                          int j0, float* tiles, int next_h, int next_i0,
                                          const DqTurn& dq) {
    typedef DkdvTiles<D, DV> T;
    constexpr int R = T::R, RK = T::RK, C = kDkdvKeys / 16, LD = kDkdvKeys + kPad;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    float* k_tile = tiles;
    float* v_tile = k_tile + T::K;
    float* q_tile = v_tile + T::V;
    float* do_tile = q_tile + T::Q;
    float* ps_tile = do_tile + T::DO;
    float s[R][C] = {}, dp[R][C] = {};
    dot_rows<R, C, D>(s, q_tile, k_tile, ty * R, tx);
    dot_rows<R, C, DV>(dp, do_tile, v_tile, ty * R, tx);
    with_mask(whole_block(mask, i0, min(i0 + kDkdvRows, sq.len) - 1, j0, kDkdvKeys),
              [&](auto masked) {
                  probabilities<decltype(masked)::value, R, C>(s, dp, mask, in.lse, in.delta, b, h,
                                                               sq, i0 + ty * R, j0, tx, p.scale);
              });
    store_scores<R, C, LD>(ps_tile, s, ty * R, tx);
    __syncthreads();
    mul_cols<RK, DV, kDkdvRows, LD>(dv, ps_tile, do_tile, ty * RK, tx);  // dV += P^T dO
    __syncthreads();  // P and dO are consumed
    if (next_i0 >= 0) {
        load_tile<kDkdvRows, DV, kDkdvThreads>(do_tile, in.dout, b, next_h, sq, next_i0, p.vec);
        copy_commit();
    }
    store_scores<R, C, LD>(ps_tile, dp, ty * R, tx);
    __syncthreads();
    mul_cols<RK, D, kDkdvRows, LD>(dk, ps_tile, q_tile, ty * RK, tx);  // dK += dS^T Q
    float dq_part[R][D / 16] = {};
    mul_rows<R, D, kDkdvKeys, LD>(dq_part, ps_tile, k_tile, ty * R, tx);  // dS K
    if (threadIdx.x == 0 && dq.wait) wait_turn(dq.turn, dq.key_block);
    __syncthreads();  // dS and Q are consumed, and the key block before ours has added
    if (next_i0 >= 0) {
        load_tile<kDkdvRows, D, kDkdvThreads>(q_tile, in.q, b, next_h, sq, next_i0, p.vec);
        copy_commit();
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int i = i0 + ty * R + r;
        if (i < sq.len) {
            add_cols_l2<D>(dq.dq.at(b, h, sq.row0 + i), dq_part[r], p.scale, tx, p.vec);
        }
    }
    // The turn passes on after the next barrier, once every thread's rows are added.
}

// CTA (kv head, sequence, key block): dV = sum P^T dO and dK = scale sum dS^T Q over the group's
// query heads in increasing order, then the query blocks that can see these keys from the last
// down; each step adds scale dS K into its query block's dQ rows in turn.
//
// The grid puts the key block slowest, so a CTA starts a whole row of heads after the one it
// waits on, which by then is a step or more ahead: with key blocks fastest, the CTAs of one head
// all started together and the j-th waited j steps. Query blocks go from the last down because
// under a causal mask every block's first turn is key block 0's, which sees all of them: the
// last blocks are the ones every later key block sees too, so key block j's first step waits
// only on key block j - 1's first step. In the other order, its first step waited on key block
// 0's (2j + 1)-th, and a CTA of two steps sat through most of key block 0's sixty-four.
template <int D, int DV>
__device__ __forceinline__ void backward_dkdv(const BackwardInputs& in, const Rows<float>& dk,
                                              const Rows<float>& dv, const Rows<float>& dq,
                                              int* turns, const Problem& p) {
    typedef DkdvTiles<D, DV> T;
    const int hk = blockIdx.x, b = blockIdx.y, kb = blockIdx.z, j0 = kb * kDkdvKeys;
    const Span skv = sequence(p.cu_kv, b, p.max_kv, p.total_kv);
    if (j0 >= skv.len) return;
    const Span sq = sequence(p.cu_q, b, p.max_q, p.total_q);
    const Mask mask = make_mask(p, sq.len, skv.len);
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    float* tiles = shared_tiles<T::FLOATS>();
    float* q_tile = tiles + T::K + T::V;

    const int2 mine = query_blocks(mask, j0);
    // The query blocks the key block before this one adds into first (none for the first).
    const int2 before = j0 > 0 ? query_blocks(mask, j0 - kDkdvKeys) : make_int2(0, 0);
    const int qb_last = mine.x + mine.y - 1, blocks = mine.y;
    const int steps = blocks * p.group;
    if (steps > 0) {
        const int i0 = qb_last * kDkdvRows;
        load_tile<kDkdvKeys, D, kDkdvThreads>(tiles, in.k, b, hk, skv, j0, p.vec);
        load_tile<kDkdvKeys, DV, kDkdvThreads>(tiles + T::K, in.v, b, hk, skv, j0, p.vec);
        load_tile<kDkdvRows, D, kDkdvThreads>(q_tile, in.q, b, hk * p.group, sq, i0, p.vec);
        load_tile<kDkdvRows, DV, kDkdvThreads>(q_tile + T::Q, in.dout, b, hk * p.group, sq, i0,
                                               p.vec);
        copy_commit();
    }
    float dk_acc[T::RK][D / 16] = {}, dv_acc[T::RK][DV / 16] = {};
    int* added = nullptr;  // the turn counter of the query block the last step added into
    for (int step = 0; step < steps; ++step) {
        const int h = hk * p.group + step / blocks;
        const int qb = qb_last - step % blocks;
        const int next = step + 1;
        const int next_h = hk * p.group + next / blocks;
        const int next_i0 = next < steps ? (qb_last - next % blocks) * kDkdvRows : -1;
        const DqTurn turn{dq, turn_counter(turns, p, gridDim.x * p.group, b, h, qb), kb,
                          qb >= before.x && qb < before.x + before.y};
        copy_wait<0>();
        __syncthreads();  // also: every thread's dQ rows of the last step are added
        // Passing the last step's turn here rather than after a barrier of its own saves one
        // of a step's six; the next key block needs it no sooner than at the end of its step.
        if (threadIdx.x == 0 && added != nullptr) pass_turn(added, kb + 1);
        dkdv_step<D, DV>(dk_acc, dv_acc, in, p, mask, sq, b, h, qb * kDkdvRows, j0, tiles,
                         next_h, next_i0, turn);
        added = turn.turn;
    }
    if (added != nullptr) {
        __syncthreads();
        if (threadIdx.x == 0) pass_turn(added, kb + 1);
    }
#pragma unroll
    for (int r = 0; r < T::RK; ++r) {
        const int j = j0 + ty * T::RK + r;
        if (j >= skv.len) continue;
        scale_cols(dk_acc[r], p.scale);
        store_cols<D>(dk.at(b, hk, skv.row0 + j), dk_acc[r], tx, p.vec);
        store_cols<DV>(dv.at(b, hk, skv.row0 + j), dv_acc[r], tx, p.vec);
    }
}

}  // namespace

// ---------------------------------------------------------------------------------- kernels
//
// Every tensor travels as its pointer and (batch, token, head) strides in elements; the problem
// follows in one fixed list. opfacade/_backends/nvrtc/flash_f32.py packs them in this order.

#define FLASH_IN(x) const float *x, i64 x##_b, i64 x##_t, i64 x##_h
#define FLASH_OUT(x) float *x, i64 x##_b, i64 x##_t, i64 x##_h
#define FLASH_ROWS(T, x) Rows<T>{x, x##_b, x##_t, x##_h}
#define FLASH_PROBLEM_PARAMS                                                                  \
    const int *cu_q, const int *cu_kv, int group, int max_q, int max_kv, i64 total_q,        \
        i64 total_kv, float scale, int causal, int left, int right, int vec
#define FLASH_PROBLEM                                                                         \
    Problem { cu_q, cu_kv, group, max_q, max_kv, total_q, total_kv, scale, causal, left, right, \
              vec }
#define FLASH_BACKWARD_INPUTS                                                                \
    BackwardInputs {                                                                         \
        FLASH_ROWS(const float, q), FLASH_ROWS(const float, k), FLASH_ROWS(const float, v),  \
            FLASH_ROWS(const float, dout), FLASH_ROWS(const float, lse),                     \
            FLASH_ROWS(const float, delta)                                                   \
    }

extern "C" __global__ void __launch_bounds__(kDeltaThreads) flash_f32_bwd_delta(
    FLASH_IN(out), FLASH_IN(dout), FLASH_OUT(delta), FLASH_OUT(dq), int* turns,
    FLASH_PROBLEM_PARAMS, int dim, int dim_v) {
    backward_delta(FLASH_ROWS(const float, out), FLASH_ROWS(const float, dout),
                   FLASH_ROWS(float, delta), FLASH_ROWS(float, dq), turns, FLASH_PROBLEM, dim,
                   dim_v);
}

#define FLASH_FORWARD(NAME, D, DV, WIDE, MMA)                                                   \
    extern "C" __global__ void __launch_bounds__(ForwardShape<D, DV, WIDE>::THREADS,            \
                                                 ForwardShape<D, DV, WIDE>::CTAS)               \
        NAME(FLASH_IN(q), FLASH_IN(k), FLASH_IN(v), FLASH_OUT(out), FLASH_OUT(lse),             \
             FLASH_PROBLEM_PARAMS) {                                                             \
        forward<D, DV, WIDE, MMA>(FLASH_ROWS(const float, q), FLASH_ROWS(const float, k),       \
                             FLASH_ROWS(const float, v), FLASH_ROWS(float, out),                \
                             FLASH_ROWS(float, lse), FLASH_PROBLEM);                            \
    }

#define FLASH_KERNELS(D, DV)                                                                    \
    FLASH_FORWARD(flash_f32_fwd_d##D##_dv##DV, D, DV, false, false)                             \
    FLASH_FORWARD(flash_f32_fwd_mma_d##D##_dv##DV, D, DV, false, true)                          \
    extern "C" __global__ void __launch_bounds__(kDkdvThreads, ctas_per_sm(D, DV))              \
        flash_f32_bwd_dkdv_d##D##_dv##DV(                                                       \
        FLASH_IN(q), FLASH_IN(k), FLASH_IN(v), FLASH_IN(dout), FLASH_IN(lse), FLASH_IN(delta),  \
        FLASH_OUT(dq), FLASH_OUT(dk), FLASH_OUT(dv), int* turns, FLASH_PROBLEM_PARAMS) {        \
        backward_dkdv<D, DV>(FLASH_BACKWARD_INPUTS, FLASH_ROWS(float, dk),                       \
                             FLASH_ROWS(float, dv), FLASH_ROWS(float, dq), turns,               \
                             FLASH_PROBLEM);                                                     \
    }

FLASH_KERNELS(32, 32)
FLASH_KERNELS(64, 64)
FLASH_KERNELS(96, 96)
FLASH_KERNELS(128, 128)
FLASH_KERNELS(128, 64)
FLASH_KERNELS(64, 128)
FLASH_FORWARD(flash_f32_fwd_wide_d128_dv128, 128, 128, true, false)

// The DMMA forward, for the head dims where it was measured faster (flash_f32.py's
// DMMA_FORWARD_DIMS).
#define FLASH_DMMA_FORWARD(D, DV)                                                               \
    extern "C" __global__ void __launch_bounds__(kDmmaThreads, dmma_ctas(D, DV))               \
        flash_f32_fwd_dmma_d##D##_dv##DV(FLASH_IN(q), FLASH_IN(k), FLASH_IN(v), FLASH_OUT(out), \
                                         FLASH_OUT(lse), FLASH_PROBLEM_PARAMS) {                \
        forward_dmma<D, DV>(FLASH_ROWS(const float, q), FLASH_ROWS(const float, k),            \
                            FLASH_ROWS(const float, v), FLASH_ROWS(float, out),                \
                            FLASH_ROWS(float, lse), FLASH_PROBLEM);                            \
    }

FLASH_DMMA_FORWARD(32, 32)
FLASH_DMMA_FORWARD(64, 64)
FLASH_DMMA_FORWARD(96, 96)
FLASH_DMMA_FORWARD(128, 128)
