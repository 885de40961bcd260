"""cuDNN graphs with dynamic shapes and a kernel cache (issue 14 §4) against static ones, through
opfacade's plans: selection time of each new shape (the graph build), kernel time, and whether
both give the same bits. The plan store is off, so every build is a real one.

For each mode (OPFACADE_CUDNN_DYNAMIC_SHAPES=0, then 1) the caches are cleared and the same
sequence of new shapes is selected in order: the first shape of a topology is a cold build in
both modes; the later ones are where a kernel cache can serve. Kinds: dense SDPA forward (bf16,
B2 H16 d128 causal at several lengths), ragged (varlen) forward buckets, paged decode envelopes.
Prints one JSON line per (kind, shape, mode) and a summary.

    python3 scripts/dynamic_shapes_probe.py
"""

import json
import os
import time

os.environ["OPFACADE_CUDNN_PLAN_CACHE"] = "0"

import torch  # noqa: E402

import opfacade  # noqa: E402
from opfacade import (  # noqa: E402
    DecodeAttentionArgs,
    DecodeAttentionDescriptor,
    Plan,
    PlanPreference,
    SdpaArgs,
    SdpaDescriptor,
    VarlenAttentionArgs,
    VarlenAttentionDescriptor,
)
from opfacade._backends.cudnn import runtime  # noqa: E402

CUDNN = PlanPreference(backends={"cudnn"})
gen = torch.Generator(device="cuda").manual_seed(0)


def uniform(*shape):
    return (torch.rand(shape, device="cuda", generator=gen) * 2 - 1).to(torch.bfloat16)


def timed_select(desc):
    torch.cuda.synchronize()
    start = time.perf_counter()
    plan = Plan.select(desc, CUDNN, device=0)
    return plan, (time.perf_counter() - start) * 1e3


def kernel_ms(plan, args, workspace, reps=20):
    plan.run(args, workspace=workspace)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        plan.run(args, workspace=workspace)
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / reps


def workspace_for(plan):
    return torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)


def dense(seq):
    desc = SdpaDescriptor(batch=2, heads_q=16, heads_kv=16, seq_q=seq, seq_kv=seq, head_dim=128,
                          element="bf16", causal="top_left", save_stats=True)
    plan, ms = timed_select(desc)
    q, k, v = (uniform(2, 16, seq, 128) for _ in range(3))
    out, stats = torch.empty_like(q), torch.empty((2, 16, seq, 1), device="cuda")
    args = SdpaArgs(q, k, v, out, stats)
    return plan, ms, args, out


def decode(batch, pages_per_seq=256, page=16):
    desc = DecodeAttentionDescriptor(batch=batch, element="bf16", cache="paged", kv_layout="nhd",
                                     page_size=page, max_pages=pages_per_seq, heads_q=32,
                                     heads_kv=8, head_dim=128)
    plan, ms = timed_select(desc)
    pages = batch * pages_per_seq
    q = uniform(batch, 1, 32, 128)
    k, v = uniform(pages, page, 8, 128), uniform(pages, page, 8, 128)
    table = torch.randperm(pages, device="cuda", generator=gen).int().view(batch, pages_per_seq)
    lens = torch.full((batch,), pages_per_seq * page, device="cuda", dtype=torch.int32)
    out = torch.empty_like(q)
    return plan, ms, DecodeAttentionArgs(q, k, v, lens, out, table), out


def ragged(batch, length):
    desc = VarlenAttentionDescriptor(batch=batch, heads_q=32, heads_kv=8, head_dim=128,
                                     max_seqlen_q=length, max_seqlen_kv=length, element="bf16",
                                     causal="bottom_right").bucketed()
    plan, ms = timed_select(desc)
    total = batch * length
    q, k, v = uniform(total, 32, 128), uniform(total, 8, 128), uniform(total, 8, 128)
    cu = torch.arange(0, total + 1, length, device="cuda", dtype=torch.int32)
    out = torch.empty_like(q)
    return plan, ms, VarlenAttentionArgs(q, k, v, cu, cu, out), out


KINDS = {
    "dense forward": (dense, [4096, 3968, 2048, 1000, 8192]),
    "paged decode": (decode, [64, 32, 128, 8]),
    "ragged forward": (lambda n: ragged(n, 2048), [8, 16, 4]),
}

rows, outputs = [], {}
for mode in ("0", "1"):
    os.environ[runtime.DYNAMIC_SHAPES_VARIABLE] = mode
    opfacade.clear_caches()
    for kind, (make, shapes) in KINDS.items():
        for shape in shapes:
            try:
                plan, select_ms, args, out = make(shape)
                ms = kernel_ms(plan, args, workspace_for(plan))
                outputs[(kind, shape, mode)] = out.detach().cpu()
                row = {"kind": kind, "shape": shape, "dynamic": mode, "select_ms": select_ms,
                       "kernel_ms": ms, "sku": plan.sku.id}
            except Exception as error:  # a refusal is a finding, not the end of the probe
                row = {"kind": kind, "shape": shape, "dynamic": mode,
                       "error": f"{type(error).__name__}: {str(error)[:300]}"}
            print(json.dumps(row), flush=True)
            rows.append(row)
            torch.cuda.empty_cache()

summary = []
for kind, (_, shapes) in KINDS.items():
    for shape in shapes:
        static, dynamic = (next(r for r in rows if r["kind"] == kind and r["shape"] == shape
                                and r["dynamic"] == m) for m in ("0", "1"))
        same = None
        if (kind, shape, "0") in outputs and (kind, shape, "1") in outputs:
            same = torch.equal(outputs[(kind, shape, "0")], outputs[(kind, shape, "1")])
        summary.append({"kind": kind, "shape": shape,
                        "select_ms": [static.get("select_ms"), dynamic.get("select_ms")],
                        "kernel_ms": [static.get("kernel_ms"), dynamic.get("kernel_ms")],
                        "bitwise_equal": same})
print(json.dumps({"summary": summary,
                  "device": torch.cuda.get_device_name(0)}, indent=1))
