"""Checks, on an sm_90 GPU, the shared-memory layouts and descriptors the wgmma decode tile
(experiment, fortieth session) relies on: no-swizzle core matrices (8 rows of 16 bytes, 128
contiguous bytes) written the way cp.async writes a cache's 16-byte vectors.

- S^T = K Q^T: A = K [64 keys][D] K-major, B = Q [16 rows][D] K-major (m64n16k16, D / 16 steps).
- O^T = V^T P^T: A = V^T from V [64 keys][D] (M-major, trans-a), B = P^T from P stored keys-major
  with rows contiguous (N-major, trans-b), N = 16 or 32.
Each (LBO, SBO) candidate's result is compared with float64; the accumulator's lane mapping is
PTX's (row 16 warp + lane / 4 + 8 ((i / 2) % 2), column 8 (i / 4) + 2 (lane % 4) + i % 2).
usage: python3 scripts/wgmma_layout_probe.py"""
import cupy as cp
import numpy as np

SRC = r'''
typedef unsigned long long u64;
__device__ __forceinline__ u64 desc(const void* p, unsigned lbo, unsigned sbo) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    return (u64)((a & 0x3FFFF) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32);
}
// element (r, c) of a [R][C] bf16 matrix stored as core matrices [r/8][c/8][r%8][c%8], with
// `per` = C/8 core matrices along c.
__device__ __forceinline__ int core_at(int r, int c, int per) {
    return ((r >> 3) * per + (c >> 3)) * 64 + (r & 7) * 8 + (c & 7);
}
// One wgmma.m64n16k16 (bf16, f32 accumulators d, 8 a thread): d = a b (+ d where add), with
// trans-a and trans-b both kTrans.
template <int kTrans>
__device__ __forceinline__ void mma16(float* d, u64 a, u64 b, int add) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, %11, %11;\n}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
          "+f"(d[6]), "+f"(d[7])
        : "l"(a), "l"(b), "r"(add), "n"(kTrans));
}
#define D 128
extern "C" __global__ void qk(const unsigned short* K, const unsigned short* Q, float* out,
                              unsigned lbo, unsigned sbo) {
    __shared__ __align__(128) unsigned short ks[64 * D], qs[16 * D];
    for (int e = threadIdx.x; e < 64 * D; e += 128) ks[core_at(e / D, e % D, D / 8)] = K[e];
    for (int e = threadIdx.x; e < 16 * D; e += 128) qs[core_at(e / D, e % D, D / 8)] = Q[e];
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    float d[8] = {};
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
        u64 da = desc(ks + core_at(0, 16 * k, D / 8), lbo, sbo);
        u64 db = desc(qs + core_at(0, 16 * k, D / 8), lbo, sbo);
        mma16<0>(d, da, db, k);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    for (int i = 0; i < 8; ++i) out[threadIdx.x * 8 + i] = d[i];
}
// O^T [D][N] = V^T [D][64] P^T [64][N]; V [64][D] stored as core matrices [key/8][d/8][key%8][d%8]
// (K's layout), P^T stored [key/8][n/8][key%8][n%8] (n contiguous).
template <int N>
__device__ void pv_body(const unsigned short* V, const unsigned short* P, float* out,
                        unsigned lbo_a, unsigned sbo_a, unsigned lbo_b, unsigned sbo_b) {
    __shared__ __align__(128) unsigned short vs[64 * D], ps[64 * 32];
    for (int e = threadIdx.x; e < 64 * D; e += 128) vs[core_at(e / D, e % D, D / 8)] = V[e];
    for (int e = threadIdx.x; e < 64 * N; e += 128) ps[core_at(e / N, e % N, N / 8)] = P[e];
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    float d[D / 64][N / 2] = {};
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int mt = 0; mt < D / 64; ++mt) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            // A: dims 64 mt.., keys 16 k..: core (key group 2k, d group 8 mt)
            u64 da = desc(vs + core_at(16 * k, 64 * mt, D / 8), lbo_a, sbo_a);
            u64 db = desc(ps + core_at(16 * k, 0, N / 8), lbo_b, sbo_b);
            float* x = d[mt];
            if constexpr (N == 16) {
                mma16<1>(x, da, db, k);
            } else {
                asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                    "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
                    "%16, %17, p, 1, 1, 1, 1;\n}"
                    : "+f"(x[0]), "+f"(x[1]), "+f"(x[2]), "+f"(x[3]), "+f"(x[4]), "+f"(x[5]),
                      "+f"(x[6]), "+f"(x[7]), "+f"(x[8]), "+f"(x[9]), "+f"(x[10]), "+f"(x[11]),
                      "+f"(x[12]), "+f"(x[13]), "+f"(x[14]), "+f"(x[15])
                    : "l"(da), "l"(db), "r"(k));
            }
        }
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    for (int mt = 0; mt < D / 64; ++mt)
        for (int i = 0; i < N / 2; ++i) out[(mt * 128 + threadIdx.x) * (N / 2) + i] = d[mt][i];
}
extern "C" __global__ void pv16(const unsigned short* V, const unsigned short* P, float* out,
                                unsigned la, unsigned sa, unsigned lb, unsigned sb) {
    pv_body<16>(V, P, out, la, sa, lb, sb);
}
extern "C" __global__ void pv32(const unsigned short* V, const unsigned short* P, float* out,
                                unsigned la, unsigned sa, unsigned lb, unsigned sb) {
    pv_body<32>(V, P, out, la, sa, lb, sb);
}
'''


