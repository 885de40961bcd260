"""Times the true-f32 flash kernels (native/flash_f32.cu) at the bench's f32 shapes, and saves
their outputs so that two builds can be compared.

    python3 scripts/f32_time.py OUT_PREFIX [--profile]

Whichever opfacade is first on PYTHONPATH is timed, so a baseline tree unpacked elsewhere
(``git archive REV opfacade native``) runs the very same harness:

    PYTHONPATH=/tmp/base:$PYTHONPATH python3 scripts/f32_time.py $OUT/base
    python3 scripts/f32_time.py $OUT/new
    python3 scripts/f32_time.py --compare $OUT/base $OUT/new

Each case runs the forward and the backward through opfacade._backends.nvrtc.flash_f32 on inputs
uniform in [-1, 1) from a fixed seed, times them with CUDA events (median of 5 batches of 3
calls, after a warm-up), and writes out, lse, dq, dk, dv to OUT_PREFIX.npz. ``--compare``
prints, per case and tensor, the largest difference relative to the tensor's largest
magnitude. ``--profile`` runs every call once after one warm-up, for ncu. F32_CASES (names
separated by spaces) picks cases.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

# name: batch, heads, seq, head_dim, causal[, head_dim_v] (dense, Hq = Hkv). The bench's f32
# rows, and other head dims.
CASES = {
    "d32": (4, 16, 2048, 32, None),
    "d64": (4, 16, 2048, 64, None),
    "d64_causal": (4, 16, 2048, 64, "bottom_right"),
    "d96": (4, 16, 2048, 96, None),
    "d128": (4, 16, 2048, 128, None),
    "d128_causal": (4, 16, 2048, 128, "bottom_right"),
    "d128_dv64": (4, 16, 2048, 128, None, 64),
    "d64_dv128": (4, 16, 2048, 64, None, 128),
}


def flops(batch: int, heads: int, seq: int, dim: int, causal: str | None,
          dim_v: int | None = None) -> float:
    """The forward's unmasked FLOPs (the backward is counted as 2.5 times this)."""
    full = 2.0 * batch * heads * seq * seq * (dim + (dim if dim_v is None else dim_v))
    return full / 2 if causal else full


def run(prefix: str, profile: bool) -> None:
    import cupy

    from opfacade._backends.nvrtc import flash_f32 as f

    rng = np.random.default_rng(7)
    stream = cupy.cuda.Stream(non_blocking=True)
    results, saved = {}, {}
    chosen = os.environ.get("F32_CASES", "").split() or list(CASES)
    for name in chosen:
        b, h, s, d, causal, *rest = CASES[name]
        dv_ = rest[0] if rest else d
        problem = f.FlashProblem(batch=b, heads_q=h, heads_kv=h, head_dim=d, head_dim_v=dv_,
                                 max_seqlen_q=s, max_seqlen_kv=s, total_q=b * s, total_kv=b * s,
                                 varlen=False, scale=d ** -0.5, causal=causal)
        shape, shape_v = (b, h, s, d), (b, h, s, dv_)
        q, k, v, dout = (cupy.asarray(rng.uniform(-1, 1, x).astype(np.float32))
                         for x in (shape, shape, shape_v, shape_v))
        out, dq, dk, dv = (cupy.empty(x, np.float32) for x in (shape_v, shape, shape, shape_v))
        lse = cupy.empty((b, h, s), np.float32)
        workspace = cupy.empty(f.backward_workspace_bytes(problem), np.uint8)
        strides = f.FlashStrides.contiguous(problem)
        forward = f.forward_call(problem, 0, q.data.ptr, k.data.ptr, v.data.ptr, out.data.ptr,
                                 lse.data.ptr, 0, 0, strides, stream.ptr)
        backward = f.backward_call(problem, 0, q.data.ptr, k.data.ptr, v.data.ptr, out.data.ptr,
                                   dout.data.ptr, lse.data.ptr, dq.data.ptr, dk.data.ptr,
                                   dv.data.ptr, 0, 0, workspace.data.ptr, strides, stream.ptr)
        forward(), backward()
        stream.synchronize()
        if profile:
            forward(), backward()
            stream.synchronize()
            continue
        for tensor, value in dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv).items():
            saved[f"{name}.{tensor}"] = cupy.asnumpy(value)
        row = {}
        for label, call, weight in (("forward", forward, 1.0), ("backward", backward, 2.5)):
            times = []
            for _ in range(5):
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                start.record(stream)
                for _ in range(3):
                    call()
                end.record(stream)
                end.synchronize()
                times.append(cupy.cuda.get_elapsed_time(start, end) / 3)
            ms = float(np.median(times))
            row[label] = dict(ms=ms, tflops=weight * flops(b, h, s, d, causal, dv_) / ms / 1e9)
        results[name] = row
        print(f"{name:12s} forward {row['forward']['ms']:8.3f} ms {row['forward']['tflops']:5.1f}"
              f" TFLOP/s   backward {row['backward']['ms']:8.3f} ms "
              f"{row['backward']['tflops']:5.1f} TFLOP/s", flush=True)
    if not profile:
        np.savez(prefix + ".npz", **saved)
        with open(prefix + ".json", "w") as handle:
            json.dump(results, handle, indent=2)


def compare(first: str, second: str) -> None:
    a, b = np.load(first + ".npz"), np.load(second + ".npz")
    for key in a.files:
        x, y = a[key].astype(np.float64), b[key].astype(np.float64)
        finite = np.isfinite(x) & np.isfinite(y)
        same_inf = np.array_equal(np.isfinite(x), np.isfinite(y))
        scale = max(np.abs(x[finite]).max(initial=0.0), 1e-30)
        diff = np.abs(x - y)[finite].max(initial=0.0) / scale
        bitwise = np.array_equal(a[key].view(np.uint32), b[key].view(np.uint32))
        print(f"{key:20s} max |diff| / max |x| = {diff:.2e}  bitwise {bitwise}  "
              f"same non-finite {same_inf}")
    for path in (first, second):
        with open(path + ".json") as handle:
            rows = json.load(handle)
        print(path, {k: (round(v['forward']['ms'], 3), round(v['backward']['ms'], 3))
                     for k, v in rows.items()})


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        run(sys.argv[1], "--profile" in sys.argv[2:])
