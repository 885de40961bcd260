"""Probe: the FP64 tensor cores (DMMA) of the device, for a true-f32 attention forward whose
products run in f64 (issue 12). Checks the fragment layouts assumed for mma.sync f64 at
m8n8k4 and m16n8k16 against NumPy, and times each shape's throughput against an FFMA loop and
torch's float64 matmul (cuBLAS DGEMM).  python3 scripts/dmma_probe.py [out.json]"""

import json
import sys

import cupy as cp
import numpy as np

SOURCE = r"""
// The two f64 mma shapes, D = A B + C in place (fragment layouts: layout_k16, layout_k4).
__device__ __forceinline__ void mma16(double (&c)[4], const double (&a)[8], const double (&b)[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, {%0,%1,%2,%3};"
                 : "+d"(c[0]), "+d"(c[1]), "+d"(c[2]), "+d"(c[3])
                 : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]),
                   "d"(a[7]), "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
}

__device__ __forceinline__ void mma4(double& c0, double& c1, double a, double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};"
                 : "+d"(c0), "+d"(c1) : "d"(a), "d"(b));
}
extern "C" __global__ void layout_k16(const double* a, const double* b, double* d) {
    // A 16x16 row-major, B 16x8 row-major (k x n), D 16x8 row-major.
    int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    double A[8], B[4], C[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; ++i) {
        A[2 * i] = a[g * 16 + t + 4 * i];
        A[2 * i + 1] = a[(g + 8) * 16 + t + 4 * i];
        B[i] = b[(t + 4 * i) * 8 + g];
    }
    mma16(C, A, B);
    d[g * 8 + 2 * t] = C[0];
    d[g * 8 + 2 * t + 1] = C[1];
    d[(g + 8) * 8 + 2 * t] = C[2];
    d[(g + 8) * 8 + 2 * t + 1] = C[3];
}

extern "C" __global__ void layout_k4(const double* a, const double* b, double* d) {
    // A 8x4, B 4x8, D 8x8, row-major.
    int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    double A = a[g * 4 + t], B = b[t * 8 + g], C0 = 0, C1 = 0;
    mma4(C0, C1, A, B);
    d[g * 8 + 2 * t] = C0;
    d[g * 8 + 2 * t + 1] = C1;
}

#define CHAINS 8
extern "C" __global__ void rate_k16(double* out, int iters) {
    double A[8], B[4], C[CHAINS][4];
    for (int i = 0; i < 8; ++i) A[i] = 1e-3 * (threadIdx.x + i);
    for (int i = 0; i < 4; ++i) B[i] = 1e-3 * (threadIdx.x - i);
    for (int c = 0; c < CHAINS; ++c) for (int i = 0; i < 4; ++i) C[c][i] = 0;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c)
            mma16(C[c], A, B);
    }
    double s = 0;
    for (int c = 0; c < CHAINS; ++c) for (int i = 0; i < 4; ++i) s += C[c][i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

extern "C" __global__ void rate_k4(double* out, int iters) {
    double A = 1e-3 * threadIdx.x, B = 1e-3 * (threadIdx.x + 1), C[CHAINS][2];
    for (int c = 0; c < CHAINS; ++c) C[c][0] = C[c][1] = 0;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c)
            mma4(C[c][0], C[c][1], A, B);
    }
    double s = 0;
    for (int c = 0; c < CHAINS; ++c) s += C[c][0] + C[c][1];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}


// F2F f32 -> f64 alone, and beside DMMA: CONV conversions per mma (operands converted from f32
// registers that change every iteration, so none can be hoisted).
template <int CONV>
__device__ void conv_mix(double* out, int iters, bool with_mma) {
    double C[CHAINS][4];
    float src[8];
    for (int i = 0; i < 8; ++i) src[i] = 1e-3f * (threadIdx.x + i);
    for (int c = 0; c < CHAINS; ++c) for (int i = 0; i < 4; ++i) C[c][i] = 0;
    double acc = 0;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c) {
            double a[8], b[4];
#pragma unroll
            for (int i = 0; i < 8; ++i) a[i] = i < CONV ? (double)src[i] : 1e-3 * i;
#pragma unroll
            for (int i = 0; i < 4; ++i) b[i] = i + 8 < CONV ? (double)src[(i + c) & 7] : 2e-3 * i;
            if (with_mma) {
                mma16(C[c], a, b);
            } else {
#pragma unroll
                for (int i = 0; i < 8; ++i) acc += a[i];
#pragma unroll
                for (int i = 0; i < 4; ++i) acc += b[i];
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) src[i] = __int_as_float(__float_as_int(src[i]) ^ (it & 1));
        }
    }
    double s = acc;
    for (int c = 0; c < CHAINS; ++c) for (int i = 0; i < 4; ++i) s += C[c][i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
extern "C" __global__ void mma_conv0(double* out, int iters) { conv_mix<0>(out, iters, true); }
extern "C" __global__ void mma_conv6(double* out, int iters) { conv_mix<6>(out, iters, true); }
extern "C" __global__ void mma_conv12(double* out, int iters) { conv_mix<12>(out, iters, true); }


// m16n8k16 f64 fed from f32 tiles in shared memory, as the MMA forward's scores are (and as a
// forward with P V on DMMA too would be): per k-step a warp loads and widens its 16 x 16 A
// fragment, then NT 16 x 8 B fragments, one mma each. Row stride 132 floats (the kernels'
// D + 4): every load of a fragment element hits 32 banks. ITERS passes over a 64 x 128 tile.
template <int NT>
__device__ void smem_fed(double* out, int iters) {
    extern __shared__ float tiles[];
    constexpr int LD = 132;
    float* qt = tiles;               // 64 x 128
    float* kt = tiles + 64 * LD;     // 64 x 128
    for (int i = threadIdx.x; i < 2 * 64 * LD; i += blockDim.x) tiles[i] = 1e-3f * (i % 97);
    __syncthreads();
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, w = threadIdx.x >> 5;
    const float* qa = qt + ((w & 3) * 16 + g) * LD + t;
    const float* kb = kt + g * LD + t;
    double acc[NT][4] = {};
    for (int it = 0; it < iters; ++it) {
#pragma unroll 2
        for (int kk = 0; kk < 128; kk += 16) {
            double a[8];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                a[2 * i] = qa[kk + 4 * i];
                a[2 * i + 1] = qa[8 * LD + kk + 4 * i];
            }
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                double b[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) b[i] = kb[n * 8 * LD + kk + 4 * i];
                mma16(acc[n], a, b);
            }
        }
    }
    double sum = 0;
    for (int n = 0; n < NT; ++n) sum += acc[n][0] + acc[n][1] + acc[n][2] + acc[n][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
extern "C" __global__ void smem_fed4(double* out, int iters) { smem_fed<4>(out, iters); }
extern "C" __global__ void smem_fed8(double* out, int iters) { smem_fed<8>(out, iters); }

extern "C" __global__ void rate_ffma(float* out, int iters) {
    float x[CHAINS], y = 1.0001f * threadIdx.x, z = 0.9999f;
    for (int c = 0; c < CHAINS; ++c) x[c] = c;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int r = 0; r < 8; ++r)
#pragma unroll
            for (int c = 0; c < CHAINS; ++c) x[c] = fmaf(x[c], z, y);
    }
    float s = 0;
    for (int c = 0; c < CHAINS; ++c) s += x[c];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""


def timed(fn, reps=5):
    fn()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    best = float("inf")
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return best


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else None
    module = cp.RawModule(code=SOURCE, options=("-arch=sm_90",))
    rng = np.random.default_rng(0)
    report = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode()}
    sms = cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    for name, (m, k, n) in (("layout_k16", (16, 16, 8)), ("layout_k4", (8, 4, 8))):
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
        d = cp.zeros((m, n))
        module.get_function(name)((1,), (32,), (cp.asarray(a), cp.asarray(b), d))
        err = float(np.abs(d.get() - a @ b).max())
        report[name] = {"max_abs_err_vs_numpy": err, "ok": err < 1e-12}
    out = cp.zeros(sms * 16 * 128, dtype=cp.float64)
    iters = 4096
    for name, flops_per_mma in (("rate_k16", 2 * 16 * 8 * 16), ("rate_k4", 2 * 8 * 8 * 4)):
        for blocks_per_sm, threads in ((4, 128), (8, 128), (2, 256)):
            grid = sms * blocks_per_sm
            fn = module.get_function(name)
            s = timed(lambda fn=fn, grid=grid, threads=threads: fn((grid,), (threads,),
                                                                     (out, np.int32(iters))))
            warps = grid * threads // 32
            tflops = warps * iters * 8 * flops_per_mma / s / 1e12
            report[f"{name} {blocks_per_sm}x{threads}"] = round(tflops, 2)
    # DMMA with 0, 6 or 12 f32 -> f64 conversions of its operands per mma (the MMA forward's
    # scores convert 6: a quarter of A's 8 and B's 4).
    for name in ("mma_conv0", "mma_conv6", "mma_conv12"):
        fn = module.get_function(name)
        grid = sms * 8
        s = timed(lambda fn=fn, grid=grid: fn((grid,), (128,), (out, np.int32(iters // 4))))
        report[name] = round(grid * 4 * (iters // 4) * 8 * 2 * 16 * 8 * 16 / s / 1e12, 2)
    # Operands from f32 shared tiles, widened per use (4 or 8 B tiles a k-step: 6 or 5
    # widenings an mma), two 128-thread CTAs an SM and one of 256 threads.
    smem, reps = 2 * 64 * 132 * 4, 64
    for name, tiles in (("smem_fed4", 4), ("smem_fed8", 8)):
        fn = module.get_function(name)
        fn.max_dynamic_shared_size_bytes = smem
        for blocks_per_sm, threads in ((2, 128), (1, 256)):
            grid = sms * blocks_per_sm
            s = timed(lambda fn=fn, grid=grid, threads=threads: fn(
                (grid,), (threads,), (out, np.int32(reps)), shared_mem=smem))
            mmas = grid * threads // 32 * reps * 8 * tiles
            report[f"{name} {blocks_per_sm}x{threads}"] = round(
                mmas * 2 * 16 * 8 * 16 / s / 1e12, 2)
    outf = cp.zeros(sms * 16 * 256, dtype=cp.float32)
    fn = module.get_function("rate_ffma")
    grid = sms * 8
    s = timed(lambda: fn((grid,), (256,), (outf, np.int32(iters))))
    report["ffma"] = round(grid * 256 * iters * 8 * 8 * 2 / s / 1e12, 2)
    try:
        import torch
        x = torch.randn(8192, 8192, dtype=torch.float64, device="cuda")
        torch.mm(x, x)
        torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record()
        for _ in range(3):
            torch.mm(x, x)
        ev[1].record()
        torch.cuda.synchronize()
        report["torch dgemm 8192"] = round(3 * 2 * 8192**3 / (ev[0].elapsed_time(ev[1]) / 1e3)
                                           / 1e12, 2)
    except Exception as e:  # noqa: BLE001 - a probe: report it
        report["torch dgemm 8192"] = repr(e)
    print(json.dumps(report, indent=1))
    if out_path:
        with open(out_path, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
