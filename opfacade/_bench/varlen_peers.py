"""The contestants of the varlen_attention benchmark (``varlen_attention.py``): the packed
problem every contestant runs on, and the peers the issue names, each built by a function that
runs its calls once, so that a peer that fails is left out of its row with why in the notes.

- "torch sdpa loop" / "torch sdpa f32": torch's scaled_dot_product_attention per sequence (or
  dense), held to a backend where asked, its backward through autograd (``sdpa_peer``);
- "torch varlen_attn": ``torch.nn.attention.varlen.varlen_attn`` (``torch_varlen``);
- "cudnn graph" / "cudnn f32": the raw cuDNN graphs of ``cudnn_peers.py``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import graph_timing
from .cudnn_peers import RaggedPeer, RawCudnn, first_line

__all__ = ["Contestant", "Packed", "VarlenSet", "cudnn_dense", "cudnn_ragged", "gather", "packed",
           "ragged_peer", "sdpa_peer", "torch_varlen"]


@dataclass(frozen=True)
class VarlenSet:
    """A packed batch to bench: ``count`` sequences with lengths drawn uniformly from [low,
    high] (both ends included) by ``numpy.random.default_rng(seed)``, q and kv alike."""

    count: int
    low: int
    high: int
    heads_q: int
    heads_kv: int
    head_dim: int
    seed: int

    def lengths(self) -> list[int]:
        rng = np.random.default_rng(self.seed)
        return [int(n) for n in rng.integers(self.low, self.high, size=self.count,
                                             endpoint=True)]


@dataclass
class Contestant:
    """One contestant's calls on a problem: the forward, the backward from its own saved forward
    (None: forward only), a maker of the backward for a capture stream where autograd must run
    it on its forward's stream (``common.Contest``), and what each row should say about it."""

    forward: Callable[[], object]
    backward: Callable[[], object] | None = None
    backward_on: graph_timing.Maker | None = None
    forward_note: str = ""
    backward_note: str = ""


# ----------------------------------------------------------------------------- problems


@dataclass
class Packed:
    """A packed problem: q [T, Hq, D], k and v [T, Hkv, D], grad_out like q, cu_seqlens int32."""

    spec: VarlenSet
    lengths: list[int]
    q: object
    k: object
    v: object
    d_out: object
    cu: object

    @property
    def longest(self) -> int:
        return max(self.lengths)

    @property
    def bounds(self) -> list[tuple[int, int]]:
        ends = np.cumsum(self.lengths).tolist()
        return list(zip([0, *ends[:-1]], ends, strict=True))

    def sequences(self) -> list[list]:
        """q, k, v and grad_out as lists of [1, H, n, D] views, one a sequence (no copies)."""
        return [[x[start:end].transpose(0, 1).unsqueeze(0) for start, end in self.bounds]
                for x in (self.q, self.k, self.v, self.d_out)]

    def fields(self, element: str) -> dict:
        s = self.spec
        return dict(batch=len(self.lengths), heads_q=s.heads_q, heads_kv=s.heads_kv,
                    head_dim=s.head_dim, max_seqlen_q=self.longest, max_seqlen_kv=self.longest,
                    element=element, causal="bottom_right")

    def case(self, element: str) -> str:
        s = self.spec
        return (f"{element} varlen d{s.head_dim} H{s.heads_q}/{s.heads_kv} {s.count} seqs "
                f"{s.low}-{s.high} causal")

    def about(self, bucket) -> str:
        return (f"{sum(self.lengths)} tokens, lengths of seed {self.spec.seed}, bucket "
                f"B{bucket.batch} S{bucket.max_seqlen_q}")


def packed(torch, spec: VarlenSet, dtype) -> Packed:
    """Random inputs in [-1, 1) for ``spec``'s lengths, in ``dtype``."""
    lengths = spec.lengths()
    tokens = sum(lengths)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def uniform(heads: int):
        shape = (tokens, heads, spec.head_dim)
        return torch.rand(shape, device="cuda", dtype=dtype, generator=gen) * 2 - 1

    q, k, v = uniform(spec.heads_q), uniform(spec.heads_kv), uniform(spec.heads_kv)
    d_out = uniform(spec.heads_q)
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32, device="cuda")
    return Packed(spec, lengths, q, k, v, d_out, cu)


# ----------------------------------------------------------------------------- peers


def gather(builders: dict[str, Callable[[], Contestant]], notes: list[str]
            ) -> dict[str, Contestant]:
    """Each peer its builder makes; a builder runs its calls once, so a peer that fails, fails
    here, and is left out with why in ``notes``."""
    peers = {}
    for name, build in builders.items():
        try:
            peers[name] = build()
        except Exception as error:  # whatever a peer's library raises, the row goes on without it
            notes.append(f"{name}: declined: {first_line(error)}")
    return peers


