"""The decode_attention family as a torch op: ``opfacade::decode_attention`` over a contiguous
or paged KV cache, and the ``decode_attention`` function. Decode has no backward: a call that
autograd would differentiate is refused with Unsupported.

Serving loops that step many times keep a DecodeAttentionPlan for their envelope and its
prepared call (opfacade.ops.decode_attention); this op selects per problem from the plan cache,
as torch.compile'd models call it."""

from __future__ import annotations

import torch

from ..ops import decode_attention as functional
from ._common import absent, cuda_device, element_of, empty, no_grad_wanted
from ._define import define_op

__all__ = ["decode_attention"]


def _decode_impl(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 seq_lens: torch.Tensor, page_table: torch.Tensor | None, kv_layout: str,
                 scale: float | None, window_left: int | None, save_lse: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    cuda_device("decode_attention", q=q, k_cache=k_cache, v_cache=v_cache, seq_lens=seq_lens,
                page_table=page_table)
    out, lse = functional.decode_attention(q, k_cache, v_cache, seq_lens, page_table=page_table,
                                           kv_layout=kv_layout, scale=scale,
                                           window_left=window_left, return_lse=save_lse)
    return out, lse if save_lse else absent(q)


def _decode_fake(q, k_cache, v_cache, seq_lens, page_table, kv_layout, scale, window_left,
                 save_lse):
    device = cuda_device("decode_attention", q=q, k_cache=k_cache, v_cache=v_cache,
                         seq_lens=seq_lens, page_table=page_table)
    element = element_of(q, "q")
    out = empty((*q.shape[:3], v_cache.shape[3]), element, device)
    lse = empty(q.shape[:3], element.accumulator, device) if save_lse else absent(q)
    return out, lse


_decode = define_op("decode_attention", _decode_impl, _decode_fake)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     seq_lens: torch.Tensor, *, page_table: torch.Tensor | None = None,
                     kv_layout: str = "nhd", scale: float | None = None,
                     window_left: int | None = None, return_lse: bool = False):
    """One decode step: q [B, q_len, Hq, D] attends over each sequence's first seq_lens[b] cache
    tokens (contiguous [B, max_seq, Hkv, D], or paged pools with ``page_table``; "hnd" for
    heads-major). Returns out [B, q_len, Hq, Dv], or (out, lse) with ``return_lse``."""
    cuda_device("decode_attention", q=q, k_cache=k_cache, v_cache=v_cache, seq_lens=seq_lens,
                page_table=page_table)
    no_grad_wanted("decode_attention", q=q, k_cache=k_cache, v_cache=v_cache)
    arguments = (q, k_cache, v_cache, seq_lens, page_table, kv_layout, scale, window_left,
                 return_lse)
    out, lse = _decode(*arguments)
    return (out, lse) if return_lse else out
