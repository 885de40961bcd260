"""Dense SDPA with a bottom-right causal mask over as many queries as keys: the same mask as
top-left, which graphs.py now declares to cuDNN (its backward is the faster one). Times both
plans through opfacade (B4 H32/8 S4096 d128 bf16) and checks that their forwards are bitwise
equal (the default backward adds dQ with atomics, so its bits may differ run to run anyway).

Seen on an H100 (2026-11-23, before the forward check was narrowed to out): both backwards
2.917 ms; the raw bottom-right graph took 5.23 ms (scripts/varlen_backward_probe.py).

    python3 scripts/sdpa_square_check.py
"""

import json

import torch

from opfacade import Plan, SdpaArgs, SdpaBackwardArgs, SdpaBackwardDescriptor, SdpaDescriptor

SHAPE = dict(batch=4, heads_q=32, heads_kv=8, seq_q=4096, seq_kv=4096, head_dim=128,
             element="bf16")
gen = torch.Generator(device="cuda").manual_seed(0)


def uniform(heads):
    return (torch.rand((4, heads, 4096, 128), device="cuda", generator=gen) * 2 - 1).to(
        torch.bfloat16)


q, k, v, d_out = uniform(32), uniform(8), uniform(8), uniform(32)
results, times = {}, {}
for causal in ("bottom_right", "top_left"):
    forward = Plan.select(SdpaDescriptor(**SHAPE, causal=causal, save_stats=True), device=0)
    backward = Plan.select(SdpaBackwardDescriptor(**SHAPE, causal=causal), device=0)
    out, stats = torch.empty_like(q), torch.empty((4, 32, 4096, 1), device="cuda")
    grads = [torch.empty_like(t) for t in (q, k, v)]
    workspace = torch.empty(max(forward.workspace_size, backward.workspace_size, 1),
                            device="cuda", dtype=torch.uint8)
    forward.run(SdpaArgs(q, k, v, out, stats), workspace=workspace)
    args = SdpaBackwardArgs(q, k, v, out, d_out, stats, *grads)
    backward.run(args, workspace=workspace)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        backward.run(args, workspace=workspace)
    stop.record()
    stop.synchronize()
    times[causal] = start.elapsed_time(stop) / 10
    results[causal] = [out.clone(), *(g.clone() for g in grads)]
same = torch.equal(results["bottom_right"][0], results["top_left"][0])
print(json.dumps({"backward_ms": times, "forward_out_bitwise_equal": same}))
