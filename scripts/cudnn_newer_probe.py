"""What a newer cuDNN offers the varlen (THD) graphs, probed on a GPU (issue 12 section 2).

cuDNN 9.19, which the device image ships, takes a ragged graph's batch and longest sequences as
graph dimensions, its lengths as seq_len tensors and its packing as ragged offsets in elements:
so our plans bucket the dimensions and run a small NVRTC kernel that turns cu_seqlens into
offsets and lengths before every graph (``_backends/cudnn/varlen.py``). cudnn-frontend 1.32
names three newer inputs: ``cu_seq_len_q/kv`` (cuDNN 9.24, forward only), a ragged offset
multiplier (9.24: offsets in tokens, scaled by the engine, so cu_seqlens itself can be the
offsets) and override shapes (9.21: the batch and lengths set per execute). This script builds
the forward graph in each form (``FORMS``) on whatever cuDNN the process loads (LD_LIBRARY_PATH
first, as the frontend looks), reports what cuDNN refuses, checks what it accepts against a
float64 reference, and times the forms on the bench's set in f16, the forward at two buckets
and the backward (default and deterministic) with and without override shapes. CuPy only, no
torch (torch would load its own cuDNN). Results: docs/VARLEN-CUDNN.md, "What a newer cuDNN
offers"; record catalog/probes/cudnn_newer_H200.json.

    python3 scripts/cudnn_newer_probe.py [--out FILE] [--skip-timing] [--backward-check]
"""

from __future__ import annotations

import argparse
import json
import math
import traceback

import cudnn
import cupy as cp
import numpy as np

from opfacade._backends.cudnn.graphs import build_in_order
from opfacade._bench.common import time_ms

# UIDs: the tensors each form binds.
Q, K, V, OUT, STATS, SEQ_Q, SEQ_KV, RAG_Q, RAG_KV, CU_Q, CU_KV, DO, DQ, DK, DV = range(1, 16)
F16 = cudnn.data_type.HALF
F32 = cudnn.data_type.FLOAT
I32 = cudnn.data_type.INT32
I64 = cudnn.data_type.INT64


