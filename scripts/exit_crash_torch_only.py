"""Does pure torch (no opfacade) abort at interpreter exit after the two things the bisect of
tests/test_torch_gpu.py pointed at: a model compiled by torch.compile and a CUDA
torch.profiler session? (scripts/exit_crash_bisect.py; exit status 134 means it does.)"""
import torch
from torch.profiler import ProfilerActivity, profile

model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()).cuda()
x = torch.randn(64, 256, device="cuda")
compiled = torch.compile(model, fullgraph=True)
with torch.autocast("cuda", dtype=torch.bfloat16):
    compiled(x).sum().item()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    (model(x) @ x.T).sum().item()
print("events", len(prof.events()) > 0, flush=True)