def gathered(raw, m_tiles, n):
    """The [64 m_tiles][n] matrix the accumulators hold, by PTX's mapping."""
    full = np.full((64 * m_tiles, n), np.nan)
    regs = raw.reshape(m_tiles, 128, n // 2)
    for mt in range(m_tiles):
        for t in range(128):
            w, lane = divmod(t, 32)
            for i in range(n // 2):
                row = 16 * w + lane // 4 + 8 * ((i // 2) % 2)
                col = 8 * (i // 4) + 2 * (lane % 4) + i % 2
                full[64 * mt + row, col] = regs[mt, t, i]
    return full


def main(which):
    """Runs one candidate (a wrong stride may fault, so each runs in its own process)."""
    import torch

    mod = cp.RawModule(code=SRC, options=("-std=c++17", "-arch=sm_90a"))
    rng = np.random.default_rng(1)

    def to_bf16(x):
        t = torch.tensor(x, dtype=torch.float32).to(torch.bfloat16)
        return t.cuda(), t.float().numpy().astype(np.float64)

    ptr = lambda t: np.uint64(t.data_ptr())  # noqa: E731
    k_t, k64 = to_bf16(rng.standard_normal((64, 128)))
    q_t, q64 = to_bf16(rng.standard_normal((16, 128)))
    v_t, v64 = to_bf16(rng.standard_normal((64, 128)))
    kind, *strides = which.split(",")
    strides = [np.uint32(int(x)) for x in strides]
    if kind == "qk":
        want = k64 @ q64.T  # S^T [64][16]
        out = torch.zeros(128 * 8, device="cuda")
        mod.get_function("qk")((1,), (128,), (ptr(k_t), ptr(q_t), ptr(out), *strides))
        got = gathered(out.cpu().numpy(), 1, 16)
    else:
        n = int(kind[2:])
        p_t, p64 = to_bf16(rng.random((64, n)))
        want = v64.T @ p64  # O^T [128][n]
        out = torch.zeros(128 * n, device="cuda")
        mod.get_function(kind)((1,), (128,), (ptr(v_t), ptr(p_t), ptr(out), *strides))
        got = gathered(out.cpu().numpy(), 2, n)
    scale = np.abs(want).max()
    print(f"{which}: max |err| / max |want| {np.nanmax(np.abs(got - want)) / scale:.3g}",
          flush=True)


if __name__ == "__main__":
    import subprocess
    import sys

    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        cases = ["qk,128,2048", "qk,2048,128"]
        for n in (16, 32):
            for a in ((2048, 128), (128, 2048)):
                for b in ((n // 8 * 128, 128), (128, n // 8 * 128)):
                    cases.append(f"pv{n},{a[0]},{a[1]},{b[0]},{b[1]}")
        for case in cases:
            run = subprocess.run([sys.executable, __file__, case], capture_output=True, text=True)
            print(run.stdout.strip() or f"{case}: failed: {run.stderr.strip().splitlines()[-1]}",
                  flush=True)
