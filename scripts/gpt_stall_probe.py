"""What the host waits on when examples/gpt.py's loop runs ahead of the GPU: torch.profiler over
free-running steps (no synchronize between them), each backend's CUDA runtime and driver calls
by total host time (a cudaStreamSynchronize, cudaFree or blocking copy shows up here), after a
deterministic opfacade run in the same process as the example does.

    python3 scripts/gpt_stall_probe.py [steps]
"""

from __future__ import annotations

import sys
import time

import torch
from gpt_profile import example_module  # this directory is on sys.path when run as a script
from torch.profiler import ProfilerActivity, profile


def main(steps: int) -> int:
    gpt = example_module()
    config = gpt.Config()
    gpt.train(config, steps=10)
    for backend in ("opfacade", "torch"):
        with gpt.deterministic_torch(False):
            model = gpt.make_model(config, backend, False)
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)

            def run(count, model=model, optimizer=optimizer):
                for tokens, targets in gpt.batches(config, count, 1):
                    optimizer.zero_grad(set_to_none=True)
                    gpt.loss_of(model, tokens, targets).backward()
                    optimizer.step()

            run(3)
            torch.cuda.synchronize()
            start = time.perf_counter()
            run(steps)
            torch.cuda.synchronize()
            free = (time.perf_counter() - start) / steps * 1e3
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                run(steps)
                torch.cuda.synchronize()
        print(f"===== {backend}: {free:.2f} ms per step free-running")
        rows = [e for e in prof.key_averages() if e.key.startswith(("cuda", "cu"))]
        rows.sort(key=lambda e: -e.cpu_time_total)
        for e in rows[:14]:
            print(f"  {e.key[:60]:60s} calls {e.count:6d}  "
                  f"host total {e.cpu_time_total / 1e3:9.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
