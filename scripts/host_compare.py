"""Host microseconds per call of the paths a framework takes, for whichever opfacade is on the
path (so the same script times the code before and after a change, in one GPU session):
functional forms, plan.run without and with a workspace, against torch's own calls.

    python3 scripts/host_compare.py [label] [--json FILE]
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

import opfacade
from opfacade._bench.common import host_us_interleaved


def main(argv: list[str]) -> int:
    label = argv[0] if argv and not argv[0].startswith("--") else "opfacade"
    sdpa = getattr(opfacade, "sdpa", None) or opfacade.attention  # 0.1.0 called it attention
    sdpa_plan = getattr(opfacade, "SdpaForwardPlan", None) or opfacade.AttentionPlan
    sdpa_desc = getattr(opfacade, "SdpaDescriptor", None) or opfacade.AttentionDescriptor
    sdpa_args = getattr(opfacade, "SdpaArgs", None) or opfacade.AttentionArgs

    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    x, w, b = torch.randn(64, 64, **bf16), torch.randn(64, 64, **bf16), torch.randn(64, **bf16)
    y = torch.empty(64, 64, **bf16)
    lin = opfacade.LinearDescriptor(m=64, n=64, k=64, element="bf16", activation="gelu_tanh")
    lin_plan = opfacade.LinearForwardPlan.cached(lin)
    lin_args = opfacade.LinearArgs(x, w, b, out=y)
    lin_ws = torch.empty(max(lin_plan.workspace_size, 256), device="cuda", dtype=torch.uint8)

    # A problem whose plan takes a workspace, so run() without one allocates it every call.
    xl, wl, bl = (torch.randn(1024, 1024, **bf16), torch.randn(4096, 1024, **bf16),
                  torch.randn(4096, **bf16))
    yl = torch.empty(1024, 4096, **bf16)
    big = opfacade.LinearDescriptor(m=1024, n=4096, k=1024, element="bf16",
                                    activation="gelu_tanh")
    big_plan = opfacade.LinearForwardPlan.cached(big)
    big_args = opfacade.LinearArgs(xl, wl, bl, out=yl)
    big_ws = torch.empty(max(big_plan.workspace_size, 256), device="cuda", dtype=torch.uint8)

    # The training backward needs a workspace (d_pre, the bias partials): without one, run()
    # allocates it and makes its launches on every call.
    bwd = opfacade.LinearBackwardDescriptor(m=64, n=64, k=64, element="bf16",
                                            activation="gelu_tanh")
    bwd_plan = opfacade.LinearBackwardPlan.cached(bwd)
    aux, dy = torch.randn(64, 64, **bf16), torch.randn(64, 64, **bf16)
    gx, gw, gb = torch.empty_like(x), torch.empty_like(w), torch.empty_like(b)
    bwd_args = opfacade.LinearBackwardArgs(dy, x, w, aux, gx, gw, gb)
    bwd_ws = torch.empty(max(bwd_plan.workspace_size, 256), device="cuda", dtype=torch.uint8)

    q, k, v = (torch.randn(1, 1, 64, 64, **bf16) for _ in range(3))
    o = torch.empty(1, 1, 64, 64, **bf16)
    att = sdpa_desc(batch=1, heads_q=1, heads_kv=1, seq_q=64, seq_kv=64, head_dim=64,
                    element="bf16")
    att_plan = sdpa_plan.cached(att)
    att_args = sdpa_args(q, k, v, o)
    att_ws = torch.empty(max(att_plan.workspace_size, 256), device="cuda", dtype=torch.uint8)

    us = host_us_interleaved({
        "torch F.linear+gelu": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
        "torch _addmm_activation": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True),
        "linear() functional": lambda: opfacade.linear(x, w, b, activation="gelu_tanh"),
        "linear plan.run, no workspace": lambda: lin_plan.run(lin_args),
        "linear plan.run, workspace": lambda: lin_plan.run(lin_args, workspace=lin_ws),
        "linear 1024x4096x1024 run, no ws": lambda: big_plan.run(big_args),
        "linear 1024x4096x1024 run, ws": lambda: big_plan.run(big_args, workspace=big_ws),
        "linear_backward run, no ws": lambda: bwd_plan.run(bwd_args),
        "linear_backward run, ws": lambda: bwd_plan.run(bwd_args, workspace=bwd_ws),
        "torch F.sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        "sdpa() functional": lambda: sdpa(q, k, v),
        "sdpa plan.run, no workspace": lambda: att_plan.run(att_args),
        "sdpa plan.run, workspace": lambda: att_plan.run(att_args, workspace=att_ws),
    }, calls=200, rounds=9)
    print(f"{label}: workspace bytes: linear 64^3 {lin_plan.workspace_size}, linear 1024x4096x1024 "
          f"{big_plan.workspace_size}, linear_backward 64^3 {bwd_plan.workspace_size}, sdpa "
          f"{att_plan.workspace_size}")
    for name, value in us.items():
        torch_peer = "torch F.sdpa" if "sdpa" in name else "torch F.linear+gelu"
        print(f"{label:8s} {name:34s} {value:8.2f} us  {value / us[torch_peer]:5.2f}x {torch_peer}")
    if "--json" in argv:
        with open(argv[argv.index("--json") + 1], "w") as out:
            json.dump({"label": label, "us": us}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
