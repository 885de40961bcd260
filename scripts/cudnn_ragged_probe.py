"""What cuDNN (as shipped on the device) does with ragged (THD) attention graphs: the facts the
varlen_attention cuDNN SKUs (issue 12, section 2) are to be built on.

For f16 and bf16, packed q/k/v/o with ragged offsets (element offsets, [B+1,1,1,1] int32 and
int64) and the padding mask, it builds the forward and the default and deterministic backward,
and records for each:
- whether it builds (and cuDNN's message when not);
- the error of the packed results against the float64 reference (opfacade's varlen oracle);
- the workspace size, and the time per call;
- whether the stats tensor takes a ragged offset too (else it is [B, H, S_max, 1] padded).
It also tries bucket sizes larger than the batch and lengths (extra sequences of length 0).

    python3 scripts/cudnn_ragged_probe.py OUT.json
"""

from __future__ import annotations

import json
import sys
import time
import traceback

import cudnn
import numpy as np
import torch

from opfacade._backends.reference import varlen_backward, varlen_forward

RESULTS: dict = {"cudnn": cudnn.backend_version(), "frontend": cudnn.__version__, "cases": []}
H_Q, H_KV, D = 8, 2, 128


def _offsets(lengths) -> list[int]:
    return [0, *np.cumsum(lengths).tolist()]


