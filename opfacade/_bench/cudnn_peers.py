"""Raw cuDNN attention graphs built directly with the cudnn frontend: the "cudnn graph" and
"cudnn f32" peers of the varlen_attention benchmark.

Each graph is what a cuDNN user writes by hand for the same problem, with everything that can
be made ahead made ahead: the ragged (THD) graphs' element offsets and sequence lengths are
device tensors filled once, at the bucket (graph batch and max length) the caller names, so a
call is one ``graph.execute``. Nothing here is part of opfacade's ops; the bench measures our
plans against these.

A packed tensor [T, H, D] is described to cuDNN as [B, H, S_max, D] with strides
[S_max * token stride, head stride, token stride, 1] plus a ragged offset per sequence (its
first row, in elements); the batch stride is nominal, since the offset places each sequence.
Ragged graphs need the padding mask, whose lengths are 0 for the bucket's extra sequences. The
stats tensor stays padded [B, Hq, S_max, 1] f32 (whether it takes a ragged offset on cuDNN 9.19
is open: docs/VARLEN-CUDNN.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["RaggedLayout", "RaggedPeer", "RawCudnn", "RawGraph", "first_line"]


def first_line(error: BaseException) -> str:
    """The first line of an error's message (cuDNN's run to many), for a row's notes."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:160]


@dataclass
class RaggedLayout:
    """Where each sequence of a packed batch lies, at a graph's bucket: ``batch`` sequences of at
    most ``max_seqlen`` tokens (the bucket's extra ones empty), the element offsets of each
    sequence's first q/out row and first k/v row ([batch + 1, 1, 1, 1]), and the lengths
    ([batch, 1, 1, 1] int32) the padding mask reads."""

    batch: int
    max_seqlen: int
    offsets_q: Any
    offsets_kv: Any
    lengths: Any


@dataclass
class RawGraph:
    """One built graph and its variant pack, run as its users run it: ``graph.execute`` on a
    handle bound to torch's current stream (so a call captured in a CUDA graph launches on the
    capture stream). ``bind`` gives it a workspace first."""

    owner: RawCudnn
    graph: Any
    pack: dict
    workspace_size: int
    workspace: Any = None

    def bind(self, workspace: Any = None) -> RawGraph:
        """Uses ``workspace`` (a uint8 tensor of at least workspace_size bytes, which graphs that
        never run at once may share), or a new one."""
        torch = self.owner.torch
        if workspace is None:
            workspace = torch.empty(max(self.workspace_size, 1), dtype=torch.uint8, device="cuda")
        elif workspace.numel() < self.workspace_size:
            raise ValueError(f"the workspace must hold {self.workspace_size} bytes, got "
                             f"{workspace.numel()}")
        self.workspace = workspace
        return self

    def __call__(self) -> None:
        owner = self.owner
        owner.cudnn.set_stream(owner.handle, owner.torch.cuda.current_stream().cuda_stream)
        self.graph.execute(self.pack, self.workspace, handle=owner.handle)


