"""The varlen_attention family as torch ops: ``opfacade::varlen_attention`` and
``opfacade::varlen_attention_backward``, the autograd between them, and ``varlen_attention``
with FlashAttention's ``flash_attn_varlen_func`` conventions.

    out = varlen_attention(q, k, v, cu_q, cu_kv, max_seqlen_q=4096, max_seqlen_kv=4096,
                           causal="bottom_right")     # q [total_q, Hq, D], cu_* int32 [B + 1]
"""

from __future__ import annotations

import torch

from ..ops import varlen_attention as functional
from ._common import (
    absent,
    autocast_dtype,
    autocast_inputs,
    cuda_device,
    deterministic_choice,
    element_of,
    empty,
    wants_grad,
)
from ._define import define_op

__all__ = ["varlen_attention"]


def _window(left: int | None, right: int | None) -> tuple[int | None, int | None] | None:
    return None if left is None and right is None else (left, right)


def _causal(causal: str) -> str | None:
    return None if causal == "none" else causal


def _varlen_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, cu_seqlens_kv: torch.Tensor, max_seqlen_q: int,
                 max_seqlen_kv: int, scale: float | None, causal: str, window_left: int | None,
                 window_right: int | None, save_lse: bool, deterministic: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    # deterministic is the backward's choice, carried in the forward's schema for autograd.
    cuda_device("varlen_attention", q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_kv=cu_seqlens_kv)
    out, lse = functional.varlen_attention(
        q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
        max_seqlen_kv=max_seqlen_kv, scale=scale, causal=_causal(causal),
        window=_window(window_left, window_right), return_lse=save_lse)
    return out, lse if save_lse else absent(q)


def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, scale,
                 causal, window_left, window_right, save_lse, deterministic):
    device = cuda_device("varlen_attention", q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q,
                         cu_seqlens_kv=cu_seqlens_kv)
    element = element_of(q, "q")
    out = empty((q.shape[0], q.shape[1], v.shape[2]), element, device)
    lse = (empty((q.shape[1], q.shape[0]), element.accumulator, device) if save_lse
           else absent(q))
    return out, lse


def _varlen_backward_impl(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                          cu_seqlens_q: torch.Tensor, cu_seqlens_kv: torch.Tensor,
                          max_seqlen_q: int, max_seqlen_kv: int, scale: float | None,
                          causal: str, window_left: int | None, window_right: int | None,
                          deterministic: bool
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cuda_device("varlen_attention_backward", grad_out=grad_out, q=q, k=k, v=v, out=out, lse=lse)
    return functional.varlen_attention_backward(
        grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
        max_seqlen_kv=max_seqlen_kv, scale=scale, causal=_causal(causal),
        window=_window(window_left, window_right), deterministic=deterministic)


def _varlen_backward_fake(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv,
                          max_seqlen_q, max_seqlen_kv, scale, causal, window_left, window_right,
                          deterministic):
    device = cuda_device("varlen_attention_backward", grad_out=grad_out, q=q, k=k, v=v)
    element = element_of(q, "q")
    return tuple(empty(t.shape, element, device) for t in (q, k, v))


_varlen_backward = define_op("varlen_attention_backward", _varlen_backward_impl,
                             _varlen_backward_fake)


def _save_for_backward(ctx, inputs, output) -> None:
    q, k, v, cu_q, cu_kv, *options = inputs
    ctx.options = tuple(options[:6]) + (options[7],)  # all but save_lse
    ctx.save_for_backward(q, k, v, cu_q, cu_kv, *output)


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, cu_q, cu_kv, out, lse = ctx.saved_tensors
    if grad_out is None:  # out was not used
        return (None,) * 13
    grads = _varlen_backward(
        grad_out.contiguous(), q, k, v, out, lse, cu_q, cu_kv, *ctx.options)
    return (*grads, *(None,) * 10)


_varlen = define_op("varlen_attention", _varlen_impl, _varlen_fake,
                    setup_context=_save_for_backward, backward=_backward, autocast=True)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     cu_seqlens_q: torch.Tensor, cu_seqlens_kv: torch.Tensor, *,
                     max_seqlen_q: int, max_seqlen_kv: int, scale: float | None = None,
                     causal: str | bool | None = None,
                     window: tuple[int | None, int | None] | None = None,
                     return_lse: bool = False, deterministic: bool | None = None):
    """Packed attention: sequence b attends q[cu_q[b]:cu_q[b+1]] over its keys (see
    contracts/varlen_attention.py). ``causal``: True/"top_left" or "bottom_right". Returns out,
    or (out, lse [Hq, total_q] f32) with ``return_lse``. Differentiable in q, k and v;
    ``deterministic`` (None: follow torch.are_deterministic_algorithms_enabled()) picks the
    deterministic backward. Under torch.autocast("cuda") q, k and v are cast to its dtype
    first, as F.scaled_dot_product_attention's are."""
    cast = autocast_dtype()
    if cast is not None:
        q, k, v = autocast_inputs(cast, q, k, v)
    cuda_device("varlen_attention", q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_kv=cu_seqlens_kv)
    causal = "top_left" if causal is True else (causal or "none")
    left, right = (None, None) if window is None else window
    out, lse = _varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_kv, int(max_seqlen_q), int(max_seqlen_kv), scale,
        causal, left, right, return_lse or wants_grad(q, k, v),
        deterministic_choice(deterministic))
    return (out, lse) if return_lse else out
