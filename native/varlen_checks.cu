// Checked mode of packed (varlen) attention: the offsets' rules, tested on the device.
//
//   varlen_check_offsets   verdict = the first offset that breaks a rule, in cu_seqlens_q then
//                          cu_seqlens_kv: it must start at 0, never decrease, keep every sequence
//                          within max_seqlen, and end within the tensor's tokens.
//
// One thread walks both arrays (b + 1 <= 65536 ints: microseconds), so the verdict is the first
// violation in index order, as the host reference reports it. verdict is int32 [5]: argument (0
// none, 1 cu_seqlens_q, 2 cu_seqlens_kv), rule (1 start, 2 decreases, 3 too long, 4 past the
// tokens), index, and the values before and at it.
#include "common.cuh"

__device__ __forceinline__ bool check_one(const int* __restrict__ cu, int entries, int tokens,
                                          int longest, int argument, int* __restrict__ verdict) {
    int rule = 0, index = 0, before = 0, at = cu[0];
    if (at != 0) {
        rule = 1;
    } else {
        for (int i = 1; i < entries && rule == 0; ++i) {
            before = cu[i - 1];
            at = cu[i];
            index = i;
            // In 64 bits: a garbage pair cannot overflow the difference.
            const i64 step = (i64)at - (i64)before;
            rule = step < 0 ? 2 : step > longest ? 3 : 0;
        }
        if (rule == 0 && at > tokens) {
            rule = 4;
            index = entries - 1;
        }
    }
    if (rule == 0) return false;
    verdict[0] = argument;
    verdict[1] = rule;
    verdict[2] = index;
    verdict[3] = before;
    verdict[4] = at;
    return true;
}

extern "C" __global__ void __launch_bounds__(32) varlen_check_offsets(
    const int* __restrict__ cu_q, const int* __restrict__ cu_kv, int entries, int tokens_q,
    int tokens_kv, int max_q, int max_kv, int* __restrict__ verdict) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    verdict[0] = 0;
    if (!check_one(cu_q, entries, tokens_q, max_q, 1, verdict)) {
        check_one(cu_kv, entries, tokens_kv, max_kv, 2, verdict);
    }
}
