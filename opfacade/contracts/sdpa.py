"""The sdpa family's contract: scaled dot-product attention forward and backward, [B, H, S, D].

    out = softmax(scale * q k^T + bias + alibi, masked) . v        (dropout on the probabilities)
    stats = logsumexp of the masked, undropped scores (natural log), for the backward

q is [B, Hq, Sq, D]; k and v are [B, Hkv, Skv, D] and [B, Hkv, Skv, Dv] with Hq a multiple of
Hkv (GQA/MQA); out is [B, Hq, Sq, Dv]; stats is [B, Hq, Sq, 1] float32 (float64 for an f64
problem), contiguous. Tensors are indexed [batch, heads, seq, dim] whatever their memory order;
the descriptor's ``layout`` names the dense order they are stored in ("bhsd", "bshd" or
"sbhd"), and the GPU plans check that the strides are exactly those. q, k and v may instead
have strides of their own (``qkv_strides``: views into one packed QKV projection, read in place);
out and the gradients stay dense in ``layout``.

Masks follow the float64 reference (``_backends/reference/sdpa.py``): with ``d`` the
diagonal offset (0 top-left, ``seq_len_kv - seq_len_q`` bottom-right), ``causal`` keeps keys
``j <= i + d`` and ``window=(left, right)`` keeps ``i + d - left <= j <= i + d + right``. ALiBi
adds ``slope[h] * (j - i)`` with cuDNN's standard slopes (``alibi_slopes``).

Edges, stated in README's "SDPA's edges" (with ``padding``, ``seq_len_q``/``seq_len_kv`` are
int32 [B] device tensors in [0, seq_q] / [0, seq_kv]): a query row with no key gets out 0, stats
-inf and no gradient (a sequence with ``seq_len_kv == 0`` included: the GPU SKUs write those
rows after cuDNN); out rows past seq_len_q are 0 and their stats finite; gradient rows past the
lengths are unspecified. Precondition: content past the lengths must be finite (a NaN there can
reach valid outputs through cuDNN's 0 * NaN; finite values change none); nothing checks it yet.

Dropout takes its Philox seed and offset from int64 [1] device tensors (read by the kernel, so a
CUDA graph can be replayed with new values); the backward must be given the forward's seed and
offset. One forward consumes ``desc.dropout_offset_stride`` offset units: a caller driving
``dropout_offset`` itself must advance it by at least that much between calls, or successive
calls reuse part of each other's mask (offset + 1 repeats most of it). ``dropout_counter`` (or
the functional form's ``DropoutState``) makes the forward do it: the forward copies the counter
into ``dropout_offset`` and advances the counter by the stride, on the device, in stream order.

    desc = SdpaDescriptor(batch=2, heads_q=32, heads_kv=8, seq_q=4096, seq_kv=4096,
                          head_dim=128, element="bf16", causal="top_left", save_stats=True)
    pair = SdpaForwardPlan.select_for_training(desc, PlanPreference(deterministic=True))
    pair.forward.run(SdpaArgs(q, k, v, out, stats), stream=s)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field, ValidationInfo, field_validator

from .._internal.contract import BoundArgs, OpContract
from .._internal.tensors import (
    TensorView,
    argument_when,
    c_strides,
    expect,
    expect_args_type,
    expect_no_overlaps,
    wrap,
)
from ..errors import InvalidArgument, InvalidProblem
from ..types import ElementKind, OpCategory
from .attention_masks import ELEMENTS, MAX_EXTENT, Alignment, AttentionMask, SlidingWindow
from .sdpa_layouts import (
    LAYOUTS,
    MEMORY_ORDER,
    Layout,
    QkvStrides,
    dense_in,
    dense_strides,
    layout_by_order,
    layout_of,
    output_layout,
)
from .sdpa_samples import (
    backward_large,
    backward_samples,
    backward_signature,
    forward_large,
    forward_samples,
    forward_signature,
    verification_inputs,
)

__all__ = [
    "ELEMENTS",
    "OPS",
    "LAYOUTS",
    "MEMORY_ORDER",
    "QkvStrides",
    "SDPA_BACKWARD",
    "SDPA_FORWARD",
    "SdpaArgs",
    "SdpaBackwardArgs",
    "SdpaBackwardDescriptor",
    "SdpaDescriptor",
    "SlidingWindow",
    "alibi_slopes",
    "dense_in",
    "dense_strides",
    "layout_by_order",
    "layout_of",
    "output_layout",
    "reference_options",
    "stats_strides",
]

def stats_strides(desc: _SdpaProblem) -> tuple[int, int, int, int]:
    """The saved stats (log-sum-exp) are [B, Hq, Sq, 1], C-contiguous: the layout every backward
    reads."""
    return c_strides(desc.stats_shape)


BiasShape = Literal["bhqk", "1hqk", "b1qk", "11qk"]


class _SdpaProblem(AttentionMask):
    """The fields forward and backward share.

    heads_q must be a multiple of heads_kv; head_dim_v (Dv) defaults to head_dim. ``layout``:
    the dense memory order of q, k, v, out (and their gradients). ``qkv_strides``: q, k and v's
    own element strides when they are not dense in ``layout`` (QkvStrides). ``scale``: None for
    1/sqrt(head_dim). ``causal``: None, "top_left" (or True) or "bottom_right". ``window``:
    SlidingWindow, a (left, right) pair or "left,right". ``bias``: the bias tensor's shape,
    "bhqk" for [B, Hq, Sq, Skv], a "1" for a broadcast extent ("1hqk", "b1qk", "11qk").
    ``alibi``: cuDNN's ALiBi slopes (needs a top-left causal mask on cuDNN). ``padding``:
    seq_len_q/seq_len_kv are given.
    """

    batch: int = Field(ge=1, lt=MAX_EXTENT)
    heads_q: int = Field(ge=1, lt=MAX_EXTENT)
    heads_kv: int = Field(ge=1, lt=MAX_EXTENT)
    seq_q: int = Field(ge=1, lt=MAX_EXTENT)
    seq_kv: int = Field(ge=1, lt=MAX_EXTENT)
    head_dim: int = Field(ge=1, lt=MAX_EXTENT)
    head_dim_v: int | None = Field(default=None, ge=1, lt=MAX_EXTENT)
    element: ElementKind
    layout: Layout = "bhsd"
    qkv_strides: QkvStrides | None = None
    scale: float | None = None
    causal: Alignment | None = None
    window: SlidingWindow | None = None
    bias: BiasShape | None = None
    alibi: bool = False
    dropout_p: float = Field(default=0.0, ge=0.0, lt=1.0)
    padding: bool = False

    @property
    def q_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads_q, self.seq_q, self.head_dim)

    @property
    def k_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads_kv, self.seq_kv, self.head_dim)

    @property
    def v_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads_kv, self.seq_kv, self.dim_v)

    @functools.cached_property
    def o_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads_q, self.seq_q, self.dim_v)

    @functools.cached_property
    def o_strides(self) -> tuple[int, int, int, int]:
        """The element strides out is allocated with: dense in ``layout``. (Cached, as
        ``o_shape``: the functional forms read both on every call.)"""
        return dense_strides(self.layout, *self.o_shape)

    def input_strides(self, name: str) -> tuple[int, int, int, int]:
        """The element strides of input ``name`` ("q", "k" or "v"): its own from
        ``qkv_strides``, else dense in ``layout``."""
        if self.qkv_strides is not None:
            return getattr(self.qkv_strides, name)
        return dense_strides(self.layout, *getattr(self, f"{name}_shape"))

    @property
    def stats_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads_q, self.seq_q, 1)

    @property
    def stats_element(self) -> ElementKind:
        return self.element.accumulator

    @property
    def bias_shape(self) -> tuple[int, int, int, int] | None:
        if self.bias is None:
            return None
        return (self.batch if self.bias[0] == "b" else 1, self.heads_q if self.bias[1] == "h"
                else 1, self.seq_q, self.seq_kv)

    @property
    def dropout_offset_stride(self) -> int:
        """Philox offset units one forward consumes (0 without dropout): advance the offset by
        at least this much between calls, or their masks overlap.

        From cuDNN 9.19 on an H100 (README "SDPA's edges"): with the same seed, offset + 1
        repeats 75% of the mask's rows, + 2 50%, + 3 25%: an offset unit is one of the four
        32-bit outputs of a Philox call, four rows sharing a call. How far along the offset the
        other rows, keys and heads draw is not documented (in a B2 H4 S200 probe, + 4 and every
        larger step tried shared none of the mask's rows, as if positions took Philox
        subsequences), so the stride assumes the most a mask can take: one output per score
        element, B * Hq * Sq * Skv, with both sequence extents padded to 128 (the largest tile
        cuDNN's sm80/sm90 attention kernels use: they may draw for a tile's padded positions),
        rounded up to a power of two (a margin of up to 2x for tilings not seen). Offsets are
        int64: at B*Hq*Sq*Skv = 2**34 (B8 H32 S8192) that leaves 2**29 calls.
        """
        if self.dropout_p == 0.0:
            return 0
        padded = self.batch * self.heads_q * (-(-self.seq_q // 128) * 128) * (
            -(-self.seq_kv // 128) * 128)
        return 1 << (padded - 1).bit_length()


class SdpaDescriptor(_SdpaProblem):
    """One SDPA forward problem; ``save_stats`` writes the log-sum-exp the backward needs."""

    save_stats: bool = False


class SdpaBackwardDescriptor(_SdpaProblem):
    """The SDPA backward: dq, dk, dv (and dbias when ``need_bias_grad``) from q, k, v, out,
    grad_out and stats. Determinism is a preference (``PlanPreference(deterministic=True)``
    selects cuDNN's deterministic algorithm), not part of the problem."""

    need_bias_grad: bool = False

    @field_validator("need_bias_grad")
    @classmethod
    def _has_bias(cls, need: bool, info: ValidationInfo) -> bool:
        if need and info.data.get("bias") is None:
            raise ValueError("need_bias_grad needs a bias")
        return need


@dataclass
class SdpaArgs:
    """q [B,Hq,Sq,D], k [B,Hkv,Skv,D], v [B,Hkv,Skv,Dv], out [B,Hq,Sq,Dv]; stats [B,Hq,Sq,1] f32
    when save_stats; bias as the descriptor's bias shape; seq_len_q/seq_len_kv int32 [B] when
    padding; dropout_seed/dropout_offset int64 [1] on the device when dropout_p > 0.

    ``dropout_counter`` (optional, int64 [1] on the device, only with dropout): a dropout
    generator's running offset. When given, the forward first sets ``dropout_offset`` to it and
    advances it by ``desc.dropout_offset_stride``, in stream order on the device (so each replay
    of a captured CUDA graph draws a fresh mask); ``dropout_offset`` then holds this call's
    offset for the backward. Without it, ``dropout_offset`` is only read, and advancing it
    between calls is the caller's job."""

    q: Any
    k: Any
    v: Any
    out: Any
    stats: Any = None
    bias: Any = None
    seq_len_q: Any = None
    seq_len_kv: Any = None
    dropout_seed: Any = None
    dropout_offset: Any = None
    dropout_counter: Any = None


@dataclass
class SdpaBackwardArgs:
    """The forward's q, k, v, out and stats, grad_out like out; grad_q, grad_k, grad_v like q, k,
    v; grad_bias like bias when need_bias_grad; the rest as in SdpaArgs."""

    q: Any
    k: Any
    v: Any
    out: Any
    grad_out: Any
    stats: Any
    grad_q: Any
    grad_k: Any
    grad_v: Any
    bias: Any = None
    grad_bias: Any = None
    seq_len_q: Any = None
    seq_len_kv: Any = None
    dropout_seed: Any = None
    dropout_offset: Any = None


# ----------------------------------------------------------------------------- binding


def _optional(obj: Any, name: str, wanted: bool, why: str, shape, element) -> TensorView | None:
    """The tensor when the descriptor asks for it (required then), else it must be None."""
    if argument_when(obj, name, wanted, why) is None:
        return None
    view = wrap(obj, name)
    expect(view, name, shape=shape, element=element)
    return view


def _tensor(obj: Any, name: str, shape, element) -> TensorView:
    if obj is None:
        raise InvalidArgument(f"{name} is required", argument=name)
    view = wrap(obj, name)
    expect(view, name, shape=shape, element=element)
    return view


def _common(desc: _SdpaProblem, args) -> dict[str, TensorView | None]:
    lengths = dict(shape=(desc.batch,), element=ElementKind.i32)
    philox = dict(shape=(1,), element=ElementKind.i64)
    dropout = desc.dropout_p > 0.0
    return {
        "q": _tensor(args.q, "q", desc.q_shape, desc.element),
        "k": _tensor(args.k, "k", desc.k_shape, desc.element),
        "v": _tensor(args.v, "v", desc.v_shape, desc.element),
        "out": _tensor(args.out, "out", desc.o_shape, desc.element),
        "bias": _optional(args.bias, "bias", desc.bias is not None, "the descriptor has a bias",
                          desc.bias_shape, desc.element),
        "seq_len_q": _optional(args.seq_len_q, "seq_len_q", desc.padding,
                               "the descriptor has padding", **lengths),
        "seq_len_kv": _optional(args.seq_len_kv, "seq_len_kv", desc.padding,
                                "the descriptor has padding", **lengths),
        "dropout_seed": _optional(args.dropout_seed, "dropout_seed", dropout,
                                  "dropout_p > 0", **philox),
        "dropout_offset": _optional(args.dropout_offset, "dropout_offset", dropout,
                                    "dropout_p > 0", **philox),
    }


def _bind_forward(desc: SdpaDescriptor, args: SdpaArgs) -> BoundArgs:
    expect_args_type(args, SdpaArgs)
    views = _common(desc, args)
    views["stats"] = _optional(args.stats, "stats", desc.save_stats, "save_stats is True",
                               desc.stats_shape, desc.stats_element)
    outputs: tuple[str, ...] = ("out", "stats")
    if args.dropout_counter is not None:
        # Optional even with dropout; refused without it (argument_when's wording).
        views["dropout_counter"] = _optional(args.dropout_counter, "dropout_counter",
                                             desc.dropout_p > 0.0, "dropout_p > 0",
                                             shape=(1,), element=ElementKind.i64)
        outputs = (*outputs, "dropout_offset", "dropout_counter")  # both written
    expect_no_overlaps(views, outputs)
    return BoundArgs(views, outputs=outputs)


def _bind_backward(desc: SdpaBackwardDescriptor, args: SdpaBackwardArgs) -> BoundArgs:
    expect_args_type(args, SdpaBackwardArgs)
    views = _common(desc, args)
    views["grad_out"] = _tensor(args.grad_out, "grad_out", desc.o_shape, desc.element)
    views["stats"] = _tensor(args.stats, "stats", desc.stats_shape, desc.stats_element)
    views["grad_q"] = _tensor(args.grad_q, "grad_q", desc.q_shape, desc.element)
    views["grad_k"] = _tensor(args.grad_k, "grad_k", desc.k_shape, desc.element)
    views["grad_v"] = _tensor(args.grad_v, "grad_v", desc.v_shape, desc.element)
    views["grad_bias"] = _optional(args.grad_bias, "grad_bias", desc.need_bias_grad,
                                   "need_bias_grad is True", desc.bias_shape, desc.element)
    outputs = ("grad_q", "grad_k", "grad_v", "grad_bias")
    expect_no_overlaps(views, outputs)
    return BoundArgs(views, outputs=outputs)


# ----------------------------------------------------------------------------- reference


def alibi_slopes(heads: int) -> np.ndarray:
    """cuDNN's ALiBi slopes for ``heads`` query heads, float32 values as float64.

    For n the largest power of two <= heads: 2^(-8k/n) for k = 1..n, then 2^(-8(k + 1/2)/n)
    for k = 0, 1, ... for the remaining heads (cudnn-frontend ``get_alibi_slope``).
    """
    n = 1 << int(math.floor(math.log2(heads)))
    exponents = [k + 1.0 for k in range(n)] + [k + 0.5 for k in range(heads - n)]
    return np.array([2.0 ** (-8.0 * e / n) for e in exponents], dtype=np.float32).astype(
        np.float64)


def reference_options(desc: _SdpaProblem) -> dict:
    """The float64 reference's keywords for this descriptor (everything but the tensors)."""
    window = None
    if desc.window is not None:
        window = (desc.window.left, desc.window.right)
    return {
        "scale": desc.softmax_scale,
        "causal": desc.causal,
        "window": window,
        "alignment": None if desc.causal is not None else desc.alignment,
        "alibi_slopes": alibi_slopes(desc.heads_q) if desc.alibi else None,
        "dropout_p": desc.dropout_p,
    }


# ----------------------------------------------------------------------------- ops


def _shared_fields(desc: _SdpaProblem) -> dict:
    return {name: getattr(desc, name) for name in _SdpaProblem.model_fields}


def _training_backward(desc: SdpaDescriptor) -> SdpaBackwardDescriptor:
    if not desc.save_stats:
        raise InvalidProblem("save_stats must be True to train: the backward reads the forward's "
                             "stats", field="save_stats")
    return SdpaBackwardDescriptor(**_shared_fields(desc))


SDPA_FORWARD: OpContract[SdpaDescriptor] = OpContract(
    name="sdpa_forward",
    category=OpCategory.attention,
    descriptor=SdpaDescriptor,
    args=SdpaArgs,
    bind=_bind_forward,
    summary="out = softmax(scale*q.k^T + bias, masked).v over [B, H, S, D], stats = LSE",
    signature=forward_signature,
    sample_problems=forward_samples,
    training_backward=_training_backward,
    verification_inputs=verification_inputs,
    large_scales=forward_large,
)

SDPA_BACKWARD: OpContract[SdpaBackwardDescriptor] = OpContract(
    name="sdpa_backward",
    category=OpCategory.attention,
    descriptor=SdpaBackwardDescriptor,
    args=SdpaBackwardArgs,
    bind=_bind_backward,
    summary="dq, dk, dv (and dbias) of SDPA from q, k, v, out, grad_out and stats",
    signature=backward_signature,
    sample_problems=backward_samples,
    verification_inputs=verification_inputs,
    large_scales=backward_large,
)

OPS = (SDPA_FORWARD, SDPA_BACKWARD)
