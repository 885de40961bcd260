"""The varlen_attention family's contract: attention over packed (variable-length) sequences,
forward and backward, in the convention of FlashAttention's ``flash_attn_varlen_func``.

    q [Tq, Hq, D], k [Tkv, Hkv, D], v [Tkv, Hkv, Dv], out [Tq, Hq, Dv]      (packed tokens)
    cu_seqlens_q, cu_seqlens_kv: int32 [b + 1] device offsets, 1 <= b <= desc.batch
    lse [Hq, Tq]: the natural-log log-sum-exp of each query row's scores, f32 (f64 for an f64
        problem), contiguous: what the backward reads (FlashAttention's varlen layout)

Sequence ``s`` attends q rows ``cu_q[s]:cu_q[s + 1]`` over k and v rows ``cu_kv[s]:cu_kv[s + 1]``,
on its own: masks (``attention_masks``) are aligned per sequence (bottom-right uses its own
``len_kv - len_q``, which is chunked prefill when q is shorter than kv). Query head ``h`` reads
kv head ``h // (Hq // Hkv)`` (GQA/MQA).

The descriptor states capacities, not one call's lengths: ``batch`` sequences at most, none
longer than ``max_seqlen_q`` / ``max_seqlen_kv``. A plan runs any call within them (the token
counts Tq and Tkv are the tensors' own), so CUDA graphs and training loops with changing
packings reuse one plan. ``bucketed()`` rounds a problem up to the documented ladder.

Checked mode (``checked=True``) tests the offsets on the device before each run: they must
start at 0, never decrease, keep every sequence within max_seqlen and end within the tensors'
tokens; a violation is InvalidArgument naming the argument and its first bad index. Unchecked
runs read nothing back (no host sync); garbage offsets then give garbage values, but never an
access outside the tensors.

Edges: zero-length and single-token sequences are legal. A query row with no allowed key
(``len_kv == 0``, or masked out entirely) gets out 0 and lse -inf, and passes no gradient; never
NaN. Tokens past ``cu_seqlens[-1]`` belong to no sequence: runs leave their out, lse and
gradient rows as they were. q, k, v, out and the gradients may be strided along tokens and heads
(views into one packed QKV projection run without copies); D has unit stride.

    desc = VarlenAttentionDescriptor(batch=8, heads_q=32, heads_kv=8, head_dim=128,
                                     max_seqlen_q=4096, max_seqlen_kv=4096, element="f32",
                                     causal="bottom_right", save_lse=True)
    plan = VarlenAttentionForwardPlan.select(desc)
    plan.run(VarlenAttentionArgs(q, k, v, cu_q, cu_kv, out, lse), stream=s)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from .._internal.contract import BoundArgs, OpContract, TensorSpec
from .._internal.tensors import (
    TensorView,
    argument_when,
    expect,
    expect_args_type,
    expect_no_overlaps,
    wrap,
)
from ..errors import InvalidArgument, InvalidProblem, ShapeMismatch
from ..types import ElementKind, OpCategory
from .attention_masks import (
    ELEMENTS,
    MAX_EXTENT,
    Alignment,
    AttentionMask,
    SlidingWindow,
    large_backward_scales,
    large_forward_scales,
)

__all__ = [
    "ELEMENTS",
    "OPS",
    "SEQLEN_LADDER_MIN",
    "VARLEN_ATTENTION_BACKWARD",
    "VARLEN_ATTENTION_FORWARD",
    "VarlenAttentionArgs",
    "VarlenAttentionBackwardArgs",
    "VarlenAttentionBackwardDescriptor",
    "VarlenAttentionDescriptor",
    "check_offsets",
    "offsets_problem",
    "reference_options",
    "verification_lengths",
]

# The bucket ladder (``bucketed``): batch and max lengths round up to a power of two, lengths to
# at least this. An H100 probe of cuDNN's ragged graphs (issue 12): a 16k max-length bucket for
# ~8.2k actual tokens cost nothing measurable; doubling the batch bucket cost 7%.
SEQLEN_LADDER_MIN = 128


class _VarlenProblem(AttentionMask):
    """What forward and backward share; AttentionMask states the mask fields' rules."""

    batch: int = Field(ge=1, lt=MAX_EXTENT)
    heads_q: int = Field(ge=1, lt=MAX_EXTENT)
    heads_kv: int = Field(ge=1, lt=MAX_EXTENT)
    head_dim: int = Field(ge=1, lt=MAX_EXTENT)
    head_dim_v: int | None = Field(default=None, ge=1, lt=MAX_EXTENT)
    max_seqlen_q: int = Field(ge=1, lt=MAX_EXTENT)
    max_seqlen_kv: int = Field(ge=1, lt=MAX_EXTENT)
    element: ElementKind
    scale: float | None = None
    causal: Alignment | None = None
    window: SlidingWindow | None = None
    # Checked mode: each run first tests the offsets on the device and raises InvalidArgument
    # naming the argument and its first bad index. It waits for the stream to read the verdict,
    # so a checked run synchronises the host and cannot be captured; off, nothing is read back.
    checked: bool = False

    @property
    def lse_element(self) -> ElementKind:
        return self.element.accumulator

    @property
    def max_tokens_q(self) -> int:
        """The most query tokens a call can hold: every sequence at its longest."""
        return self.batch * self.max_seqlen_q

    @property
    def max_tokens_kv(self) -> int:
        return self.batch * self.max_seqlen_kv

    def bucketed(self):
        """This problem on the bucket ladder: batch and both max lengths rounded up to a power
        of two (lengths at least SEQLEN_LADDER_MIN), so nearby packings share one plan."""
        def up(n: int, least: int = 1) -> int:
            return max(least, 1 << (n - 1).bit_length())

        return self.model_copy(update={
            "batch": up(self.batch), "max_seqlen_q": up(self.max_seqlen_q, SEQLEN_LADDER_MIN),
            "max_seqlen_kv": up(self.max_seqlen_kv, SEQLEN_LADDER_MIN)})


