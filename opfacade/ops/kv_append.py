"""KV append plans and the functional form, over the kv_append contract
(``opfacade/contracts/kv_append.py``; the cache forms in ``contracts/kv_cache.py``).

    plan = KvAppendPlan.select(KvAppendDescriptor(batch=64, heads_kv=8, head_dim=128,
                                                  element="bf16", cache="paged", page_size=16,
                                                  max_pages=512), device=0)
    plan.run(KvAppendArgs(k_new, v_new, k_pages, v_pages, seq_lens, page_table), stream=s)

    kv_append(k_new, v_new, k_cache, v_cache, seq_lens, page_table=table)
"""

from __future__ import annotations

from typing import Any

from .._internal import operands
from .._internal.tensors import wrap
from ..contracts.kv_append import KV_APPEND, KvAppendArgs, KvAppendDescriptor
from ..errors import InvalidArgument
from ..plan import plan_class
from .decode_attention import cache_fields

__all__ = ["KvAppendArgs", "KvAppendDescriptor", "KvAppendPlan", "kv_append"]

KvAppendPlan = plan_class(KV_APPEND.name)


def kv_append(k_new: Any, v_new: Any, k_cache: Any, v_cache: Any, seq_lens: Any, *,
              page_table: Any = None, kv_layout: str = "nhd", stream: Any = None) -> None:
    """Functional form of KvAppendPlan: writes the step's new tokens into a contiguous cache, or
    a paged one when ``page_table`` is given, in place."""
    # The plan by the call's facts (no descriptor built, nothing wrapped, on a repeat call).
    k_facts = operands.facts(k_new, "k_new")
    facts = (k_facts, operands.facts(v_new, "v_new")[0], operands.facts(k_cache, "k_cache")[0],
             None if page_table is None else operands.facts(page_table, "page_table")[0],
             kv_layout)
    plan = KvAppendPlan.cached_for(
        facts, lambda: _descriptor(k_new, v_new, k_cache, page_table, kv_layout),
        device=operands.device_of(k_facts))
    plan.run(KvAppendArgs(k_new, v_new, k_cache, v_cache, seq_lens, page_table), stream=stream)


def _descriptor(k_new: Any, v_new: Any, k_cache: Any, page_table: Any, kv_layout: str
                ) -> KvAppendDescriptor:
    """The functional form's descriptor (built on a plan-cache miss only)."""
    k_view, v_view = wrap(k_new, "k_new"), wrap(v_new, "v_new")
    if k_view.ndim != 4:
        raise InvalidArgument(f"k_new must be 4-D [b, q_len, heads_kv, head_dim], got shape "
                              f"{k_view.shape}", argument="k_new")
    return KvAppendDescriptor(batch=k_view.shape[0], q_len=k_view.shape[1],
                              head_dim_v=v_view.shape[3], element=k_view.element,
                              **cache_fields(wrap(k_cache, "k_cache"), page_table, kv_layout))
