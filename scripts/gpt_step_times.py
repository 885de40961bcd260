"""Per-step host time of examples/gpt.py's training loop over a long run, opfacade and torch
eager in one process (after a deterministic opfacade run, as the example's report does): does
a step's cost drift with the step count, and where the example's tokens/s and a short profile
disagree.

    python3 scripts/gpt_step_times.py [steps]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from gpt_profile import example_module  # this directory is on sys.path when run as a script


def main(steps: int) -> int:
    gpt = example_module()
    config = gpt.Config()
    gpt.train(config, steps=10)
    for backend in ("opfacade", "torch"):
        with gpt.deterministic_torch(False):
            model = gpt.make_model(config, backend, False)
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)
            times = []
            for tokens, targets in gpt.batches(config, steps, 1):
                torch.cuda.synchronize()
                start = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                loss = gpt.loss_of(model, tokens, targets)
                loss.backward()
                optimizer.step()
                torch.cuda.synchronize()
                times.append((time.perf_counter() - start) * 1e3)
        tail = times[3:]
        print(f"===== {backend}: ms per step (synchronized) first {times[:3]}, median "
              f"{statistics.median(tail):.2f}, steps 3-12 {statistics.median(tail[:10]):.2f}, "
              f"last 10 {statistics.median(tail[-10:]):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 50))
