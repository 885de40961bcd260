"""Linear layers as GEMMs with fused epilogues, row-major the way torch's nn.Linear holds them.

    forward   pre = x @ W + bias + residual,  out = act(pre)          [aux saved for training]
    backward  d_pre = grad_out * act'(aux),   grad_bias = sum of d_pre over rows,
              grad_x = d_pre @ W^T,           grad_weight = x^T @ d_pre (in W's layout)

``x`` is ``[M, K]`` or ``[batch, M, K]``; the weight is ``[K, N]`` ("kn") or ``[N, K]`` ("nk",
nn.Linear's layout, the default), one per batch entry (``weight_batched``) or one for the whole
batch; ``bias`` is ``[N]``; ``residual`` has the output's shape and enters before the activation,
as cuBLASLt's ``beta * C`` does. Activations: none, relu, gelu_tanh (cuBLASLt's GELU) fused into
the GEMM's epilogue; gelu_erf (torch's default GELU) and silu, which cuBLASLt has no epilogue
for, in a separate element-wise pass after the GEMM (one more rounding, declared in that SKU's
bound). ``tf32=True`` lets f32 problems use TF32 tensor cores (the TF32 SKU's guarantee says what
that costs).

The aux a training forward saves (``save_aux``) is the pre-activation for GELU and SiLU, and
cuBLASLt's ReLU bit-mask (``u8 [.., M, ceil(N / 128) * 16]``) for ReLU. What each activation
computes where, saves and needs is one table, ``ACTIVATIONS`` in ``linear_activations.py``
(with the aux layouts and the one row-padding rule, ``padded_row``), re-exported here.
``Plan.select_for_training`` on a forward descriptor selects the matching backward with it. The
plans and functional forms are in ``opfacade/ops/linear.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from .._internal.contract import BoundArgs, Descriptor, OpContract, TensorSpec, bits_for
from .._internal.tensors import (
    TensorView,
    argument_when,
    expect,
    expect_args_type,
    expect_no_overlaps,
    wrap,
)
from .._internal.validation import one_of
from ..errors import InvalidProblem, ShapeMismatch
from ..types import ElementKind, OpCategory
from .linear_activations import (
    ACTIVATIONS,
    ActivationSpec,
    AuxLayout,
    pack_relu_mask,
    padded_row,
    relu_mask_bytes,
    unpack_relu_mask,
)

__all__ = [
    "ACTIVATIONS",
    "ELEMENTS",
    "OPS",
    "LINEAR_BACKWARD",
    "LINEAR_FORWARD",
    "Activation",
    "ActivationSpec",
    "AuxLayout",
    "LinearArgs",
    "LinearBackwardArgs",
    "LinearBackwardDescriptor",
    "LinearDescriptor",
    "pack_relu_mask",
    "padded_row",
    "relu_mask_bytes",
    "unpack_relu_mask",
]

# The descriptor's activations: the names of ACTIVATIONS, in its order (written out for type
# checkers; tests/test_linear.py checks the two agree).
Activation = Literal["none", "relu", "gelu_tanh", "gelu_erf", "silu"]
WeightLayout = Literal["kn", "nk"]
MAX_EXTENT = (1 << 31) - 1  # cuBLASLt's matrix extents are int32
# The element types a linear problem may be stated in: those some SKU serves (no fp8 SKU exists;
# fp8 joins this tuple with its first SKU, with its scaling factors in the descriptor).
ELEMENTS = (ElementKind.f64, ElementKind.f32, ElementKind.f16, ElementKind.bf16)


class _LinearShape(Descriptor):
    m: int = Field(ge=1, le=MAX_EXTENT)
    n: int = Field(ge=1, le=MAX_EXTENT)
    k: int = Field(ge=1, le=MAX_EXTENT)
    batch: int | None = Field(default=None, ge=1, le=MAX_EXTENT)
    weight_layout: WeightLayout = "nk"
    weight_batched: bool = False
    element: ElementKind
    tf32: bool = False
    activation: Activation = "none"

    @field_validator("element")
    @classmethod
    def _floating(cls, element: ElementKind) -> ElementKind:
        if element not in ELEMENTS:
            raise ValueError(f"element must be {one_of(ELEMENTS)}; for TF32 math use "
                             "element='f32' with tf32=True")
        return element

    @field_validator("weight_batched")
    @classmethod
    def _needs_batch(cls, weight_batched: bool, info: ValidationInfo) -> bool:
        if weight_batched and info.data.get("batch") is None:
            raise ValueError("weight_batched=True needs a batch; a 2-D problem has one weight")
        return weight_batched

    @field_validator("tf32")
    @classmethod
    def _only_for_f32(cls, tf32: bool, info: ValidationInfo) -> bool:
        element = info.data.get("element")
        if tf32 and element is not None and element is not ElementKind.f32:
            raise ValueError(f"tf32=True applies to element='f32' only, got element="
                             f"'{element.value}'")
        return tf32

    @property
    def lead(self) -> tuple[int, ...]:
        return () if self.batch is None else (self.batch,)

    @property
    def x_shape(self) -> tuple[int, ...]:
        return (*self.lead, self.m, self.k)

    @property
    def weight_shape(self) -> tuple[int, ...]:
        rows = (self.k, self.n) if self.weight_layout == "kn" else (self.n, self.k)
        return (*self.lead, *rows) if self.weight_batched else rows

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (*self.lead, self.m, self.n)

    @property
    def activation_spec(self) -> ActivationSpec:
        """The activation's row of ACTIVATIONS."""
        return ACTIVATIONS[self.activation]

    @property
    def aux_layout(self) -> AuxLayout | None:
        """What the forward saves for the backward (None without an activation)."""
        return self.activation_spec.aux

    @property
    def aux_shape(self) -> tuple[int, ...]:
        """The saved aux: the pre-activation, or for ReLU cuBLASLt's bit-mask (u8)."""
        aux = self.aux_layout
        return self.out_shape if aux is None else (*self.lead, self.m, aux.columns(self.n))

    @property
    def aux_element(self) -> ElementKind:
        aux = self.aux_layout
        return self.element if aux is None else aux.element(self.element)

    @property
    def aux_strides(self) -> tuple[int, ...] | None:
        """The strides (in the aux's elements) of the aux the plans are built for: rows padded
        to the smallest stride cuBLASLt accepts (``AuxLayout.row_stride``), batches of M such
        rows. None without an activation."""
        aux = self.aux_layout
        if aux is None:
            return None
        row = aux.row_stride(self.n)
        return (self.m * row, row, 1) if self.lead else (row, 1)


