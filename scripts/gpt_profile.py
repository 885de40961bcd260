"""Where a training step of examples/gpt.py spends its time, opfacade against torch eager: the
host time per step, the GPU kernels by total time (torch.profiler), at the example's size, and
opfacade's host time by Python function (cProfile, own time and cumulative).

    python3 scripts/gpt_profile.py [steps]
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile


def example_module():
    path = Path(__file__).parent.parent / "examples" / "gpt.py"
    spec = importlib.util.spec_from_file_location("example_gpt", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write_report(report: dict) -> None:
    """The probe's report as JSON to the command line's ``*.json`` argument, where there is one
    (the probes that import this module share it)."""
    import json

    paths = [arg for arg in sys.argv[1:] if arg.endswith(".json")]
    if paths:
        with open(paths[0], "w") as handle:
            json.dump(report, handle, indent=1)


def profiled(run, own: int = 30, cumulative: int = 45):
    """``run()`` under cProfile (stopped after a synchronize), its top functions printed by own
    and by cumulative time; returns what ``run()`` returned."""
    import cProfile
    import pstats

    python = cProfile.Profile()
    python.enable()
    result = run()
    torch.cuda.synchronize()
    python.disable()
    stats = pstats.Stats(python)
    stats.sort_stats("tottime").print_stats(own)
    stats.sort_stats("cumulative").print_stats(cumulative)
    return result


def main(steps: int) -> int:
    gpt = example_module()
    config = gpt.Config()
    for backend in ("opfacade", "torch"):
        model = gpt.make_model(config, backend, False)
        print(f"{backend} parameters:", [(n, tuple(p.shape), p.stride(), p.dtype)
                                        for n, p in model.named_parameters()][:6])
        # Batches made step by step, as the example's loop makes them: each step's tensors
        # (and so its activations) land at new addresses.
        def data_steps(count):
            return gpt.batches(config, count, 1)

        # The example's optimizer, so a step is the example's step.
        optimizer = gpt.make_optimizer(model.parameters())

        def step(tokens, targets, model=model, optimizer=optimizer):
            gpt.step(model, optimizer, tokens, targets)

        for tokens, targets in data_steps(3):
            step(tokens, targets)
        torch.cuda.synchronize()
        print(f"{backend} gradients not contiguous:",
              [(n, tuple(p.grad.shape), p.grad.stride()) for n, p in model.named_parameters()
               if p.grad is not None and not p.grad.is_contiguous()])
        start = time.perf_counter()
        for tokens, targets in data_steps(steps):
            step(tokens, targets)
        host = (time.perf_counter() - start) / steps
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / steps
        print(f"===== {backend}: {wall * 1e3:.2f} ms per step, host {host * 1e3:.2f} ms")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for tokens, targets in data_steps(steps):
                step(tokens, targets)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18,
                                        max_name_column_width=70))
        if backend == "opfacade":
            def run(step=step):
                for tokens, targets in data_steps(steps):
                    step(tokens, targets)

            profiled(run)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
