"""The FP64 tensor-core rate a tuned GEMM reaches on this GPU: cuBLAS's DGEMM through torch
float64 matmuls of n x n by n x n, timed with CUDA events after two warm-up calls.

    python3 scripts/fp64_ceiling.py

The true-f32 forward's DMMA kernels do both attention products on the same units, so this is
the practical ceiling of their matmul work (the softmax and the f32 -> f64 widenings come on
top); issue 12's "cudnn f32" 2x rows are compared with it in docs/PERF-NOTES.md.
"""

import torch


def main() -> None:
    for n in (4096, 8192, 16384):
        a = torch.randn(n, n, dtype=torch.float64, device="cuda")
        b = torch.randn_like(a)
        for _ in range(2):
            a @ b
        torch.cuda.synchronize()
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        reps = 5 if n < 16384 else 2
        start.record()
        for _ in range(reps):
            a @ b
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / reps
        print(f"dgemm n={n}: {ms:.3f} ms, {2 * n**3 / ms / 1e9:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
