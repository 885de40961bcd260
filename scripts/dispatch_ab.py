"""What a call through torch's dispatcher costs the host, opfacade's ops as registered
(opfacade/torch/_define.py) against twins of the same kernels, fake kernels and autograd
registered through torch.library.custom_op (as they were before), in one process, at tiny
problems (the GPU work hides nothing). Three ways a call arrives: a compiled forward (a weight
that requires grad, under no_grad), a compiled backward's op (plain tensors), and an eager call
of the op with autograd; torch's own op beside each.

    python3 scripts/dispatch_ab.py [out.json]
"""

from __future__ import annotations

import importlib
import statistics
import time

import torch
from gpt_profile import write_report  # this directory is on sys.path


def twin(name: str, kernel, fake, backward=None, setup_context=None):
    """The op registered through custom_op, as opfacade registered it before _define.py."""
    op = torch.library.custom_op(f"twin::{name}", kernel, mutates_args=())
    op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    return getattr(torch.ops.twin, name).default


def host_us(fn, calls: int = 200, repeats: int = 25) -> float:
    """Median over ``repeats`` batches of the host time per call (no synchronize inside a
    batch; a batch short enough never to fill the launch queue, as opfacade bench's host rows)."""
    for _ in range(300):
        fn()
    runs = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(runs)


def report_host_us(cases: dict) -> dict[str, float]:
    """Each case's host_us, printed as it is timed, then written with the device's name as the
    report (gpt_profile.write_report): the pieces probes' common ending."""
    rows = {}
    for name, fn in cases.items():
        rows[name] = round(host_us(fn), 2)
        print(f"{rows[name]:7.2f} us  {name}", flush=True)
    write_report({"device": torch.cuda.get_device_name(), "host_us": rows})
    return rows


def main() -> int:
    linear = importlib.import_module("opfacade.torch.linear")
    sdpa = importlib.import_module("opfacade.torch.sdpa")
    twins = {
        "linear": twin("linear", linear._linear_impl, linear._linear_fake,
                       linear._backward, linear._save_for_backward),
        "linear_backward": twin("linear_backward", linear._linear_backward_impl,
                                linear._linear_backward_fake),
        "sdpa": twin("sdpa", sdpa._sdpa_impl, sdpa._sdpa_fake, sdpa._backward,
                     sdpa._save_for_backward),
    }
    defined = {"linear": linear._linear, "linear_backward": linear._linear_backward,
               "sdpa": sdpa._sdpa}
    ours = {name: op.op for name, op in defined.items()}
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    x = torch.randn(64, 64, **bf16)
    w = torch.randn(64, 64, **bf16, requires_grad=True)
    g = torch.randn(64, 64, **bf16)
    x_grad = torch.randn(64, 64, **bf16, requires_grad=True)
    q, k, v = (torch.randn(1, 1, 64, 64, **bf16, requires_grad=True) for _ in range(3))
    cases = {
        "linear, compiled forward (weight requires grad, no_grad)":
            ("linear", (x, w, None, "none", False, False), True,
             lambda: torch.ops.aten.mm.default(x, w.t())),
        "linear_backward, compiled backward (plain tensors)":
            ("linear_backward", (g, x, w.detach(), None, "none", True, True, False, False),
             True, lambda: (torch.ops.aten.mm.default(g, w.detach()),
                             torch.ops.aten.mm.default(g.t(), x))),
        "linear, eager with autograd":
            ("linear", (x_grad, w, None, "none", False, False), False,
             lambda: torch.nn.functional.linear(x_grad, w)),
        "sdpa, compiled forward (inputs require grad, no_grad)":
            ("sdpa", (q, k, v, None, False, None, 0.0, None, None, True, False), True,
             lambda: torch.ops.aten._scaled_dot_product_cudnn_attention.default(
                 q, k, v, None, True, 0.0, False, False)),
    }
    rows = {}
    for label, (name, args, no_grad, peer) in cases.items():
        with torch.set_grad_enabled(not no_grad):
            row = {"opfacade (define_op)": host_us(lambda n=name, a=args: ours[n](*a)),
                   "custom_op twin": host_us(lambda n=name, a=args: twins[n](*a)),
                   "kernel called directly":
                       host_us(lambda n=name, a=args: defined[n].kernel(*a)),
                   "torch": host_us(peer)}
        rows[label] = {key: round(value, 2) for key, value in row.items()}
        print(f"{label}: " + ", ".join(f"{key} {value:.1f} us" for key, value in row.items()),
              flush=True)
    write_report({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                  "host_us_per_call": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
