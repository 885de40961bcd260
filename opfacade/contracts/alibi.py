"""ALiBi (attention with linear biases) as a standalone op over [B, H, Q, K] score tensors.

    forward   Y[b,h,i,j] = A[b,h,i,j] + slope[h] * (j - i)         (optionally in place)
    backward  dA = dY,  dslope[h] = sum over b, i, j of dY[b,h,i,j] * (j - i)

Slopes and their gradient are f64 for f64 problems and f32 otherwise (the accumulator type).
Either backward output may be skipped, not both. The GPU SKUs are bespoke NVRTC kernels whose
dslope reduction has a fixed order: deterministic and bit-stable.

    desc = AlibiBackwardDescriptor(batch=2, heads=4, query_len=16, key_len=16, element="bf16")
    plan = AlibiBackwardPlan.select(desc)
    plan.run(AlibiBackwardArgs(grad_output=dy, grad_input=da, grad_slopes=ds), stream=s)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import Field, field_validator, model_validator

from ._backends.nvrtc import alibi as nvrtc_alibi
from ._backends.reference import alibi as reference_alibi
from ._backends.reference.sku import ReferenceSku
from ._internal.memory import OutputAllocator
from ._internal.registry import register
from ._internal.sku import BoundArgs, Descriptor, OpSpec, TensorSpec
from ._internal.tensors import TensorView, expect, expect_args_type, expect_no_overlap, wrap
from .errors import InvalidArgument, LayoutMismatch
from .plan import plan_class
from .types import ElementKind, OpCategory

__all__ = [
    "AlibiForwardDescriptor",
    "AlibiBackwardDescriptor",
    "AlibiForwardArgs",
    "AlibiBackwardArgs",
    "AlibiForwardPlan",
    "AlibiBackwardPlan",
    "alibi_forward",
    "alibi_backward",
]

# |j - i| must stay exact in the f32 accumulator.
MAX_LENGTH = 1 << 24


class _AlibiShape(Descriptor):
    batch: int = Field(ge=1)
    heads: int = Field(ge=1)
    query_len: int = Field(ge=1, lt=MAX_LENGTH)
    key_len: int = Field(ge=1, lt=MAX_LENGTH)
    element: ElementKind

    @field_validator("element")
    @classmethod
    def _floating(cls, element: ElementKind) -> ElementKind:
        if not element.is_float or element is ElementKind.tf32:
            raise ValueError("element must be a floating-point storage type (f64, f32, f16, bf16)")
        return element

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.query_len, self.key_len)

    @property
    def slope_element(self) -> ElementKind:
        """Slopes and dslope: the accumulator type (f64 for f64 problems, else f32)."""
        return nvrtc_alibi.accumulator(self.element)


class AlibiForwardDescriptor(_AlibiShape):
    """Y = A + slope[h]*(j - i) over [batch, heads, query_len, key_len]."""

    op_name = "alibi_forward"
    in_place: bool = False


class AlibiBackwardDescriptor(_AlibiShape):
    """dA = dY and dslope[h] = sum dY*(j - i); either output may be skipped, not both."""

    op_name = "alibi_backward"
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


def _required(obj: Any, name: str, why: str) -> Any:
    if obj is None:
        raise InvalidArgument(f"{name} is required {why}", argument=name)
    return obj


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
        out = _score_tensor(_required(args.output, "output", "unless the descriptor is in_place"),
                            "output", desc)
        expect_no_overlap(out, "output", x, "input")
    expect_no_overlap(out, "output", slopes, "slopes")
    return BoundArgs({"input": x, "slopes": slopes, "output": out}, outputs=("output",))


def _bind_backward(desc: AlibiBackwardDescriptor, args: AlibiBackwardArgs) -> BoundArgs:
    expect_args_type(args, AlibiBackwardArgs)
    dy = _score_tensor(args.grad_output, "grad_output", desc)
    d_in = d_slopes = None
    if desc.need_input_grad:
        d_in = _score_tensor(_required(args.grad_input, "grad_input", "when need_input_grad"),
                             "grad_input", desc)
        if not d_in.same_layout(dy):  # exact aliasing is allowed: dA = dY holds already
            expect_no_overlap(d_in, "grad_input", dy, "grad_output")
    elif args.grad_input is not None:
        raise InvalidArgument("grad_input must be None when need_input_grad is False",
                              argument="grad_input")
    if desc.need_slope_grad:
        d_slopes = _slope_tensor(
            _required(args.grad_slopes, "grad_slopes", "when need_slope_grad"), "grad_slopes",
            desc)
        expect_no_overlap(d_slopes, "grad_slopes", dy, "grad_output")
        if d_in is not None:
            expect_no_overlap(d_slopes, "grad_slopes", d_in, "grad_input")
    elif args.grad_slopes is not None:
        raise InvalidArgument("grad_slopes must be None when need_slope_grad is False",
                              argument="grad_slopes")
    return BoundArgs({"grad_output": dy, "grad_input": d_in, "grad_slopes": d_slopes},
                     outputs=("grad_input", "grad_slopes"))


def _reference_forward(desc: AlibiForwardDescriptor, arrays: dict) -> dict:
    return {"output": reference_alibi.alibi_forward(arrays["input"], arrays["slopes"])}


def _reference_backward(desc: AlibiBackwardDescriptor, arrays: dict) -> dict:
    d_in, d_slopes = reference_alibi.alibi_backward(
        arrays["grad_output"], need_input_grad=desc.need_input_grad,
        need_slope_grad=desc.need_slope_grad)
    results = {"grad_input": d_in, "grad_slopes": d_slopes}
    return {name: value for name, value in results.items() if value is not None}


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


ALIBI_FORWARD = register(OpSpec(
    name="alibi_forward",
    category=OpCategory.positional_bias,
    descriptor=AlibiForwardDescriptor,
    args=AlibiForwardArgs,
    bind=_bind_forward,
    skus=(*nvrtc_alibi.FORWARD_SKUS,
          ReferenceSku("alibi_forward", OpCategory.positional_bias, _reference_forward,
                       "Y = A + slope[h]*(j - i).")),
    summary="Y = A + slope[h]*(j - i) over [B, H, Q, K]",
    signature=_forward_signature,
    sample_problems=_forward_samples,
    training_backward=lambda desc: AlibiBackwardDescriptor(
        batch=desc.batch, heads=desc.heads, query_len=desc.query_len, key_len=desc.key_len,
        element=desc.element),
))

ALIBI_BACKWARD = register(OpSpec(
    name="alibi_backward",
    category=OpCategory.positional_bias,
    descriptor=AlibiBackwardDescriptor,
    args=AlibiBackwardArgs,
    bind=_bind_backward,
    skus=(*nvrtc_alibi.BACKWARD_SKUS,
          ReferenceSku("alibi_backward", OpCategory.positional_bias, _reference_backward,
                       "dA = dY; dslope[h] = sum dY*(j - i).")),
    summary="dA = dY, dslope[h] = sum dY*(j - i) over [B, H, Q, K]",
    signature=_backward_signature,
    sample_problems=_backward_samples,
))

AlibiForwardPlan = plan_class(ALIBI_FORWARD)
AlibiBackwardPlan = plan_class(ALIBI_BACKWARD)


def _descriptor_shape(view: TensorView, name: str) -> dict:
    if view.ndim != 4:
        raise InvalidArgument(f"{name} must be 4-D [batch, heads, query_len, key_len], got "
                              f"shape {view.shape}", argument=name)
    batch, heads, query_len, key_len = view.shape
    return dict(batch=batch, heads=heads, query_len=query_len, key_len=key_len,
                element=view.element)


def alibi_forward(input: Any, slopes: Any, *, out: Any = None, in_place: bool = False,
                  stream: Any = None) -> Any:
    """Functional form of AlibiForwardPlan: returns ``out`` (allocated when None) or ``input``.

    Uses the process-wide plan cache; arguments are those of AlibiForwardArgs and Plan.run.
    """
    view = wrap(input, "input")
    desc = AlibiForwardDescriptor(**_descriptor_shape(view, "input"), in_place=in_place)
    plan = AlibiForwardPlan.cached(desc, device="cpu" if view.device is None else view.device)
    if not in_place and out is None:
        out = OutputAllocator(view, stream)(view.shape, view.element)
    plan.run(AlibiForwardArgs(input, slopes, None if in_place else out), stream=stream)
    return input if in_place else out


def alibi_backward(grad_output: Any, *, need_input_grad: bool = True,
                   need_slope_grad: bool = True, stream: Any = None) -> tuple[Any, Any]:
    """Functional form of AlibiBackwardPlan: returns (grad_input, grad_slopes), None if skipped."""
    view = wrap(grad_output, "grad_output")
    desc = AlibiBackwardDescriptor(**_descriptor_shape(view, "grad_output"),
                                   need_input_grad=need_input_grad,
                                   need_slope_grad=need_slope_grad)
    plan = AlibiBackwardPlan.cached(desc, device="cpu" if view.device is None else view.device)
    allocate = OutputAllocator(view, stream)
    d_in = allocate(view.shape, view.element) if need_input_grad else None
    d_slopes = allocate((desc.heads,), desc.slope_element) if need_slope_grad else None
    plan.run(AlibiBackwardArgs(grad_output, d_in, d_slopes), stream=stream)
    return d_in, d_slopes
