"""cuDNN's SDPA graph over a contiguous decode cache (q_len 1): with the padding mask and
per-sequence lengths (what a contiguous cuDNN decode SKU would build) and without any mask (what
"torch sdpa" runs when every sequence is full), against our run() on the same tensors, as the
bench times a row. Whether a contiguous cuDNN SKU would read MQA's cache faster than ours
(docs/DECODE.md, "Scores tested only where a warp needs it, and kv heads of more than 16 rows").

    python3 scripts/decode_cudnn_dense_probe.py [out.json]
"""

from __future__ import annotations

import torch
from decode_rows_probe import copy_tbps_of  # beside this script
from decode_variants import case_key, case_tensors  # beside this script
from probe_record import write_to_argument  # beside this script

from opfacade import DecodeAttentionPlan
from opfacade._bench.common import settle_by_copying, time_contestants
from opfacade._bench.cudnn_peers import RawCudnn

CASES = [(64, 4096, "contiguous", 0),                   # GQA 4 (the bench's B64 S4096 row)
         (64, 32768, "contiguous", 0, {"heads_kv": 1}),  # MQA, 32 rows
         (64, 4096, "contiguous", 0, {"heads_q": 128})]  # GQA 16


def dense_decode(raw: RawCudnn, q, k, v, out, seq_lens, padded: bool):
    """The graph over q [b, 1, Hq, D] and nhd caches [b, S, Hkv, D] as [B, H, S, D] views."""
    g = raw._new_graph(q.dtype)
    qv, kv, vv, ov = (x.transpose(1, 2) for x in (q, k, v, out))
    qt, kt, vt = g.tensor_like(qv), g.tensor_like(kv), g.tensor_like(vv)
    options, pack = {}, {}
    if padded:
        int32 = raw.cudnn.data_type.INT32
        b = q.shape[0]
        seq_q, seq_kv = (g.tensor(name=name, dim=[b, 1, 1, 1], stride=[1, 1, 1, 1],
                                  data_type=int32) for name in ("seq_len_q", "seq_len_kv"))
        ones = torch.ones(b, 1, 1, 1, dtype=torch.int32, device=q.device)
        options = {"use_padding_mask": True, "seq_len_q": seq_q, "seq_len_kv": seq_kv}
        pack = {seq_q: ones, seq_kv: seq_lens.view(b, 1, 1, 1)}
    ot, _ = g.sdpa(q=qt, k=kt, v=vt, name="decode", generate_stats=False,
                   attn_scale=q.shape[3] ** -0.5, **options)
    ot.set_output(True).set_dim(list(ov.shape)).set_stride(list(ov.stride()))
    return raw._built(g, {qt: qv, kt: kv, vt: vv, ot: ov, **pack})


def main() -> None:
    settle = settle_by_copying(torch)
    copy_tbps = copy_tbps_of(settle)
    raw, rows = RawCudnn(torch), {}
    for case in CASES:
        desc, args, nbytes = case_tensors(*case)
        plan = DecodeAttentionPlan.select(desc, device=0)
        ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
        plan.run(args, workspace=ws)
        contestants = {"ours": lambda p=plan, a=args, w=ws: p.run(a, workspace=w)}
        outs, notes = {}, []
        for name, padded in (("cudnn padded", True), ("cudnn unmasked", False)):
            out = torch.empty_like(args.out)
            try:
                graph = dense_decode(raw, args.q, args.k_cache, args.v_cache, out,
                                     args.seq_lens, padded).bind()
            except Exception as error:  # cuDNN declines: noted
                notes.append(f"{name}: {str(error).splitlines()[0]}")
                continue
            graph()
            contestants[name], outs[name] = graph, out
        ms = time_contestants(contestants, 20, settle=settle).gpu_ms
        row = {f"{name} % of copy": 100 * nbytes / t / 1e9 / copy_tbps for name, t in ms.items()}
        row.update({f"{name} ms": t for name, t in ms.items()})
        row.update({f"max |ours - {name}|": float((args.out.float() - o.float()).abs().max())
                    for name, o in outs.items()})
        row["notes"] = notes
        rows[case_key(case)] = row
        times = "  ".join(f"{name} {t:.3f} ms ({row[name + ' % of copy']:.1f}%)"
                          for name, t in ms.items())
        print(f"{case_key(case):36s} {times}  {'; '.join(notes)}")
        plan.free()
        del args, contestants, outs
        torch.cuda.empty_cache()
    write_to_argument(dict(copy_tbps=copy_tbps, rows=rows))


if __name__ == "__main__":
    main()
