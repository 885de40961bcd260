// Writing a decode step's new keys and values into the KV caches (issue 13), and the cache
// check of checked mode, which decode_attention and kv_append share.
//
//   kv_append_<T>_<form>_<layout>
//                    one CTA per (sequence, new token, group of kv heads), one thread per 16
//                    bytes of a head's new key and value: threads (vector, head). The token's
//                    position (OPFACADE_TOKEN_POSITION) and page are one broadcast load each per
//                    CTA; positions outside the capacity and pages outside the pool are skipped.
//                    A kernel per cache form (contiguous, paged, pointers) and layout (nhd, hnd).
//   kv_cache_check   checked mode: the first sequence whose length, pages or cache addresses
//                    break the contract's rules (contracts/kv_cache.py).
// The caches' forms and addressing are kv_cache.cuh's.
#define OPFACADE_STREAMING 1  // the new tokens are written once per step (common.cuh)
#include "kv_cache.cuh"

namespace {

using namespace kv_cache;

// blockDim = (vectors of one head's key and value, heads per CTA); grid = (sequences, q_len,
// head groups). Nothing divides to find a thread's place: this kernel is a few microseconds
// of latency, and on an H100 (scripts/kv_append_variants.py) the former grid-stride loop with
// 32-bit divisions took 0.3 us more per paged call.
template <typename T>
__device__ void append(const T* __restrict__ k_new, i64 k_sb, i64 k_st, i64 k_sh,
                       const T* __restrict__ v_new, i64 v_sb, i64 v_st, i64 v_sh, const Cache& c,
                       const int* __restrict__ seq_lens, int q_len) {
    constexpr int kVec = 16 / sizeof(T);
    const int key_vecs = c.dim / kVec;
    const int e = threadIdx.x, g = blockIdx.z * blockDim.y + threadIdx.y;
    const int s = blockIdx.x, t = blockIdx.y;
    if (g >= c.heads_kv) return;
    const bool is_key = e < key_vecs;
    const int col = (is_key ? e : e - key_vecs) * kVec;
    // The token's bytes are loaded before its position is known, so the loads overlap.
    const uint4 bytes = load16(is_key ? k_new + s * k_sb + t * k_st + g * k_sh + col
                                      : v_new + s * v_sb + t * v_st + g * v_sh + col);
    const int pos = OPFACADE_TOKEN_POSITION(seq_lens[s], q_len, t);
    // Checked mode names these; unchecked runs skip them rather than write elsewhere.
    if (pos < 0 || pos >= c.capacity) return;
    if (c.kind == 2 && sequence_length(c, seq_lens, s) == 0) return;
    int page = -1;
    if (c.kind == 1 && (page = page_of(c, s, pos)) < 0) return;
    T* dst = const_cast<T*>(is_key ? row_at<T>(c, c.k, s, pos, g, c.dim, page)
                                   : row_at<T>(c, c.v, s, pos, g, c.dim_v, page)) + col;
    store16(dst, bytes);
}

}  // namespace

// The cache's form and layout are the kernel's constants, the rest of its description is read
// at run time (the kind and hnd parameters are then unused): the branches on them, and the
// addressing of the forms not taken, leave the store's dependent chain. On an H200
// (scripts/kv_append_variants.py, record catalog/probes/kv_append_forms_H200.json) the paged
// rows went from 0.59-0.64 to 0.66-0.69 of a copy, the contiguous ones from 0.72-0.75 to
// 0.74-0.78.
#define OPFACADE_APPEND(NAME, T, KIND, HND)                                                      \
    extern "C" __global__ void __launch_bounds__(1024) NAME(                                     \
        const T* k_new, i64 k_sb, i64 k_st, i64 k_sh, const T* v_new, i64 v_sb, i64 v_st,        \
        i64 v_sh, OPFACADE_CACHE_PARAMS, const int* seq_lens, int q_len) {                       \
        Cache c = OPFACADE_CACHE_ARGS;                                                           \
        c.kind = KIND;                                                                           \
        c.hnd = HND;                                                                             \
        append<T>(k_new, k_sb, k_st, k_sh, v_new, v_sb, v_st, v_sh, c, seq_lens, q_len);         \
    }

// The forms as kv_cache.cuh numbers them (decode.py's KINDS).
#define OPFACADE_APPEND_FORMS(SUFFIX, T)                                                         \
    OPFACADE_APPEND(kv_append_##SUFFIX##_contiguous_nhd, T, 0, 0)                                \
    OPFACADE_APPEND(kv_append_##SUFFIX##_contiguous_hnd, T, 0, 1)                                \
    OPFACADE_APPEND(kv_append_##SUFFIX##_paged_nhd, T, 1, 0)                                     \
    OPFACADE_APPEND(kv_append_##SUFFIX##_paged_hnd, T, 1, 1)                                     \
    OPFACADE_APPEND(kv_append_##SUFFIX##_pointers_nhd, T, 2, 0)                                  \
    OPFACADE_APPEND(kv_append_##SUFFIX##_pointers_hnd, T, 2, 1)

OPFACADE_APPEND_FORMS(f32, float)
OPFACADE_APPEND_FORMS(f16, f16_t)
OPFACADE_APPEND_FORMS(bf16, bf16_t)

// Checked mode: verdict int32 [4] = (sequence, rule, detail, value) of the first sequence s that
// breaks a rule, or sequence -1. Rules: 1 seq_lens[s] = value is neither 0 nor within
// [q_len, capacity]; 2 page_table[s, detail] = value is outside [0, pages); 3 k_cache's address
// of s is null or not 16-byte aligned; 4 v_cache's likewise. One CTA: each thread tests its
// sequences, the smallest failing index wins (atomicMin), then thread 0 describes it.
__device__ __forceinline__ int check_sequence(const Cache& c, const int* seq_lens, int s,
                                             int q_len, int* detail, int* value) {
    const int len = seq_lens[s];
    *detail = 0;
    *value = len;
    if (len != 0 && (len < q_len || len > c.capacity)) return 1;
    if (c.kind == 1) {
        const int used = (len + c.page_size - 1) / c.page_size;
        for (int k = 0; k < used; ++k) {
            const int page = c.table[(i64)s * c.max_pages + k];
            if (page < 0 || page >= c.pages) {
                *detail = k;
                *value = page;
                return 2;
            }
        }
    }
    if (c.kind == 2) {
        if (!usable_address(static_cast<const i64*>(c.k)[s])) return 3;
        if (!usable_address(static_cast<const i64*>(c.v)[s])) return 4;
    }
    return 0;
}

extern "C" __global__ void __launch_bounds__(256) kv_cache_check(
    OPFACADE_CACHE_PARAMS, const int* seq_lens, int sequences, int q_len, int* verdict) {
    __shared__ int first;
    const Cache c = OPFACADE_CACHE_ARGS;
    if (threadIdx.x == 0) first = 0x7fffffff;
    __syncthreads();
    int detail, value;
    for (int s = threadIdx.x; s < sequences; s += blockDim.x) {
        if (check_sequence(c, seq_lens, s, q_len, &detail, &value) != 0) {
            atomicMin(&first, s);
            break;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const int s = first == 0x7fffffff ? -1 : first;
        const int rule = s < 0 ? 0 : check_sequence(c, seq_lens, s, q_len, &detail, &value);
        verdict[0] = s;
        verdict[1] = rule;
        verdict[2] = s < 0 ? 0 : detail;
        verdict[3] = s < 0 ? 0 : value;
    }
}
