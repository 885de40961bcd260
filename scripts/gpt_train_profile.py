"""Where examples/gpt.py's own training loop (train(): optimizer, batches made per step) spends
host time with opfacade, after a deterministic run in the same process as the example does:
cProfile of the timed run, own time and cumulative, beside the loop's tokens/s for both
backends.

    python3 scripts/gpt_train_profile.py [steps]
"""

from __future__ import annotations

import sys

from gpt_profile import example_module, profiled  # this directory is on sys.path as a script


def main(steps: int) -> int:
    gpt = example_module()
    config = gpt.Config()
    gpt.train(config, steps=10)  # deterministic first, as the example's report does
    gpt.train(config, steps=5, deterministic=False)  # its plans built outside the profile
    rate = profiled(lambda: gpt.train(config, steps=steps, deterministic=False)[2])
    print(f"===== opfacade {rate:.0f} tokens/s; torch eager "
          f"{gpt.train(config, 'torch', steps=steps, deterministic=False)[2]:.0f} tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 30))