class LinearDescriptor(_LinearShape):
    """``out = act(x @ W + bias + residual)``; ``save_aux`` keeps what the backward needs."""

    bias: bool = True
    residual: bool = False
    save_aux: bool = False

    @field_validator("save_aux")
    @classmethod
    def _aux_needs_activation(cls, save_aux: bool, info: ValidationInfo) -> bool:
        activation = info.data.get("activation")
        if save_aux and activation is not None and ACTIVATIONS[activation].aux is None:
            raise ValueError("save_aux=True needs an activation: with activation='none' the "
                             "backward needs no aux")
        return save_aux


class LinearBackwardDescriptor(_LinearShape):
    """Gradients of a LinearDescriptor's forward, from grad_out and the aux it saved."""

    need_input_grad: bool = True
    need_weight_grad: bool = True
    need_bias_grad: bool = True
    need_pre_grad: bool = False  # d_pre itself: the residual's gradient

    @field_validator("need_pre_grad")
    @classmethod
    def _pre_grad_needs_activation(cls, need_pre_grad: bool, info: ValidationInfo) -> bool:
        activation = info.data.get("activation")
        if need_pre_grad and activation is not None and ACTIVATIONS[activation].d_pre is None:
            raise ValueError("need_pre_grad=True needs an activation: with activation='none' the "
                             "pre-activation's gradient is grad_out itself")
        return need_pre_grad

    @model_validator(mode="after")
    def _some_output(self) -> LinearBackwardDescriptor:
        if not (self.need_input_grad or self.need_weight_grad or self.need_bias_grad
                or self.need_pre_grad):
            raise ValueError("need_input_grad, need_weight_grad, need_bias_grad and "
                             "need_pre_grad cannot all be False")
        return self


@dataclass
class LinearArgs:
    """x, weight and out always; bias, residual and aux as the descriptor says."""

    x: Any
    weight: Any
    bias: Any = None
    residual: Any = None
    out: Any = None
    aux: Any = None