class Problem:
    """Packed f16 q [Tq, Hq, D], k, v [Tkv, Hkv, D] for ``lengths`` (self-attention, causal),
    and the buffers each form reads, padded to a bucket of ``bucket`` sequences."""

    def __init__(self, lengths, heads_q, heads_kv, dim, bucket, seq_bucket, seed=0):
        rng = np.random.default_rng(seed)
        self.lengths = np.asarray(lengths, np.int64)
        self.b, self.hq, self.hkv, self.d = len(lengths), heads_q, heads_kv, dim
        self.bucket, self.seq_bucket = bucket, seq_bucket
        self.max_len = int(self.lengths.max())
        total = int(self.lengths.sum())
        self.q = cp.asarray(rng.uniform(-1, 1, (total, heads_q, dim)).astype(np.float16))
        self.k = cp.asarray(rng.uniform(-1, 1, (total, heads_kv, dim)).astype(np.float16))
        self.v = cp.asarray(rng.uniform(-1, 1, (total, heads_kv, dim)).astype(np.float16))
        self.out = cp.full((total, heads_q, dim), np.nan, np.float16)
        self.d_out = cp.asarray(rng.uniform(-1, 1, (total, heads_q, dim)).astype(np.float16))
        self.dq, self.dk, self.dv = (cp.empty_like(t) for t in (self.q, self.k, self.v))
        cu = np.concatenate([[0], np.cumsum(self.lengths)])
        padded_cu = np.concatenate([cu, np.full(bucket - self.b, cu[-1])])  # [bucket + 1]
        padded_len = np.concatenate([self.lengths, np.zeros(bucket - self.b, np.int64)])
        self.cu = cp.asarray(cu.astype(np.int32))  # the user's cu_seqlens, [b + 1]
        self.cu_padded = cp.asarray(padded_cu.astype(np.int32))
        self.lens_padded = cp.asarray(padded_len.astype(np.int32))
        self.rag_q = cp.asarray(padded_cu * heads_q * dim)  # int64 element offsets
        self.rag_kv = cp.asarray(padded_cu * heads_kv * dim)
        self.stats = cp.empty((bucket, heads_q, seq_bucket, 1), np.float32)
        self.scale = 1.0 / math.sqrt(dim)

    def reference(self) -> np.ndarray:
        """Causal (top-left) attention in float64, sequence by sequence."""
        q, k, v = (cp.asnumpy(t).astype(np.float64) for t in (self.q, self.k, self.v))
        out = np.zeros_like(q)
        group = self.hq // self.hkv
        start = 0
        for n in self.lengths:
            sl = slice(start, start + n)
            for h in range(self.hq):
                s = q[sl, h] @ k[sl, h // group].T * self.scale
                s[np.triu_indices(n, 1)] = -np.inf
                p = np.exp(s - s.max(1, keepdims=True))
                out[sl, h] = (p / p.sum(1, keepdims=True)) @ v[sl, h // group]
            start += n
        return out


# Each form: (lengths from "seq_len" tensors [B] or "cu_seq_len" prefix sums [B + 1], ragged
# offsets in "elements" (int64) or "tokens" (int32 cu_seqlens times a multiplier), override
# shapes or not).
FORMS = {
    "offsets": ("seq_len", "elements", False),  # what our SKUs build on 9.19
    "override_offsets": ("seq_len", "elements", True),  # the 9.21 form
    "cu_seq_len": ("cu_seq_len", "elements", False),
    "multiplier": ("cu_seq_len", "tokens", False),
    "override": ("cu_seq_len", "tokens", True),  # the caller's [b + 1] cu_seqlens, bound as is
}


def build(p: Problem, form: str, handle, stats: bool = False, backward: bool = False,
          deterministic: bool = False):
    """The forward (or backward) graph of ``form`` (``FORMS``), built for the bucket."""
    lengths_form, offsets_form, override = FORMS[form]
    g = cudnn.pygraph(io_data_type=F16, intermediate_data_type=F32, compute_data_type=F32,
                      handle=handle, is_override_shape_enabled=override)
    B, S = p.bucket, p.seq_bucket
    ints = ((B + 1, 1, 1, 1), (1, 1, 1, 1))
    if offsets_form == "elements":
        rag_q = g.tensor(*ints, I64, name="rag_q", uid=RAG_Q)
        rag_kv = g.tensor(*ints, I64, name="rag_kv", uid=RAG_KV)
        mult_q = mult_kv = 1
    else:
        rag_q = g.tensor(*ints, I32, name="rag_q", uid=RAG_Q)
        rag_kv = g.tensor(*ints, I32, name="rag_kv", uid=RAG_KV)
        mult_q, mult_kv = p.hq * p.d, p.hkv * p.d

    def dims(heads):
        return [B, heads, S, p.d], [S * heads * p.d, p.d, heads * p.d, 1]

    def packed(uid, heads, rag, mult, name):
        return g.tensor(*dims(heads), F16, name=name, uid=uid, ragged_offset=rag,
                        ragged_offset_multiplier=mult)

    def packed_output(t, uid, heads, rag, mult):
        shape, strides = dims(heads)
        t.set_output(True).set_dim(shape).set_stride(strides).set_data_type(F16).set_uid(uid)
        t.set_ragged_offset(rag).set_ragged_offset_multiplier(mult)

    q = packed(Q, p.hq, rag_q, mult_q, "q")
    k = packed(K, p.hkv, rag_kv, mult_kv, "k")
    v = packed(V, p.hkv, rag_kv, mult_kv, "v")
    options = dict(attn_scale=p.scale, diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT,
                   diagonal_band_right_bound=0, use_padding_mask=True)
    if lengths_form == "seq_len":
        lengths = ((B, 1, 1, 1), (1, 1, 1, 1), I32)
        options["seq_len_q"] = g.tensor(*lengths, name="seq_q", uid=SEQ_Q)
        options["seq_len_kv"] = g.tensor(*lengths, name="seq_kv", uid=SEQ_KV)
    else:
        options["cu_seq_len_q"] = g.tensor(*ints, I32, name="cu_q", uid=CU_Q)
        options["cu_seq_len_kv"] = g.tensor(*ints, I32, name="cu_kv", uid=CU_KV)
    stats_dims = ([B, p.hq, S, 1], [p.hq * S, S, 1, 1])
    if backward:
        o = packed(OUT, p.hq, rag_q, mult_q, "o")
        d_o = packed(DO, p.hq, rag_q, mult_q, "d_o")
        st = g.tensor(*stats_dims, F32, name="stats", uid=STATS)
        grads = g.sdpa_backward(q, k, v, o, d_o, st, name="sdpa_backward",
                                use_deterministic_algorithm=deterministic, **options)
        for t, uid, heads, rag, mult in zip(grads, (DQ, DK, DV), (p.hq, p.hkv, p.hkv),
                                            (rag_q, rag_kv, rag_kv), (mult_q, mult_kv, mult_kv),
                                            strict=True):
            packed_output(t, uid, heads, rag, mult)
    else:
        out, st = g.sdpa(q, k, v, name="sdpa", generate_stats=stats, **options)
        packed_output(out, OUT, p.hq, rag_q, mult_q)
        if stats:
            st.set_output(True).set_dim(stats_dims[0]).set_stride(stats_dims[1])
            st.set_data_type(F32).set_uid(STATS)
    return build_in_order(g, cudnn)


def runner(p: Problem, form: str, g, handle, stats: bool = False, backward: bool = False):
    """(a call that executes ``g`` on ``p``'s buffers, its workspace bytes): the exact [b + 1]
    cu_seqlens and the call's longest sequence where the form overrides shapes."""
    lengths_form, offsets_form, override = FORMS[form]
    cu = p.cu if override else p.cu_padded
    pack = {Q: p.q.data.ptr, K: p.k.data.ptr, V: p.v.data.ptr, OUT: p.out.data.ptr}
    if offsets_form == "elements":
        pack.update({RAG_Q: p.rag_q.data.ptr, RAG_KV: p.rag_kv.data.ptr})
    else:
        pack.update({RAG_Q: cu.data.ptr, RAG_KV: cu.data.ptr})
    if lengths_form == "seq_len":
        pack.update({SEQ_Q: p.lens_padded.data.ptr, SEQ_KV: p.lens_padded.data.ptr})
    else:
        pack.update({CU_Q: cu.data.ptr, CU_KV: cu.data.ptr})
    if stats or backward:
        pack[STATS] = p.stats.data.ptr
    if backward:
        pack.update({DO: p.d_out.data.ptr, DQ: p.dq.data.ptr, DK: p.dk.data.ptr,
                     DV: p.dv.data.ptr})
    overrides = {}
    if override:
        b, s = p.b, p.max_len

        def packed(heads):
            return [b, heads, s, p.d], [s * heads * p.d, p.d, heads * p.d, 1]

        ints = ([b + 1, 1, 1, 1], [1, 1, 1, 1])
        shapes = {Q: packed(p.hq), K: packed(p.hkv), V: packed(p.hkv), OUT: packed(p.hq),
                  RAG_Q: ints, RAG_KV: ints}
        if lengths_form == "seq_len":
            shapes.update({SEQ_Q: ([b, 1, 1, 1], [1, 1, 1, 1]),
                           SEQ_KV: ([b, 1, 1, 1], [1, 1, 1, 1])})
        else:
            shapes.update({CU_Q: ints, CU_KV: ints})
        if stats or backward:
            shapes[STATS] = ([b, p.hq, s, 1], [p.hq * s, s, 1, 1])
        if backward:
            shapes.update({DO: packed(p.hq), DQ: packed(p.hq), DK: packed(p.hkv),
                           DV: packed(p.hkv)})
        overrides = dict(override_uids=list(shapes),
                         override_shapes=[v[0] for v in shapes.values()],
                         override_strides=[v[1] for v in shapes.values()])
        size = g.get_workspace_size(handle=handle, **overrides)
    else:
        size = g.get_workspace_size()
    workspace = cp.empty(max(int(size), 1), np.uint8)

    def call():
        g.execute(pack, workspace.data.ptr, handle=handle, **overrides)

    return call, int(size)


def first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}" if str(
        error).strip() else type(error).__name__


