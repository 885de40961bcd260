"""The kv_append family as a torch op: ``opfacade::kv_append`` writes a step's new K and V
tokens into a contiguous or paged cache in place (declared as mutating both caches, so
torch.compile orders it before the attention that reads them). It has no backward."""

from __future__ import annotations

import torch

from ..ops import kv_append as functional
from ._common import cuda_device, no_grad_wanted
from ._define import DefinedOp

__all__ = ["kv_append"]


def _kv_append_impl(k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, seq_lens: torch.Tensor,
                    page_table: torch.Tensor | None, kv_layout: str) -> None:
    cuda_device("kv_append", k_new=k_new, v_new=v_new, k_cache=k_cache, v_cache=v_cache,
                seq_lens=seq_lens, page_table=page_table)
    functional.kv_append(k_new, v_new, k_cache, v_cache, seq_lens, page_table=page_table,
                         kv_layout=kv_layout)


# The one op registered through torch.library.custom_op rather than _define.define_op: it
# mutates its caches, and custom_op's handling of mutated arguments is what torch.compile's
# functionalization of it has been tested with.
_kv_append_op = torch.library.custom_op("opfacade::kv_append", _kv_append_impl,
                                        mutates_args=("k_cache", "v_cache"))


@_kv_append_op.register_fake
def _(k_new, v_new, k_cache, v_cache, seq_lens, page_table, kv_layout):
    cuda_device("kv_append", k_new=k_new, v_new=v_new, k_cache=k_cache, v_cache=v_cache,
                seq_lens=seq_lens, page_table=page_table)


# Eager calls skip the dispatcher (custom_op's layers cost more than the launch); traced ones,
# and those a dispatch mode watches, go through the op.
_kv_append = DefinedOp("kv_append", _kv_append_impl, torch.ops.opfacade.kv_append.default)


def kv_append(k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
              v_cache: torch.Tensor, seq_lens: torch.Tensor, *,
              page_table: torch.Tensor | None = None, kv_layout: str = "nhd") -> None:
    """Writes k_new/v_new [B, q_len, Hkv, D] into each sequence's cache (contiguous, or paged
    with ``page_table``) in place, at positions seq_lens[b] - q_len .. seq_lens[b] - 1:
    seq_lens already counts the new tokens, as the decode that follows reads them."""
    cuda_device("kv_append", k_new=k_new, v_new=v_new, k_cache=k_cache, v_cache=v_cache,
                seq_lens=seq_lens, page_table=page_table)
    no_grad_wanted("kv_append", k_new=k_new, v_new=v_new)
    _kv_append(k_new, v_new, k_cache, v_cache, seq_lens, page_table, kv_layout)
