"""Whether the decode step's merge tail hides behind another part of the batch: a bench problem
run as one plan, against the same batch split into parts of equal size, each its own plan on its
own stream (forked from and joined to one stream inside one CUDA graph), so that one part's merge
may run while another part's partial grid still streams. Batch invariance makes every split give
the whole batch's bits (checked). Each contestant is a CUDA graph replayed in batches,
interleaved round by round; % of a 1 GiB device copy timed in the same process. A probe for
issue 13's q_len 4 row (docs/DECODE.md, "Not met yet"), not a product path.

    python3 scripts/decode_split_probe.py [out.json]
"""

from __future__ import annotations

import numpy as np
import torch
from decode_variants import case_key, case_tensors, gpu_ms  # beside this script
from probe_record import write_to_argument  # beside this script

from opfacade import DecodeAttentionArgs, DecodeAttentionPlan

CASES = [(64, 4096, "contiguous4", 0), (64, 4096, "paged4", 16), (64, 4096, "contiguous", 0),
         (256, 1024, "paged", 16)]
SPLITS = (1, 2, 4)
ROUNDS, REPLAYS = 15, 20


def part(args: DecodeAttentionArgs, first: int, count: int) -> DecodeAttentionArgs:
    """Sequences [first, first + count) of ``args``: views of q, out, seq_lens and the table's
    rows (a paged cache's pool is shared; a contiguous cache's rows are sliced)."""
    rows = slice(first, first + count)
    paged = args.page_table is not None
    return DecodeAttentionArgs(args.q[rows], args.k_cache if paged else args.k_cache[rows],
                               args.v_cache if paged else args.v_cache[rows],
                               args.seq_lens[rows], args.out[rows],
                               args.page_table[rows] if paged else None)


def split_graph(desc, args: DecodeAttentionArgs, parts: int) -> torch.cuda.CUDAGraph:
    """One CUDA graph running the batch as ``parts`` plans, each on a stream of its own."""
    count = desc.batch // parts
    part_desc = desc.model_copy(update={"batch": count})
    plan = DecodeAttentionPlan.select(part_desc, device=0)
    calls = []
    for i in range(parts):
        stream = torch.cuda.Stream()
        workspace = torch.empty(plan.workspace_size, dtype=torch.uint8, device="cuda")
        calls.append((part(args, i * count, count), workspace, stream))
    for part_args, workspace, stream in calls:  # warm: modules loaded, memos built
        plan.run(part_args, workspace=workspace, stream=stream)
    torch.cuda.synchronize()
    graph, main = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.graph(graph, stream=main):
        for part_args, workspace, stream in calls:
            stream.wait_stream(main)
            plan.run(part_args, workspace=workspace, stream=stream)
        for _, _, stream in calls:
            main.wait_stream(stream)
    # The plan and the tensors the graph writes (the workspaces) live as long as the graph:
    # freed, the allocator hands their memory to later tensors, which each replay overwrites.
    graph.plan, graph.calls = plan, calls
    return graph


def same_bits(what: str, out: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether ``out`` is ``expected`` bitwise; if not, prints where it differs: how many
    elements, how many NaN, the largest difference, and the sequences and new tokens."""
    differ = out.view(torch.int16) != expected.view(torch.int16)
    if not differ.any():
        return True
    where = differ.nonzero()
    diff = (out.float() - expected.float()).abs()[differ]
    print(f"  {what}: {int(differ.sum())} of {differ.numel()} elements differ, "
          f"{int(out.isnan().sum())} NaN, largest {float(diff.nan_to_num(0).max()):.3g}; "
          f"sequences {sorted(set(where[:, 0].tolist()))[:12]}, tokens "
          f"{sorted(set(where[:, 1].tolist()))}, heads {sorted(set(where[:, 2].tolist()))[:12]}")
    return False


def main() -> None:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_tbps = 2 * src.numel() / gpu_ms(lambda: dst.copy_(src)) / 1e9
    print(f"device copy {copy_tbps:.2f} TB/s")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rows = {}
    for case in CASES:
        desc, args, nbytes = case_tensors(*case)
        graphs, same = {}, {}
        plan = DecodeAttentionPlan.select(desc, device=0)
        plan.run(args)  # the whole batch, launched directly: the bits every graph must give
        torch.cuda.synchronize()
        direct = args.out.clone()
        for parts in SPLITS:
            graphs[parts] = split_graph(desc, args, parts)
            same[parts] = True
            for replay in range(2):
                args.out.fill_(float("nan"))
                graphs[parts].replay()
                torch.cuda.synchronize()
                same[parts] &= same_bits(f"{case_key(case)}, {parts} parts, replay {replay}",
                                         args.out, direct)
        times = {parts: [] for parts in SPLITS}
        for _ in range(ROUNDS):
            for parts, graph in graphs.items():
                start.record()
                for _ in range(REPLAYS):
                    graph.replay()
                end.record()
                end.synchronize()
                times[parts].append(start.elapsed_time(end) / REPLAYS)
        key = case_key(case)
        rows[key] = {f"{parts} part{'s' if parts > 1 else ''}": {
            "ms": float(np.median(t)), "of_copy": nbytes / float(np.median(t)) / 1e9 / copy_tbps,
            "same_bits_as_one_launch": same[parts]} for parts, t in times.items()}
        print(f"{key:26s} " + "  ".join(
            f"{name} {row['ms']:.4f} ms {row['of_copy']:6.1%}"
            + ("" if row["same_bits_as_one_launch"] else " BITS DIFFER")
            for name, row in rows[key].items()))
        for used in {id(p): p for p in (plan, *(g.plan for g in graphs.values()))}.values():
            used.free()  # each plan once (the whole batch's graph runs the direct launch's)
    write_to_argument(dict(copy_tbps=copy_tbps, rows=rows))


if __name__ == "__main__":
    main()
