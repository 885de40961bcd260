"""Kv heads of more than 16 query rows (MQA, GQA 8 and 16, speculative tokens): our step against
"torch sdpa" on the same contiguous cache (and, with one new token, our cuDNN SKU there), and on
paged caches with one new token against our cuDNN SKU (pinned by PlanPreference.sku) and the raw
"cudnn paged" graph, as the bench times a row. Our tiles take a kv head's rows 16 (or, on
sm_90, 32) at a time, each tile over all of the head's keys; this probe measures what that
costs beside the peers (docs/DECODE.md, "Scores tested only where a warp needs it, and kv
heads of more than 16 rows", and "The wgmma tile").

    python3 scripts/decode_rows_probe.py [out.json]
"""

from __future__ import annotations

import dataclasses

import torch
from decode_variants import case_key, case_tensors  # beside this script
from probe_record import write_to_argument  # beside this script

from opfacade import DecodeAttentionPlan, PlanPreference
from opfacade._backends.nvrtc import decode as kernels
from opfacade._bench.common import settle_by_copying, time_contestants
from opfacade._bench.cudnn_peers import RawCudnn
from opfacade._bench.decode_peers import cudnn_paged, torch_sdpa
from opfacade._bench.device_state import device_state, format_state

# (batch, capacity, cache, page size, overrides): rows per kv head = Hq / Hkv x q_len.
CASES = [(64, 4096, "contiguous", 0),                        # 4 rows: the kq tile
         (64, 4096, "contiguous", 0, {"heads_q": 64}),       # 8: GQA 8, the kq tile's 8-row build
         (64, 4096, "contiguous4", 0),                       # 16 rows: the bench's q_len 4 row
         (64, 4096, "contiguous8", 0),                       # 32: GQA 4, 8 new tokens
         (64, 4096, "contiguous4", 0, {"heads_q": 64}),      # 32: GQA 8, 4 new tokens
         (64, 32768, "contiguous", 0, {"heads_kv": 1}),      # 32: MQA, one new token
         (64, 32768, "contiguous2", 0, {"heads_kv": 1}),     # 64
         (64, 32768, "contiguous4", 0, {"heads_kv": 1}),     # 128
         (64, 4096, "contiguous", 0, {"heads_q": 128}),      # 16: GQA 16, one new token
         (1, 32768, "contiguous", 0, {"heads_kv": 1}),       # MQA, one long sequence
         (8, 32768, "contiguous", 0, {"heads_kv": 1}),
         # the bench's other contiguous q_len 1 shapes (GQA 4), for our cuDNN SKU beside ours
         (8, 32768, "contiguous", 0), (256, 1024, "contiguous", 0), (1, 32768, "contiguous", 0),
         (64, 8192, "contiguous", 0, {"ragged": True})]         # lengths in [1, 8192]
PAGED = [(64, 4096, "paged", 16),                                  # 4 rows (kq tile), GQA 4
         (64, 4096, "paged", 16, {"heads_q": 64}),                 # 8: GQA 8
         (64, 32768, "paged", 16, {"heads_kv": 1}),                # 32: MQA
         (64, 32768, "paged", 64, {"heads_kv": 1}),
         (64, 4096, "paged", 16, {"heads_q": 128})]                # 16: GQA 16
CUDNN_SKU = "decode_attention.cudnn.bf16"


