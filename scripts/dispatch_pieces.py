"""Where a dispatched SDPA call's host time goes (the bench's torch.ops.opfacade.sdpa row, B1 H1
S64 d64 bf16, plain tensors): the functional form, the op's kernel called directly, the op
through the dispatcher, and what run()'s memo did meanwhile (a launch stored means a call that
missed the memo); linear beside it, and kv_append's drop-in (the kernel, directly) against its
op (a custom_op, through the dispatcher).

    python3 scripts/dispatch_pieces.py [out.json] [--reverse]
"""

from __future__ import annotations

import importlib
import sys

import torch
from dispatch_ab import host_us  # this directory is on sys.path
from gpt_memo_probe import COUNTS, instrument
from gpt_profile import write_report

import opfacade
import opfacade.torch as oft


def gpu_us(fn, calls: int = 200) -> float:
    """GPU microseconds per call over ``calls`` back-to-back calls (events around them): where
    this reaches host_us, the host measure may be the GPU's."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def main() -> int:
    instrument()
    sdpa = importlib.import_module("opfacade.torch.sdpa")
    linear = importlib.import_module("opfacade.torch.linear")
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    q, k, v = (torch.randn(1, 1, 64, 64, **bf16) for _ in range(3))
    x, w = torch.randn(64, 64, **bf16), torch.randn(64, 64, **bf16)
    s_args = (q, k, v, None, False, None, 0.0, None, None, False, False)
    new, cache = torch.randn(4, 1, 2, 64, **bf16), torch.zeros(4, 64, 2, 64, **bf16)
    lens = torch.full((4,), 9, dtype=torch.int32, device="cuda")
    kv_args = (new, new, cache, cache.clone(), lens, None, "nhd")
    l_args = (x, w, None, "gelu_tanh", False, False)
    cases = {
        "sdpa functional": lambda: opfacade.sdpa(q, k, v),
        "sdpa functional, return_stats": lambda: opfacade.sdpa(q, k, v, return_stats=True),
        "sdpa op kernel directly": lambda: sdpa._sdpa_impl(*s_args),
        "sdpa op kernel directly, save_stats": lambda: sdpa._sdpa_impl(*s_args[:9], True, False),
        "sdpa op through the dispatcher": lambda: sdpa._sdpa.op(*s_args),
        "linear functional": lambda: opfacade.linear(x, w, activation="gelu_tanh"),
        "linear op kernel directly": lambda: linear._linear_impl(*l_args),
        "linear op through the dispatcher": lambda: linear._linear.op(*l_args),
        "kv_append drop-in": lambda: oft.kv_append(*kv_args[:5]),
        "kv_append op through the dispatcher":
            lambda: torch.ops.opfacade.kv_append.default(*kv_args),
        "torch F.sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v),
    }
    rows = {}
    order = list(cases)[::-1] if "--reverse" in sys.argv else list(cases)
    for name in order:
        fn = cases[name]
        COUNTS.update(dict.fromkeys(COUNTS, 0))
        us = host_us(fn)
        rows[name] = {"host_us": round(us, 2), "gpu_us": round(gpu_us(fn), 2),
                      "memo_calls": COUNTS["calls"], "stored": COUNTS["stored"],
                      "full_checks": COUNTS["full_checks"]}
        print(f"{us:7.1f} us  {name}  memo: {rows[name]}", flush=True)
    write_report({"device": torch.cuda.get_device_name(), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