class VarlenAttentionDescriptor(_VarlenProblem):
    """One packed attention forward; ``save_lse`` writes the log-sum-exp the backward reads."""

    save_lse: bool = False


class VarlenAttentionBackwardDescriptor(_VarlenProblem):
    """Its backward: grad_q, grad_k, grad_v from q, k, v, out, grad_out and lse. Determinism is a
    preference (``PlanPreference(deterministic=True)``), not part of the problem."""


@dataclass
class VarlenAttentionArgs:
    """q [Tq,Hq,D], k [Tkv,Hkv,D], v [Tkv,Hkv,Dv], cu_seqlens_q/cu_seqlens_kv int32 [b+1],
    out [Tq,Hq,Dv]; lse [Hq,Tq] f32 when save_lse."""

    q: Any
    k: Any
    v: Any
    cu_seqlens_q: Any
    cu_seqlens_kv: Any
    out: Any
    lse: Any = None


@dataclass
class VarlenAttentionBackwardArgs:
    """The forward's q, k, v, cu_seqlens, out and lse, grad_out like out; grad_q, grad_k and
    grad_v are written (shaped like q, k, v)."""

    q: Any
    k: Any
    v: Any
    out: Any
    grad_out: Any
    lse: Any
    cu_seqlens_q: Any
    cu_seqlens_kv: Any
    grad_q: Any
    grad_k: Any
    grad_v: Any


# ----------------------------------------------------------------------------- binding


def _packed(obj: Any, name: str, heads: int, dim: int, element: ElementKind,
            tokens: int | None = None, like: str | None = None) -> TensorView:
    """A [T, heads, dim] tensor, any token and head strides, unit stride along dim."""
    if obj is None:
        raise InvalidArgument(f"{name} is required", argument=name)
    view = wrap(obj, name)
    if view.ndim != 3:
        raise ShapeMismatch(f"{name} must be 3-D [tokens, {heads}, {dim}], got shape "
                            f"{view.shape}", argument=name)
    shape = (view.shape[0] if tokens is None else tokens, heads, dim)
    expect(view, name, shape=shape, element=element, like=like)
    return view


def _offsets(obj: Any, name: str, batch: int, entries: int | None = None) -> TensorView:
    if obj is None:
        raise InvalidArgument(f"{name} is required", argument=name)
    view = wrap(obj, name)
    if view.ndim != 1 or not 2 <= view.shape[0] <= batch + 1:
        raise ShapeMismatch(f"{name} must be 1-D with 2 to batch + 1 = {batch + 1} offsets, got "
                            f"shape {view.shape}", argument=name)
    expect(view, name, shape=(view.shape[0] if entries is None else entries,),
           element=ElementKind.i32)
    return view


