"""Whether a warp's 16-byte load shape moves a decode stream's bandwidth (forty-third session):
streams a token-major bf16 cache [B, S, 8 kv heads, 128] (K, then V) with the kq tile's CTA
shape (128 threads, 512 tokens a CTA, a warp's 128 tokens in groups of 16, 8 LDG.128 a lane a
group with the last-use hint, one group flying while the previous is consumed, 3 CTAs an SM),
its K in one of two shapes and its V as the kq tile reads V (4 tokens x 128 bytes an
instruction):
  K as 8 x 64 B: lane (gid, tig) reads token gid (+ 8) at bytes (4 p + tig) * 16: the 8-row kq
                 tile's fragments, each 128-byte line asked for in two halves;
  K as 4 x 128 B: lane l reads token l / 8 (+ 4 i) at bytes (l % 8 + 8 half) * 16: whole lines.
Prints each as % of a 1 GiB device copy (bytes read + written), median of 30 timed runs, three
rounds in turn. Nothing is computed on the loaded values but an xor that keeps them live.

    python3 scripts/decode_load_shape_probe.py [B S]
"""

from __future__ import annotations

import sys

import cupy as cp

SOURCE = r'''
__device__ __forceinline__ uint4 load_last_use(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.lu.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
// One group of 16 tokens from token `row0` of kv head `head` (rows of 128 uint4: 8 heads x 256 B).
template <bool LINES>
__device__ __forceinline__ void group(uint4 (&r)[8], const uint4* head, long long row0, int lane) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int row = LINES ? (lane >> 3) + 4 * (i >> 1) : (lane >> 2) + 8 * (i >> 2);
        const int piece = LINES ? (lane & 7) + 8 * (i & 1) : 4 * (i & 3) + (lane & 3);
        r[i] = load_last_use(head + (row0 + row) * 128 + piece);
    }
}
template <bool LINES>
__device__ void stream(const uint4* base, int chunks, unsigned* out) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long row0 = ((long long)blockIdx.z * chunks + blockIdx.y) * 512 + warp * 128;
    const uint4* head = base + blockIdx.x * 16;
    unsigned acc = 0;
    uint4 a[8], b[8];
    group<LINES>(a, head, row0, lane);
#pragma unroll
    for (int g = 0; g < 8; g += 2) {
        group<LINES>(b, head, row0 + 16 * (g + 1), lane);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc ^= a[i].x ^ a[i].y ^ a[i].z ^ a[i].w;
        if (g + 2 < 8) group<LINES>(a, head, row0 + 16 * (g + 2), lane);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc ^= b[i].x ^ b[i].y ^ b[i].z ^ b[i].w;
    }
    if (acc == 0x12345678u) out[0] = acc;  // never, in practice: keeps the loads
}
extern "C" __global__ void __launch_bounds__(128, 3)
kv(const uint4* k, const uint4* v, int chunks, int k_lines, unsigned* out) {
    if (k_lines) stream<true>(k, chunks, out); else stream<false>(k, chunks, out);
    stream<true>(v, chunks, out);
}
'''


def median_ms(fn, reps: int = 30) -> float:
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    batch, seq = (int(x) for x in sys.argv[1:3]) if len(sys.argv) > 2 else (64, 4096)
    kernel = cp.RawModule(code=SOURCE, options=("-std=c++17", "-arch=sm_90")).get_function("kv")
    elements = batch * seq * 8 * 128
    k = cp.random.randint(0, 1 << 16, elements, dtype=cp.uint16)
    v = cp.random.randint(0, 1 << 16, elements, dtype=cp.uint16)
    out = cp.zeros(4, cp.uint32)
    chunks = seq // 512
    src = cp.empty(1 << 28, cp.float32)
    dst = cp.empty_like(src)
    copy_tbps = 2 * src.nbytes / median_ms(lambda: dst.__setitem__(slice(None), src), 10) / 1e9
    shapes = {"K as 8 x 64 B (the 8-row kq tile)": 0, "K as 4 x 128 B (whole lines)": 1}
    read = {name: [] for name in shapes}
    for _ in range(3):
        for name, lines in shapes.items():
            ms = median_ms(lambda lines=lines: kernel(
                (8, chunks, batch), (128,), (k, v, cp.int32(chunks), cp.int32(lines), out)))
            read[name].append(round(100 * 2 * k.nbytes / ms / 1e9 / copy_tbps, 1))
    print(f"B{batch} S{seq}, copy {copy_tbps:.3f} TB/s; % of copy, 3 rounds:")
    for name, figures in read.items():
        print(f"  {name}: {figures}")


if __name__ == "__main__":
    main()