def check(forms, handle) -> dict:
    lengths = [1, 7, 100, 333, 64, 257]
    p = Problem(lengths, heads_q=4, heads_kv=2, dim=128, bucket=8, seq_bucket=512)
    ref = p.reference()
    results = {}
    for form in forms:
        for stats in (False, True):
            name = form + (" +stats" if stats else "")
            try:
                g = build(p, form, handle, stats)
                call, size = runner(p, form, g, handle, stats)
                p.out.fill(np.nan)
                call()
                cp.cuda.Device().synchronize()
                out = cp.asnumpy(p.out).astype(np.float64)
                err = float(np.abs(out - ref).max())
                results[name] = dict(built=True, workspace=size, max_abs_error=err,
                                     finite=bool(np.isfinite(out).all()))
            except Exception as error:  # cuDNN's refusal is the finding
                results[name] = dict(built=False, error=first_line(error))
                traceback.print_exc(limit=2)
            print(name, results[name], flush=True)
    return results


def backward_check(handle) -> dict:
    """The ragged backward with override shapes on the check's small problem, default and
    deterministic: built or declined, and its gradients against the offsets form's."""
    results = {}
    for deterministic in (False, True):
        grads = {}
        for form in ("offsets", "override_offsets"):
            name = f"backward{' deterministic' if deterministic else ''} {form}"
            try:
                p = Problem([1, 7, 100, 333, 64, 257], heads_q=4, heads_kv=2, dim=128, bucket=8,
                            seq_bucket=512)
                forward, _ = runner(p, "offsets", build(p, "offsets", handle, stats=True),
                                    handle, stats=True)
                forward()
                g = build(p, form, handle, backward=True, deterministic=deterministic)
                call, size = runner(p, form, g, handle, backward=True)
                call()
                cp.cuda.Device().synchronize()
                grads[form] = [cp.asnumpy(t).astype(np.float64) for t in (p.dq, p.dk, p.dv)]
                results[name] = dict(built=True, workspace=size)
                if form != "offsets" and "offsets" in grads:
                    results[name]["max_abs_difference_from_offsets"] = max(
                        float(np.abs(a - b).max())
                        for a, b in zip(grads[form], grads["offsets"], strict=True))
            except Exception as error:
                results[name] = dict(built=False, error=first_line(error))
            print(name, results[name], flush=True)
    return results