@dataclass
class LinearBackwardArgs:
    """grad_out, x, weight, the forward's aux (with an activation), and the gradients asked for."""

    grad_out: Any
    x: Any
    weight: Any
    aux: Any = None
    grad_x: Any = None
    grad_weight: Any = None
    grad_bias: Any = None
    grad_pre: Any = None


# -- binding: shapes, types, presence and aliasing, each error naming the argument -------------

def _describe(desc: _LinearShape, name: str) -> str:
    """The expected shape in words, for error messages."""
    lead = "batch, " if desc.batch is not None else ""
    if name == "aux" and desc.aux_layout is not None:
        return desc.aux_layout.describe(lead)
    w_rows = "K, N" if desc.weight_layout == "kn" else "N, K"
    weight = (f"[{lead if desc.weight_batched else ''}{w_rows}] in the "
              f"'{desc.weight_layout}' layout")
    return {"x": f"[{lead}M, K]", "grad_x": f"[{lead}M, K]", "weight": weight,
            "grad_weight": weight, "bias": "[N], to match N of the output",
            "grad_bias": "[N]"}.get(name, f"[{lead}M, N]")


def _tensor(obj: Any, name: str, desc: _LinearShape, shape: tuple[int, ...],
            element: ElementKind) -> TensorView:
    view = wrap(obj, name)
    if view.shape != shape:
        raise ShapeMismatch(f"{name} must have shape {shape} ({_describe(desc, name)}), got "
                            f"{view.shape}", argument=name)
    if view.element is not element or (shape[-1] > 1 and view.strides[-1] != 1):
        expect(view, name, shape=shape, element=element)  # raises the standard error
    return view


def _optional(obj: Any, name: str, wanted: bool, condition: str, make) -> TensorView | None:
    present = argument_when(obj, name, wanted, condition)
    return None if present is None else make(present)


def _bind_forward(desc: LinearDescriptor, args: LinearArgs) -> BoundArgs:
    expect_args_type(args, LinearArgs)
    e = desc.element
    x = _tensor(args.x, "x", desc, desc.x_shape, e)
    w = _tensor(args.weight, "weight", desc, desc.weight_shape, e)
    bias = _optional(args.bias, "bias", desc.bias, "the descriptor has bias=True",
                     lambda o: _tensor(o, "bias", desc, (desc.n,), e))
    residual = _optional(args.residual, "residual", desc.residual,
                         "the descriptor has residual=True",
                         lambda o: _tensor(o, "residual", desc, desc.out_shape, e))
    out = _optional(args.out, "out", True, "writing the result",
                    lambda o: _tensor(o, "out", desc, desc.out_shape, e))
    aux = _optional(args.aux, "aux", desc.save_aux, "the descriptor has save_aux=True",
                    lambda o: _tensor(o, "aux", desc, desc.aux_shape, desc.aux_element))
    inputs = {"x": x, "weight": w, "bias": bias}
    if residual is not None and not residual.same_layout(out):  # out += ... in place is fine
        inputs["residual"] = residual  # (an in-place residual is out, which aux is checked against)
    expect_no_overlaps({**inputs, "out": out, "aux": aux}, ("out", "aux"))
    return BoundArgs({"x": x, "weight": w, "bias": bias, "residual": residual, "out": out,
                      "aux": aux}, outputs=("out", "aux"))


def _bind_backward(desc: LinearBackwardDescriptor, args: LinearBackwardArgs) -> BoundArgs:
    expect_args_type(args, LinearBackwardArgs)
    e = desc.element
    grad_out = _tensor(args.grad_out, "grad_out", desc, desc.out_shape, e)
    x = _tensor(args.x, "x", desc, desc.x_shape, e)
    w = _tensor(args.weight, "weight", desc, desc.weight_shape, e)
    aux = _optional(args.aux, "aux", desc.aux_layout is not None,
                    "the activation is not 'none' (the forward's saved aux)",
                    lambda o: _tensor(o, "aux", desc, desc.aux_shape, desc.aux_element))
    outputs = {
        "grad_x": _optional(args.grad_x, "grad_x", desc.need_input_grad,
                            "need_input_grad", lambda o: _tensor(o, "grad_x", desc,
                                                                     desc.x_shape, e)),
        "grad_weight": _optional(args.grad_weight, "grad_weight", desc.need_weight_grad,
                                 "need_weight_grad",
                                 lambda o: _tensor(o, "grad_weight", desc, desc.weight_shape, e)),
        "grad_bias": _optional(args.grad_bias, "grad_bias", desc.need_bias_grad,
                               "need_bias_grad",
                               lambda o: _tensor(o, "grad_bias", desc, (desc.n,), e)),
        "grad_pre": _optional(args.grad_pre, "grad_pre", desc.need_pre_grad,
                              "need_pre_grad",
                              lambda o: _tensor(o, "grad_pre", desc, desc.out_shape, e)),
    }
    expect_no_overlaps({"grad_out": grad_out, "x": x, "weight": w, "aux": aux, **outputs},
                       tuple(outputs))
    return BoundArgs({"grad_out": grad_out, "x": x, "weight": w, "aux": aux, **outputs},
                     outputs=tuple(outputs))


