"""Does pure torch (no opfacade) abort at interpreter exit after what the 7 tests that
scripts/exit_crash_bisect.py left of tests/test_torch_gpu.py use (twenty-second session,
docs/PERF-NOTES.md): a torch.cuda.CUDAGraph capture and replays, inference mode, a model
compiled by torch.compile under autocast, side streams, activation checkpointing, and a CUDA
torch.profiler session under deterministic algorithms? Exit status 134 (or -6) means it does.
Call 8 ran the compile and profiler parts alone: exit status 0.

    python3 -X faulthandler scripts/exit_crash_torch_only.py; echo $?
"""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, as the test

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()).cuda()
x = torch.randn(64, 256, device="cuda")

# A CUDA graph captured and replayed (test_the_ops_replay_from_a_captured_cuda_graph).
static = x.clone()
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side), torch.no_grad():
    model(static)  # warm-up off the default stream, as torch's docs capture
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph), torch.no_grad():
    captured = model(static)
for _ in range(3):
    graph.replay()
torch.cuda.synchronize()

with torch.inference_mode():
    model(x).sum().item()

compiled = torch.compile(model, fullgraph=True)
with torch.autocast("cuda", dtype=torch.bfloat16):
    compiled(x).sum().item()

with torch.cuda.stream(torch.cuda.Stream()):
    xg = x.clone().requires_grad_()
    checkpoint(model, xg, use_reentrant=False).sum().backward()
torch.cuda.synchronize()

torch.use_deterministic_algorithms(True)
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    (model(x) @ x.T).sum().item()
torch.use_deterministic_algorithms(False)
print("captured", tuple(captured.shape), "events", len(prof.events()) > 0, flush=True)
