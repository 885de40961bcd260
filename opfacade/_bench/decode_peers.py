"""The peers of the decode_attention benchmark (``decode_attention.py``), each built by a function
that runs its call once, so that a peer that fails is left out of its row with why in the notes:

- "torch sdpa": ``torch.nn.functional.scaled_dot_product_attention`` of one query per sequence
  over the contiguous cache padded to the batch's longest sequence, k and v read in place as
  [b, Hkv, S, D] views; a varied-length batch passes a boolean key mask, so the padding is read
  and masked (which is what that comparison shows).
- "cudnn paged": cuDNN's paged-cache SDPA graph, built directly with the cudnn frontend
  (``paged_graph``), on the same page pools and page tables as ours.

Both read finite caches: a masked key still multiplies its value by a zero weight, and 0 * NaN
is NaN, so the NaN padding our rows carry would poison their outputs (not their times).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .cudnn_peers import RawCudnn, RawGraph, first_line

__all__ = ["PagedDims", "Peer", "build_peers", "cudnn_paged", "describe_paged", "new_token_mask",
           "stats_option", "torch_sdpa"]


@dataclass
class Peer:
    """A peer's call, the output its first call wrote as [b, q_len, Hq, D], and a note."""

    call: Callable[[], object]
    out: Any
    note: str = ""


def build_peers(builders: dict[str, Callable[[], Peer]], notes: list[str]) -> dict[str, Peer]:
    """Each peer its builder makes; one that raises is left out with ``"<name>: <first line of
    the error>"`` in ``notes`` (whatever its library raises, the row goes on without it)."""
    peers = {}
    for name, build in builders.items():
        try:
            peers[name] = build()
        except Exception as error:  # a failing peer is a note, never a crash
            notes.append(f"{name}: {first_line(error)}")
            continue
        if peers[name].note:
            notes.append(peers[name].note)
    return peers


# ----------------------------------------------------------------------------- torch


def new_token_mask(torch, seq_lens, q_len: int, longest: int):
    """The keys each new token sees, as torch SDPA's boolean mask [b, 1, q_len, longest]: token
    t of a sequence of length n sits at n - q_len + t and sees the keys up to it (the decode
    contract's causal rule among new tokens; torch's ``is_causal`` aligns top-left instead)."""
    positions = torch.arange(longest, device=seq_lens.device)
    last = seq_lens[:, None].long() - q_len + torch.arange(q_len, device=seq_lens.device)
    return (positions[None, None, :] <= last[:, :, None]).unsqueeze(1)


def torch_sdpa(torch, q, k_cache, v_cache, lengths: list[int], seq_lens) -> Peer:
    """torch's SDPA for q [b, q_len, Hq, D] over contiguous nhd caches [B, capacity, Hkv, D], up
    to the longest of ``lengths``; with unequal lengths or several new tokens a boolean mask
    from the device ``seq_lens`` (``new_token_mask``, made ahead of the timed calls). GQA
    through ``enable_gqa``; a torch without it, or no kernel taking it with this mask, gets the
    kv heads expanded to Hq ahead of the timed calls, and the note says so."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    b, q_len, longest = q.shape[0], q.shape[1], max(lengths)
    qh = q.transpose(1, 2)  # [b, Hq, q_len, D]
    kh, vh = (cache[:b, :longest].transpose(1, 2) for cache in (k_cache, v_cache))
    mask = None
    if min(lengths) < longest or q_len > 1:
        mask = new_token_mask(torch, seq_lens, q_len, longest)
    groups = q.shape[2] // k_cache.shape[2]
    options, note = ({"enable_gqa": True} if groups > 1 else {}), ""
    try:
        out = sdpa(qh, kh, vh, attn_mask=mask, **options)
    except (TypeError, RuntimeError):  # no enable_gqa, or no kernel for GQA with this mask
        if not options:
            raise
        kh, vh = (x.repeat_interleave(groups, dim=1) for x in (kh, vh))
        options, note = {}, "torch sdpa: k and v heads expanded to Hq ahead of the timed calls"
        out = sdpa(qh, kh, vh, attn_mask=mask)
    return Peer(lambda: sdpa(qh, kh, vh, attn_mask=mask, **options), out.transpose(1, 2), note)


# ----------------------------------------------------------------------------- cuDNN


def stats_option(sdpa: Callable) -> dict:
    """How this frontend's ``graph.sdpa`` is told not to write the softmax stats, read off its
    signature without calling it: ``generate_stats=False`` where it names generate_stats, or
    takes any keyword (frontend 1.32's generic builder, whose C++ call wants exactly one of
    generate_stats and the deprecated is_inference); ``is_inference=True`` where it names only
    that (frontends older than generate_stats). A compiled method without a signature is read
    from its docstring."""
    try:
        params = inspect.signature(sdpa).parameters
    except (TypeError, ValueError):
        doc = getattr(sdpa, "__doc__", None) or ""
        return {"generate_stats": False} if "generate_stats" in doc else {"is_inference": True}
    if "generate_stats" in params:
        return {"generate_stats": False}
    if "is_inference" in params:
        return {"is_inference": True}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return {"generate_stats": False}
    return {"is_inference": True}


@dataclass(frozen=True)
class PagedDims:
    """One paged decode problem as cuDNN is told it: ``batch`` sequences of one query each,
    nhd page pools of ``pages`` pages [page_size, Hkv, D], page tables [batch, max_pages]."""

    batch: int
    heads_q: int
    heads_kv: int
    head_dim: int
    pages: int
    page_size: int
    max_pages: int

    @property
    def capacity(self) -> int:
        return self.page_size * self.max_pages

    def q(self) -> tuple[list[int], list[int]]:
        """q and out [b, 1, Hq, D] as [B, Hq, 1, D]."""
        hq, d = self.heads_q, self.head_dim
        return [self.batch, hq, 1, d], [hq * d, d, hq * d, 1]

    def pool(self) -> tuple[list[int], list[int]]:
        """An nhd pool [P, page_size, Hkv, D] as cuDNN's container [P, Hkv, page_size, D]."""
        ps, h, d = self.page_size, self.heads_kv, self.head_dim
        return [self.pages, h, ps, d], [ps * h * d, d, h * d, 1]

    def table(self) -> tuple[list[int], list[int]]:
        """A page table [b, max_pages] as [B, 1, max_pages, 1]."""
        n = self.max_pages
        return [self.batch, 1, n, 1], [n, n, 1, 1]

    def lengths(self) -> tuple[list[int], list[int]]:
        return [self.batch, 1, 1, 1], [1, 1, 1, 1]