class RawCudnn:
    """Builds the raw graphs: the cudnn frontend, imported on the first build (so a machine
    without it declines each cuDNN peer with the import's message), and one handle."""

    def __init__(self, torch):
        self.torch = torch
        self._cudnn = None
        self._handle = None

    @property
    def cudnn(self):
        if self._cudnn is None:
            import cudnn

            self._cudnn = cudnn
        return self._cudnn

    @property
    def handle(self):
        if self._handle is None:
            self._handle = self.cudnn.create_handle()
        return self._handle

    # -- layouts ---------------------------------------------------------------------------
    def ragged_layout(self, lengths: Sequence[int], batch: int, max_seqlen: int, q, k
                      ) -> RaggedLayout:
        """The layout of packed q [T, Hq, D] and k/v [T, Hkv, D] holding ``lengths`` (q and kv
        alike), at a bucket of ``batch`` sequences of at most ``max_seqlen`` tokens."""
        if len(lengths) > batch or max(lengths) > max_seqlen:
            raise ValueError(f"{len(lengths)} sequences of up to {max(lengths)} tokens do not fit "
                             f"a bucket of {batch} sequences of {max_seqlen}")
        torch = self.torch
        padded = [int(n) for n in lengths] + [0] * (batch - len(lengths))
        starts = [0]
        for n in padded:
            starts.append(starts[-1] + n)

        def offsets(token_stride: int):
            values = [start * token_stride for start in starts]
            # int32 holds the offsets of up to 2 Gi elements; cuDNN takes int64 too past that.
            dtype = torch.int32 if values[-1] < 2**31 else torch.int64
            return torch.tensor(values, dtype=dtype, device="cuda").view(-1, 1, 1, 1)

        lengths_tensor = torch.tensor(padded, dtype=torch.int32, device="cuda").view(-1, 1, 1, 1)
        return RaggedLayout(batch, max_seqlen, offsets(q.stride(0)), offsets(k.stride(0)),
                            lengths_tensor)

    # -- graphs ----------------------------------------------------------------------------
    def ragged_forward(self, layout: RaggedLayout, q, k, v, out, stats, causal: bool
                       ) -> RawGraph:
        """The ragged forward writing packed ``out`` and, unless ``stats`` is None (inference),
        the padded stats [B, Hq, S_max, 1] f32."""
        g = self._new_graph(q.dtype)
        ro_q, ro_kv = self._offsets(g, "ro_q", layout.offsets_q), self._offsets(g, "ro_kv",
                                                                                layout.offsets_kv)
        qt, kt, vt = (self._packed(g, name, t, layout, ro) for name, t, ro in
                      (("q", q, ro_q), ("k", k, ro_kv), ("v", v, ro_kv)))
        mask, pack = self._padding_mask(g, layout, causal)
        ot, st = g.sdpa(q=qt, k=kt, v=vt, name="sdpa", generate_stats=stats is not None,
                        attn_scale=1.0 / math.sqrt(q.shape[2]), **mask)
        self._packed_output(ot, out, layout, ro_q)
        pack.update({qt: q, kt: k, vt: v, ot: out, ro_q: layout.offsets_q,
                     ro_kv: layout.offsets_kv})
        if stats is not None:
            st.set_output(True).set_dim(list(stats.shape)).set_stride(list(stats.stride()))
            st.set_data_type(self.cudnn.data_type.FLOAT)
            pack[st] = stats
        return self._built(g, pack)

    def ragged_backward(self, layout: RaggedLayout, q, k, v, out, d_out, stats, dq, dk, dv,
                        causal: bool, deterministic: bool) -> RawGraph:
        """The ragged backward from a ragged forward's out and padded stats; cuDNN's default
        algorithm, or its deterministic one."""
        g = self._new_graph(q.dtype)
        ro_q, ro_kv = self._offsets(g, "ro_q", layout.offsets_q), self._offsets(g, "ro_kv",
                                                                                layout.offsets_kv)
        inputs = (("q", q, ro_q), ("k", k, ro_kv), ("v", v, ro_kv), ("o", out, ro_q),
                  ("do", d_out, ro_q))
        qt, kt, vt, ot, dot = (self._packed(g, name, t, layout, ro) for name, t, ro in inputs)
        st = g.tensor(name="stats", dim=list(stats.shape), stride=list(stats.stride()),
                      data_type=self.cudnn.data_type.FLOAT)
        mask, pack = self._padding_mask(g, layout, causal)
        dqt, dkt, dvt = g.sdpa_backward(q=qt, k=kt, v=vt, o=ot, dO=dot, stats=st,
                                        name="sdpa_backward",
                                        attn_scale=1.0 / math.sqrt(q.shape[2]),
                                        use_deterministic_algorithm=deterministic, **mask)
        for tensor, data, ro in ((dqt, dq, ro_q), (dkt, dk, ro_kv), (dvt, dv, ro_kv)):
            self._packed_output(tensor, data, layout, ro)
        pack.update({qt: q, kt: k, vt: v, ot: out, dot: d_out, st: stats, dqt: dq, dkt: dk,
                     dvt: dv, ro_q: layout.offsets_q, ro_kv: layout.offsets_kv})
        return self._built(g, pack)

    def dense_forward(self, q, k, v, out, causal: bool) -> RawGraph:
        """The inference forward of dense [B, H, S, D] tensors (top-left causal when asked), in
        their own element type: cuDNN's f32 forward for f32 tensors."""
        g = self._new_graph(q.dtype)
        qt, kt, vt = g.tensor_like(q), g.tensor_like(k), g.tensor_like(v)
        mask = {}
        if causal:
            mask = {"diagonal_alignment": self.cudnn.diagonal_alignment.TOP_LEFT,
                    "diagonal_band_right_bound": 0}
        ot, _ = g.sdpa(q=qt, k=kt, v=vt, name="sdpa", generate_stats=False,
                       attn_scale=1.0 / math.sqrt(q.shape[3]), **mask)
        ot.set_output(True).set_dim(list(out.shape)).set_stride(list(out.stride()))
        return self._built(g, {qt: q, kt: k, vt: v, ot: out})

    # -- pieces ----------------------------------------------------------------------------
    def _data_type(self, dtype):
        torch, types = self.torch, self.cudnn.data_type
        known = {torch.bfloat16: types.BFLOAT16, torch.float16: types.HALF,
                 torch.float32: types.FLOAT, torch.int32: types.INT32, torch.int64: types.INT64}
        return known[dtype]

    def _new_graph(self, dtype):
        f32 = self.cudnn.data_type.FLOAT
        return self.cudnn.pygraph(io_data_type=self._data_type(dtype), intermediate_data_type=f32,
                                  compute_data_type=f32, handle=self.handle)

    def _offsets(self, g, name: str, values):
        return g.tensor(name=name, dim=list(values.shape), stride=[1, 1, 1, 1],
                        data_type=self._data_type(values.dtype))

    def _packed(self, g, name: str, data, layout: RaggedLayout, ragged_offset):
        tensor = g.tensor(name=name, dim=self._packed_dim(data, layout),
                          stride=self._packed_stride(data, layout),
                          data_type=self._data_type(data.dtype))
        tensor.set_ragged_offset(ragged_offset)
        return tensor

    def _packed_output(self, tensor, data, layout: RaggedLayout, ragged_offset) -> None:
        tensor.set_output(True).set_dim(self._packed_dim(data, layout)).set_stride(
            self._packed_stride(data, layout))
        tensor.set_ragged_offset(ragged_offset)

    @staticmethod
    def _packed_dim(data, layout: RaggedLayout) -> list[int]:
        return [layout.batch, data.shape[1], layout.max_seqlen, data.shape[2]]

    @staticmethod
    def _packed_stride(data, layout: RaggedLayout) -> list[int]:
        tokens, heads, dims = data.stride()
        return [layout.max_seqlen * tokens, heads, tokens, dims]

    def _padding_mask(self, g, layout: RaggedLayout, causal: bool) -> tuple[dict, dict]:
        """The sdpa options of the padding mask (and the causal mask) with the pack entries of
        its lengths. The bench's sequences have as many queries as keys, so the causal mask is
        aligned top-left, as a cuDNN user writing self-attention by hand would: the same mask as
        bottom-right there, and cuDNN 9.19's top-left backward is the faster one (15.2 against
        28.2 ms on the bf16 set, scripts/varlen_backward_probe.py). Our plans take the same
        graph when handed one cu_seqlens buffer for both sides (cudnn/varlen.py)."""
        int32 = self.cudnn.data_type.INT32
        seq_q, seq_kv = (g.tensor(name=name, dim=list(layout.lengths.shape), stride=[1, 1, 1, 1],
                                  data_type=int32) for name in ("seq_len_q", "seq_len_kv"))
        options = {"use_padding_mask": True, "seq_len_q": seq_q, "seq_len_kv": seq_kv}
        if causal:
            options.update(diagonal_alignment=self.cudnn.diagonal_alignment.TOP_LEFT,
                           diagonal_band_right_bound=0)
        return options, {seq_q: layout.lengths, seq_kv: layout.lengths}

    def _built(self, g, pack: dict) -> RawGraph:
        """The frontend's fixed build order; raises what cuDNN raises when it declines."""
        heuristics = self.cudnn.heur_mode
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([heuristics.A, heuristics.FALLBACK])
        g.check_support()
        g.build_plans()
        return RawGraph(self, g, pack, int(g.get_workspace_size()))


