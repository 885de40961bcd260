"""Where the host time of examples/gpt.py's compiled step goes, opfacade's ops against torch's
(both under torch.compile's default mode, where both are host-bound): the free-running step time
of each, then cProfile of the opfacade step (own time and cumulative, the top functions), and
the host time of one op call by path (the dispatcher with a parameter that requires grad under
no_grad, as the compiled forward calls it; the kernel called directly).

    python3 scripts/gpt_compiled_profile.py [steps]
"""

from __future__ import annotations

import sys
import time

import torch
from gpt_profile import example_module, profiled  # this directory is on sys.path


def per_call_us(fn, calls: int = 2000) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    seconds = time.perf_counter() - start
    torch.cuda.synchronize()
    return seconds / calls * 1e6


def op_paths() -> None:
    """One linear's host time by path, at the example's qkv shape (8192 x 512 -> 768)."""
    import importlib

    module = importlib.import_module("opfacade.torch.linear")  # the package exports linear()

    x = torch.randn(8192, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(768, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    op = torch.ops.opfacade.linear.default
    with torch.no_grad():
        rows = {
            "torch.ops.opfacade.linear, no_grad, weight requires grad":
                lambda: op(x, w, None, "none", False, False),
            "kernel directly": lambda: module._linear_impl(x, w, None, "none", False, False),
            "aten.mm, no_grad, weight requires grad": lambda: torch.ops.aten.mm.default(x, w.t()),
        }
        for name, fn in rows.items():
            print(f"{per_call_us(fn):8.1f} us  {name}")
    g = torch.randn(8192, 768, device="cuda", dtype=torch.bfloat16)
    args = (g, x, w.detach(), None, "none", True, True, False, False)
    back = torch.ops.opfacade.linear_backward.default
    print(f"{per_call_us(lambda: back(*args)):8.1f} us  torch.ops.opfacade.linear_backward")
    print(f"{per_call_us(lambda: module._linear_backward_impl(*args)):8.1f} us  "
          "linear_backward kernel directly")


def main(steps: int) -> int:
    gpt = example_module()
    config = gpt.Config()
    data = list(gpt.batches(config, steps, seed=1))
    trainers = {backend: gpt.Trainer(config, backend, False, "default")
                for backend in ("opfacade", "torch")}
    for trainer in trainers.values():
        trainer.steps(data[:5])
    for _ in range(2):
        for backend, trainer in trainers.items():
            _, seconds = trainer.timed_steps(data)
            print(f"{backend} + torch.compile: {seconds / steps * 1e3:.2f} ms per step")
    op_paths()
    profiled(lambda: trainers["opfacade"].steps(data), own=35)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
