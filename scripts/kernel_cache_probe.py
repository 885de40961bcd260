"""cudnn-frontend alone (no opfacade): an SDPA forward declared with dynamic shapes, built at
several sequence lengths in a row, with one shared kernel cache, with a fresh cache per graph,
and with no cache, each variant in a process of its own (an illegal address poisons the CUDA
context). Each output is compared with torch's SDPA in f32 on the same inputs.

Why: through opfacade (commit fc14bb0, its scripts/dynamic_shapes_probe.py), forwards built with
a shared kernel cache at a second length gave wrong results on an H100 (cuDNN 9.19, frontend
1.32), and a paged decode at a second batch raised an illegal memory access. This tells whether
the frontend's own public path does the same. Seen on an H100 (2026-11-25, all variants in one
process then): the first graph, S 1024 causal with the shared cache, was right (relative error
0.002, built in 1.6 s); the second, S 512 through the same cache, raised an illegal memory access.

    python3 scripts/kernel_cache_probe.py
"""

import json
import subprocess
import sys
import time

import cudnn
import torch

B, H, D = 2, 16, 128
LENGTHS = [1024, 512, 2048, 1000]
handle = None


def build(seq, causal, cache, dynamic):
    global handle
    if handle is None:
        handle = cudnn.create_handle()
    extra = {}
    if dynamic:
        extra["is_dynamic_shape_enabled"] = True
    if cache is not None:
        extra["kernel_cache"] = cache
    g = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16,
                      intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle, **extra)
    shape, stride = [B, H, seq, D], [H * seq * D, seq * D, D, 1]
    q, k, v = (g.tensor(dim=shape, stride=stride, uid=u, data_type=cudnn.data_type.BFLOAT16)
               for u in (1, 2, 3))
    options = {"diagonal_band_right_bound": 0} if causal else {}
    o, _ = g.sdpa(q, k, v, attn_scale=D ** -0.5, generate_stats=False, name="sdpa", **options)
    o.set_output(True).set_dim(shape).set_stride(stride).set_uid(4)
    start = time.perf_counter()
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g, (time.perf_counter() - start) * 1e3


def check(seq, causal, cache, dynamic):
    g, ms = build(seq, causal, cache, dynamic)
    gen = torch.Generator(device="cuda").manual_seed(seq)
    q, k, v = (torch.randn(B, H, seq, D, device="cuda", generator=gen).to(torch.bfloat16)
               for _ in range(3))
    out = torch.full_like(q, float("nan"))
    workspace = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    g.execute({1: q, 2: k, 3: v, 4: out}, workspace, handle=handle)
    torch.cuda.synchronize()
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                            is_causal=causal)
    error = float((out.float() - want).norm() / want.norm())
    return {"seq": seq, "build_ms": round(ms, 1), "rel_error": error}


def variant_rows(causal: bool, variant: str) -> list[dict]:
    shared = cudnn.create_kernel_cache() if variant == "shared cache" else None
    rows = []
    for seq in LENGTHS:
        cache = shared if variant == "shared cache" else (
            cudnn.create_kernel_cache() if variant == "fresh cache" else None)
        try:
            rows.append(check(seq, causal, cache, dynamic=variant != "static"))
        except Exception as error:
            rows.append({"seq": seq, "error": f"{type(error).__name__}: {str(error)[:120]}"})
            break  # the context is gone
    return rows


if len(sys.argv) == 3:  # a child: one variant
    print(json.dumps(variant_rows(sys.argv[1] == "causal", sys.argv[2])))
    sys.exit(0)
for mask in ("causal", "full"):
    for variant in ("shared cache", "fresh cache", "no cache", "static"):
        done = subprocess.run([sys.executable, __file__, mask, variant], capture_output=True,
                              text=True, check=False)
        lines = done.stdout.strip().splitlines()
        print(json.dumps({f"{mask}, {variant}": json.loads(lines[-1]) if lines else
                          done.stderr[-300:]}), flush=True)
print(json.dumps({"device": torch.cuda.get_device_name(0), "cudnn": cudnn.backend_version(),
                  "frontend": cudnn.__version__}))
