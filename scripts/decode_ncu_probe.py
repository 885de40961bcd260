"""One decode step of ours (partial and merge) and torch SDPA's on the same cache, for Nsight
Compute: where our partial kernel's KV reads fall short of the peers' ~3.05 TB/s (issue 13).
Both are warmed first; only the profiled calls run between cudaProfilerStart and Stop.

    ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section Occupancy --section LaunchStats --section WarpStateStats --csv --page details \
    python3 scripts/decode_ncu_probe.py [batch seq [element [cache [page_size [NAME=VALUE..]]]]]

(element: bf16 by default; f32 or f16 for the same cache in that type. cache: decode_variants'
case names, "contiguous" by default, "contiguous4" for q_len 4, "paged" or "paged4" with a
page_size; torch's SDPA, which reads contiguous caches only, runs beside the contiguous ones.)
"""

from __future__ import annotations

import sys

import torch
from decode_variants import case_tensors  # this directory is on sys.path when run as a script

from opfacade import DecodeAttentionPlan
from opfacade._bench.decode_peers import torch_sdpa


def main() -> int:
    batch, seq = (int(x) for x in sys.argv[1:3]) if len(sys.argv) > 2 else (64, 4096)
    element = sys.argv[3] if len(sys.argv) > 3 else "bf16"
    cache = sys.argv[4] if len(sys.argv) > 4 else "contiguous"
    page_size = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    # Then NAME=VALUE: integer descriptor fields (heads_q=64, heads_kv=1).
    fields = dict(arg.split("=", 1) for arg in sys.argv[6:])
    overrides = {"element": element, **{name: int(value) for name, value in fields.items()}}
    desc, args, _ = case_tensors(batch, seq, cache, page_size, overrides)
    plan = DecodeAttentionPlan.select(desc, device=0)
    workspace = torch.empty(plan.workspace_size, dtype=torch.uint8, device="cuda")
    step = plan.prepare(args, workspace=workspace)
    peer = (torch_sdpa(torch, args.q, args.k_cache, args.v_cache, [seq] * batch, args.seq_lens)
            if cache.startswith("contiguous") else None)
    calls = [step._call._launch_direct] + ([peer.call] if peer else [])
    for _ in range(3):
        for call in calls:
            call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled {element} B{batch} S{seq} {cache}: ours (partial, merge)"
          + (", then torch sdpa" if peer else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