# -- what verify and the bench allocate, and the standard problems ------------------------------

def _forward_signature(desc: LinearDescriptor) -> dict[str, TensorSpec]:
    e = desc.element
    signature = {"x": TensorSpec(desc.x_shape, e), "weight": TensorSpec(desc.weight_shape, e)}
    if desc.bias:
        signature["bias"] = TensorSpec((desc.n,), e)
    if desc.residual:
        signature["residual"] = TensorSpec(desc.out_shape, e)
    signature["out"] = TensorSpec(desc.out_shape, e, "out")
    if desc.save_aux:
        signature["aux"] = TensorSpec(desc.aux_shape, desc.aux_element, "out", desc.aux_strides)
    return signature


def _backward_signature(desc: LinearBackwardDescriptor) -> dict[str, TensorSpec]:
    e = desc.element
    signature = {"grad_out": TensorSpec(desc.out_shape, e), "x": TensorSpec(desc.x_shape, e),
                 "weight": TensorSpec(desc.weight_shape, e)}
    if desc.aux_layout is not None:
        signature["aux"] = TensorSpec(desc.aux_shape, desc.aux_element, strides=desc.aux_strides)
    for flag, name, shape in (("need_input_grad", "grad_x", desc.x_shape),
                              ("need_weight_grad", "grad_weight", desc.weight_shape),
                              ("need_bias_grad", "grad_bias", (desc.n,)),
                              ("need_pre_grad", "grad_pre", desc.out_shape)):
        if getattr(desc, flag):
            signature[name] = TensorSpec(shape, e, "out")
    return signature


# M, N and K all different and mostly odd, every layout and batch mode. A saved GELU or SiLU aux
# with N % 8 != 0 has padded rows (the signature's aux_strides; verify poisons the padding); the
# ReLU mask is u8, which verify does not generate as a backward's input, so ReLU training is
# checked by its own GPU test. gelu_erf and silu exercise the separate activation pass: from a
# saved aux, and in place in a batch with a residual.
_FORWARD_SAMPLES = (
    dict(m=37, n=72, k=56, weight_layout="kn", activation="gelu_tanh", save_aux=True),
    dict(m=33, n=65, k=47, weight_layout="nk", activation="relu"),
    dict(m=129, n=257, k=100, weight_layout="nk", bias=False),
    dict(m=64, n=96, k=80, weight_layout="kn", residual=True),
    dict(m=17, n=40, k=24, batch=3, weight_batched=True, activation="gelu_tanh", save_aux=True),
    dict(m=31, n=48, k=72, batch=2, weight_layout="kn", activation="relu", residual=True),
    dict(m=9, n=33, k=20, batch=4, weight_batched=True, weight_layout="kn"),
    dict(m=256, n=512, k=384, activation="gelu_tanh", save_aux=True),
    dict(m=45, n=80, k=36, activation="gelu_erf", save_aux=True),
    dict(m=23, n=56, k=40, batch=2, weight_layout="kn", activation="silu", residual=True),
    dict(m=19, n=33, k=24, activation="gelu_erf"),
    dict(m=19, n=33, k=24, activation="gelu_tanh", save_aux=True),
    dict(m=11, n=45, k=30, batch=2, activation="silu", save_aux=True),
)
_BACKWARD_SAMPLES = (
    dict(m=37, n=72, k=56, weight_layout="kn", activation="gelu_tanh"),
    dict(m=33, n=65, k=47, weight_layout="nk"),
    dict(m=64, n=96, k=80, activation="gelu_tanh", need_weight_grad=False, need_bias_grad=False),
    dict(m=17, n=40, k=24, batch=3, weight_batched=True, activation="gelu_tanh"),
    dict(m=31, n=48, k=72, batch=2, weight_layout="kn"),
    dict(m=9, n=33, k=20, batch=4, weight_batched=True, weight_layout="kn"),
    dict(m=40, n=64, k=32, activation="gelu_tanh", need_pre_grad=True, need_input_grad=False),
    dict(m=256, n=512, k=384, activation="gelu_tanh"),
    dict(m=45, n=80, k=36, activation="gelu_erf"),
    dict(m=23, n=56, k=40, batch=2, weight_layout="kn", activation="silu"),
    dict(m=19, n=33, k=24, activation="gelu_tanh"),
    dict(m=11, n=45, k=30, batch=2, activation="silu", need_pre_grad=True),
)


