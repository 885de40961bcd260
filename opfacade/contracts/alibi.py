"""The alibi family's contract: ALiBi (attention with linear biases) over [B, H, Q, K] scores.

    forward   Y[b,h,i,j] = A[b,h,i,j] + slope[h] * (j - i)         (optionally in place)
    backward  dA = dY,  dslope[h] = sum over b, i, j of dY[b,h,i,j] * (j - i)

Slopes and their gradient are f64 for f64 problems and f32 otherwise (the accumulator type).
Either backward output may be skipped, not both. The GPU SKUs are bespoke NVRTC kernels whose
dslope reduction has a fixed order: deterministic and bit-stable.

Backends implement ``ALIBI_FORWARD`` and ``ALIBI_BACKWARD`` against the types here; the plans
and functional forms are in ``opfacade/ops/alibi.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, field_validator, model_validator

from .._internal.contract import BoundArgs, Descriptor, OpContract, TensorSpec, bits_for
from .._internal.tensors import (
    TensorView,
    argument_when,
    expect,
    expect_args_type,
    expect_no_overlap,
    wrap,
)
from .._internal.validation import one_of
from ..errors import LayoutMismatch
from ..types import ElementKind, OpCategory

__all__ = [
    "OPS",
    "AlibiForwardDescriptor",
    "AlibiBackwardDescriptor",
    "AlibiForwardArgs",
    "AlibiBackwardArgs",
    "ALIBI_BACKWARD",
    "ALIBI_FORWARD",
    "ELEMENTS",
    "MAX_LENGTH",
    "accumulator",
]

# |j - i| must stay exact in the f32 accumulator.
MAX_LENGTH = 1 << 24
# The element types an ALiBi problem may be stated in: every floating-point storage type. fp8 is
# a valid problem no SKU serves yet (selection says element_unsupported), not an invalid one.
ELEMENTS = (ElementKind.f64, ElementKind.f32, ElementKind.f16, ElementKind.bf16,
            ElementKind.fp8_e4m3, ElementKind.fp8_e5m2)


def accumulator(element: ElementKind) -> ElementKind:
    """What ALiBi computes and accumulates in, and the slopes' (and dslope's) element type."""
    return element.accumulator


class _AlibiShape(Descriptor):
    batch: int = Field(ge=1)
    heads: int = Field(ge=1)
    query_len: int = Field(ge=1, lt=MAX_LENGTH)
    key_len: int = Field(ge=1, lt=MAX_LENGTH)
    element: ElementKind

    @field_validator("element")
    @classmethod
    def _floating(cls, element: ElementKind) -> ElementKind:
        if element not in ELEMENTS:
            raise ValueError(f"element must be a floating-point storage type: {one_of(ELEMENTS)}")
        return element

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.query_len, self.key_len)

    @property
    def slope_element(self) -> ElementKind:
        """Slopes and dslope: the accumulator type (f64 for f64 problems, else f32)."""
        return accumulator(self.element)


class AlibiForwardDescriptor(_AlibiShape):
    """Y = A + slope[h]*(j - i) over [batch, heads, query_len, key_len]."""

    in_place: bool = False


class AlibiBackwardDescriptor(_AlibiShape):
    """dA = dY and dslope[h] = sum dY*(j - i); either output may be skipped, not both."""

    need_input_grad: bool = True
    need_slope_grad: bool = True

    @model_validator(mode="after")
    def _some_output(self) -> AlibiBackwardDescriptor:
        if not (self.need_input_grad or self.need_slope_grad):
            raise ValueError("need_input_grad and need_slope_grad cannot both be False")
        return self


@dataclass
class AlibiForwardArgs:
    """input [B,H,Q,K]; slopes [H]; output [B,H,Q,K], or None (or input itself) when in_place."""

    input: Any
    slopes: Any
    output: Any = None


@dataclass
class AlibiBackwardArgs:
    """grad_output [B,H,Q,K]; grad_input [B,H,Q,K] and grad_slopes [H] as the descriptor asks."""

    grad_output: Any
    grad_input: Any = None
    grad_slopes: Any = None


def _score_tensor(obj: Any, name: str, desc: _AlibiShape) -> TensorView:
    view = wrap(obj, name)
    expect(view, name, shape=desc.shape, element=desc.element)
    return view


def _slope_tensor(obj: Any, name: str, desc: _AlibiShape) -> TensorView:
    view = wrap(obj, name)
    expect(view, name, shape=(desc.heads,), element=desc.slope_element)
    return view


def _bind_forward(desc: AlibiForwardDescriptor, args: AlibiForwardArgs) -> BoundArgs:
    expect_args_type(args, AlibiForwardArgs)
    x = _score_tensor(args.input, "input", desc)
    slopes = _slope_tensor(args.slopes, "slopes", desc)
    if desc.in_place:
        out = x if args.output is None or args.output is args.input else wrap(args.output,
                                                                              "output")
        if not out.same_layout(x):
            raise LayoutMismatch("output must be input itself (or None) for an in_place plan",
                                 argument="output")
    else:
        out = _score_tensor(argument_when(args.output, "output", True,
                                          "the descriptor is not in_place"), "output", desc)
        expect_no_overlap(out, "output", x, "input")
    expect_no_overlap(out, "output", slopes, "slopes")
    return BoundArgs({"input": x, "slopes": slopes, "output": out}, outputs=("output",))


def _bind_backward(desc: AlibiBackwardDescriptor, args: AlibiBackwardArgs) -> BoundArgs:
    expect_args_type(args, AlibiBackwardArgs)
    dy = _score_tensor(args.grad_output, "grad_output", desc)
    d_in = d_slopes = None
    grad_input = argument_when(args.grad_input, "grad_input", desc.need_input_grad,
                               "need_input_grad")
    if grad_input is not None:
        d_in = _score_tensor(grad_input, "grad_input", desc)
        if not d_in.same_layout(dy):  # exact aliasing is allowed: dA = dY holds already
            expect_no_overlap(d_in, "grad_input", dy, "grad_output")
    grad_slopes = argument_when(args.grad_slopes, "grad_slopes", desc.need_slope_grad,
                                "need_slope_grad")
    if grad_slopes is not None:
        d_slopes = _slope_tensor(grad_slopes, "grad_slopes", desc)
        expect_no_overlap(d_slopes, "grad_slopes", dy, "grad_output")
        if d_in is not None:
            expect_no_overlap(d_slopes, "grad_slopes", d_in, "grad_input")
    return BoundArgs({"grad_output": dy, "grad_input": d_in, "grad_slopes": d_slopes},
                     outputs=("grad_input", "grad_slopes"))


def _forward_signature(desc: AlibiForwardDescriptor) -> dict[str, TensorSpec]:
    scores = TensorSpec(desc.shape, desc.element, "inout" if desc.in_place else "in")
    signature = {"input": scores, "slopes": TensorSpec((desc.heads,), desc.slope_element)}
    if not desc.in_place:
        signature["output"] = TensorSpec(desc.shape, desc.element, "out")
    return signature


def _backward_signature(desc: AlibiBackwardDescriptor) -> dict[str, TensorSpec]:
    signature = {"grad_output": TensorSpec(desc.shape, desc.element)}
    if desc.need_input_grad:
        signature["grad_input"] = TensorSpec(desc.shape, desc.element, "out")
    if desc.need_slope_grad:
        signature["grad_slopes"] = TensorSpec((desc.heads,), desc.slope_element, "out")
    return signature


# Odd extents exercise the element-by-element tails; the last shapes give thousands of blocks.
_SAMPLE_SHAPES = (
    dict(batch=1, heads=1, query_len=1, key_len=1),
    dict(batch=2, heads=3, query_len=5, key_len=7),
    dict(batch=2, heads=4, query_len=33, key_len=130),
    dict(batch=2, heads=8, query_len=257, key_len=1031),
    dict(batch=4, heads=16, query_len=512, key_len=512),
)


def _forward_samples(element: ElementKind) -> list[AlibiForwardDescriptor]:
    return [AlibiForwardDescriptor(**shape, element=element, in_place=in_place)
            for shape in _SAMPLE_SHAPES for in_place in (False, True)]


def _backward_samples(element: ElementKind) -> list[AlibiBackwardDescriptor]:
    flags = ((True, True), (True, False), (False, True))
    return [AlibiBackwardDescriptor(**shape, element=element, need_input_grad=d_in,
                                    need_slope_grad=d_slopes)
            for shape in _SAMPLE_SHAPES for d_in, d_slopes in flags]


def _forward_large(desc: AlibiForwardDescriptor) -> dict[str, float]:
    # Y = A + slope (j - i): A a quarter of the range below the top leaves room for the bias.
    return {"input": 2.0 ** (desc.element.max_exponent - 2)}


def _backward_large(desc: AlibiBackwardDescriptor) -> dict[str, float]:
    # dslope sums B*Q*K terms of |dY| |j - i| <= max(Q, K) in the slope's type.
    terms = desc.batch * desc.query_len * desc.key_len * max(desc.query_len, desc.key_len)
    return {"grad_output": 2.0 ** min(desc.element.max_exponent - 2,
                                      desc.slope_element.max_exponent - 3 - bits_for(terms))}


def _training_backward(desc: AlibiForwardDescriptor) -> AlibiBackwardDescriptor:
    return AlibiBackwardDescriptor(batch=desc.batch, heads=desc.heads, query_len=desc.query_len,
                                   key_len=desc.key_len, element=desc.element)


ALIBI_FORWARD: OpContract[AlibiForwardDescriptor] = OpContract(
    name="alibi_forward",
    category=OpCategory.positional_bias,
    descriptor=AlibiForwardDescriptor,
    args=AlibiForwardArgs,
    bind=_bind_forward,
    summary="Y = A + slope[h]*(j - i) over [B, H, Q, K]",
    signature=_forward_signature,
    sample_problems=_forward_samples,
    training_backward=_training_backward,
    large_scales=_forward_large,
)

ALIBI_BACKWARD: OpContract[AlibiBackwardDescriptor] = OpContract(
    name="alibi_backward",
    category=OpCategory.positional_bias,
    descriptor=AlibiBackwardDescriptor,
    args=AlibiBackwardArgs,
    bind=_bind_backward,
    summary="dA = dY, dslope[h] = sum dY*(j - i) over [B, H, Q, K]",
    signature=_backward_signature,
    sample_problems=_backward_samples,
    large_scales=_backward_large,
)

OPS = (ALIBI_FORWARD, ALIBI_BACKWARD)
