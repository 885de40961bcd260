"""Packed (varlen) attention as cuDNN ragged graphs: the THD layout, declared for a bucket.

cuDNN 9.19 has no cu_seqlens input (9.24) and no override shapes (9.21), so the graph's batch
and longest sequences are its dimensions: the descriptor's capacities (``batch``,
``max_seqlen_q``, ``max_seqlen_kv``; ``bucketed()`` rounds them to the ladder). The graphs keep
this form on newer cuDNNs too (``varlen.py`` says why). Every packed tensor [T, H, D] is
declared [B, H, S, D] with strides [S * ts, hs, ts, 1] (ts, hs its token and head strides) and a
ragged offset: per sequence, the element where it starts. The batch stride is nominal; the
offsets place the sequences. Tensors that share a side (q, out, grad_out, grad_q on the query
side; k, v, grad_k, grad_v on the key side) and a token stride share one offsets tensor, so a
compact problem has two and views into one packed QKV at most eight.

The padding mask reads each sequence's lengths (int32 [B, 1, 1, 1]). Softmax stats stay padded
[B, Hq, S_q, 1] f32 in the SKU's workspace (``varlen.py`` moves them to and from the contract's
lse [Hq, Tq]). Offsets, lengths and stats are all computed on the device for each run
(``native/varlen_ragged.cu``), so one graph serves any packing inside its bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ...contracts.varlen_attention import (
    VarlenAttentionBackwardDescriptor,
    VarlenAttentionDescriptor,
)
from .graphs import Uid, _Builder, mask_options

__all__ = ["KV_SIDE", "MAX_GROUPS", "OFFSETS_UID", "Q_SIDE", "RaggedKey", "RaggedLayout",
           "declare_ragged"]

VarlenProblem = VarlenAttentionDescriptor | VarlenAttentionBackwardDescriptor

Q_SIDE = ("q", "out", "grad_out", "grad_q")
KV_SIDE = ("k", "v", "grad_k", "grad_v")
MAX_GROUPS = len(Q_SIDE) + len(KV_SIDE)  # every tensor its own token stride
OFFSETS_UID = 32  # offsets tensor g has UID 32 + g, past every Uid
STATS_NAME = "stats_padded"


@dataclass(frozen=True)
class RaggedLayout:
    """(name, token stride, head stride) of each packed tensor a graph binds, in elements."""

    strides: tuple[tuple[str, int, int], ...]

    @classmethod
    def compact(cls, desc: VarlenProblem, names: tuple[str, ...]) -> RaggedLayout:
        """The layout of freshly allocated [T, H, D] tensors: what selection builds for."""
        def row(name: str) -> tuple[str, int, int]:
            heads = desc.heads_q if name in Q_SIDE else desc.heads_kv
            dim = desc.dim_v if name in ("v", "out", "grad_out", "grad_v") else desc.head_dim
            return name, heads * dim, dim

        return cls(tuple(row(name) for name in names))

    @classmethod
    def of(cls, views: dict, names: tuple[str, ...]) -> RaggedLayout:
        return cls(tuple((name, views[name].strides[0], views[name].strides[1])
                         for name in names))

    def groups(self) -> tuple[tuple[int, int], ...]:
        """The distinct (side, token stride) pairs, side 0 for queries and 1 for keys, in order
        of first use: one offsets tensor each."""
        seen: list[tuple[int, int]] = []
        for name, token, _ in self.strides:
            pair = (int(name in KV_SIDE), token)
            if pair not in seen:
                seen.append(pair)
        return tuple(seen)

    def group_of(self, name: str) -> int:
        for row_name, token, _ in self.strides:
            if row_name == name:
                return self.groups().index((int(name in KV_SIDE), token))
        raise KeyError(name)

    def of_tensor(self, name: str) -> tuple[int, int]:
        for row_name, token, head in self.strides:
            if row_name == name:
                return token, head
        raise KeyError(name)


class RaggedKey(NamedTuple):
    """What a ragged graph is built for: the bucket (the descriptor), the device, the
    deterministic backward or not, and the tensors' strides. ``square``: every call gives each
    sequence as many queries as keys, so the descriptor's diagonal is declared top-left (the
    same mask then; ``varlen.py`` says when and why)."""

    direction: str
    desc: VarlenProblem
    device: int
    variant: bool  # the backward: use_deterministic_algorithm
    layout: RaggedLayout
    square: bool = False

    def __str__(self) -> str:
        variant = " (deterministic)" if self.variant else ""
        square = ", declared top-left" if self.square else ""
        return (f"ragged {self.direction} graph{variant} on cuda:{self.device} for "
                f"{self.desc!r} with strides {self.layout.strides}{square}")

    def declare(self, handle: object) -> _Builder:
        return declare_ragged(self, handle)


def declare_ragged(key: RaggedKey, handle: object) -> _Builder:
    """The forward or backward ragged graph with its tensors declared, nothing built yet."""
    desc, layout = key.desc, key.layout
    b = _Builder(desc, handle)
    cudnn = b.cudnn
    batch, seq_q, seq_kv = desc.batch, desc.max_seqlen_q, desc.max_seqlen_kv
    offsets = [b.tensor(OFFSETS_UID + g, (batch + 1, 1, 1, 1), (1, 1, 1, 1),
                        cudnn.data_type.INT64, name=f"ragged_offsets_{g}")
               for g in range(len(layout.groups()))]

    def shape(name: str) -> tuple[int, int, int, int]:
        heads, seq = (desc.heads_q, seq_q) if name in Q_SIDE else (desc.heads_kv, seq_kv)
        dim = desc.dim_v if name in ("v", "out", "grad_out", "grad_v") else desc.head_dim
        return batch, heads, seq, dim

    def strides(name: str) -> tuple[int, int, int, int]:
        token, head = layout.of_tensor(name)
        return shape(name)[2] * token, head, token, 1

    def packed(uid: Uid, name: str):
        tensor = b.tensor(uid, shape(name), strides(name), name=name)
        tensor.set_ragged_offset(offsets[layout.group_of(name)])
        return tensor

    def packed_output(tensor, uid: Uid, name: str) -> None:
        b.output(tensor, uid, shape(name), strides(name), name=name)
        tensor.set_ragged_offset(offsets[layout.group_of(name)])

    stats_shape = (batch, desc.heads_q, seq_q, 1)
    stats_strides = (desc.heads_q * seq_q, seq_q, 1, 1)
    lengths = ((batch, 1, 1, 1), (1, 1, 1, 1), cudnn.data_type.INT32)
    options = {**mask_options(cudnn, desc, top_left=key.square), "use_padding_mask": True,
               "seq_len_q": b.tensor(Uid.SEQ_LEN_Q, *lengths),
               "seq_len_kv": b.tensor(Uid.SEQ_LEN_KV, *lengths)}
    q, k, v = packed(Uid.Q, "q"), packed(Uid.K, "k"), packed(Uid.V, "v")
    if key.direction == "forward":
        out, stats = b.graph.sdpa(q, k, v, name="sdpa", generate_stats=bool(desc.save_lse),
                                  **options)
        packed_output(out, Uid.O, "out")
        if desc.save_lse:
            b.output(stats, Uid.STATS, stats_shape, stats_strides, b.f32, name=STATS_NAME)
        return b
    out, d_out = packed(Uid.O, "out"), packed(Uid.DO, "grad_out")
    stats = b.tensor(Uid.STATS, stats_shape, stats_strides, b.f32, name=STATS_NAME)
    grads = b.graph.sdpa_backward(q, k, v, out, d_out, stats, name="sdpa_backward",
                                  use_deterministic_algorithm=bool(key.variant), **options)
    for tensor, uid, name in zip(grads, (Uid.DQ, Uid.DK, Uid.DV), ("grad_q", "grad_k", "grad_v"),
                                 strict=True):
        packed_output(tensor, uid, name)
    return b
