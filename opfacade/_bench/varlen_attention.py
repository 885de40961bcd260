"""Packed (varlen) attention in true f32 against torch, forward and backward, plus the dense f32
SDPA SKUs the same kernels give the sdpa family.

Peers, all f32 on the same values:
- varlen: torch's scaled_dot_product_attention on the sequences padded to the longest, with a
  boolean mask hiding the padded keys (what a torch user without a varlen kernel runs; its
  efficient-attention backend serves f32 with a mask). Its FLOPs on padding are its own cost;
  the figure counts the packed problem's FLOPs for both.
- dense: torch's scaled_dot_product_attention (its efficient-attention backend in f32).
Backward peers are torch autograd of the same calls, timed on a kept graph.
"""

from __future__ import annotations

from ..ops.sdpa import SdpaArgs, SdpaBackwardArgs, SdpaBackwardDescriptor, SdpaDescriptor
from ..ops.varlen_attention import (
    VarlenAttentionArgs,
    VarlenAttentionBackwardArgs,
    VarlenAttentionBackwardDescriptor,
    VarlenAttentionDescriptor,
)
from ..plan import Plan
from ..types import PlanPreference
from .common import BenchRow, time_contestants

# Sequence lengths of a packed batch (a mix, as a data loader packs them), heads, head dim.
LENGTHS = (2048, 512, 1536, 256, 2048, 1024, 768, 1792)
QUICK_LENGTHS = (256, 64, 192)
HEADS, HEAD_DIM = 16, 128
DENSE = dict(batch=2, heads_q=16, heads_kv=16, seq_q=4096, seq_kv=4096, head_dim=128)
QUICK_DENSE = dict(batch=1, heads_q=4, heads_kv=4, seq_q=512, seq_kv=512, head_dim=64)
_F32 = PlanPreference(backends={"nvrtc"})


def _tflops(flops: float, ms: float) -> str:
    return f"{flops / ms / 1e9:.1f} TFLOP/s"


def _attention_flops(pairs: float, dim: int) -> float:
    """Forward FLOPs of (query, key) pairs: two products of ``dim`` multiply-adds each."""
    return 4.0 * pairs * dim


def _varlen_rows(lengths: tuple[int, ...], causal: bool, reps: int) -> list[BenchRow]:
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device="cuda").manual_seed(0)
    tokens, longest, batch = sum(lengths), max(lengths), len(lengths)

    def uniform(*shape):
        return torch.rand(shape, device="cuda", generator=gen) * 2 - 1

    q, k, v, d_out = (uniform(tokens, HEADS, HEAD_DIM) for _ in range(4))
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda",
                           dtype=torch.int32)
    fields = dict(batch=batch, heads_q=HEADS, heads_kv=HEADS, head_dim=HEAD_DIM,
                  max_seqlen_q=longest, max_seqlen_kv=longest, element="f32",
                  causal="bottom_right" if causal else None)
    forward = Plan.select(VarlenAttentionDescriptor(**fields, save_lse=True), _F32)
    backward = Plan.select(VarlenAttentionBackwardDescriptor(**fields), _F32)
    out, lse = torch.empty_like(q), torch.empty((HEADS, tokens), device="cuda")
    grads = [torch.empty_like(t) for t in (q, k, v)]
    fwd_ws = torch.empty(max(forward.workspace_size, 1), device="cuda", dtype=torch.uint8)
    bwd_ws = torch.empty(max(backward.workspace_size, 1), device="cuda", dtype=torch.uint8)
    fwd_args = VarlenAttentionArgs(q, k, v, offsets, offsets, out, lse)
    bwd_args = VarlenAttentionBackwardArgs(q, k, v, out, d_out, lse, offsets, offsets, *grads)
    forward.run(fwd_args, workspace=fwd_ws)

    # torch: the sequences padded to the longest, [B, H, S, D], padded keys masked out.
    def padded(x):
        dense = x.new_zeros((batch, longest, HEADS, HEAD_DIM))
        for s, n in enumerate(lengths):
            dense[s, :n] = x[offsets[s]:offsets[s] + n]
        return dense.transpose(1, 2).contiguous()

    pq, pk, pv, pd = (padded(x) for x in (q, k, v, d_out))
    keys = torch.arange(longest, device="cuda")
    mask = keys[None, :] < torch.tensor(lengths, device="cuda")[:, None]  # [B, S] keys kept
    mask = mask[:, None, None, :].expand(batch, 1, longest, longest)
    if causal:
        rows = keys[:, None]
        mask = mask & (keys[None, :] <= rows)[None, None]  # all sequences start at row 0

    def torch_forward(*tensors):
        return F.scaled_dot_product_attention(*tensors, attn_mask=mask)

    leaves = [t.detach().clone().requires_grad_() for t in (pq, pk, pv)]
    kept = torch_forward(*leaves)
    pairs = sum(n * (n + 1) / 2 if causal else n * n for n in lengths)
    flops = _attention_flops(pairs * HEADS, HEAD_DIM)
    label = f"f32 d{HEAD_DIM} H{HEADS} {batch} seqs {tokens} tokens" + (" causal" if causal
                                                                        else "")
    rows = [time_contestants({
        "ours": lambda: forward.run(fwd_args, workspace=fwd_ws),
        "torch sdpa padded+mask": lambda: torch_forward(pq, pk, pv),
    }, reps).row("varlen_attention_forward", label, lambda ms: _tflops(flops, ms),
                 notes=forward.sku.id)]
    rows.append(time_contestants({
        "ours": lambda: backward.run(bwd_args, workspace=bwd_ws),
        "torch autograd padded+mask": lambda: torch.autograd.grad(kept, leaves, pd,
                                                                  retain_graph=True),
    }, reps).row("varlen_attention_backward", label, lambda ms: _tflops(2.5 * flops, ms),
                 notes=backward.sku.id))
    return rows


