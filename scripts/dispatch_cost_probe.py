"""What torch's op registration costs per call, on any host (CPU tensors, no GPU): a trivial op
(a clone) registered through ``torch.library.custom_op`` (as opfacade.torch's ops are), through
a bare ``torch.library.Library`` definition with a CPU kernel, and the latter with
``torch.library.register_autograd``; the clone alone for scale. Under torch.compile our ops are
called through this dispatcher, so its cost is per op call of a compiled model.

    python3 scripts/dispatch_cost_probe.py
"""

from __future__ import annotations

import timeit

import torch


def per_call_us(fn, calls: int = 50000) -> float:
    return min(timeit.repeat(fn, number=calls, repeat=5)) / calls * 1e6


def main() -> None:
    x = torch.randn(4)

    def clone(a: torch.Tensor) -> torch.Tensor:
        return a.clone()

    torch.library.custom_op("dispatch_probe::custom", clone, mutates_args=())
    library = torch.library.Library("dispatch_probe2", "DEF")
    for name in ("bare", "with_autograd"):
        library.define(f"{name}(Tensor a) -> Tensor")
        library.impl(name, clone, "CPU")
    torch.library.register_autograd("dispatch_probe2::with_autograd", lambda ctx, g: g,
                                    setup_context=lambda ctx, inputs, output: None, lib=library)
    paths = {"clone alone": lambda: x.clone(),
             "custom_op": lambda: torch.ops.dispatch_probe.custom(x),
             "Library, CPU kernel": lambda: torch.ops.dispatch_probe2.bare(x),
             "Library + register_autograd": lambda: torch.ops.dispatch_probe2.with_autograd(x)}
    for name, fn in paths.items():
        print(f"{name:30s} {per_call_us(fn):6.2f} us")


if __name__ == "__main__":
    main()
