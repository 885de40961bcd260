"""examples/gpt.py's tokens/s for one backend in a process of its own, without the example's
history (two deterministic runs and a float64 gradient check before its timed runs): a 10-step
run to build plans and warm the allocator, then the timed 50-step run, twice.

    python3 scripts/gpt_rates.py opfacade|torch|compile
"""

from __future__ import annotations

import json
import sys

from gpt_profile import example_module  # this directory is on sys.path when run as a script


def main(backend: str) -> int:
    gpt = example_module()
    config = gpt.Config()
    options = dict(deterministic=False)
    if backend == "compile":
        options.update(compile_mode="default", warmup=5)
    name = "torch" if backend == "compile" else backend
    gpt.train(config, name, steps=10, **options)
    rates = [gpt.train(config, name, steps=50, **options)[2] for _ in range(2)]
    print(json.dumps({"backend": backend, "tokens_per_s": rates}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
