"""Whether CUDA-graph replays of prepared calls (``graph_replay.REPLAY``) help examples/gpt.py's
eager training step in the example's own harness: one opfacade model trained in 50-step windows
with replays on, then off, then torch eager's model, in turn, ``--rounds`` rounds (median and
spread of tokens/s per contestant).

    python3 scripts/gpt_replay_ab.py [out.json] [--rounds N]
"""

from __future__ import annotations

import json
import statistics
import sys

import torch
from gpt_profile import example_module  # this directory is on sys.path when run as a script

from opfacade._internal import graph_replay


def main() -> int:
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 7
    gpt = example_module()
    config = gpt.Config()
    data = list(gpt.batches(config, 50, seed=1))
    ours = gpt.Trainer(config, "opfacade", False)
    torch_eager = gpt.Trainer(config, "torch", False)
    contestants = {"opfacade, replays": (ours, True), "opfacade, direct": (ours, False),
                   "torch eager": (torch_eager, True)}
    for trainer in (ours, torch_eager):
        trainer.steps(data[:5])
    runs = {name: [] for name in contestants}
    for _ in range(rounds):
        for name, (trainer, replay) in contestants.items():
            graph_replay.REPLAY = replay
            _, seconds = trainer.timed_steps(data)
            runs[name].append(len(data) * config.batch * config.seq / seconds)
    graph_replay.REPLAY = True
    report = {"device": torch.cuda.get_device_name(), "rounds": rounds,
              "tokens_per_s": {n: statistics.median(v) for n, v in runs.items()},
              "spread": {n: [min(v), max(v)] for n, v in runs.items()}, "runs": runs}
    for name, rate in report["tokens_per_s"].items():
        low, high = report["spread"][name]
        print(f"{name:20s} {rate / 1e3:6.0f}k tokens/s ({low / 1e3:.0f}-{high / 1e3:.0f}k)")
    paths = [arg for arg in sys.argv[1:] if arg.endswith(".json")]
    if paths:
        with open(paths[0], "w") as handle:
            json.dump(report, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
