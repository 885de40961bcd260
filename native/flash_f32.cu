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
//   flash_f32_fwd_dmma_d<D>_dv<D>   Q K^T and P V both on sm_90's FP64 tensor cores, CTAs of 32
//                                   rows and 128 threads, three an SM at D <= 64, else two
//                                   (forward_dmma, in flash_f32_dmma.cuh).
//   flash_f32_fwd_wide_d128_dv128   the 64-row forward over 128 rows and 128-key blocks, 256
//                                   threads, for GPUs other than sm_90 that give a block 198 KiB of
//                                   shared memory (ForwardShape).
//   flash_f32_bwd_delta             Delta_i = rowsum(dO_i * O_i) into the workspace; zeroes dQ
//                                   and the query blocks' turn counters.
//   flash_f32_bwd_dkdv_d<D>_dv<Dv>  CTA = (64 keys, kv head, sequence); loops over the group's
//                                   query heads, then 32-row query blocks, in a fixed order,
//                                   writes dK and dV for its key rows (zeros included) and adds
//                                   each query block's dS K into dQ in its turn.
//   flash_f32_bwd_dkdv_mma_d<D>_dv<Dv>  the same with S = Q K^T and dP = dO V^T on sm_90's FP64
//                                   tensor cores (scores_dmma).
// dQ sums over key blocks, which different CTAs hold. Rather than recompute the scores in a
// kernel of its own, each CTA adds its share into dQ in key-block order: query block i's turn
// counter holds one past the last key block that added into it, and CTA j waits (spinning on an
// acquire load) until it reaches j, when key block j - 1 also sees block i. The additions are
// L2 reductions, but only one CTA adds into a query block at a time, so the sums run in a fixed
// order and the backward is bitwise reproducible. Waiting on a lower CTA index relies on the GPU
// starting a grid's CTAs in index order (as deterministic FlashAttention 3 does): the CTA waited
// on is then running or done. The backward recomputes the scores as the forward on the same GPU
// takes them: f64 sums rounded once on sm_90 (its order of the products may differ from the DMMA
// forward's, so a score may sit one f32 rounding apart), the f32 chain of dot_rows elsewhere.
//
// Shared memory holds row-major tiles padded by 4 floats a row: a float4 read of 16 different
// rows at one column then spreads over all 32 banks. Tiles arrive by cp.async (16-byte copies
// when every base and stride allows, 4-byte copies otherwise), which lets the next V (or K)
// block stream in while the current one is multiplied. At D = Dv = 128 each kernel takes about
// 100 KiB, so two CTAs share an SM; the wide forward takes 198 KiB, one CTA an SM.
//
// NVRTC builds without fast math: exp2f, logf and the divisions here are the precise ones.
//
// This file holds the kernels' entry points; their bodies are in flash_f32_forward.cuh (the FMA
// forward), flash_f32_dmma.cuh (sm_90's forward) and flash_f32_backward.cuh, over the shared
// pieces of flash_f32_common.cuh and the tile products of flash_f32_products.cuh.
#include "flash_f32_forward.cuh"
#include "flash_f32_dmma.cuh"
#include "flash_f32_backward.cuh"

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

#define FLASH_FORWARD(NAME, D, DV, WIDE)                                                        \
    extern "C" __global__ void __launch_bounds__(ForwardShape<D, DV, WIDE>::THREADS,            \
                                                 ForwardShape<D, DV, WIDE>::CTAS)               \
        NAME(FLASH_IN(q), FLASH_IN(k), FLASH_IN(v), FLASH_OUT(out), FLASH_OUT(lse),             \
             FLASH_PROBLEM_PARAMS) {                                                             \
        forward<D, DV, WIDE>(FLASH_ROWS(const float, q), FLASH_ROWS(const float, k),            \
                             FLASH_ROWS(const float, v), FLASH_ROWS(float, out),                \
                             FLASH_ROWS(float, lse), FLASH_PROBLEM);                            \
    }

#define FLASH_DMMA_FORWARD(D, DV)                                                               \
    extern "C" __global__ void __launch_bounds__(kDmmaThreads, dmma_ctas(D, DV))               \
        flash_f32_fwd_dmma_d##D##_dv##DV(FLASH_IN(q), FLASH_IN(k), FLASH_IN(v), FLASH_OUT(out), \
                                         FLASH_OUT(lse), FLASH_PROBLEM_PARAMS) {                \
        forward_dmma<D, DV>(FLASH_ROWS(const float, q), FLASH_ROWS(const float, k),            \
                            FLASH_ROWS(const float, v), FLASH_ROWS(float, out),                \
                            FLASH_ROWS(float, lse), FLASH_PROBLEM);                            \
    }

#define FLASH_DKDV(NAME, D, DV, MMA)                                                            \
    extern "C" __global__ void __launch_bounds__(kDkdvThreads, ctas_per_sm(D, DV))              \
        NAME(FLASH_IN(q), FLASH_IN(k), FLASH_IN(v), FLASH_IN(dout), FLASH_IN(lse),              \
             FLASH_IN(delta), FLASH_OUT(dq), FLASH_OUT(dk), FLASH_OUT(dv), int* turns,          \
             FLASH_PROBLEM_PARAMS) {                                                             \
        backward_dkdv<D, DV, MMA>(FLASH_BACKWARD_INPUTS, FLASH_ROWS(float, dk),                  \
                                  FLASH_ROWS(float, dv), FLASH_ROWS(float, dq), turns,          \
                                  FLASH_PROBLEM);                                                \
    }

// Every (head_dim, head_dim_v) pair gets the FMA forward and backward (any GPU) and the DMMA
// forward and the backward with its scores on the FP64 tensor cores (sm_90).
#define FLASH_KERNELS(D, DV)                                                                    \
    FLASH_FORWARD(flash_f32_fwd_d##D##_dv##DV, D, DV, false)                                    \
    FLASH_DMMA_FORWARD(D, DV)                                                                   \
    FLASH_DKDV(flash_f32_bwd_dkdv_d##D##_dv##DV, D, DV, false)                                  \
    FLASH_DKDV(flash_f32_bwd_dkdv_mma_d##D##_dv##DV, D, DV, true)

FLASH_KERNELS(32, 32)
FLASH_KERNELS(64, 64)
FLASH_KERNELS(96, 96)
FLASH_KERNELS(128, 128)
FLASH_KERNELS(128, 64)
FLASH_KERNELS(64, 128)
FLASH_FORWARD(flash_f32_fwd_wide_d128_dv128, 128, 128, true)
