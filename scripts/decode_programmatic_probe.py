"""What the decode partial kernel's programmatic launch gives (issue 13): decode steps inside a
caller's CUDA graph, as a serving engine captures them, with the partial kernel launched as a
programmatic dependent of the stream's previous kernel (decode.PARTIAL_FOLLOWS_PREVIOUS, as
shipped) and plainly (the switch off when the step is prepared). Per case, interleaved over
rounds, each figure is one replay of a graph of STEPS calls, per call:

- "steps": STEPS decode steps back to back (the partial follows the step before's merge);
- "append+steps": STEPS times a kv_append step (itself a programmatic dependent) then a decode
  step, the order of a serving engine's layer;
- "torch sdpa" (contiguous q_len 1 cases): the bench's peer, STEPS calls in a graph;
- "bursts": STEPS prepared steps launched from the host (each its own graph replay, which waits
  for the stream's earlier work whatever its first node says: the control, expected level).

Both forms run the same kernels: their outputs are compared bitwise.

    python3 scripts/decode_programmatic_probe.py [out.json]
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from decode_variants import case_key, case_tensors  # this directory is on sys.path

from opfacade import DecodeAttentionPlan, KvAppendArgs, KvAppendDescriptor, KvAppendPlan
from opfacade._backends.nvrtc import decode as kernels
from opfacade._bench.decode_peers import torch_sdpa

CASES = [(1, 32768, "contiguous", 0), (8, 32768, "contiguous", 0), (64, 4096, "contiguous", 0),
         (64, 4096, "paged", 16), (256, 1024, "paged", 16), (64, 4096, "contiguous4", 0),
         (4, 1024, "contiguous", 0)]
STEPS, ROUNDS = 20, 7


def graph_of(calls, stream) -> torch.cuda.CUDAGraph:
    """STEPS rounds of ``calls`` captured on ``stream`` (each warmed once outside)."""
    with torch.cuda.stream(stream):
        for call in calls:
            call()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(STEPS):
                for call in calls:
                    call()
    return graph


def timed_us(run, stream) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        run()  # warm
        start.record()
        run()
        end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / STEPS


def rotated_medians(contestants: dict, stream, rounds: int) -> tuple[dict, dict]:
    """Each contestant timed once a round (timed_us), the order rotating from round to round:
    ({name: median us}, {name: every round's us})."""
    names = list(contestants)
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timed_us(contestants[name], stream))
    torch.cuda.synchronize()
    return {name: float(np.median(samples)) for name, samples in times.items()}, times


def run_cases(out_path: str | None, cases: list[tuple], row_of, rounds: int) -> int:
    """``row_of(*case)`` for every case, each printed as a JSON line as it comes, and all as
    JSON at ``out_path`` if one was given."""
    rows = []
    for case in cases:
        rows.append(row_of(*case))
        print(json.dumps(rows[-1]), flush=True)
    if out_path:
        with open(out_path, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "steps": STEPS, "rounds": rounds,
                       "rows": rows}, f, indent=1)
    return 0


def bursts(step):
    def run() -> None:
        for _ in range(STEPS):
            step()
    return run


def case_rows(case) -> dict:
    desc, args, kv_bytes = case_tensors(*case)
    plan = DecodeAttentionPlan.select(desc, device=0)
    append_desc = KvAppendDescriptor(**desc.model_dump(include={
        "batch", "heads_kv", "head_dim", "element", "cache", "kv_layout", "max_seq",
        "page_size", "max_pages"}), q_len=desc.q_len)
    append = KvAppendPlan.select(append_desc, device=0)
    b, hkv, d = desc.batch, desc.heads_kv, desc.head_dim
    k_new = torch.rand((b, desc.q_len, hkv, d), device="cuda").to(args.q.dtype)
    v_new = torch.rand_like(k_new)
    append_args = KvAppendArgs(k_new, v_new, args.k_cache, args.v_cache, args.seq_lens,
                               args.page_table)
    stream = torch.cuda.Stream()
    # A captured graph holds the prepared steps' workspaces and the peer's tensors by address
    # only: everything it replays stays referenced here until the case ends (a first form of
    # this probe let the first form's chain step go, and a replay faulted on its workspace).
    contestants, outs, alive = {}, {}, []
    for form, follows in (("follows", True), ("plain", False)):
        saved = kernels.PARTIAL_FOLLOWS_PREVIOUS
        kernels.PARTIAL_FOLLOWS_PREVIOUS = follows  # read when a step is prepared
        try:
            mine = type(args)(args.q, args.k_cache, args.v_cache, args.seq_lens,
                              torch.empty_like(args.out), args.page_table)
            step = plan.prepare(mine, stream=stream)
            chain_step = plan.prepare(mine, stream=stream)
            append_step = append.prepare(append_args, stream=stream)
        finally:
            kernels.PARTIAL_FOLLOWS_PREVIOUS = saved
        alive += [mine, step, chain_step, append_step]
        graph = graph_of([step], stream)
        chain = graph_of([append_step, chain_step], stream)
        contestants[f"steps, partial {form}"] = graph.replay
        contestants[f"append+steps, partial {form}"] = chain.replay
        contestants[f"bursts, partial {form}"] = bursts(step)
        outs[form] = mine.out
    if desc.cache == "contiguous" and desc.q_len == 1:
        peer = torch_sdpa(torch, args.q, args.k_cache, args.v_cache, [args.k_cache.shape[1]] * b,
                          args.seq_lens)
        alive.append(peer)
        contestants["torch sdpa"] = graph_of([peer.call], stream).replay
    us, times = rotated_medians(contestants, stream, ROUNDS)
    same = torch.equal(outs["follows"], outs["plain"])
    del alive, contestants  # the graphs first, then what they replay
    row = {"case": case_key(case), "kv_bytes": kv_bytes, "bits_equal": same, "us": us,
           "spread_us": {n: [float(min(s)), float(max(s))] for n, s in times.items()}}
    for kind in ("steps", "append+steps", "bursts"):
        row[f"{kind}: plain - follows, us"] = (us[f"{kind}, partial plain"]
                                               - us[f"{kind}, partial follows"])
    if "torch sdpa" in us:
        row["torch sdpa / ours, steps (follows, plain)"] = [
            us["torch sdpa"] / us["steps, partial follows"],
            us["torch sdpa"] / us["steps, partial plain"]]
    return row


def main(out_path: str | None) -> int:
    return run_cases(out_path, [(case,) for case in CASES], case_rows, ROUNDS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
