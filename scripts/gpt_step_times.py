"""The host side of examples/gpt.py's training loop, opfacade (with and without deterministic
SKUs) and torch eager in one process (after a deterministic opfacade run, as the example's
report does): per-step times with a
synchronize after every step (does a step's cost drift?), then the loop free-running (the host
ahead of the GPU) under torch.profiler, its CUDA runtime and driver calls by total host time (a
cudaStreamSynchronize, cudaFree or blocking copy would show up there), and the GPU kernels by
device time per step (which of ours cost more than torch's counterparts).

    python3 scripts/gpt_step_times.py [steps]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from gpt_profile import example_module  # this directory is on sys.path when run as a script
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def _synchronized_steps(gpt, config, model, optimizer, steps: int) -> list[float]:
    times = []
    for tokens, targets in gpt.batches(config, steps, 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        gpt.step(model, optimizer, tokens, targets)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _free_running(gpt, config, model, optimizer, steps: int) -> None:
    for tokens, targets in gpt.batches(config, steps, 1):
        gpt.step(model, optimizer, tokens, targets)


def main(steps: int) -> int:
    gpt = example_module()
    config = gpt.Config()
    gpt.train(config, steps=10)
    # The example's eager models: ours as the example trains it (deterministic SKUs, torch's
    # deterministic algorithms for the rest of the step), ours without them, and torch's, with
    # and without torch.use_deterministic_algorithms.
    for backend, deterministic in (("opfacade", True), ("opfacade", False), ("torch", False),
                                   ("torch", True)):
        with gpt.deterministic_torch(deterministic):
            model = gpt.make_model(config, backend, deterministic)
            optimizer = gpt.make_optimizer(model.parameters())
            loop = (gpt, config, model, optimizer)
            times = _synchronized_steps(*loop, steps)
            torch.cuda.synchronize()
            start = time.perf_counter()
            _free_running(*loop, steps)
            torch.cuda.synchronize()
            free = (time.perf_counter() - start) / steps * 1e3
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                _free_running(*loop, steps)
                torch.cuda.synchronize()
        tail = times[3:]
        label = f"{backend}{' deterministic' if deterministic else ''}"
        print(f"===== {label}: ms per step synchronized: first {times[:3]}, median "
              f"{statistics.median(tail):.2f}, steps 3-12 {statistics.median(tail[:10]):.2f}, "
              f"last 10 {statistics.median(tail[-10:]):.2f}; free-running {free:.2f}")
        averages = prof.key_averages()
        rows = [e for e in averages if e.key.startswith(("cuda", "cu"))]
        for e in sorted(rows, key=lambda e: -e.cpu_time_total)[:14]:
            print(f"  {e.key[:60]:60s} calls {e.count:6d}  "
                  f"host total {e.cpu_time_total / 1e3:9.2f} ms")
        kernels = [e for e in averages if e.device_type == DeviceType.CUDA and e.count
                   and not e.key.startswith("Optimizer.")]  # a range, not a kernel
        total = sum(e.device_time_total for e in kernels) / steps / 1e3
        print(f"  GPU kernels: {total:.2f} ms per step")
        for e in sorted(kernels, key=lambda e: -e.device_time_total)[:16]:
            print(f"  {e.key[:90]:90s} per step {e.count / steps:5.1f} x "
                  f"{e.device_time_total / e.count:8.1f} us = "
                  f"{e.device_time_total / steps / 1e3:6.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 50))