def _time(fn, reps: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / reps


def _rel(got: torch.Tensor, want: np.ndarray) -> float:
    got = got.double().cpu().numpy()
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


def case(dtype, len_q, len_kv, bucket_batch, causal, offset_type, ragged_stats, deterministic,
         check=True):
    record = dict(dtype=str(dtype), tokens_q=int(sum(len_q)), tokens_kv=int(sum(len_kv)),
                  batch=len(len_q), bucket_batch=bucket_batch, max_q=max(len_q),
                  max_kv=max(len_kv), causal=causal, offset_type=str(offset_type),
                  ragged_stats=ragged_stats, deterministic=deterministic)
    try:
        _run(record, dtype, len_q, len_kv, bucket_batch, causal, offset_type, ragged_stats,
             deterministic, check)
    except Exception as error:  # recorded: the probe's point is what cuDNN accepts
        record["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        record["where"] = traceback.format_exc().splitlines()[-3][:200]
    RESULTS["cases"].append(record)
    print(json.dumps(record), flush=True)


def _run(record, dtype, len_q, len_kv, bucket_batch, causal, offset_type, ragged_stats,
         deterministic, check):
    io = cudnn.data_type.HALF if dtype == torch.float16 else cudnn.data_type.BFLOAT16
    f32 = cudnn.data_type.FLOAT
    b = bucket_batch
    s_q, s_kv = max(len_q), max(len_kv)
    lq = list(len_q) + [0] * (b - len(len_q))
    lk = list(len_kv) + [0] * (b - len(len_kv))
    tq, tk = sum(lq), sum(lk)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def uniform(*shape):
        return (torch.rand(shape, device="cuda", generator=gen) * 2 - 1).to(dtype)

    q, d_o = uniform(tq, H_Q, D), uniform(tq, H_Q, D)
    k, v = uniform(tk, H_KV, D), uniform(tk, H_KV, D)
    o = torch.empty_like(q)
    torch_offset = torch.int32 if offset_type == "int32" else torch.int64
    cudnn_offset = cudnn.data_type.INT32 if offset_type == "int32" else cudnn.data_type.INT64
    cu_q, cu_kv = _offsets(lq), _offsets(lk)
    off_q = torch.tensor(cu_q, device="cuda", dtype=torch_offset).view(-1, 1, 1, 1) * (H_Q * D)
    off_kv = torch.tensor(cu_kv, device="cuda", dtype=torch_offset).view(-1, 1, 1, 1) * (H_KV * D)
    seq_q = torch.tensor(lq, device="cuda", dtype=torch.int32).view(-1, 1, 1, 1)
    seq_kv = torch.tensor(lk, device="cuda", dtype=torch.int32).view(-1, 1, 1, 1)
    stats_rows = tq if ragged_stats else b * s_q
    stats = torch.empty((stats_rows * H_Q,), device="cuda", dtype=torch.float32)
    off_stats = torch.tensor(cu_q, device="cuda", dtype=torch_offset).view(-1, 1, 1, 1) * H_Q
    handle = cudnn.create_handle()

    def packed(graph, name, heads, seq, offsets):
        tensor = graph.tensor(name=name, dim=[b, heads, seq, D],
                              stride=[seq * heads * D, D, heads * D, 1], data_type=io)
        tensor.set_ragged_offset(offsets)
        return tensor

    def scalar_like(graph, name, value, data_type):
        return graph.tensor(name=name, dim=list(value.shape), stride=[1, 1, 1, 1],
                            data_type=data_type)

    def masks(graph):
        options = dict(use_padding_mask=True, seq_len_q=scalar_like(graph, "sq", seq_q,
                                                                      cudnn.data_type.INT32),
                       seq_len_kv=scalar_like(graph, "skv", seq_kv, cudnn.data_type.INT32),
                       attn_scale=1.0 / D ** 0.5)
        if causal:
            options.update(diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT,
                           diagonal_band_right_bound=0)
        return options

    def stats_tensor(graph, output=None):
        dim, stride = [b, H_Q, s_q, 1], ([s_q * H_Q, 1, H_Q, 1] if ragged_stats
                                          else [H_Q * s_q, s_q, 1, 1])
        tensor = output if output is not None else graph.tensor(name="stats", dim=dim,
                                                               stride=stride, data_type=f32)
        if output is not None:
            tensor.set_output(True).set_dim(dim).set_stride(stride).set_data_type(f32)
        if ragged_stats:
            tensor.set_ragged_offset(scalar_like(graph, "ro_stats", off_stats, cudnn_offset))
        return tensor

    # -- forward
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=f32, compute_data_type=f32,
                      handle=handle)
    ro_q = scalar_like(g, "ro_q", off_q, cudnn_offset)
    ro_kv = scalar_like(g, "ro_kv", off_kv, cudnn_offset)
    tq_, tk_, tv_ = (packed(g, "q", H_Q, s_q, ro_q), packed(g, "k", H_KV, s_kv, ro_kv),
                     packed(g, "v", H_KV, s_kv, ro_kv))
    options = masks(g)
    out, st = g.sdpa(q=tq_, k=tk_, v=tv_, name="sdpa", generate_stats=True, **options)
    out.set_output(True).set_dim([b, H_Q, s_q, D]).set_stride([s_q * H_Q * D, D, H_Q * D, 1])
    out.set_ragged_offset(ro_q)
    stats_tensor(g, st)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    workspace = torch.empty(max(g.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    pack = {tq_: q, tk_: k, tv_: v, out: o, st: stats, ro_q: off_q, ro_kv: off_kv,
            options["seq_len_q"]: seq_q, options["seq_len_kv"]: seq_kv}
    if ragged_stats:
        pack[st.get_ragged_offset()] = off_stats
    record["forward_workspace"] = int(g.get_workspace_size())
    record["forward_ms"] = _time(lambda: g.execute(pack, workspace, handle=handle))
    host = {n: t.double().cpu().numpy() for n, t in (("q", q), ("k", k), ("v", v),
                                                     ("d_o", d_o))}
    opts = dict(causal="bottom_right" if causal else None)
    if check:
        ref_out, _ = varlen_forward(host["q"], host["k"], host["v"], np.array(cu_q),
                                    np.array(cu_kv), **opts)
        record["forward_rel_error"] = _rel(o, ref_out)

    # -- backward
    g2 = cudnn.pygraph(io_data_type=io, intermediate_data_type=f32, compute_data_type=f32,
                       handle=handle)
    ro_q2 = scalar_like(g2, "ro_q", off_q, cudnn_offset)
    ro_kv2 = scalar_like(g2, "ro_kv", off_kv, cudnn_offset)
    q2, k2, v2 = (packed(g2, "q", H_Q, s_q, ro_q2), packed(g2, "k", H_KV, s_kv, ro_kv2),
                  packed(g2, "v", H_KV, s_kv, ro_kv2))
    o2, do2 = packed(g2, "o", H_Q, s_q, ro_q2), packed(g2, "do", H_Q, s_q, ro_q2)
    st2 = stats_tensor(g2)
    options2 = masks(g2)
    dq, dk, dv = g2.sdpa_backward(q=q2, k=k2, v=v2, o=o2, dO=do2, stats=st2, name="bwd",
                                  use_deterministic_algorithm=deterministic, **options2)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    for tensor, heads, seq, ro in ((dq, H_Q, s_q, ro_q2), (dk, H_KV, s_kv, ro_kv2),
                                   (dv, H_KV, s_kv, ro_kv2)):
        tensor.set_output(True).set_dim([b, heads, seq, D]).set_stride(
            [seq * heads * D, D, heads * D, 1])
        tensor.set_ragged_offset(ro)
    g2.validate()
    g2.build_operation_graph()
    g2.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g2.check_support()
    g2.build_plans()
    workspace2 = torch.empty(max(g2.get_workspace_size(), 1), device="cuda", dtype=torch.uint8)
    pack2 = {q2: q, k2: k, v2: v, o2: o, do2: d_o, st2: stats, dq: grads[0], dk: grads[1],
             dv: grads[2], ro_q2: off_q, ro_kv2: off_kv, options2["seq_len_q"]: seq_q,
             options2["seq_len_kv"]: seq_kv}
    if ragged_stats:
        pack2[st2.get_ragged_offset()] = off_stats
    record["backward_workspace"] = int(g2.get_workspace_size())
    record["backward_ms"] = _time(lambda: g2.execute(pack2, workspace2, handle=handle))
    if check:
        ref = varlen_backward(host["q"], host["k"], host["v"], host["d_o"], np.array(cu_q),
                              np.array(cu_kv), **opts)
        record["backward_rel_error"] = {n: _rel(g_, r) for n, g_, r in
                                        zip(("dq", "dk", "dv"), grads, ref, strict=True)}
    if deterministic:
        first = [g_.clone() for g_ in grads]
        g2.execute(pack2, workspace2, handle=handle)
        torch.cuda.synchronize()
        record["bitwise_repeat"] = all(torch.equal(a, c) for a, c in zip(first, grads,
                                                                          strict=True))


def main() -> None:
    started = time.time()
    small_q, small_kv = [300, 1, 0, 129, 64], [300, 90, 5, 400, 64]
    for dtype in (torch.bfloat16, torch.float16):
        for offset_type in ("int32", "int64"):
            case(dtype, small_q, small_kv, 5, False, offset_type, False, False)
        case(dtype, small_q, small_kv, 5, True, "int32", False, False)
        case(dtype, small_q, small_kv, 5, True, "int32", True, False)  # ragged stats
        case(dtype, small_q, small_kv, 8, True, "int32", False, True)  # bucket > batch, det.
    # The workspace figures: deterministic backward at ~3.9k and ~73k tokens.
    for lengths, check in (([980] * 4, True), ([4600] * 16, False)):
        for deterministic in (True, False):
            case(torch.bfloat16, lengths, lengths, len(lengths), True, "int32", False,
                 deterministic, check)
    RESULTS["seconds"] = round(time.time() - started, 1)
    with open(sys.argv[1], "w") as out:
        json.dump(RESULTS, out, indent=1)


if __name__ == "__main__":
    main()
