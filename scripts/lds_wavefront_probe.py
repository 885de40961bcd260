"""How many shared-memory wavefronts one warp-wide 16-byte shared load (LDS.128) costs, by the
pattern of addresses its 32 lanes read: the cost model behind the true-f32 kernels' tile layouts
(native/flash_f32.cu). Each pattern is a kernel of one warp that runs 512 such loads; ncu counts
the wavefronts:

    ncu --metrics l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,\
smsp__inst_executed_op_shared_ld.sum python3 scripts/lds_wavefront_probe.py

The row stride is 132 floats, as a padded d128 tile's.
"""

from __future__ import annotations

import cupy

# name: the float offset lane l reads (before the column k), in C.
PATTERNS = {
    "warp_same": "0",
    "halves_rows_0_8": "(l >> 4) * 8 * 132",
    "halves_rows_0_1": "(l >> 4) * 132",
    "quarters_4_rows": "(l >> 3) * 132",
    "half_16_rows_twice": "(l & 15) * 132",
    "warp_32_rows": "l * 132",
    "eighths_8_rows": "(l & 7) * 132",
    "half_8_rows_2_groups": "((l & 7) + ((l >> 4) << 3)) * 132",
    "contiguous_512B": "l * 4",
    "contiguous_256B_twice": "(l & 15) * 4",
}

SOURCE = r"""
extern "C" __global__ void probe_NAME(float* out) {
    __shared__ __align__(16) float tile[64 * 132];
    const int l = threadIdx.x;
    for (int i = l; i < 64 * 132; i += 32) tile[i] = i;
    __syncwarp();
    const unsigned base = (unsigned)__cvta_generic_to_shared(tile) + 4u * (OFFSET);
    float a = 0.f, b = 0.f, c = 0.f, d = 0.f;
    for (int it = 0; it < 512; ++it) {
        const unsigned addr = base + 16u * (it & 31);
        float x, y, z, w;
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(x), "=f"(y), "=f"(z), "=f"(w) : "r"(addr));
        a += x; b += y; c += z; d += w;
    }
    out[l] = a + b + c + d;
}
"""


def main() -> None:
    out = cupy.zeros(32, cupy.float32)
    for name, offset in PATTERNS.items():
        source = SOURCE.replace("NAME", name).replace("OFFSET", offset)
        kernel = cupy.RawKernel(source, f"probe_{name}", options=("-std=c++17",))
        kernel((1,), (32,), (out,))
    cupy.cuda.Device().synchronize()
    print("ran", len(PATTERNS), "patterns")


if __name__ == "__main__":
    main()
