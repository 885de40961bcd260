"""Why cuDNN 9.19's ragged backward is slower than its dense one (issue 12 bench: 248 TFLOP/s on
the bf16 varlen set, where torch's SDPA looped per sequence reaches ~435): times the raw graphs
on the bench's 16 sequences (seed 12, Hq 32 / Hkv 8, d 128, causal) in variants that each change
one thing, forward and backward:

    ragged          the bench's "cudnn graph": THD, bucket (16, 8192), padding mask
    ragged-sorted   the same sequences, longest first in the graph's batch
    ragged-mha      k and v repeated to 32 heads (no GQA)
    ragged-exact    bucket max length = the longest sequence (7985), not 8192
    ragged-total    sdpa_backward's max_total_seq_len_q/kv set to the packed token counts
    padded          [16, 32, 8192, 128] BHSD tensors (no ragged offsets), padding mask
    loop            one graph per sequence at its own length (batch 1), summed

    ragged-top-left the same with the causal mask aligned top-left (equal q and kv lengths)
    loop-top-left   loop, aligned top-left
    loop-dense      loop without ragged offsets or the padding mask: plain dense graphs
    dense-bottom-right / dense-top-left   B4 x 4096 dense (no padding), the two alignments:
                    the same mask where queries and keys are equally many

    python3 scripts/varlen_backward_probe.py OUT.json [variant,variant...]
"""

from __future__ import annotations

import json
import sys
import traceback

import cudnn
import numpy as np
import torch

from opfacade._backends.cudnn.graphs import build_in_order

HQ, HKV, D = 32, 8, 128
LENGTHS = [int(n) for n in np.random.default_rng(12).integers(512, 8192, 16, endpoint=True)]
RESULTS: dict = {"cudnn": cudnn.backend_version(), "lengths": LENGTHS, "cases": {}}
IO, F32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT
handle = cudnn.create_handle()
cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)


