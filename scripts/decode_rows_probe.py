"""Kv heads of more than 16 query rows (MQA, GQA 8, speculative tokens): our step against "torch
sdpa" on the same contiguous cache, as the bench times a row, and the step's time per 16-row
tile it runs. Our 16-row tile takes a kv head's rows 16 at a time, each tile over all of the
head's keys; this probe measures what that costs beside a peer (docs/DECODE.md, "Kv heads of
more than 16 rows").

    python3 scripts/decode_rows_probe.py [out.json]
"""

from __future__ import annotations

import torch
from decode_variants import case_key, case_tensors  # beside this script
from probe_record import write_to_argument  # beside this script

from opfacade import DecodeAttentionPlan
from opfacade._backends.nvrtc import decode as kernels
from opfacade._bench.common import settle_by_copying, time_contestants
from opfacade._bench.decode_peers import torch_sdpa
from opfacade._bench.device_state import device_state, format_state

# (batch, capacity, cache, page size, overrides): rows per kv head = Hq / Hkv x q_len.
CASES = [(64, 4096, "contiguous4", 0),                       # 16 rows: the bench's q_len 4 row
         (64, 4096, "contiguous8", 0),                       # 32: GQA 4, 8 new tokens
         (64, 4096, "contiguous4", 0, {"heads_q": 64}),      # 32: GQA 8, 4 new tokens
         (64, 32768, "contiguous", 0, {"heads_kv": 1}),      # 32: MQA, one new token
         (64, 32768, "contiguous2", 0, {"heads_kv": 1}),     # 64
         (64, 32768, "contiguous4", 0, {"heads_kv": 1})]     # 128


def copy_tbps_of(settle) -> float:
    """A 1 GiB device copy's rate (bytes read and written), timed as the contestants are."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = time_contestants({"copy": lambda: dst.copy_(src)}, 20, ours="copy", settle=settle)
    return 2 * src.numel() / copy.gpu_ms["copy"] / 1e9


def main() -> None:
    settle = settle_by_copying(torch)
    copy_tbps = copy_tbps_of(settle)
    print(f"device copy {copy_tbps:.2f} TB/s; {format_state(device_state(0))}")
    rows = {}
    for case in CASES:
        desc, args, nbytes = case_tensors(*case)
        rows_per_head = desc.heads_q // desc.heads_kv * desc.q_len
        plan = DecodeAttentionPlan.select(desc, device=0)
        ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
        plan.run(args, workspace=ws)
        peer = torch_sdpa(torch, args.q, args.k_cache, args.v_cache, [case[1]] * case[0],
                          args.seq_lens)
        timings = time_contestants({"ours": lambda p=plan, a=args, w=ws: p.run(a, workspace=w),
                                    "torch sdpa": peer.call}, 20, settle=settle)
        ms = timings.gpu_ms
        tiles = kernels.row_tiles(desc.heads_q, desc.heads_kv, desc.q_len,
                                  kernels.row_tile(rows_per_head, desc.element, desc.head_dim))
        diff = float((args.out.float() - peer.out.float()).abs().max())
        row = {"rows per kv head": rows_per_head, "tiles": tiles, "ours ms": ms["ours"],
               "torch sdpa ms": ms["torch sdpa"],
               "ours % of copy": 100 * nbytes / ms["ours"] / 1e9 / copy_tbps,
               "torch % of copy": 100 * nbytes / ms["torch sdpa"] / 1e9 / copy_tbps,
               "torch ms / ours": ms["torch sdpa"] / ms["ours"], "max |ours - torch|": diff,
               "peer note": peer.note}
        rows[case_key(case)] = row
        print(f"{case_key(case):36s} rows {rows_per_head:3d} tiles {tiles:2d}  ours "
              f"{ms['ours']:.3f} ms ({row['ours % of copy']:.1f}%)  torch {ms['torch sdpa']:.3f}"
              f" ms ({row['torch % of copy']:.1f}%)  {row['torch ms / ours']:.2f}x  "
              f"max diff {diff:.2e} {peer.note}")
        plan.free()
        del args, peer
        torch.cuda.empty_cache()
    write_to_argument(dict(copy_tbps=copy_tbps, device_state=device_state(0), rows=rows))


if __name__ == "__main__":
    main()
