"""The SM clock and power each contestant of two close bench rows runs at, sampled by NVML
while it runs back to back: the f32 d128 dense forward (ours against torch's f32 SDPA, 0.9986x
on two H200s; our CUDA-core forward beside them) and the bf16 decode step at B64 S4096 (ours
against torch's SDPA over the same cache). The bench reads its clocks only after its warm-up
and at its end (_bench/device_state.py); this says whether a contestant is held by the power
cap while it runs.

    python3 scripts/clock_probe.py [out.json]

Each contestant: 1.5 s of calls after 0.5 s unsampled, a sample every 20 ms (SM clock, power,
clock-event reasons), and its time per call over the sampled calls; contestants alternate over
three rounds.
"""

from __future__ import annotations

import statistics
import time

import torch
from decode_variants import case_tensors  # beside this script
from probe_record import write_to_argument  # beside this script

from opfacade import DecodeAttentionPlan
from opfacade._bench.decode_peers import torch_sdpa
from opfacade._bench.device_state import REASONS
from opfacade._bench.sustained import nvml_samples


def f32_contestants() -> dict:
    from opfacade._backends.nvrtc import flash_f32 as f

    b, h, s, d = 4, 16, 2048, 128
    problem = f.FlashProblem(batch=b, heads_q=h, heads_kv=h, head_dim=d, head_dim_v=d,
                             max_seqlen_q=s, max_seqlen_kv=s, total_q=b * s, total_kv=b * s,
                             varlen=False, scale=d ** -0.5, causal=None)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.rand((b, h, s, d), generator=gen, device="cuda") * 2 - 1 for _ in range(3))
    out, lse = torch.empty_like(q), torch.empty((b, h, s), device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    def forward(out):
        return f.forward_call(problem, 0, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                              out.data_ptr(), lse.data_ptr(), 0, 0,
                              f.FlashStrides.contiguous(problem), stream)

    ours = forward(out)
    # The CUDA-core forward (f32 FMA only, fwd_wide), which sm_90 gives up for the FP64 tensor
    # cores: whether it draws less power per FLOP. (Another order of sums: not the same bits.)
    mma_arches, f.MMA_ARCHES = f.MMA_ARCHES, frozenset()
    try:
        fma = forward(torch.empty_like(out))
    finally:
        f.MMA_ARCHES = mma_arches
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def peer():
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            sdpa(q, k, v)

    return {"f32 d128 forward, ours": ours, "f32 d128 forward, ours on FMA": fma,
            "f32 d128 forward, torch sdpa f32": peer}


def decode_contestants() -> dict:
    desc, args, _ = case_tensors(64, 4096, "contiguous", 0)
    plan = DecodeAttentionPlan.select(desc, device=0)
    workspace = torch.empty(plan.workspace_size, dtype=torch.uint8, device="cuda")
    step = plan.prepare(args, workspace=workspace)
    peer = torch_sdpa(torch, args.q, args.k_cache, args.v_cache, [4096] * 64, args.seq_lens)
    return {"decode B64 S4096, ours": step, "decode B64 S4096, torch sdpa": peer.call}


def sampled(call, seconds: float = 1.5, settle: float = 0.5) -> dict:
    end = time.perf_counter() + settle
    while time.perf_counter() < end:
        call()
    torch.cuda.synchronize()
    with nvml_samples(0) as samples:
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(10):
                call()
            calls += 10
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    reasons = 0
    for s in samples:
        reasons |= s["clock_event_reasons"] or 0
    return {"ms_per_call": elapsed / calls * 1e3, "samples": len(samples),
            "sm_clock_mhz_median": statistics.median(s["sm_clock_mhz"] for s in samples),
            "sm_clock_mhz_range": [min(s["sm_clock_mhz"] for s in samples),
                                   max(s["sm_clock_mhz"] for s in samples)],
            "power_w_median": statistics.median(s["power_draw_w"] for s in samples),
            "reasons_seen": [name for bit, name in REASONS.items() if reasons & bit]}


def main() -> None:
    contestants = {**f32_contestants(), **decode_contestants()}
    rounds: dict[str, list] = {name: [] for name in contestants}
    for _ in range(3):
        for name, call in contestants.items():
            row = sampled(call)
            rounds[name].append(row)
            print(f"{name:36s} {row['ms_per_call']:7.3f} ms  SM {row['sm_clock_mhz_median']:.0f}"
                  f" MHz ({row['sm_clock_mhz_range'][0]}-{row['sm_clock_mhz_range'][1]})  "
                  f"{row['power_w_median']:.0f} W  {', '.join(row['reasons_seen']) or '-'}",
                  flush=True)
    write_to_argument({"device": torch.cuda.get_device_name(), "rounds": rounds})


if __name__ == "__main__":
    main()