def elapsed(fn, reps: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / reps


def built(g):
    return build_in_order(g, cudnn)


def graph():
    return cudnn.pygraph(io_data_type=IO, intermediate_data_type=F32, compute_data_type=F32,
                         handle=handle)


def pair(lengths, batch, seq, hkv, total=False, ragged=True, top_left=False, padding=True):
    """(forward ms, backward ms, workspaces) of one ragged or padded problem."""
    tokens = sum(lengths)
    lens = list(lengths) + [0] * (batch - len(lengths))
    cu = [0, *np.cumsum(lens).tolist()]
    rows = tokens if ragged else batch * seq

    def rand(heads):
        return (torch.rand(rows, heads, D, device="cuda") * 2 - 1).to(torch.bfloat16)

    q, k, v, d_o = rand(HQ), rand(hkv), rand(hkv), rand(HQ)
    o, grads = torch.empty_like(q), [torch.empty_like(t) for t in (q, k, v)]
    stats = torch.empty(batch * HQ * seq, device="cuda")
    seq_len = torch.tensor(lens, device="cuda", dtype=torch.int32).view(-1, 1, 1, 1)
    if ragged:
        off_q = torch.tensor(cu, device="cuda", dtype=torch.int64).view(-1, 1, 1, 1) * (HQ * D)
        off_kv = torch.tensor(cu, device="cuda", dtype=torch.int64).view(-1, 1, 1, 1) * (hkv * D)
    else:  # padded [B, S, H, D] rows, sequence b at row b * seq
        q, k, v, d_o, o = (t.view(batch, seq, -1, D) for t in (q, k, v, d_o, o))
        grads = [g.view(batch, seq, -1, D) for g in grads]

    def declare(g, heads, offsets):
        def make(name):
            t = g.tensor(name=name, dim=[batch, heads, seq, D],
                         stride=[seq * heads * D, D, heads * D, 1], data_type=IO)
            if offsets is not None:
                t.set_ragged_offset(offsets)
            return t
        return make

    def common(g):
        ro = {}
        if ragged:
            for name in ("ro_q", "ro_kv"):
                ro[name] = g.tensor(name=name, dim=[batch + 1, 1, 1, 1], stride=[1, 1, 1, 1],
                                    data_type=cudnn.data_type.INT64)
        sq = g.tensor(name="sq", dim=[batch, 1, 1, 1], stride=[1, 1, 1, 1],
                      data_type=cudnn.data_type.INT32)
        skv = g.tensor(name="skv", dim=[batch, 1, 1, 1], stride=[1, 1, 1, 1],
                       data_type=cudnn.data_type.INT32)
        alignment = cudnn.diagonal_alignment
        options = dict(attn_scale=D ** -0.5, diagonal_band_right_bound=0,
                       diagonal_alignment=alignment.TOP_LEFT if top_left else
                       alignment.BOTTOM_RIGHT)
        if padding:
            options.update(use_padding_mask=True, seq_len_q=sq, seq_len_kv=skv)
        return ro, options

    def out_like(t, heads, offsets):
        t.set_output(True).set_dim([batch, heads, seq, D]).set_stride(
            [seq * heads * D, D, heads * D, 1])
        if offsets is not None:
            t.set_ragged_offset(offsets)

    g = graph()
    ro, options = common(g)
    qo = ro.get("ro_q")
    kvo = ro.get("ro_kv")
    tq, tk, tv = declare(g, HQ, qo)("q"), declare(g, hkv, kvo)("k"), declare(g, hkv, kvo)("v")
    out, st = g.sdpa(q=tq, k=tk, v=tv, name="sdpa", generate_stats=True, **options)
    out_like(out, HQ, qo)
    st.set_output(True).set_dim([batch, HQ, seq, 1]).set_stride([HQ * seq, seq, 1, 1]) \
        .set_data_type(F32)
    built(g)
    ws = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    pack = {tq: q, tk: k, tv: v, out: o, st: stats}
    if padding:
        pack.update({options["seq_len_q"]: seq_len, options["seq_len_kv"]: seq_len})
    if ragged:
        pack.update({qo: off_q, kvo: off_kv})
    fwd_ms = elapsed(lambda: g.execute(pack, ws, handle=handle))

    g2 = graph()
    ro2, options2 = common(g2)
    qo2, kvo2 = ro2.get("ro_q"), ro2.get("ro_kv")
    q2, k2, v2 = declare(g2, HQ, qo2)("q"), declare(g2, hkv, kvo2)("k"), declare(g2, hkv, kvo2)("v")
    o2, do2 = declare(g2, HQ, qo2)("o"), declare(g2, HQ, qo2)("do")
    st2 = g2.tensor(name="stats", dim=[batch, HQ, seq, 1], stride=[HQ * seq, seq, 1, 1],
                    data_type=F32)
    if total:
        options2.update(max_total_seq_len_q=tokens, max_total_seq_len_kv=tokens)
    dq, dk, dv = g2.sdpa_backward(q=q2, k=k2, v=v2, o=o2, dO=do2, stats=st2, name="bwd",
                                  **options2)
    for t, heads, offsets in ((dq, HQ, qo2), (dk, hkv, kvo2), (dv, hkv, kvo2)):
        out_like(t, heads, offsets)
    built(g2)
    ws2 = torch.empty(max(g2.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    pack2 = {q2: q, k2: k, v2: v, o2: o, do2: d_o, st2: stats, dq: grads[0], dk: grads[1],
             dv: grads[2]}
    if padding:
        pack2.update({options2["seq_len_q"]: seq_len, options2["seq_len_kv"]: seq_len})
    if ragged:
        pack2.update({qo2: off_q, kvo2: off_kv})
    bwd_ms = elapsed(lambda: g2.execute(pack2, ws2, handle=handle))
    return {"forward_ms": fwd_ms, "backward_ms": bwd_ms,
            "forward_workspace": g.get_workspace_size(),
            "backward_workspace": g2.get_workspace_size()}


def case(name, fn):
    try:
        RESULTS["cases"][name] = fn()
    except Exception as error:
        RESULTS["cases"][name] = {"error": f"{type(error).__name__}: {str(error)[:300]}",
                                  "where": traceback.format_exc().splitlines()[-3][:200]}
    print(name, json.dumps(RESULTS["cases"][name]), flush=True)
    torch.cuda.empty_cache()


VARIANTS = sys.argv[2].split(",") if len(sys.argv) > 2 else None


def wanted(name: str) -> bool:
    return VARIANTS is None or name in VARIANTS


def loop(**options):
    parts = [pair([n], 1, n, HKV, **options) for n in LENGTHS]
    return {"forward_ms": sum(p["forward_ms"] for p in parts),
            "backward_ms": sum(p["backward_ms"] for p in parts)}


for name, run in (
        ("ragged", lambda: pair(LENGTHS, 16, 8192, HKV)),
        ("ragged-sorted", lambda: pair(sorted(LENGTHS, reverse=True), 16, 8192, HKV)),
        ("ragged-mha", lambda: pair(LENGTHS, 16, 8192, HQ)),
        ("ragged-exact", lambda: pair(LENGTHS, 16, max(LENGTHS), HKV)),
        ("ragged-total", lambda: pair(LENGTHS, 16, 8192, HKV, total=True)),
        ("ragged-top-left", lambda: pair(LENGTHS, 16, 8192, HKV, top_left=True)),
        ("padded", lambda: pair(LENGTHS, 16, 8192, HKV, ragged=False)),
        ("loop", loop),
        ("loop-top-left", lambda: loop(top_left=True)),
        ("loop-dense", lambda: loop(top_left=True, padding=False, ragged=False)),
        ("dense-bottom-right", lambda: pair([4096] * 4, 4, 4096, HKV, ragged=False,
                                            padding=False)),
        ("dense-top-left", lambda: pair([4096] * 4, 4, 4096, HKV, ragged=False, padding=False,
                                        top_left=True))):
    if wanted(name):
        case(name, run)
pairs = sum(n * (n + 1) / 2 for n in LENGTHS)
for result in RESULTS["cases"].values():
    if "backward_ms" in result:
        result["forward_tflops"] = 4 * pairs * HQ * D / result["forward_ms"] / 1e9
        result["backward_tflops"] = 10 * pairs * HQ * D / result["backward_ms"] / 1e9
with open(sys.argv[1], "w") as out:
    json.dump(RESULTS, out, indent=1)
print(json.dumps({n: (round(r.get("forward_tflops", 0)), round(r.get("backward_tflops", 0)))
                  for n, r in RESULTS["cases"].items()}))
