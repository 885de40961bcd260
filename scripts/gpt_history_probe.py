"""Does examples/gpt.py's own history slow its timed opfacade run? The example times opfacade
(deterministic=False) after two deterministic 50-step runs and a float64 gradient check; this
times the same run after each of those stages in turn, with torch eager's rate beside each.

    python3 scripts/gpt_history_probe.py [steps]
"""

from __future__ import annotations

import json
import sys

from gpt_profile import example_module  # this directory is on sys.path when run as a script


def main(steps: int) -> int:
    gpt = example_module()
    config = gpt.Config()

    def rates(stage: str) -> None:
        ours = gpt.train(config, steps=steps, deterministic=False)[2]
        torch_rate = gpt.train(config, "torch", steps=steps, deterministic=False)[2]
        ours_again = gpt.train(config, steps=steps, deterministic=False)[2]
        print(json.dumps({"after": stage, "opfacade": round(ours), "torch eager": round(torch_rate),
                          "opfacade again": round(ours_again),
                          "ratio": round(max(ours, ours_again) / torch_rate, 3)}), flush=True)

    gpt.train(config, steps=5, deterministic=False)  # plans built
    gpt.train(config, "torch", steps=5, deterministic=False)
    rates("warm-up only")
    gpt.train(config, steps=steps)
    gpt.train(config, steps=steps)
    rates("two deterministic runs")
    gpt.gradient_check(config)
    rates("the float64 gradient check")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 50))