def sdpa_peer(torch, qs: list, ks: list, vs: list, d_outs: list, causal: bool, backend=None,
               name: str = "") -> Contestant:
    """torch's scaled_dot_product_attention on each (q, k, v) of the lists in turn ([B, H, S, D]
    each: one dense problem, or one sequence of a packed batch), held to ``backend`` where one
    is given; its backward through autograd over every output at once. With fewer kv heads than
    query heads it asks for GQA; a backend without GQA gets k and v heads expanded ahead of the
    timed calls, and the notes say so."""
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def loop(qs, ks, vs, options):
        with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
            return [sdpa(q, k, v, is_causal=causal, **options)
                    for q, k, v in zip(qs, ks, vs, strict=True)]

    groups = qs[0].shape[1] // ks[0].shape[1]
    options, note = ({"enable_gqa": True} if groups > 1 else {}), ""
    try:
        with torch.no_grad():
            loop(qs, ks, vs, options)
    except RuntimeError:  # no kernel of this backend takes GQA: expand the heads, as users do
        if not options:
            raise
        ks, vs = ([x.repeat_interleave(groups, dim=1) for x in xs] for xs in (ks, vs))
        options, note = {}, f"{name}: k and v heads expanded to Hq ahead of the timed calls"
        with torch.no_grad():
            loop(qs, ks, vs, options)

    def forward() -> None:
        with torch.no_grad():
            loop(qs, ks, vs, options)

    def backward_on(stream):
        # Autograd runs the backward on the forward's stream: a captured backward needs its
        # forward made on the capture stream.
        leaves = [x.detach().requires_grad_() for x in (*qs, *ks, *vs)]
        n = len(qs)
        with torch.cuda.stream(stream):
            outs = loop(leaves[:n], leaves[n:2 * n], leaves[2 * n:], options)
        return lambda: torch.autograd.grad(outs, leaves, d_outs, retain_graph=True)

    backward = backward_on(torch.cuda.current_stream())
    backward()
    return Contestant(forward, backward, backward_on, note, note)


def _varlen_attn_options(varlen_attn, p: Packed) -> dict:
    """Causal and GQA in the words of this torch's varlen_attn: ``is_causal`` (torch 2.9), or
    the window (-1, 0) of later releases; ``enable_gqa`` where its signature has it (older
    ones take fewer kv heads as they come)."""
    params = inspect.signature(varlen_attn).parameters
    if "is_causal" in params:
        options = {"is_causal": True}
    elif "window_size" in params:
        options = {"window_size": (-1, 0)}
    else:
        raise TypeError(f"varlen_attn{inspect.signature(varlen_attn)} takes neither is_causal "
                        "nor window_size")
    if "enable_gqa" in params and p.spec.heads_q != p.spec.heads_kv:
        options["enable_gqa"] = True
    return options


def torch_varlen(torch, p: Packed) -> Contestant:
    """torch.nn.attention.varlen.varlen_attn on the packed tensors, its backward through
    autograd; k and v heads expanded ahead of the timed calls where it refuses GQA. Raises
    ImportError where this torch has no varlen_attn."""
    from torch.nn.attention.varlen import varlen_attn

    options = _varlen_attn_options(varlen_attn, p)
    groups = p.spec.heads_q // p.spec.heads_kv

    def call(q, k, v):
        return varlen_attn(q, k, v, p.cu, p.cu, p.longest, p.longest, **options)

    k, v, note = p.k, p.v, ""
    try:
        call(p.q, k, v)
    except RuntimeError:
        if groups == 1:
            raise
        k, v = (x.repeat_interleave(groups, dim=1) for x in (p.k, p.v))
        note = "torch varlen_attn: k and v heads expanded to Hq ahead of the timed calls"
        call(p.q, k, v)

    def backward_on(stream):
        leaves = [x.detach().requires_grad_() for x in (p.q, k, v)]
        with torch.cuda.stream(stream):
            out = call(*leaves)
        return lambda: torch.autograd.grad(out, leaves, p.d_out, retain_graph=True)

    backward = backward_on(torch.cuda.current_stream())
    backward()
    return Contestant(lambda: call(p.q, k, v), backward, backward_on, note, note)


def ragged_peer(raw: RawCudnn, p: Packed, bucket) -> RaggedPeer:
    layout = raw.ragged_layout(p.lengths, bucket.batch, bucket.max_seqlen_q, p.q, p.k)
    return RaggedPeer(raw, layout, p.q, p.k, p.v, causal=True)


def cudnn_ragged(raw: RawCudnn, p: Packed, bucket, training: bool, name: str) -> Contestant:
    """The raw ragged graphs at ``bucket``: the training forward and the default backward, or
    (``training=False``) the inference forward alone."""
    peer = ragged_peer(raw, p, bucket)
    forward = peer.forward(save_stats=training)
    forward_note = f"{name} workspace {forward.workspace_size} B"
    if not training:
        return Contestant(forward, forward_note=forward_note)
    backward = peer.backward(p.d_out).bind()
    backward()
    return Contestant(forward, backward, forward_note=forward_note,
                      backward_note=f"{name} workspace {backward.workspace_size} B")


def cudnn_dense(raw: RawCudnn, q, k, v, causal: bool) -> Contestant:
    graph = raw.dense_forward(q, k, v, raw.torch.empty_like(q), causal).bind()
    graph()
    return Contestant(graph, forward_note=f"cudnn f32 workspace {graph.workspace_size} B")
