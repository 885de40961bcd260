"""Where the training ops' host time goes (issue 14 §3; B1 H1 S64 d64 and 64x64x64 bf16, the
bench's host rows): each training op through the dispatcher with what a graph compiled for
training saves (sdpa's softmax stats, linear's GELU aux) and without, its kernel, the functional
path under it (torch_forward), and that path's pieces: the guarded lookup, the allocations, the
args, and run() with fixed and with fresh outputs. torch's F.sdpa and the aten forward its
training graph calls (opfacade._bench.host.torch_training_forward) are the yardsticks. Host
microseconds per call, median of batches (scripts/dispatch_ab.host_us), one process.

    python3 scripts/training_op_pieces.py [out.json]
"""

from __future__ import annotations

import importlib
import sys

import torch
from dispatch_ab import report_host_us  # this directory is on sys.path

from opfacade._bench.host import torch_training_forward
from opfacade.ops import linear as flinear
from opfacade.ops import sdpa as fsdpa
from opfacade.ops.linear import LinearArgs
from opfacade.ops.sdpa import SdpaArgs


def sdpa_cases(q, k, v) -> dict:
    sdpa = importlib.import_module("opfacade.torch.sdpa")
    op = torch.ops.opfacade.sdpa.default
    cases = {"torch F.sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)}
    name, training = torch_training_forward(q, k, v)
    if training is not None:
        cases[f"torch {name}"] = training
    for stats in (True, False):
        tag = "stats" if stats else "no stats"
        op(q, k, v, None, False, None, 0.0, None, None, stats, False)
        # The entry's options end with the op's refusal (ops/sdpa.torch_forward's options).
        options = (None, None, stats, sdpa._ON_GPU["sdpa"])
        sel = fsdpa._TORCH_CALLS.find((q, k, v), options)
        out = sel.empty(q)
        saved = torch.empty(*sel.extra[0], dtype=sel.extra[1], device="cuda") if stats else None
        args = SdpaArgs(q, k, v, out, saved)
        cases |= {
            f"sdpa op dispatched, {tag}": lambda s=stats: op(q, k, v, None, False, None, 0.0,
                                                            None, None, s, False),
            f"sdpa op kernel, {tag}": lambda s=stats: sdpa._sdpa_impl(
                q, k, v, None, False, None, 0.0, None, None, s, False),
            f"sdpa torch_forward, {tag}": lambda s=stats: fsdpa.torch_forward(q, k, v, None, None,
                                                                               s),
            f"sdpa find, {tag}": lambda o=options: fsdpa._TORCH_CALLS.find((q, k, v), o),
            f"sdpa run, fixed outputs, {tag}": lambda a=args, p=sel.plan: p.run(a),
            f"sdpa run, fresh outputs, {tag}": lambda s=sel: s.plan.run(SdpaArgs(
                q, k, v, s.empty(q), None if s.extra is None else torch.empty(
                    *s.extra[0], dtype=s.extra[1], device="cuda"))),
        }
        if stats:
            cases["sdpa stats' allocation"] = lambda s=sel: torch.empty(
                *s.extra[0], dtype=s.extra[1], device="cuda")
            cases["sdpa out's allocation"] = lambda s=sel: s.empty(q)
    return cases


def linear_cases(x, w, b) -> dict:
    linear = importlib.import_module("opfacade.torch.linear")
    op = torch.ops.opfacade.linear.default
    cases = {"torch F.gelu(F.linear)": lambda: torch.nn.functional.gelu(
        torch.nn.functional.linear(x, w, b), approximate="tanh")}
    for aux in (True, False):
        tag = "aux" if aux else "no aux"
        op(x, w, b, "gelu_tanh", aux, False)
        options = ("gelu_tanh", False, False, aux, linear._ON_GPU["linear"])
        sel = flinear._TORCH_CALLS.find((x, w, b), options)
        args = LinearArgs(x, w, b, None, sel.empty(),
                          None if sel.extra is None else sel.extra.new(sel.device))
        cases |= {
            f"linear op dispatched, {tag}": lambda a=aux: op(x, w, b, "gelu_tanh", a, False),
            f"linear op kernel, {tag}": lambda a=aux: linear._linear_impl(x, w, b, "gelu_tanh",
                                                                          a, False),
            f"linear torch_forward, {tag}": lambda a=aux: flinear.torch_forward(
                x, w, b, "gelu_tanh", False, a),
            f"linear find, {tag}": lambda o=options: flinear._TORCH_CALLS.find((x, w, b), o),
            f"linear run, fixed outputs, {tag}": lambda a=args, p=sel.plan: p.run(a),
            f"linear run, fresh outputs, {tag}": lambda s=sel: s.plan.run(LinearArgs(
                x, w, b, None, s.empty(), None if s.extra is None else s.extra.new(s.device))),
        }
        if aux:
            cases["linear aux's allocation"] = lambda s=sel: s.extra.new(s.device)
    return cases


def main() -> int:
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    q, k, v = (torch.randn(1, 1, 64, 64, **bf16) for _ in range(3))
    x, w, b = (torch.randn(64, 64, **bf16), torch.randn(64, 64, **bf16),
               torch.randn(64, **bf16))
    cases = {**sdpa_cases(q, k, v), **linear_cases(x, w, b), "python call of nothing": lambda: None}
    report_host_us(cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
