"""What a prepared step's host time is made of (issue 13 §5): the bench times batches of 20
calls that each start on an idle GPU (common.host_us_interleaved, HOST_CALLS). This probe times
the same calls one by one inside such batches, so the first call after the GPU idled is told
apart from the calls that follow it (a serving engine's steady state, one step per token while
the GPU works), and times batches of 20 and of 100 as the bench would.

Calls: one replay of a one-kernel graph (GraphedLaunches, the floor), and the prepared step and
run() (with a workspace) of decode_attention (B64 S4096 contiguous, B1 S32768 pages of 16) and
of kv_append (B64 q_len 1 pages of 16), built as the bench builds its rows.

    python3 scripts/host_batch_probe.py   # prints a table, writes $OUT/host_batch_probe.json
"""

from __future__ import annotations

import statistics
import time

import probe_record  # scripts/probe_record.py, beside this probe
import torch
from noop_launch import noop_kernel  # scripts/noop_launch.py, beside this probe

from opfacade import DecodeAttentionArgs, DecodeAttentionPlan, KvAppendArgs, KvAppendPlan
from opfacade._backends.nvrtc.launch import PackedLaunch
from opfacade._bench import decode_attention as decode_bench
from opfacade._bench import kv_append as append_bench
from opfacade._internal.graph_replay import GraphedLaunches

ROUNDS = 9


def _floor():
    kernel, args, verdict = noop_kernel(torch)
    stream = torch.cuda.current_stream().cuda_stream
    return GraphedLaunches(lambda on: [PackedLaunch(kernel, (1,), (256,), args, on, 0)],
                           stream, 0), verdict


def _calls() -> tuple[dict, list]:
    keep, calls = [], {}
    graphed, verdict = _floor()
    keep.append(verdict)
    calls["graph replay, 1 kernel"] = graphed
    for label, case in (("decode B64 S4096 contiguous",
                         decode_bench.DecodeCase(64, 4096)),
                        ("decode B1 S32768 paged16",
                         decode_bench.DecodeCase(1, 32768, "paged", 16))):
        p = decode_bench.decode_problem(torch, case)
        keep.append(p)
        args = DecodeAttentionArgs(p.q, p.k, p.v, p.seq_lens, p.out, p.table)
        run, step = decode_bench.our_calls(torch, DecodeAttentionPlan, case.descriptor(), args,
                                           [])
        calls[f"{label} step"], calls[f"{label} run"] = step, run
    case = append_bench.AppendCase(64, "paged", page_size=16)
    p = append_bench.append_problem(torch, case)
    keep.append(p)
    args = KvAppendArgs(p.k_new, p.v_new, p.k_cache, p.v_cache, p.seq_lens, p.table)
    run, step = decode_bench.our_calls(torch, KvAppendPlan, case.descriptor(), args, [])
    calls["kv_append B64 paged16 step"], calls["kv_append B64 paged16 run"] = step, run
    return calls, keep


def _one_by_one(fn, calls: int) -> list[float]:
    """Microseconds of each call of a batch that starts on an idle GPU."""
    torch.cuda.synchronize()
    stamps = [0.0] * (calls + 1)
    clock = time.perf_counter
    stamps[0] = clock()
    for i in range(calls):
        fn()
        stamps[i + 1] = clock()
    return [(b - a) * 1e6 for a, b in zip(stamps, stamps[1:], strict=False)]


def _batch(fn, calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    calls, keep = _calls()
    found: dict[str, dict[str, list[float]]] = {
        name: {"first": [], "rest median": [], "batch 20": [], "batch 100": []} for name in calls}
    names = list(calls)
    for fn in calls.values():
        for _ in range(20):
            fn()
    for round_ in range(ROUNDS):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            fn = calls[name]
            each = _one_by_one(fn, 20)
            found[name]["first"].append(each[0])
            found[name]["rest median"].append(statistics.median(each[1:]))
            found[name]["batch 20"].append(_batch(fn, 20))
            found[name]["batch 100"].append(_batch(fn, 100))
    torch.cuda.synchronize()
    medians = {name: {kind: statistics.median(values) for kind, values in kinds.items()}
               for name, kinds in found.items()}
    print(f"{'call':36s} {'first':>8s} {'rest':>8s} {'batch20':>8s} {'batch100':>8s}  (us)")
    for name, m in medians.items():
        print(f"{name:36s} {m['first']:8.2f} {m['rest median']:8.2f} {m['batch 20']:8.2f} "
              f"{m['batch 100']:8.2f}")
    probe_record.write("host_batch_probe", {
        "us_median_over_rounds": medians, "rounds": ROUNDS,
        "device": torch.cuda.get_device_name(),
        "what": "first: the first call of a 20-call batch begun on an idle GPU; rest median: "
                "the median of its other 19; batch N: mean per call of an N-call batch begun "
                "on an idle GPU (the bench's host figures are batch 20)"})
    del keep


if __name__ == "__main__":
    main()