def _bench_set(bucket: int, seq_bucket: int) -> Problem:
    """The bench's set: 16 sequences of lengths 512-8192 (seed 12), H 32/8, d 128, f16."""
    lengths = np.random.default_rng(12).integers(512, 8192, 16, endpoint=True)
    return Problem(lengths, heads_q=32, heads_kv=8, dim=128, bucket=bucket,
                   seq_bucket=seq_bucket)


def timing(forms, handle) -> dict:
    """Forward, causal: each form at the bench's bucket (B16 S8192), and "offsets" and the
    override forms at a bucket of twice the batch and the length (B32 S16384), which the
    override forms run at the call's batch and longest sequence."""
    rows = {}
    cases = [(f, 16, 8192) for f in forms] + [
        (f, 32, 16384) for f in ("offsets", "override_offsets", "override")]
    for form, bucket, seq_bucket in cases:
        name = f"forward {form} B{bucket} S{seq_bucket}"
        try:
            p = _bench_set(bucket, seq_bucket)
            call, size = runner(p, form, build(p, form, handle), handle)
            rows[name] = dict(ms=time_ms(call), workspace=size)
        except Exception as error:
            rows[name] = dict(error=first_line(error))
        print(name, rows[name], flush=True)
    return rows


def backward_timing(handle) -> dict:
    """Backward, causal, default and deterministic: "offsets" at the bench's bucket and at
    B32 S16384, "override_offsets" (cu_seq_len has no backward input) built for B32 S16384 and
    run at the call's batch and longest sequence. The stats come from the offsets forward.
    A deterministic workspace too large to allocate is reported, not run."""
    rows, first = {}, {}
    for deterministic in (False, True):
        for form, bucket, seq_bucket in (("offsets", 16, 8192), ("offsets", 32, 16384),
                                         ("override_offsets", 32, 16384)):
            name = (f"backward{' deterministic' if deterministic else ''} {form} "
                    f"B{bucket} S{seq_bucket}")
            try:
                p = _bench_set(bucket, seq_bucket)
                forward, _ = runner(p, "offsets", build(p, "offsets", handle, stats=True),
                                    handle, stats=True)
                forward()
                g = build(p, form, handle, backward=True, deterministic=deterministic)
                size = (g.get_workspace_size() if not FORMS[form][2] else None)
                if size is not None and size > 60 << 30:
                    rows[name] = dict(workspace=int(size), ms=None)
                else:
                    call, size = runner(p, form, g, handle, backward=True)
                    rows[name] = dict(ms=time_ms(call), workspace=size)
                    grads = [cp.asnumpy(t).astype(np.float64) for t in (p.dq, p.dk, p.dv)]
                    if deterministic not in first:
                        first[deterministic] = grads
                    else:  # against the first row's gradients (the same inputs)
                        rows[name]["max_abs_difference_from_first"] = max(
                            float(np.abs(a - b).max()) for a, b in zip(
                                grads, first[deterministic], strict=True))
                    if FORMS[form][2]:
                        rows[name]["bucket_workspace"] = int(g.get_workspace_size())
            except Exception as error:
                rows[name] = dict(error=first_line(error))
            print(name, rows[name], flush=True)
            cp.get_default_memory_pool().free_all_blocks()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--backward-check", action="store_true",
                        help="also the override backward on the check's small problem")
    args = parser.parse_args()
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=cp.cuda.get_current_stream().ptr)
    forms = list(FORMS)
    record = dict(cudnn=cudnn.backend_version_string(), frontend=cudnn.__version__,
                  device=cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
    print(record, flush=True)
    record["check"] = check(forms, handle)
    if args.backward_check:
        record["backward_check"] = backward_check(handle)
    if not args.skip_timing:
        record["timing"] = timing(forms, handle)
        record["backward_timing"] = backward_timing(handle)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
