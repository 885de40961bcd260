// Writing a decode step's new keys and values into the KV caches (issue 13), and the cache
// check of checked mode, which decode_attention and kv_append share.
//
//   kv_append_<T>_<form>_<layout>
//                    one CTA per (sequence, new token, group of kv heads, key or value), one
//                    thread per 16 bytes of a head's new key or value: threads (vector, head).
//                    The token's position (OPFACADE_TOKEN_POSITION) and page are one broadcast
//                    load each per CTA; positions outside the capacity and pages outside the
//                    pool are skipped.
//                    A kernel per cache form (contiguous, paged, pointers) and layout (nhd, hnd),
//                    and paged again with pages of 16, 32 or 64 tokens compiled in.
//   kv_cache_check   checked mode: the first sequence whose length, pages or cache addresses
//                    break the contract's rules (contracts/kv_cache.py).
// The caches' forms and addressing are kv_cache.cuh's.
#define OPFACADE_STREAMING 1  // the new tokens are written once per step (common.cuh)
#include "kv_cache.cuh"

namespace {

using namespace kv_cache;

// A 16-byte load that ptxas issues where it is written. Its value is needed only by a store that
// waits on other loads too; a plain load there is one ptxas may move past the tests between them
// (as it did: the LDG after the length's test and EXIT, forty-ninth session), and a volatile
// load is not moved past code that may skip it. One only: two volatile loads issue one after the
// other (the length's as well cost 0.06-0.34 us a call on an H200), so the length's stays plain.
__device__ __forceinline__ uint4 load16_now(const void* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// blockDim = (16-byte vectors of one head's key or value, heads per CTA); grid = (sequences,
// q_len, 2 x head groups): even z the keys of a group of heads, odd z their values. Nothing
// divides to find a thread's place: this kernel is a few microseconds of latency, and on an
// H100 (scripts/kv_append_variants.py) the former grid-stride loop with 32-bit divisions took
// 0.3 us more per paged call.
//
// Keys and values in CTAs of their own (since the fiftieth session; before, a head's key and
// value lanes shared each warp) make the side a CTA writes uniform over it, so that ptxas
// selects its tensors and strides on the uniform datapath. On an H200
// (scripts/kv_append_variants.py --before=<3a4df4e's native/>, call 9; record
// catalog/probes/kv_append_kv_split_H200.json) the 1 MB cases (B256, and B64 q_len 4, both
// forms) went from 1.856-1.949 us to 1.672-1.773, B64 contiguous from 1.499 to 1.467, and B64
// pages of 16 lost 0.037 us (1.630 to 1.667; 0.02-0.06 in the candidates' calls 5-8).
//
// Its time is a chain of round trips: the token's bytes and its sequence's length are loaded
// together, then (paged) the table's entry, then the store. Everything that does not wait on a
// load is computed before it returns: the destination is a part known from the thread's place,
// plus the token's position (from the length) times a token's bytes, plus (paged) the page
// times a page's bytes. The new tokens' strides are 32-bit byte counts (the host holds them
// below 2^31 bytes), each product widened to 64 bits as it is added (IMAD.WIDE); a sequence's
// or page's place in a cache is 64-bit.
template <typename T>
__device__ void append(const T* __restrict__ k_new, i64 k_sb, i64 k_st, i64 k_sh,
                       const T* __restrict__ v_new, i64 v_sb, i64 v_st, i64 v_sh, const Cache& c,
                       const int* __restrict__ seq_lens, int q_len) {
    constexpr int kVec = 16 / sizeof(T), kSize = sizeof(T);
    const bool is_key = (blockIdx.z & 1) == 0;
    const int e = threadIdx.x, g = (blockIdx.z >> 1) * blockDim.y + threadIdx.y;
    const int s = blockIdx.x, t = blockIdx.y;
    const int dim = is_key ? c.dim : c.dim_v;
    if (g >= c.heads_kv || e * kVec >= dim) return;
    const int len = seq_lens[s];
    const int col = e * kVec;
    const int sb = static_cast<int>(is_key ? k_sb : v_sb) * kSize;
    const int st = static_cast<int>(is_key ? k_st : v_st) * kSize;
    const int sh = static_cast<int>(is_key ? k_sh : v_sh) * kSize;
    const char* src = reinterpret_cast<const char*>(is_key ? k_new : v_new) + col * kSize;
    // The token's bytes are loaded with its length, and every test below feeds the store's
    // predicate instead of returning early: ptxas moved this load past such a return (SASS: the
    // LDG after the length's test and EXIT), which made the two loads one round trip after the
    // other (kv_append_variants.py's floors, forty-ninth session).
    const uint4 bytes = load16_now(src + (i64)s * sb + (i64)t * st + (i64)g * sh);
    // pointers: both addresses, loaded with the length whatever it holds
    const i64 k_at = c.kind == 2 ? static_cast<const i64*>(c.k)[s] : 0;
    const i64 v_at = c.kind == 2 ? static_cast<const i64*>(c.v)[s] : 0;

    // The destination's parts that need no load (kv_cache.cuh's offset, taken apart).
    const int tokens = c.kind == 1 ? c.page_size : c.capacity;  // of a page, or of a sequence
    const int token_bytes = (c.hnd ? dim : c.heads_kv * dim) * kSize;
    const i64 fixed_bytes = ((c.hnd ? (i64)g * tokens * dim : g * dim) + col) * kSize;
    const char* near = static_cast<const char*>(is_key ? c.k : c.v);
    if (c.kind == 2) near = reinterpret_cast<const char*>(is_key ? k_at : v_at);
    if (c.kind == 0) near += (i64)s * tokens * c.heads_kv * dim * kSize;
    near += fixed_bytes;

    const int pos = OPFACADE_TOKEN_POSITION(len, q_len, t);
    // Checked mode names these; unchecked runs skip them rather than write elsewhere.
    bool write = pos >= 0 && pos < c.capacity;
    if (c.kind == 2) write = write & usable_address(k_at) & usable_address(v_at);
    if (c.kind == 1) {
        const int entry = pool_page(c, table_entry(c, s, write ? pos : 0));
        write = write && entry >= 0;
        near += (i64)page_slot(c, pos) * token_bytes;
        near += (i64)max(entry, 0) * (tokens * c.heads_kv * dim * kSize);
    } else {
        near += (i64)pos * token_bytes;
    }
    store16_where(const_cast<char*>(near), bytes, write);
}

}  // namespace

// Every kernel begins with follow_previous_grid (common.cuh): kv_cache.py launches kv_append as a
// programmatic dependent of the stream's previous kernel on sm_90, so its CTAs may be resident
// before that kernel ends, and each waits for it (SASS ACQBULK, before any load or store: a CPU
// test reads that) before touching k_new, seq_lens, the table or the caches. On an H200 inside
// CUDA graphs of 20 appends (scripts/kv_append_variants.py, fifty-second session, record
// catalog/probes/kv_append_programmatic_H200.json) that took 0.45-0.54 us off each call; launched
// plainly the two instructions cost nothing measurable (-0.02 to +0.04 us against d2e0e1b's).
//
// The cache's form and layout are the kernel's constants, the rest of its description is read
// at run time (the kind and hnd parameters are then unused): the branches on them, and the
// addressing of the forms not taken, leave the store's dependent chain. On an H200
// (scripts/kv_append_variants.py, record catalog/probes/kv_append_forms_H200.json) the paged
// rows went from 0.59-0.64 to 0.66-0.69 of a copy, the contiguous ones from 0.72-0.75 to
// 0.74-0.78.
#define OPFACADE_APPEND(NAME, T, KIND, HND, PAGE)                                                \
    extern "C" __global__ void __launch_bounds__(1024) NAME(                                     \
        const T* k_new, i64 k_sb, i64 k_st, i64 k_sh, const T* v_new, i64 v_sb, i64 v_st,        \
        i64 v_sh, OPFACADE_CACHE_PARAMS, const int* seq_lens, int q_len) {                       \
        follow_previous_grid(); /* a programmatic dependent */                                   \
        Cache c = OPFACADE_CACHE_ARGS;                                                           \
        c.kind = KIND;                                                                           \
        c.hnd = HND;                                                                             \
        if (PAGE > 0) c.page_size = PAGE;                                                        \
        append<T>(k_new, k_sb, k_st, k_sh, v_new, v_sb, v_st, v_sh, c, seq_lens, q_len);         \
    }

// The forms as kv_cache.cuh numbers them (decode.py's KINDS), and paged caches again for the
// usual page sizes (kv_cache.py's APPEND_PAGE_SIZES), each a constant of its kernel: on an H200
// (scripts/kv_append_variants.py, forty-ninth session, two machines) the kernel with pages of
// 16 compiled in took 0.04-0.12 us less a call than the one reading the size.
#define OPFACADE_APPEND_FORMS(SUFFIX, T)                                                         \
    OPFACADE_APPEND(kv_append_##SUFFIX##_contiguous_nhd, T, 0, 0, 0)                             \
    OPFACADE_APPEND(kv_append_##SUFFIX##_contiguous_hnd, T, 0, 1, 0)                             \
    OPFACADE_APPEND(kv_append_##SUFFIX##_paged_nhd, T, 1, 0, 0)                                  \
    OPFACADE_APPEND(kv_append_##SUFFIX##_paged_hnd, T, 1, 1, 0)                                  \
    OPFACADE_APPEND(kv_append_##SUFFIX##_paged16_nhd, T, 1, 0, 16)                               \
    OPFACADE_APPEND(kv_append_##SUFFIX##_paged16_hnd, T, 1, 1, 16)                               \
    OPFACADE_APPEND(kv_append_##SUFFIX##_paged32_nhd, T, 1, 0, 32)                               \
    OPFACADE_APPEND(kv_append_##SUFFIX##_paged32_hnd, T, 1, 1, 32)                               \
    OPFACADE_APPEND(kv_append_##SUFFIX##_paged64_nhd, T, 1, 0, 64)                               \
    OPFACADE_APPEND(kv_append_##SUFFIX##_paged64_hnd, T, 1, 1, 64)                               \
    OPFACADE_APPEND(kv_append_##SUFFIX##_pointers_nhd, T, 2, 0, 0)                               \
    OPFACADE_APPEND(kv_append_##SUFFIX##_pointers_hnd, T, 2, 1, 0)

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
