"""Run by test_torch_gpu.py's deterministic-mode test in a child process of its own: one
training step of oft.sdpa and oft.linear under torch.use_deterministic_algorithms(True), then
the same step again inside torch.profiler. Prints one JSON line: the CUDA kernels the profiled
step launched and whether its results equal the first step's bits.

Why a child process: torch 2.11's profiler leaves CUPTI holding activity buffers after the
session ends. At interpreter exit, cudart's atexit handler releases the primary context, CUPTI
hands those buffers back to torch's (already destroyed) profiler state, and glibc aborts with
"free(): invalid pointer" (native stack in docs/PERF-NOTES.md, twenty-third session). Here the
profiler's lifetime is this short process, and the test still requires it to exit 0.
Not a pytest file."""

import json

import torch
from torch.profiler import ProfilerActivity, profile

import opfacade.torch as oft


def randn(*shape, grad=False, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    values = torch.randn(*shape, device="cuda", generator=generator)
    return values.to(torch.bfloat16).requires_grad_(grad)


q, k, v = (randn(2, 4, 128, 64, grad=True, seed=s) for s in range(3))
x, w = randn(64, 96, grad=True, seed=3), randn(80, 96, grad=True, seed=4)
b = randn(80, grad=True, seed=5)
# Given cotangents in the outputs' layouts: torch's own ones_like or contiguous() would fill
# under deterministic mode, and the test counts fills.
g_out, g_y = randn(2, 4, 128, 64, seed=6), randn(64, 80, seed=7)


def step():
    out = oft.sdpa(q, k, v, is_causal=True)
    y = oft.linear(x, w, b, activation="gelu_tanh")
    return torch.autograd.grad((out, y), (q, k, v, x, w, b), (g_out, g_y))


torch.use_deterministic_algorithms(True)
first = step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    second = step()
    torch.cuda.synchronize()
kernels = sorted({e.key for e in prof.key_averages() if e.device_type.name == "CUDA"})
bitwise = all(torch.equal(a, c) for a, c in zip(first, second, strict=True))
print(json.dumps({"kernels": kernels, "bitwise": bitwise}))
