"""Why examples/gpt.py's opfacade windows alternate fast and slow while torch eager's do not: per
50-step window, tokens/s beside what run()'s memo did in it (calls, launches stored after a
retarget or a full check, full checks, table clears, host time inside the memo), the CUDA
graphs captured, and the garbage collector's passes. Windows of the two backends alternate, as
in scripts/gpt_replay_ab.py.

    python3 scripts/gpt_memo_probe.py [out.json] [--rounds N]
"""

from __future__ import annotations

import collections
import gc
import statistics
import sys
import time

import torch
from gpt_profile import example_module, write_report  # this directory is on sys.path

from opfacade._internal import call_memo, graph_replay

COUNTS = dict.fromkeys(("calls", "stored", "full_checks", "clears", "captures", "gc_passes"), 0)
MEMO_SECONDS = [0.0]
# Entries stored after a retarget or a full check, by plan (its SKU id and descriptor's shape
# fields): which calls keep arriving at new addresses.
STORED_BY: collections.Counter = collections.Counter()


def instrument() -> None:
    """Counts what the memo and the graph replays do (class attributes, so every plan's memo)."""
    memo, launches = call_memo.CallMemo, graph_replay.GraphedLaunches
    launch_for, store, init, build = (memo.launch_for, memo._store, memo.__init__,
                                      launches._build)

    def counted_launch_for(self, args, workspace, stream):
        COUNTS["calls"] += 1
        start = time.perf_counter()
        try:
            return launch_for(self, args, workspace, stream)
        finally:
            MEMO_SECONDS[0] += time.perf_counter() - start

    def counted_store(self, table, key, launch, guard):
        COUNTS["stored"] += 1
        STORED_BY[getattr(self, "probe_label", "?")] += 1
        COUNTS["clears"] += len(table) >= self.CAPACITY
        return store(self, table, key, launch, guard)

    def counted_init(self, checked, reader=None):
        def counted_checked(*args):
            COUNTS["full_checks"] += 1
            return checked(*args)

        init(self, counted_checked, reader)
        plan = getattr(checked, "__self__", None)
        if plan is not None:
            self.probe_label = f"{plan.sku.id} {plan.descriptor!r}"[:160]

    def counted_build(self):
        COUNTS["captures"] += 1
        return build(self)

    memo.launch_for, memo._store, memo.__init__ = counted_launch_for, counted_store, counted_init
    launches._build = counted_build
    gc.callbacks.append(lambda phase, info: COUNTS.__setitem__(
        "gc_passes", COUNTS["gc_passes"] + (phase == "start")))


def timed_window(gpt, trainer, data) -> tuple[float, dict]:
    """The example's step (gpt.step), free-running, with the host time of its phases: (seconds
    from one synchronize to the next, host ms per step of forward+loss, backward, optimizer)."""
    model, optimizer = trainer.model, trainer.optimizer
    phases = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    clock = time.perf_counter
    torch.cuda.synchronize()
    start = clock()
    with gpt.deterministic_torch(trainer.deterministic):
        for tokens, targets in data:
            t0 = clock()
            optimizer.zero_grad(set_to_none=True)
            loss = gpt.loss_of(model, tokens, targets)
            t1 = clock()
            loss.backward()
            t2 = clock()
            optimizer.step()
            t3 = clock()
            phases["forward"] += t1 - t0
            phases["backward"] += t2 - t1
            phases["optimizer"] += t3 - t2
    torch.cuda.synchronize()
    seconds = clock() - start
    return seconds, {k: round(v / len(data) * 1e3, 3) for k, v in phases.items()}


def main() -> int:
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 8
    instrument()
    gpt = example_module()
    config = gpt.Config()
    data = list(gpt.batches(config, 50, seed=1))
    ours = gpt.Trainer(config, "opfacade", False)
    theirs = gpt.Trainer(config, "torch", False)
    for trainer in (ours, theirs):
        trainer.steps(data[:5])
    windows = []
    for _ in range(rounds):
        for name, trainer in (("opfacade", ours), ("torch eager", theirs)):
            COUNTS.update(dict.fromkeys(COUNTS, 0))
            MEMO_SECONDS[0] = 0.0
            seconds, phases = timed_window(gpt, trainer, data)
            row = {"backend": name, "tokens_per_s": round(len(data) * config.batch * config.seq
                                                          / seconds),
                   "ms_per_step": round(seconds / len(data) * 1e3, 3),
                   "host_ms_per_step": phases,
                   "memo_ms_per_step": round(MEMO_SECONDS[0] / len(data) * 1e3, 3), **COUNTS}
            windows.append(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    report = {"device": torch.cuda.get_device_name(), "rounds": rounds, "windows": windows,
              "median_tokens_per_s": {
                  name: statistics.median(w["tokens_per_s"] for w in windows
                                          if w["backend"] == name)
                  for name in ("opfacade", "torch eager")}}
    print(report["median_tokens_per_s"])
    write_report(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
