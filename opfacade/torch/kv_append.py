"""The kv_append family as a torch op: ``opfacade::kv_append`` writes a step's new K and V
tokens into a contiguous or paged cache in place (declared as mutating both caches, so
torch.compile orders it before the attention that reads them). It has no backward."""

from __future__ import annotations

import torch

from ..ops import kv_append as functional
from ._common import cuda_device, no_grad_wanted

__all__ = ["kv_append"]


# The one op registered through torch.library.custom_op rather than _define.define_op: it
# mutates its caches, and custom_op's handling of mutated arguments is what torch.compile's
# functionalization of it has been tested with.
@torch.library.custom_op("opfacade::kv_append", mutates_args=("k_cache", "v_cache"))
def _kv_append_op(k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, seq_lens: torch.Tensor,
                  page_table: torch.Tensor | None, kv_layout: str) -> None:
    cuda_device("kv_append", k_new=k_new, v_new=v_new, k_cache=k_cache, v_cache=v_cache,
                seq_lens=seq_lens, page_table=page_table)
    functional.kv_append(k_new, v_new, k_cache, v_cache, seq_lens, page_table=page_table,
                         kv_layout=kv_layout)


@_kv_append_op.register_fake
def _(k_new, v_new, k_cache, v_cache, seq_lens, page_table, kv_layout):
    cuda_device("kv_append", k_new=k_new, v_new=v_new, k_cache=k_cache, v_cache=v_cache,
                seq_lens=seq_lens, page_table=page_table)


def kv_append(k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
              v_cache: torch.Tensor, seq_lens: torch.Tensor, *,
              page_table: torch.Tensor | None = None, kv_layout: str = "nhd") -> None:
    """Writes k_new/v_new [B, q_len, Hkv, D] into each sequence's cache (contiguous, or paged
    with ``page_table``) in place, at positions seq_lens[b] - q_len .. seq_lens[b] - 1:
    seq_lens already counts the new tokens, as the decode that follows reads them."""
    cuda_device("kv_append", k_new=k_new, v_new=v_new, k_cache=k_cache, v_cache=v_cache,
                seq_lens=seq_lens, page_table=page_table)
    no_grad_wanted("kv_append", k_new=k_new, v_new=v_new)
    torch.ops.opfacade.kv_append(k_new, v_new, k_cache, v_cache, seq_lens, page_table,
                                 kv_layout)