def _common(desc: _VarlenProblem, args) -> dict[str, TensorView]:
    q = _packed(args.q, "q", desc.heads_q, desc.head_dim, desc.element)
    k = _packed(args.k, "k", desc.heads_kv, desc.head_dim, desc.element)
    v = _packed(args.v, "v", desc.heads_kv, desc.dim_v, desc.element, tokens=k.shape[0],
                like="k")
    for view, name, most in ((q, "q", desc.max_tokens_q), (k, "k", desc.max_tokens_kv)):
        if view.shape[0] > most:
            raise ShapeMismatch(f"{name} holds {view.shape[0]} tokens, more than batch * "
                                f"max_seqlen = {most} can", argument=name)
    cu_q = _offsets(args.cu_seqlens_q, "cu_seqlens_q", desc.batch)
    cu_kv = _offsets(args.cu_seqlens_kv, "cu_seqlens_kv", desc.batch, entries=cu_q.shape[0])
    out = _packed(args.out, "out", desc.heads_q, desc.dim_v, desc.element, tokens=q.shape[0],
                  like="q")
    return {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_q, "cu_seqlens_kv": cu_kv, "out": out}


def _lse(obj: Any, desc: _VarlenProblem, tokens: int) -> TensorView:
    view = wrap(obj, "lse")
    expect(view, "lse", shape=(desc.heads_q, tokens), element=desc.lse_element)
    if not view.is_contiguous:  # an extent-1 dimension's stride addresses nothing: any is fine
        raise InvalidArgument(f"lse must be contiguous [Hq, Tq], got strides {view.strides}",
                              argument="lse")
    return view


def _bind_forward(desc: VarlenAttentionDescriptor, args: VarlenAttentionArgs) -> BoundArgs:
    expect_args_type(args, VarlenAttentionArgs)
    views: dict[str, TensorView | None] = dict(_common(desc, args))
    views["lse"] = (None if argument_when(args.lse, "lse", desc.save_lse, "save_lse is True")
                    is None else _lse(args.lse, desc, views["q"].shape[0]))
    outputs = ("out", "lse")
    expect_no_overlaps(views, outputs)
    return BoundArgs(views, outputs=outputs)


def _bind_backward(desc: VarlenAttentionBackwardDescriptor, args: VarlenAttentionBackwardArgs
                   ) -> BoundArgs:
    expect_args_type(args, VarlenAttentionBackwardArgs)
    views: dict[str, TensorView | None] = dict(_common(desc, args))
    tokens_q, tokens_kv = views["q"].shape[0], views["k"].shape[0]
    views["grad_out"] = _packed(args.grad_out, "grad_out", desc.heads_q, desc.dim_v,
                                desc.element, tokens=tokens_q, like="q")
    views["lse"] = _lse(args.lse, desc, tokens_q)
    views["grad_q"] = _packed(args.grad_q, "grad_q", desc.heads_q, desc.head_dim, desc.element,
                              tokens=tokens_q, like="q")
    views["grad_k"] = _packed(args.grad_k, "grad_k", desc.heads_kv, desc.head_dim,
                              desc.element, tokens=tokens_kv, like="k")
    views["grad_v"] = _packed(args.grad_v, "grad_v", desc.heads_kv, desc.dim_v, desc.element,
                              tokens=tokens_kv, like="k")
    outputs = ("grad_q", "grad_k", "grad_v")
    expect_no_overlaps(views, outputs)
    return BoundArgs(views, outputs=outputs)


def offsets_problem(offsets: np.ndarray, tokens: int, max_seqlen: int) -> str | None:
    """What is wrong with one cu_seqlens' values, naming the first bad index, or None: they must
    start at 0, never decrease, end within the tensor's ``tokens``, and keep every sequence
    within ``max_seqlen``. The host reference checks this on every run; the GPU SKUs' checked
    mode checks the same on the device."""
    values = np.asarray(offsets, dtype=np.int64)
    if values[0] != 0:
        return f"starts at {values[0]}, not 0 (index 0)"
    steps = np.diff(values)
    for index in np.flatnonzero((steps < 0) | (steps > max_seqlen))[:1]:
        what = "decreases" if steps[index] < 0 else f"holds a sequence longer than {max_seqlen}"
        return f"{what} at index {index + 1} ({values[index]} -> {values[index + 1]})"
    if values[-1] > tokens:
        return (f"ends at {values[-1]}, past the tensor's {tokens} tokens (index "
                f"{len(values) - 1})")
    return None


