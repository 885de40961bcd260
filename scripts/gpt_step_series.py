"""Whether the opfacade model's slow training windows (examples/gpt.py, host-bound on an H100)
are slow in every step or in a few: per window of 50 free-running steps, the host time of each
step (its median, 90th percentile, slowest, and the slowest steps' indices), the garbage
collector's passes by generation and their time, run()'s memo time and retargets, and the CUDA
graphs captured; eager and under torch.compile, each backend's windows in turn.

    python3 scripts/gpt_step_series.py [out.json] [--rounds N] [--modes eager,default]
        [--deterministic] [--plain]
"""

from __future__ import annotations

import gc
import statistics
import sys
import time

import torch

# This directory is on sys.path.
from gpt_memo_probe import COUNTS, MEMO_SECONDS, STORED_BY, instrument
from gpt_profile import example_module, write_report

GC = {"passes": [0, 0, 0], "seconds": 0.0, "started": 0.0}


def _gc_callback(phase: str, info: dict) -> None:
    if phase == "start":
        GC["started"] = time.perf_counter()
        GC["passes"][info["generation"]] += 1
    else:
        GC["seconds"] += time.perf_counter() - GC["started"]


def window(trainer, data) -> dict:
    """One window: each step timed on the host, free-running (no synchronize between steps)."""
    COUNTS.update(dict.fromkeys(COUNTS, 0))
    MEMO_SECONDS[0] = 0.0
    STORED_BY.clear()
    GC.update(passes=[0, 0, 0], seconds=0.0)
    clock = time.perf_counter
    steps = []
    torch.cuda.synchronize()
    start = clock()
    for batch in data:
        before = clock()
        trainer.steps([batch])
        steps.append(clock() - before)
    torch.cuda.synchronize()
    seconds = clock() - start
    ms = sorted(s * 1e3 for s in steps)
    slowest = sorted(range(len(steps)), key=steps.__getitem__)[-5:]
    return {"ms_per_step": round(seconds / len(data) * 1e3, 3),
            "host_step_ms": {"median": round(statistics.median(ms), 3),
                             "p90": round(ms[int(0.9 * len(ms))], 3), "max": round(ms[-1], 3),
                             "slowest_steps": slowest},
            "gc_passes_by_generation": list(GC["passes"]),
            "gc_ms": round(GC["seconds"] * 1e3, 3),
            "memo_ms": round(MEMO_SECONDS[0] * 1e3, 3),
            "retargets_or_checks": COUNTS["stored"], "captures": COUNTS["captures"],
            "stored_by_plan": dict(STORED_BY.most_common(4))}


def main() -> int:
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 6
    modes = (sys.argv[sys.argv.index("--modes") + 1].split(",") if "--modes" in sys.argv
             else ["eager", "default"])
    if "--plain" not in sys.argv:  # --plain: no counting wrappers around run()'s memo
        instrument()
    gc.callbacks.append(_gc_callback)
    gpt = example_module()
    config = gpt.Config()
    data = list(gpt.batches(config, 50, seed=1))
    trainers = {f"{backend} {mode}": gpt.Trainer(config, backend, False,
                                                 None if mode == "eager" else mode)
                for mode in modes for backend in ("opfacade", "torch")}
    if "--deterministic" in sys.argv:  # the example's own model, and torch's in the same mode
        for backend in ("opfacade", "torch"):
            trainers[f"{backend} eager deterministic"] = gpt.Trainer(config, backend, True)
    for trainer in trainers.values():
        trainer.steps(data[:5])
    windows = []
    for round_index in range(rounds):
        for name, trainer in trainers.items():
            row = {"contestant": name, "round": round_index, **window(trainer, data)}
            windows.append(row)
            print(row, flush=True)
    report = {"device": torch.cuda.get_device_name(), "windows": windows,
              "median_ms_per_step": {
                  name: statistics.median(w["ms_per_step"] for w in windows
                                          if w["contestant"] == name) for name in trainers}}
    print(report["median_ms_per_step"])
    write_report(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
