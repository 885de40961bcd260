"""Why the bench's B1 S32768 decode row reads slower than scripts/decode_variants.py's (0.060
against 0.058 ms in one H100 call): the same plan timed as a prepared step and as plan.run(),
in bursts of 5, 20 and 100 back-to-back calls between two events, interleaved round by round,
and through the bench's own time_interleaved.

    python3 scripts/decode_burst_probe.py [out.json]
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from decode_variants import case_tensors  # this directory is on sys.path

from opfacade import DecodeAttentionPlan
from opfacade._bench.common import time_interleaved


def main() -> int:
    desc, args, nbytes = case_tensors(1, 32768, "contiguous", 0)
    plan = DecodeAttentionPlan.select(desc, device=0)
    ws = torch.empty(plan.workspace_size, dtype=torch.uint8, device="cuda")
    step = plan.prepare(args, workspace=ws)
    contestants = {"step": step, "run": lambda: plan.run(args, workspace=ws)}
    for fn in contestants.values():
        for _ in range(5):
            fn()
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = {(name, burst): [] for name in contestants for burst in (5, 20, 100)}
    copies = []
    for _ in range(15):
        for (name, burst), samples in times.items():
            fn = contestants[name]
            fn()
            start.record()
            for _ in range(burst):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / burst)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        copies.append(start.elapsed_time(end))
    copy_tbps = 2 * src.numel() / float(np.median(copies)) / 1e9
    rows = {f"{name}, bursts of {burst}": float(np.median(samples))
            for (name, burst), samples in times.items()}
    rows.update({f"{name}, bench time_interleaved": ms
                 for name, ms in time_interleaved(contestants, 20).items()})
    report = {"copy_tbps": copy_tbps, "kv_bytes": nbytes,
              "rows": {k: {"ms": ms, "of_copy": nbytes / ms / 1e9 / copy_tbps}
                       for k, ms in rows.items()}}
    for key, row in report["rows"].items():
        print(f"{key:36s} {row['ms'] * 1e3:7.1f} us  {row['of_copy']:6.1%} of copy")
    paths = [a for a in sys.argv[1:] if a.endswith(".json")]
    if paths:
        with open(paths[0], "w") as handle:
            json.dump(report, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