def _dense_rows(shape: dict, causal: bool, reps: int) -> list[BenchRow]:
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device="cuda").manual_seed(1)
    b, h, s, d = shape["batch"], shape["heads_q"], shape["seq_q"], shape["head_dim"]

    def uniform():
        return torch.rand((b, h, s, d), device="cuda", generator=gen) * 2 - 1

    q, k, v, d_out = uniform(), uniform(), uniform(), uniform()
    mask = dict(causal="top_left" if causal else None)
    forward = Plan.select(SdpaDescriptor(**shape, **mask, element="f32", save_stats=True), _F32)
    backward = Plan.select(SdpaBackwardDescriptor(**shape, **mask, element="f32"), _F32)
    out, stats = torch.empty_like(q), torch.empty((b, h, s, 1), device="cuda")
    grads = [torch.empty_like(t) for t in (q, k, v)]
    ws = torch.empty(max(forward.workspace_size, backward.workspace_size, 1), device="cuda",
                     dtype=torch.uint8)
    fwd_args = SdpaArgs(q, k, v, out, stats)
    bwd_args = SdpaBackwardArgs(q, k, v, out, d_out, stats, *grads)
    forward.run(fwd_args, workspace=ws)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    kept = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    pairs = b * h * (s * (s + 1) / 2 if causal else s * s)
    flops = _attention_flops(pairs, d)
    label = f"f32 d{d} B{b} H{h} S{s}" + (" causal" if causal else "")
    rows = [time_contestants({
        "ours": lambda: forward.run(fwd_args, workspace=ws),
        "torch sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
    }, reps).row("sdpa_forward", label, lambda ms: _tflops(flops, ms), notes=forward.sku.id)]
    rows.append(time_contestants({
        "ours": lambda: backward.run(bwd_args, workspace=ws),
        "torch autograd": lambda: torch.autograd.grad(kept, leaves, d_out, retain_graph=True),
    }, reps).row("sdpa_backward", label, lambda ms: _tflops(2.5 * flops, ms),
                 notes=backward.sku.id))
    return rows


def run(quick: bool = False) -> list[BenchRow]:
    reps = 5 if quick else 15
    lengths, dense = (QUICK_LENGTHS, QUICK_DENSE) if quick else (LENGTHS, DENSE)
    rows = [r for causal in (False, True) for r in _varlen_rows(lengths, causal, reps)]
    rows += [r for causal in (False, True) for r in _dense_rows(dense, causal, reps)]
    return rows