def describe_paged(g, cudnn, dims: PagedDims) -> dict[str, Any]:
    """Adds the paged decode SDPA to graph ``g`` (bf16 in and out): padding mask from per-batch
    q and kv lengths, no causal mask (cuDNN's release notes: decode with a causal mask and
    Hq != Hkv is wrong; one query per sequence needs none), no stats. Returns the graph's
    tensors by role: q, k, v, table_k, table_v, seq_q, seq_kv, out."""
    types = cudnn.data_type

    def tensor(name: str, shape: tuple[list[int], list[int]], data_type):
        return g.tensor(name=name, dim=shape[0], stride=shape[1], data_type=data_type)

    t = {"q": tensor("q", dims.q(), types.BFLOAT16),
         "k": tensor("k_pool", dims.pool(), types.BFLOAT16),
         "v": tensor("v_pool", dims.pool(), types.BFLOAT16),
         "table_k": tensor("page_table_k", dims.table(), types.INT32),
         "table_v": tensor("page_table_v", dims.table(), types.INT32),
         "seq_q": tensor("seq_len_q", dims.lengths(), types.INT32),
         "seq_kv": tensor("seq_len_kv", dims.lengths(), types.INT32)}
    out, _ = g.sdpa(q=t["q"], k=t["k"], v=t["v"], name="paged_decode",
                    attn_scale=1.0 / math.sqrt(dims.head_dim), use_padding_mask=True,
                    seq_len_q=t["seq_q"], seq_len_kv=t["seq_kv"],
                    paged_attention_k_table=t["table_k"], paged_attention_v_table=t["table_v"],
                    paged_attention_max_seq_len_kv=dims.capacity, **stats_option(g.sdpa))
    q_dim, q_stride = dims.q()
    out.set_output(True).set_dim(q_dim).set_stride(q_stride).set_data_type(types.BFLOAT16)
    t["out"] = out
    return t


def cudnn_paged(raw: RawCudnn, q, k_pool, v_pool, table, seq_lens) -> Peer:
    """cuDNN's paged decode graph over nhd pools [P, page_size, Hkv, D] and a page table
    [b, max_pages], q [b, 1, Hq, D] bf16, seq_lens int32 [b]; its own output; run once.
    Raises what cuDNN raises where it declines."""
    torch = raw.torch
    b, _, hq, d = q.shape
    pages, page_size, hkv, _ = k_pool.shape
    dims = PagedDims(b, hq, hkv, d, pages, page_size, table.shape[1])
    out = torch.empty_like(q)
    g = raw._new_graph(q.dtype)  # cudnn_peers' graph settings: f32 intermediates and compute
    t = describe_paged(g, raw.cudnn, dims)
    ones = torch.ones(b, dtype=torch.int32, device=q.device)
    pack = {t["q"]: q.transpose(1, 2), t["k"]: k_pool.transpose(1, 2),
            t["v"]: v_pool.transpose(1, 2), t["table_k"]: table.view(*dims.table()[0]),
            t["table_v"]: table.view(*dims.table()[0]), t["seq_q"]: ones.view(b, 1, 1, 1),
            t["seq_kv"]: seq_lens.view(b, 1, 1, 1), t["out"]: out.transpose(1, 2)}
    graph: RawGraph = raw._built(g, pack).bind()  # the frontend's fixed build order
    graph()
    return Peer(graph, out, f"cudnn paged workspace {graph.workspace_size} B")
