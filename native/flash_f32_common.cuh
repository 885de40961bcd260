// What every true-f32 flash kernel shares (flash_f32.cu, which lists the kernels and states
// the layouts, masks and precision; flash_f32_products.cuh, flash_f32_dmma.cuh): the problem as
// the kernels receive it, addressing and masks, shared-memory tiles and their copies, and the
// online softmax's fold and block tests.
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
