"""Why the example's tokens/s and scripts/gpt_step_times.py disagree on who is faster: both
harnesses in one process on one host, each backend first and second.

  example   examples/gpt.py's train() (a new model per run, 3 warm-up steps, 50 steps timed
            free-running), backends alternated: torch, opfacade, torch, opfacade, ...
  one model one model and optimizer per backend, 3 warm-up steps, then the same loop for
            ``steps`` steps free-running, several runs on the same model; torch first, then
            opfacade, then torch again.

Milliseconds per step (free-running, one synchronize at each end), non-deterministic SKUs.

    python3 scripts/gpt_harness_probe.py [rounds]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from gpt_profile import example_module  # this directory is on sys.path when run as a script


def _one_model_ms(gpt, config, backend: str, runs: int, steps: int = 47) -> list[float]:
    with gpt.deterministic_torch(False):
        model = gpt.make_model(config, backend, False)
        optimizer = gpt.make_optimizer(model.parameters())
        results = []
        for run in range(runs):
            batches = list(gpt.batches(config, steps + 3, run + 1))
            for index, (tokens, targets) in enumerate(batches):
                if index == 3:
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                gpt.step(model, optimizer, tokens, targets)
            torch.cuda.synchronize()
            results.append((time.perf_counter() - start) / steps * 1e3)
    return results


def main(rounds: int) -> int:
    gpt = example_module()
    config = gpt.Config()
    tokens_per_step = config.batch * config.seq
    example: dict[str, list[float]] = {"torch": [], "opfacade": []}
    gpt.train(config, "opfacade", steps=5, deterministic=False)  # plans built before timing
    for _ in range(rounds):
        for backend in ("torch", "opfacade"):
            rate = gpt.train(config, backend, steps=50, deterministic=False)[2]
            example[backend].append(tokens_per_step / rate * 1e3)
    for backend, values in example.items():
        print(f"example harness   {backend:9s} ms/step runs {[round(v, 2) for v in values]} "
              f"median {statistics.median(values):.2f}")
    for backend in ("torch", "opfacade", "torch"):
        values = _one_model_ms(gpt, config, backend, rounds)
        print(f"one-model harness {backend:9s} ms/step runs {[round(v, 2) for v in values]} "
              f"median {statistics.median(values):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
