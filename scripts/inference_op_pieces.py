"""Where the inference ops' host time goes (issue 14 §3; B1 H1 S64 d64 and 64x64x64 bf16, the
bench's host rows): each op through the dispatcher and its kernel directly, against the training
op, the functional form and torch's call, and the kernel's pieces (the guarded lookup, the
output's allocation, the args, run() with a fixed and a fresh out). Host microseconds per call,
median of batches (scripts/dispatch_ab.host_us), one process.

    python3 scripts/inference_op_pieces.py [out.json]
"""

from __future__ import annotations

import importlib

import torch
from dispatch_ab import report_host_us  # this directory is on sys.path

import opfacade
import opfacade.torch as oft
from opfacade.ops import linear as flinear
from opfacade.ops import sdpa as fsdpa
from opfacade.ops.linear import LinearArgs
from opfacade.ops.sdpa import SdpaArgs


def main() -> int:
    sdpa = importlib.import_module("opfacade.torch.sdpa")
    linear = importlib.import_module("opfacade.torch.linear")
    F = torch.nn.functional
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    q, k, v = (torch.randn(1, 1, 64, 64, **bf16) for _ in range(3))
    x, w, b = (torch.randn(64, 64, **bf16), torch.randn(64, 64, **bf16),
               torch.randn(64, **bf16))
    ops = torch.ops.opfacade
    s_inf = ops.sdpa_inference.default
    l_inf = ops.linear_inference.default
    s_train = ops.sdpa.default
    l_train = ops.linear.default
    s_inf(q, k, v, False, None)
    l_inf(x, w, b, "gelu_tanh", False)
    # Each entry's options end with the op's refusal (ops/sdpa.torch_forward's options).
    s_options = (None, None, False, sdpa._ON_GPU["sdpa_inference"])
    s_sel = fsdpa._TORCH_CALLS.find((q, k, v), s_options)
    l_sel = flinear._TORCH_CALLS.find(
        (x, w, b), ("gelu_tanh", False, False, False, linear._ON_GPU["linear_inference"]))
    s_out, l_out = s_sel.empty(), l_sel.empty()
    s_args, l_args = SdpaArgs(q, k, v, s_out), LinearArgs(x, w, b, None, l_out)

    def noop():
        return None

    cases = {
        "torch F.sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        "sdpa_inference dispatched": lambda: s_inf(q, k, v, False, None),
        "sdpa_inference kernel": lambda: sdpa._sdpa_inference_impl(q, k, v, False, None),
        "sdpa training op dispatched": lambda: s_train(q, k, v, None, False, None, 0.0, None,
                                                       None, False, False),
        "sdpa functional": lambda: opfacade.sdpa(q, k, v),
        "oft.sdpa": lambda: oft.sdpa(q, k, v),
        "sdpa training op kernel": lambda: sdpa._sdpa_impl(q, k, v, None, False, None, 0.0,
                                                           None, None, False, False),
        "sdpa piece: guarded find": lambda: fsdpa._TORCH_CALLS.find((q, k, v), s_options),
        "sdpa piece: empty out": s_sel.empty,
        "sdpa piece: SdpaArgs": lambda: SdpaArgs(q, k, v, s_out),
        "sdpa piece: run, fixed out": lambda: s_sel.plan.run(s_args),
        "sdpa piece: run, fresh out": lambda: s_sel.plan.run(SdpaArgs(q, k, v, s_sel.empty())),
        "torch linear+gelu": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
        "linear_inference dispatched": lambda: l_inf(x, w, b, "gelu_tanh", False),
        "linear_inference kernel": lambda: linear._linear_inference_impl(x, w, b, "gelu_tanh",
                                                                         False),
        "linear training op dispatched": lambda: l_train(x, w, b, "gelu_tanh", False, False),
        "linear training op kernel": lambda: linear._linear_impl(x, w, b, "gelu_tanh", False,
                                                                 False),
        "linear functional": lambda: opfacade.linear(x, w, b, activation="gelu_tanh"),
        "oft.linear": lambda: oft.linear(x, w, b, activation="gelu_tanh"),
        "linear piece: run, fixed out": lambda: l_sel.plan.run(l_args),
        "linear piece: run, fresh out": lambda: l_sel.plan.run(
            LinearArgs(x, w, b, None, l_sel.empty())),
        "python call of nothing": noop,
    }
    report_host_us(cases)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