def copy_tbps_of(settle) -> float:
    """A 1 GiB device copy's rate (bytes read and written), timed as the contestants are."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = time_contestants({"copy": lambda: dst.copy_(src)}, 20, ours="copy", settle=settle)
    return 2 * src.numel() / copy.gpu_ms["copy"] / 1e9


def against_torch(settle, copy_tbps: float) -> dict[str, dict]:
    """CASES: our run() and "torch sdpa" on the same contiguous cache."""
    rows = {}
    for case in CASES:
        desc, args, nbytes = case_tensors(*case)
        rows_per_head = desc.heads_q // desc.heads_kv * desc.q_len
        plan = DecodeAttentionPlan.select(desc, device=0)
        ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
        plan.run(args, workspace=ws)
        peer = torch_sdpa(torch, args.q, args.k_cache, args.v_cache,
                          args.seq_lens.cpu().tolist(), args.seq_lens)
        contestants = {"ours": lambda p=plan, a=args, w=ws: p.run(a, workspace=w),
                       "torch sdpa": peer.call}
        if desc.q_len == 1:  # our cuDNN SKU on the same contiguous cache
            cudnn_plan = DecodeAttentionPlan.select(desc, PlanPreference(sku=CUDNN_SKU),
                                                    device=0)
            cudnn_ws = torch.empty(max(cudnn_plan.workspace_size, 1), dtype=torch.uint8,
                                   device="cuda")
            own = dataclasses.replace(args, out=torch.empty_like(args.out))  # ours' out stays
            contestants["ours cudnn sku"] = (
                lambda p=cudnn_plan, a=own, w=cudnn_ws: p.run(a, workspace=w))
        timings = time_contestants(contestants, 20, settle=settle)
        ms = timings.gpu_ms
        tile = kernels.row_tile(rows_per_head, desc.element, desc.head_dim, kernels.wgmma_on(0))
        tiles = kernels.row_tiles(desc.heads_q, desc.heads_kv, desc.q_len, tile)
        diff = float((args.out.float() - peer.out.float()).abs().max())
        row = {"rows per kv head": rows_per_head, "tiles": tiles, "ours ms": ms["ours"],
               "torch sdpa ms": ms["torch sdpa"],
               "ours % of copy": 100 * nbytes / ms["ours"] / 1e9 / copy_tbps,
               "torch % of copy": 100 * nbytes / ms["torch sdpa"] / 1e9 / copy_tbps,
               "torch ms / ours": ms["torch sdpa"] / ms["ours"], "max |ours - torch|": diff,
               "peer note": peer.note}
        if "ours cudnn sku" in ms:
            row["ours cudnn sku ms"] = ms["ours cudnn sku"]
            row["ours cudnn sku % of copy"] = 100 * nbytes / ms["ours cudnn sku"] / 1e9 / copy_tbps
        rows[case_key(case)] = row
        print(f"{case_key(case):36s} rows {rows_per_head:3d} tiles {tiles:2d}  ours "
              f"{ms['ours']:.3f} ms ({row['ours % of copy']:.1f}%)  torch {ms['torch sdpa']:.3f}"
              f" ms ({row['torch % of copy']:.1f}%)  {row['torch ms / ours']:.2f}x  "
              f"max diff {diff:.2e} {peer.note}" + (
                  f"  ours cudnn sku {ms['ours cudnn sku']:.3f} ms "
                  f"({row['ours cudnn sku % of copy']:.1f}%)" if "ours cudnn sku" in ms else ""))
        plan.free()
        del args, peer
        torch.cuda.empty_cache()
    return rows


def against_cudnn(settle, copy_tbps: float) -> dict[str, dict]:
    """PAGED: our run(), our cuDNN SKU's and the raw "cudnn paged" graph on the same pools; a
    contestant that declines a case is noted."""
    rows, raw = {}, RawCudnn(torch)
    for case in PAGED:
        desc, args, nbytes = case_tensors(*case)
        contestants, outs = {}, {}
        notes = []
        for name, pref in (("ours", None), ("ours cudnn sku", PlanPreference(sku=CUDNN_SKU))):
            try:
                plan = DecodeAttentionPlan.select(desc, pref, device=0)
            except Exception as error:  # a SKU that declines this case: noted, not timed
                notes.append(f"{name}: {str(error).splitlines()[0]}")
                continue
            ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
            plan.run(args, workspace=ws)
            outs[name] = args.out.clone()
            contestants[name] = lambda p=plan, a=args, w=ws: p.run(a, workspace=w)
        try:
            peer = cudnn_paged(raw, args.q, args.k_cache, args.v_cache, args.page_table,
                               args.seq_lens)
            contestants["cudnn paged"] = peer.call
            outs["cudnn paged"] = peer.out
        except Exception as error:
            notes.append(f"cudnn paged: {str(error).splitlines()[0]}")
        ms = time_contestants(contestants, 20, settle=settle).gpu_ms
        row = {f"{name} ms": value for name, value in ms.items()}
        row.update({f"{name} % of copy": 100 * nbytes / value / 1e9 / copy_tbps
                    for name, value in ms.items()})
        for name, out in outs.items():
            if name != "ours":
                diff = (outs["ours"].float() - out.float()).abs().max()
                row[f"max |ours - {name}|"] = float(diff)
        row["notes"] = notes
        rows[case_key(case)] = row
        times = "  ".join(f"{name} {value:.3f} ms ({row[name + ' % of copy']:.1f}%)"
                          for name, value in ms.items())
        diffs = " ".join(f"{key} {value:.2e}" for key, value in row.items()
                         if key.startswith("max"))
        print(f"{case_key(case):36s} {times}  {diffs}  {'; '.join(notes)}")
        del args, contestants, outs
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    settle = settle_by_copying(torch)
    copy_tbps = copy_tbps_of(settle)
    print(f"device copy {copy_tbps:.2f} TB/s; {format_state(device_state(0))}")
    rows = {**against_torch(settle, copy_tbps), **against_cudnn(settle, copy_tbps)}
    write_to_argument(dict(copy_tbps=copy_tbps, device_state=device_state(0), rows=rows))


if __name__ == "__main__":
    main()
