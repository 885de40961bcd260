"""Whether CUDA-graph replays of prepared calls (``graph_replay.REPLAY``) help examples/gpt.py's
eager training step in the example's own harness: one opfacade model trained in 50-step windows
with library calls captured at their 2nd, 16th or 256th use, then with none, then torch eager's
model, in turn, ``--rounds`` rounds (median and spread of tokens/s per contestant).

    python3 scripts/gpt_replay_ab.py [out.json] [--rounds N] [--capture-ats 2,16,256]
"""

from __future__ import annotations

import statistics
import sys

import torch
from gpt_profile import example_module, write_report  # this directory is on sys.path

from opfacade._internal import graph_replay

CAPTURE_ATS = (2, 16, 256)  # the call at which a library call is captured


def library_launches() -> list:
    """Every GraphedLaunches alive (run()'s memoised cuDNN and cuBLASLt calls among them)."""
    import gc

    return [o for o in gc.get_objects() if type(o) is graph_replay.GraphedLaunches]


DEFAULT = graph_replay.LIBRARY_CAPTURE_AT


def set_capture_at(calls: int) -> None:
    """The library calls' capture point, for the launches alive and those made from now on."""
    graph_replay.LIBRARY_CAPTURE_AT = calls
    for launch in library_launches():
        launch._capture_at = calls


def main() -> int:
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 7
    capture_ats = (tuple(int(n) for n in sys.argv[sys.argv.index("--capture-ats") + 1].split(","))
                   if "--capture-ats" in sys.argv else CAPTURE_ATS)
    gpt = example_module()
    config = gpt.Config()
    data = list(gpt.batches(config, 50, seed=1))
    ours = gpt.Trainer(config, "opfacade", False)
    torch_eager = gpt.Trainer(config, "torch", False)
    contestants = {f"opfacade, capture at {n}": (ours, n) for n in capture_ats}
    contestants.update({"opfacade, direct": (ours, None), "torch eager": (torch_eager, None)})
    for trainer in (ours, torch_eager):
        trainer.steps(data[:5])
    runs = {name: [] for name in contestants}
    for _ in range(rounds):
        for name, (trainer, capture_at) in contestants.items():
            graph_replay.REPLAY = capture_at is not None
            set_capture_at(capture_at or DEFAULT)
            _, seconds = trainer.timed_steps(data)
            runs[name].append(len(data) * config.batch * config.seq / seconds)
    graph_replay.REPLAY = True
    set_capture_at(DEFAULT)
    report = {"device": torch.cuda.get_device_name(), "rounds": rounds,
              "tokens_per_s": {n: statistics.median(v) for n, v in runs.items()},
              "spread": {n: [min(v), max(v)] for n, v in runs.items()}, "runs": runs}
    for name, rate in report["tokens_per_s"].items():
        low, high = report["spread"][name]
        print(f"{name:20s} {rate / 1e3:6.0f}k tokens/s ({low / 1e3:.0f}-{high / 1e3:.0f}k)")
    write_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