def _element_fields(element: ElementKind) -> dict:
    if element is ElementKind.tf32:
        return {"element": ElementKind.f32, "tf32": True}
    return {"element": element}


def _forward_samples(element: ElementKind) -> list[LinearDescriptor]:
    return [LinearDescriptor(**shape, **_element_fields(element)) for shape in _FORWARD_SAMPLES]


def _backward_samples(element: ElementKind) -> list[LinearBackwardDescriptor]:
    return [LinearBackwardDescriptor(**shape, **_element_fields(element))
            for shape in _BACKWARD_SAMPLES]


def _forward_large(desc: LinearDescriptor) -> dict[str, float]:
    # x a quarter of the range below the top, W small enough that K products stay an eighth
    # below it, with bias and residual at that size: act(x @ W + bias + residual) is finite.
    top = desc.element.max_exponent - 2
    return {"x": 2.0 ** top, "weight": 2.0 ** (-3 - bits_for(desc.k)),
            "bias": 2.0 ** (top - 3), "residual": 2.0 ** (top - 3)}


def _backward_large(desc: LinearBackwardDescriptor) -> dict[str, float]:
    # x, W and the pre-activation near the top of the range and grad_out small enough that
    # grad_x (N terms of d_pre W) and grad_weight (every row's x d_pre) stay below it.
    top = desc.element.max_exponent - 2
    rows = desc.m * (desc.batch or 1)
    return {"x": 2.0 ** top, "weight": 2.0 ** top, "aux": 2.0 ** top,
            "grad_out": 2.0 ** (-1 - bits_for(max(rows, desc.n)))}


def _training_backward(desc: LinearDescriptor) -> LinearBackwardDescriptor:
    if desc.aux_layout is not None and not desc.save_aux:
        raise InvalidProblem("training needs save_aux=True: the backward of "
                             f"activation='{desc.activation}' reads the aux the forward saves",
                             field="save_aux")
    shape = desc.model_dump(include={"m", "n", "k", "batch", "weight_layout", "weight_batched",
                                     "element", "tf32", "activation"})
    has_d_pre = desc.activation_spec.d_pre is not None  # else d_pre is grad_out itself
    return LinearBackwardDescriptor(**shape, need_bias_grad=desc.bias,
                                    need_pre_grad=desc.residual and has_d_pre)


LINEAR_FORWARD: OpContract[LinearDescriptor] = OpContract(
    name="linear_forward",
    category=OpCategory.gemm,
    descriptor=LinearDescriptor,
    args=LinearArgs,
    bind=_bind_forward,
    summary="out = act(x @ W + bias + residual) [+ aux], row-major",
    signature=_forward_signature,
    sample_problems=_forward_samples,
    training_backward=_training_backward,
    large_scales=_forward_large,
)

LINEAR_BACKWARD: OpContract[LinearBackwardDescriptor] = OpContract(
    name="linear_backward",
    category=OpCategory.gemm,
    descriptor=LinearBackwardDescriptor,
    args=LinearBackwardArgs,
    bind=_bind_backward,
    summary="grad_x, grad_weight, grad_bias (and d_pre) of linear_forward, from its aux",
    signature=_backward_signature,
    sample_problems=_backward_samples,
    large_scales=_backward_large,
)

OPS = (LINEAR_FORWARD, LINEAR_BACKWARD)
