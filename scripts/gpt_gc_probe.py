"""Why examples/gpt.py's eager tokens/s ratio moves with the harness: the time Python's garbage
collector takes inside each timed window, per contestant, with only the eager models alive and
then with the compiled ones beside them (as the example's report runs them), and with the heap
frozen (gc.freeze()) after warm-up.

    python3 scripts/gpt_gc_probe.py [out.json] [--rounds N]
"""

from __future__ import annotations

import gc
import statistics
import sys
import time

import torch
from gpt_profile import example_module, write_report  # this directory is on sys.path


class GcClock:
    """Seconds spent in collections, and their count, per generation, while ``on``."""

    def __init__(self) -> None:
        self.seconds, self.count, self._start, self.on = [0.0] * 3, [0] * 3, 0.0, False
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if not self.on:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            generation = info["generation"]
            self.seconds[generation] += time.perf_counter() - self._start
            self.count[generation] += 1

    def reset(self) -> None:
        self.seconds, self.count = [0.0] * 3, [0] * 3


def windows(gpt, trainers: dict, data: list, rounds: int, clock: GcClock) -> dict:
    config = gpt.Config()
    runs = {name: [] for name in trainers}
    gc_ms = {name: [] for name in trainers}
    collections = {name: [] for name in trainers}
    for _ in range(rounds):
        for name, trainer in trainers.items():
            clock.reset()
            clock.on = True
            _, seconds = trainer.timed_steps(data)
            clock.on = False
            runs[name].append(len(data) * config.batch * config.seq / seconds)
            gc_ms[name].append(1e3 * sum(clock.seconds) / len(data))
            collections[name].append(list(clock.count))
    return {name: {"tokens_per_s": statistics.median(runs[name]),
                   "spread": [min(runs[name]), max(runs[name])],
                   "gc_ms_per_step": statistics.median(gc_ms[name]),
                   "collections_per_window_by_generation": collections[name][-1]}
            for name in trainers}


def main() -> int:
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 5
    gpt = example_module()
    config = gpt.Config()
    data = list(gpt.batches(config, 50, seed=1))
    clock = GcClock()
    report = {"device": torch.cuda.get_device_name(), "gc_thresholds": gc.get_threshold()}

    def show(label: str, rows: dict) -> None:
        report[label] = rows
        print(f"== {label}: objects tracked {len(gc.get_objects())}")
        for name, row in rows.items():
            print(f"  {name:40s} {row['tokens_per_s'] / 1e3:7.0f}k tokens/s "
                  f"({row['spread'][0] / 1e3:.0f}-{row['spread'][1] / 1e3:.0f}k), gc "
                  f"{row['gc_ms_per_step']:.3f} ms/step, collections "
                  f"{row['collections_per_window_by_generation']}")

    eager = {name: gpt.Trainer(config, *spec) for name, spec in gpt.CONTESTANTS.items()
             if spec[2] is None and not spec[1]}
    for trainer in eager.values():
        trainer.steps(data[:5])
    show("eager models alone", windows(gpt, eager, data, rounds, clock))
    compiled = {name: gpt.Trainer(config, *spec) for name, spec in gpt.CONTESTANTS.items()
                if spec[2] is not None}
    for trainer in compiled.values():
        trainer.steps(data[:5])
    everyone = {**eager, **compiled}
    show("beside the compiled models", windows(gpt, everyone, data, rounds, clock))
    gc.collect()
    gc.freeze()
    show("beside the compiled models, heap frozen", windows(gpt, everyone, data, rounds, clock))
    write_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
