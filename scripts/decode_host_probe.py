"""What a prepared decode step costs the host, and what of it is the driver's: the bench's
prepared steps (one grid, and the q_len 4 batch in two halves against one grid, the same plan
with decode.SPLIT_WAVES out of reach) beside CUDA graphs of kernels that do nothing, shaped as
the steps' graphs are (one node; a chain of two with the second a programmatic dependent; two
such chains on a forked stream; the chain at the partial and merge grids' sizes). Every
contestant is timed as the bench times it (common.host_us_interleaved: batches of 20 begun on an
idle GPU, each batch's first call untimed), all contestants interleaved round by round.
A probe for issue 13's prepared-step target (docs/DECODE.md, "Not met yet").

    python3 scripts/decode_host_probe.py [out.json]
"""

from __future__ import annotations

import dataclasses

import torch
from decode_variants import case_key, case_tensors  # beside this script
from noop_launch import noop_kernel  # beside this script
from probe_record import write_to_argument  # beside this script

from opfacade import DecodeAttentionPlan
from opfacade._backends.nvrtc import decode as kernels
from opfacade._backends.nvrtc.launch import PackedLaunch
from opfacade._bench.common import HOST_CALLS, host_us_interleaved
from opfacade._bench.host_floor import replay_floor
from opfacade._internal.graph_replay import GraphedLaunches
from opfacade._internal.stream_fork import forked

CASES = [(64, 4096, "contiguous", 0), (8, 32768, "contiguous", 0), (256, 1024, "paged", 16),
         (1, 32768, "paged", 16), (64, 4096, "contiguous4", 0), (64, 4096, "paged4", 16)]
ROUNDS = 21


def noop_graphs(stream: int) -> dict[str, GraphedLaunches]:
    """Graphs of the do-nothing kernel in the steps' shapes (grids of one CTA unless named)."""
    kernel, args, keep = noop_kernel(torch)

    def noop(on: int, grid=(1,), block=(256,), dependent=False) -> PackedLaunch:
        return PackedLaunch(kernel, grid, block, args, on, 0, 0, dependent)

    def chain(on: int, grids=((1,), (1,))) -> list:
        return [noop(on, grids[0], (128,)), noop(on, grids[1], (64,), dependent=True)]

    def halves(on: int) -> list:
        side, fork, join = forked(on, 0)
        return [*fork, *chain(on), *chain(side), *join]

    big = ((64, 8, 8), (64, 32, 1))  # B64 S4096 q_len 1: the kq partial grid, the merge grid
    makes = {"noop: chain of two, programmatic": chain,
             "noop: chain of two, plain": lambda on: [noop(on), noop(on)],
             "noop: chain at B64 S4096's grids": lambda on: chain(on, big),
             "noop: two chains, forked": halves}
    graphs = {"noop: one node": replay_floor(torch),  # the bench's floor
              **{name: GraphedLaunches(make, stream, 0) for name, make in makes.items()}}
    graphs["_keep"] = keep
    return graphs


def main() -> None:
    stream = torch.cuda.current_stream().cuda_stream
    fns, keep, forks = {}, [], []
    product_fork = kernels.forked
    kernels.forked = lambda on, device: (forks.append(on), product_fork(on, device))[1]
    for case in CASES:
        desc, args, _ = case_tensors(*case)
        plan = DecodeAttentionPlan.select(desc, device=0)
        ws = torch.empty(plan.workspace_size, dtype=torch.uint8, device="cuda")
        splits = case[2][-1].isdigit()  # the q_len 4 rows: the 16-row tile, split by default
        for label, waves in (("", kernels.SPLIT_WAVES),) + (
                ((" one grid", 1 << 30),) if splits else ()):
            kernels.SPLIT_WAVES = waves
            out = torch.empty_like(args.out)
            step_args = dataclasses.replace(args, out=out)
            step = plan.prepare(step_args, workspace=ws if not label else torch.empty_like(ws))
            forks.clear()
            step()
            step()  # the second call builds the step's graph
            print(case_key(case) + label, "forked" if forks else "one stream")
            keep.append((step, step_args))
            fns[case_key(case) + label + (" (two halves)" if splits and not label else "")] = step
        kernels.SPLIT_WAVES = 8
    graphs = noop_graphs(stream)
    keep.append(graphs.pop("_keep"))
    for graph in graphs.values():
        graph()
        graph()  # the second call builds the graph
    fns.update(graphs)
    torch.cuda.synchronize()
    steady = host_us_interleaved(fns, HOST_CALLS, rounds=ROUNDS, first_untimed=True)
    batch = host_us_interleaved(fns, HOST_CALLS, rounds=ROUNDS)
    width = max(map(len, fns))
    print(f"{'contestant':{width}}  steady us  batch us")
    for name in fns:
        print(f"{name:{width}}  {steady[name]:9.2f}  {batch[name]:8.2f}")
    record = {"device": torch.cuda.get_device_name(), "calls": HOST_CALLS, "rounds": ROUNDS,
              "host_us_first_untimed": steady, "host_us_batch": batch}
    write_to_argument(record)


if __name__ == "__main__":
    main()
