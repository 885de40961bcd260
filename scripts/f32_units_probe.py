"""Which execution units run each f32 attention kernel: the SASS opcodes torch's f32 SDPA
(memory-efficient backend, the "torch sdpa f32" bench peer) and our true-f32 kernels execute,
counted by Nsight Compute. Tensor-core opcodes (HMMA) in an f32 kernel mean its products run on
the matrix units (TF32 operands, e.g. CUTLASS's error-corrected 3xTF32), not as f32 FMA.

    ncu --metrics sass__inst_executed_per_opcode --print-metric-instances details --csv \
        python3 scripts/f32_units_probe.py run > units.csv
    python3 scripts/f32_units_probe.py parse units.csv
"""

from __future__ import annotations

import csv
import re
import sys
from collections import defaultdict


def run() -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from opfacade import PlanPreference, SdpaArgs, SdpaDescriptor, SdpaForwardPlan

    b, h, s, d = 1, 4, 1024, 128
    q, k, v = (torch.rand(b, h, s, d, device="cuda", requires_grad=True) for _ in range(3))
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v)
        out.backward(torch.ones_like(out))
    desc = SdpaDescriptor(batch=b, heads_q=h, heads_kv=h, seq_q=s, seq_kv=s, head_dim=d,
                          element="f32")
    plan = SdpaForwardPlan.select(desc, PlanPreference(backends={"nvrtc"}), device=0)
    ours = torch.empty_like(q)
    plan.run(SdpaArgs(q.detach(), k.detach(), v.detach(), ours))
    torch.cuda.synchronize()


def parse(path: str) -> None:
    """Per kernel: the executed instructions of each opcode family that does the products."""
    counts: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    with open(path, newline="") as handle:
        lines = [line for line in handle if line.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "sass__inst_executed_per_opcode":
            continue
        kernel = row["Kernel Name"][:90]
        # details: "(OPCODE) value;(OPCODE) value;..." or "OPCODE: value" depending on version
        for opcode, value in re.findall(r"\(?([A-Z][A-Z0-9_.]+)\)?[:\s]+([0-9.,]+)",
                                        row["Metric Value"]):
            counts[kernel][opcode] += float(value.replace(",", ""))
    for kernel, ops in counts.items():
        tensor = sum(n for op, n in ops.items() if op.startswith(("HMMA", "HGMMA")))
        fma = sum(n for op, n in ops.items() if op in ("FFMA", "FMUL", "FADD"))
        print(f"{kernel}\n    tensor-core (HMMA/HGMMA) {tensor:.3g}, f32 FFMA/FMUL/FADD {fma:.3g}"
              f"; top: {sorted(ops.items(), key=lambda kv: -kv[1])[:6]}")


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run()
    else:
        parse(sys.argv[2])