def check_offsets(desc: _VarlenProblem, cu_seqlens_q: np.ndarray, cu_seqlens_kv: np.ndarray,
                  tokens_q: int, tokens_kv: int) -> None:
    """InvalidArgument naming the argument and its first bad index (``offsets_problem``)."""
    for name, offsets, tokens, most in (("cu_seqlens_q", cu_seqlens_q, tokens_q,
                                         desc.max_seqlen_q),
                                        ("cu_seqlens_kv", cu_seqlens_kv, tokens_kv,
                                         desc.max_seqlen_kv)):
        problem = offsets_problem(offsets, tokens, most)
        if problem is not None:
            raise InvalidArgument(f"{name} {problem}", argument=name)


def reference_options(desc: _VarlenProblem) -> dict:
    """The float64 reference's keywords for this descriptor (everything but the tensors)."""
    window = None if desc.window is None else (desc.window.left, desc.window.right)
    return {"scale": desc.softmax_scale, "causal": desc.causal, "window": window,
            "alignment": None if desc.causal is not None else desc.alignment}


# ----------------------------------------------------------------------------- verification


def verification_lengths(desc: _VarlenProblem) -> tuple[np.ndarray, np.ndarray]:
    """The per-sequence (len_q, len_kv) that verify and the GPU tests pack, a function of the
    descriptor alone (the tensors' token counts follow from it): the longest sequence, a
    single query over a half-length kv, an empty one, one query-heavy and one key-heavy, in that
    cycle, so that empty, single-token and odd-length sequences are all exercised."""
    mq, mk = desc.max_seqlen_q, desc.max_seqlen_kv
    cycle_q = (mq, 1, 0, mq, max(1, mq // 3))
    cycle_kv = (mk, mk // 2 + 1, 0, max(1, mk // 5), mk)
    picks = [b % len(cycle_q) for b in range(desc.batch)]
    return (np.array([cycle_q[p] for p in picks], np.int64),
            np.array([cycle_kv[p] for p in picks], np.int64))


def _forward_signature(desc: VarlenAttentionDescriptor) -> dict[str, TensorSpec]:
    len_q, len_kv = verification_lengths(desc)
    tq, tk = int(len_q.sum()), int(len_kv.sum())
    signature = {
        "q": TensorSpec((tq, desc.heads_q, desc.head_dim), desc.element),
        "k": TensorSpec((tk, desc.heads_kv, desc.head_dim), desc.element),
        "v": TensorSpec((tk, desc.heads_kv, desc.dim_v), desc.element),
        "cu_seqlens_q": TensorSpec((desc.batch + 1,), ElementKind.i32),
        "cu_seqlens_kv": TensorSpec((desc.batch + 1,), ElementKind.i32),
        "out": TensorSpec((tq, desc.heads_q, desc.dim_v), desc.element, "out"),
    }
    if desc.save_lse:
        signature["lse"] = TensorSpec((desc.heads_q, tq), desc.lse_element, "out")
    return signature


def _backward_signature(desc: VarlenAttentionBackwardDescriptor) -> dict[str, TensorSpec]:
    forward = _forward_signature(VarlenAttentionDescriptor(**_shared_fields(desc),
                                                           save_lse=True))
    grads = {f"grad_{name}": TensorSpec(forward[name].shape, desc.element, "out")
             for name in ("q", "k", "v")}
    return {"q": forward["q"], "k": forward["k"], "v": forward["v"],
            "out": TensorSpec(forward["out"].shape, desc.element),
            "grad_out": TensorSpec(forward["out"].shape, desc.element),
            "lse": TensorSpec(forward["lse"].shape, desc.lse_element),
            "cu_seqlens_q": forward["cu_seqlens_q"], "cu_seqlens_kv": forward["cu_seqlens_kv"],
            **grads}


def _verification_inputs(desc: _VarlenProblem, inputs: dict[str, np.ndarray],
                         rng: np.random.Generator) -> dict[str, np.ndarray]:
    """cu_seqlens from verification_lengths; for the backward, out and lse as the reference
    forward leaves them (rounded to their elements), which is what the backward reads."""
    len_q, len_kv = verification_lengths(desc)
    result = dict(inputs)
    result["cu_seqlens_q"] = np.concatenate([[0], np.cumsum(len_q)]).astype(np.int32)
    result["cu_seqlens_kv"] = np.concatenate([[0], np.cumsum(len_kv)]).astype(np.int32)
    if isinstance(desc, VarlenAttentionBackwardDescriptor):
        from .._backends.reference.varlen import varlen_forward  # the oracle's forward
        from ..testing import _from_bits, _to_bits

        out, lse = varlen_forward(result["q"], result["k"], result["v"], result["cu_seqlens_q"],
                                  result["cu_seqlens_kv"], **reference_options(desc))
        result["out"] = _from_bits(_to_bits(out, desc.element), desc.element)
        result["lse"] = lse.T.astype(np.float32).astype(np.float64)
    return result


_SAMPLES = (
    dict(batch=5, heads_q=4, heads_kv=4, head_dim=64, max_seqlen_q=130, max_seqlen_kv=130),
    dict(batch=5, heads_q=4, heads_kv=1, head_dim=64, max_seqlen_q=100, max_seqlen_kv=200,
         causal="bottom_right"),
    dict(batch=3, heads_q=8, heads_kv=2, head_dim=128, max_seqlen_q=96, max_seqlen_kv=96,
         causal="top_left"),
    dict(batch=5, heads_q=4, heads_kv=2, head_dim=64, max_seqlen_q=150, max_seqlen_kv=150,
         window=(32, 0)),
    dict(batch=2, heads_q=2, heads_kv=2, head_dim=32, max_seqlen_q=64, max_seqlen_kv=80,
         window=(16, 8), head_dim_v=32),
)


def _forward_samples(element: ElementKind) -> list[VarlenAttentionDescriptor]:
    return [VarlenAttentionDescriptor(**shape, element=element, save_lse=True)
            for shape in _SAMPLES]


def _backward_samples(element: ElementKind) -> list[VarlenAttentionBackwardDescriptor]:
    return [VarlenAttentionBackwardDescriptor(**shape, element=element) for shape in _SAMPLES]


def _forward_large(desc: VarlenAttentionDescriptor) -> dict[str, float]:
    return large_forward_scales(desc)


def _backward_large(desc: VarlenAttentionBackwardDescriptor) -> dict[str, float]:
    return large_backward_scales(desc, desc.max_seqlen_q, desc.max_seqlen_kv)


# ----------------------------------------------------------------------------- ops


def _shared_fields(desc: _VarlenProblem) -> dict:
    return {name: getattr(desc, name) for name in _VarlenProblem.model_fields}


def _training_backward(desc: VarlenAttentionDescriptor) -> VarlenAttentionBackwardDescriptor:
    if not desc.save_lse:
        raise InvalidProblem("save_lse must be True to train: the backward reads the forward's "
                             "lse", field="save_lse")
    return VarlenAttentionBackwardDescriptor(**_shared_fields(desc))


VARLEN_ATTENTION_FORWARD: OpContract[VarlenAttentionDescriptor] = OpContract(
    name="varlen_attention_forward",
    category=OpCategory.varlen_attention,
    descriptor=VarlenAttentionDescriptor,
    args=VarlenAttentionArgs,
    bind=_bind_forward,
    summary="out = softmax(scale*q.k^T, masked per sequence).v over packed [T, H, D], lse",
    signature=_forward_signature,
    sample_problems=_forward_samples,
    training_backward=_training_backward,
    verification_inputs=_verification_inputs,
    large_scales=_forward_large,
)

VARLEN_ATTENTION_BACKWARD: OpContract[VarlenAttentionBackwardDescriptor] = OpContract(
    name="varlen_attention_backward",
    category=OpCategory.varlen_attention,
    descriptor=VarlenAttentionBackwardDescriptor,
    args=VarlenAttentionBackwardArgs,
    bind=_bind_backward,
    summary="grad_q, grad_k, grad_v of packed attention from q, k, v, out, grad_out and lse",
    signature=_backward_signature,
    sample_problems=_backward_samples,
    verification_inputs=_verification_inputs,
    large_scales=_backward_large,
)

OPS = (VARLEN_ATTENTION_FORWARD, VARLEN_ATTENTION_BACKWARD)
