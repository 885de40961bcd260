"""Where a tiny SDPA or linear call's host time goes, piece by piece, on GPU tensors: each piece
of the functional form and of run() timed alone (median of interleaved batches), beside torch's
own call and the whole paths, so the sum of the pieces can be read against the whole.

    python3 scripts/host_pieces.py [out.json]
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.nn.attention
import torch.nn.functional as F

import opfacade
import opfacade.torch as oft
from opfacade._internal import operands
from opfacade.contracts.sdpa import SdpaArgs, dense_strides
from opfacade.ops import sdpa as functional
from opfacade.ops.sdpa import SdpaForwardPlan

CALLS, BATCHES = 200, 9


def per_call_us(paths: dict) -> dict[str, float]:
    """Median over interleaved batches of CALLS calls, in microseconds per call."""
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for fn in paths.values():
        for _ in range(50):
            fn()
    torch.cuda.synchronize()
    for _ in range(BATCHES):
        for name, fn in paths.items():
            start = time.perf_counter()
            for _ in range(CALLS):
                fn()
            samples[name].append((time.perf_counter() - start) / CALLS * 1e6)
            torch.cuda.synchronize()
    return {name: round(statistics.median(values), 2) for name, values in samples.items()}


def main(out_path: str | None) -> int:
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    q, k, v = (torch.randn(1, 1, 64, 64, **bf16) for _ in range(3))
    x, w, b = torch.randn(64, 64, **bf16), torch.randn(64, 64, **bf16), torch.randn(64, **bf16)
    out = torch.empty_like(q)
    options = (None, None, None, False, 0.0, False)  # ops/sdpa._facts's, as sdpa(q, k, v) has
    functional.sdpa(q, k, v)
    functional.sdpa(q, k, v)  # the first call met q before wrap enrolled its type: other facts
    facts = functional._facts(q, k, v, None, options)
    plan = SdpaForwardPlan.cached_for((facts, False), lambda: None, device=0)
    desc = plan.descriptor
    args = SdpaArgs(q, k, v, out, None, None, None, None, None, None, None)
    workspace = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
    prepared = plan.prepare(args, workspace)
    plan.run(args, workspace)  # the memo's entry and pattern for these tensors
    calls = plan._calls
    reader_key = calls._local.state[1]
    pattern = next(iter(reader_key.values()))
    key, tensors = pattern.key(args, workspace, None)
    launch, guard = calls.table()[key]
    stream = torch.cuda.current_stream()
    strides = dense_strides(desc.layout, *desc.o_shape)
    device = q.device
    backends = torch.nn.attention.SDPBackend

    def torch_sdpa_on(backend):
        def call():
            with torch.nn.attention.sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v)
        return call

    def torch_nothing_on(backend):
        def call():
            with torch.nn.attention.sdpa_kernel(backend):
                pass
        return call

    whole = {
        "torch F.sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        "torch F.sdpa in sdpa_kernel(FLASH)": torch_sdpa_on(backends.FLASH_ATTENTION),
        "torch F.sdpa in sdpa_kernel(CUDNN)": torch_sdpa_on(backends.CUDNN_ATTENTION),
        "sdpa_kernel(FLASH) around nothing": torch_nothing_on(backends.FLASH_ATTENTION),
        "opfacade.sdpa": lambda: opfacade.sdpa(q, k, v),
        "oft.sdpa": lambda: oft.sdpa(q, k, v),
        "run() with ws": lambda: plan.run(args, workspace),
        "run() without ws": lambda: plan.run(args),
        "prepared": prepared,
        "torch linear+gelu": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
        "opfacade.linear": lambda: opfacade.linear(x, w, b, activation="gelu_tanh"),
        "oft.linear": lambda: oft.linear(x, w, b, activation="gelu_tanh"),
    }
    pieces = {
        "_facts(q,k,v)": lambda: functional._facts(q, k, v, None, options),
        "cached_for hit": lambda: SdpaForwardPlan.cached_for((facts, False), None, device=0),
        "desc.o_shape + dense_strides": lambda: dense_strides(desc.layout, *desc.o_shape),
        "torch.empty_strided": lambda: torch.empty_strided(desc.o_shape, strides,
                                                           dtype=torch.bfloat16, device=device),
        "torch.empty 256 B": lambda: torch.empty(256, dtype=torch.uint8, device=device),
        "operands.allocate": lambda: operands.allocate(q, facts[0], desc.o_shape, desc.element,
                                                       None, strides),
        "SdpaArgs(...)": lambda: SdpaArgs(q, k, v, out, None, None, None, None, None, None, None),
        "memo pattern.key": lambda: pattern.key(args, workspace, None),
        "memo launch_for": lambda: calls.launch_for(args, workspace, None),
        "guard.check": lambda: guard.check(*tensors),
        "current_stream": torch.cuda.current_stream,
        "stream.cuda_stream": lambda: stream.cuda_stream,
        "memo launch()": launch,
        "torch.is_grad_enabled": torch.is_grad_enabled,
        "torch.compiler.is_compiling": torch.compiler.is_compiling,
    }
    results = {"whole": per_call_us(whole), "pieces": per_call_us(pieces),
               "gpu": torch.cuda.get_device_name()}
    for group in ("whole", "pieces"):
        print(f"== {group}")
        for name, us in results[group].items():
            print(f"  {name:32s} {us:7.2f} us")
    if out_path:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