class RaggedPeer:
    """The raw ragged graphs of one packed problem at one bucket, on outputs of their own: the
    forward writes out and the padded stats, from which each backward graph starts."""

    def __init__(self, raw: RawCudnn, layout: RaggedLayout, q, k, v, causal: bool):
        torch = raw.torch
        self.raw, self.layout, self.q, self.k, self.v, self.causal = raw, layout, q, k, v, causal
        self.out = torch.empty_like(q)
        self.stats = torch.empty((layout.batch, q.shape[1], layout.max_seqlen, 1),
                                 dtype=torch.float32, device="cuda")

    def forward(self, save_stats: bool = True) -> RawGraph:
        """The forward graph (with its own workspace), run once so that out and stats hold its
        results; ``save_stats=False`` is the inference forward."""
        graph = self.raw.ragged_forward(self.layout, self.q, self.k, self.v, self.out,
                                        self.stats if save_stats else None, self.causal).bind()
        graph()
        return graph

    def backward(self, d_out, deterministic: bool = False) -> RawGraph:
        """The backward graph from the forward's out and stats (a training forward must have
        run), writing gradients of its own; bind it to a workspace before calling it."""
        torch = self.raw.torch
        grads = [torch.empty_like(t) for t in (self.q, self.k, self.v)]
        return self.raw.ragged_backward(self.layout, self.q, self.k, self.v, self.out, d_out,
                                        self.stats, *grads, self.causal, deterministic)
