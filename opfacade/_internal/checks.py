"""The checks every op makes on its wrapped arguments: each turns a mismatch into a typed error
that names the argument, the expected and the actual value (``tensors.py`` re-exports them);
``self_aliasing`` says why an output's elements would share memory (Plan's placement check)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import numpy as np

from ..errors import DeviceMismatch, DTypeMismatch, InvalidArgument, LayoutMismatch, ShapeMismatch
from ..types import ElementKind

if TYPE_CHECKING:
    from .view import TensorView

__all__ = [
    "argument_when",
    "expect",
    "expect_aligned",
    "expect_args_type",
    "expect_no_overlap",
    "expect_no_overlaps",
    "layout_aliasing",
    "self_aliasing",
]


def argument_when(obj: object, name: str, wanted: bool, condition: str) -> object | None:
    """An argument the descriptor asks for when ``condition`` holds (``wanted``): required then,
    and None otherwise. The one wording of both errors for every op."""
    if wanted:
        if obj is None:
            raise InvalidArgument(f"{name} is required when {condition}", argument=name)
        return obj
    if obj is not None:
        raise InvalidArgument(f"{name} must be None unless {condition}", argument=name)
    return None


def _where(device: int | None) -> str:
    return "host memory" if device is None else f"cuda:{device}"


def expect(
    view: TensorView,
    name: str,
    *,
    shape: tuple[int, ...],
    element: ElementKind | tuple[ElementKind, ...],
    device: int | None | Literal["any_gpu", "any"] = "any",
    contiguous_last_dim: bool = True,
    like: str | None = None,
) -> None:
    """Checks shape, element type, device and (by default) a unit last-dimension stride.

    Args:
        device: the CUDA ordinal the plan runs on, ``None`` for host memory, "any_gpu", or
            "any" (the default) to leave the device to another check.
        like: the argument ``device`` was taken from, for "expected cuda:0 like input".
    """
    if view.shape != tuple(shape):
        raise ShapeMismatch(f"{name} must have shape {tuple(shape)}, got {view.shape}",
                            argument=name)
    allowed = (element,) if isinstance(element, ElementKind) else tuple(element)
    if view.element not in allowed:
        wanted = allowed[0].value if len(allowed) == 1 else "one of " + ", ".join(allowed)
        raise DTypeMismatch(f"{name} must have element type {wanted}, got {view.element.value}",
                            argument=name)
    _expect_device(view, name, device, like)
    if contiguous_last_dim and view.ndim and view.shape[-1] > 1 and view.strides[-1] != 1:
        raise LayoutMismatch(
            f"{name} must have unit stride in its last dimension, got strides {view.strides}",
            argument=name,
        )


def _expect_device(view: TensorView, name: str, device, like: str | None) -> None:
    if device == "any":
        return
    if device == "any_gpu":
        if view.device is None:
            raise DeviceMismatch(f"{name} is in host memory; this plan needs CUDA device memory",
                                 argument=name)
        return
    if view.device == device:
        return
    actual = "is in host memory" if view.device is None else f"is on cuda:{view.device}"
    if device is None:
        wanted = "this plan runs on the host and needs host memory"
    elif like is not None:
        wanted = f"expected {_where(device)} like {like}"
    else:
        wanted = f"this plan runs on {_where(device)}"
    raise DeviceMismatch(f"{name} {actual}; {wanted}", argument=name)


def expect_aligned(view: TensorView, name: str, alignment_bytes: int) -> None:
    """Checks that ``view.ptr`` is a multiple of ``alignment_bytes``."""
    offset = view.ptr % alignment_bytes
    if offset:
        raise LayoutMismatch(
            f"{name} must be {alignment_bytes}-byte aligned, but its address {view.ptr:#x} is "
            f"{offset} bytes past a {alignment_bytes}-byte boundary",
            argument=name,
        )


def expect_no_overlap(
    out_view: TensorView,
    out_name: str,
    in_view: TensorView,
    in_name: str,
    *,
    allow_same: bool = False,
) -> None:
    """Checks that an output shares no byte with an input (``allow_same``: exact aliasing is ok)."""
    if allow_same and out_view.same_layout(in_view):
        return
    if out_view.overlaps(in_view):
        out_lo, out_hi = out_view.byte_span()
        in_lo, in_hi = in_view.byte_span()
        raise LayoutMismatch(
            f"{out_name} overlaps {in_name} in memory ({out_name} spans [{out_lo:#x}, "
            f"{out_hi:#x}), {in_name} spans [{in_lo:#x}, {in_hi:#x})); pass separate buffers",
            argument=out_name,
        )


def expect_no_overlaps(views: dict[str, TensorView | None], outputs: tuple[str, ...]) -> None:
    """Checks that no output shares a byte with any other argument in ``views`` (absent ones
    None). Each span is computed once and each pair compared once, outputs in order: this runs
    on every checked call."""
    spans = {name: view.byte_span() for name, view in views.items() if view is not None}
    compared: set[str] = set()
    for name in outputs:
        if name not in spans:
            continue
        compared.add(name)
        lo, hi = spans[name]
        for other, (other_lo, other_hi) in spans.items():
            if other not in compared and lo < other_hi and other_lo < hi:
                expect_no_overlap(views[name], name, views[other], other)  # raises if they do


def expect_args_type(args: object, expected: type) -> None:
    """Checks that an op's arguments came in its args class (LinearArgs, SdpaArgs, ...)."""
    if not isinstance(args, expected):
        raise InvalidArgument(f"args must be {expected.__name__}, got {type(args).__name__}",
                              argument="args")


# Outputs with more elements than this whose strides interleave are refused rather than
# enumerated (a layout no framework makes; torch and NumPy views are never this case).
_ALIAS_CHECK_LIMIT = 1 << 20


def self_aliasing(view: TensorView) -> str:
    """Why two elements of ``view`` share memory (a broadcast, zero-stride or self-overlapping
    output), or "" when each element has its own address.

    Sorted by stride, each dimension must step past everything the smaller ones reach: true of
    every dense layout, its permutations and slices. Otherwise the offsets are enumerated, up to
    ``_ALIAS_CHECK_LIMIT`` elements.
    """
    return layout_aliasing(view.shape, view.strides)


def layout_aliasing(shape: tuple[int, ...], strides: tuple[int, ...]) -> str:
    """self_aliasing for a layout alone (extents and element strides, no buffer)."""
    size = math.prod(shape)
    if size == 0:
        return ""
    dims = sorted((abs(stride), extent) for extent, stride in zip(shape, strides, strict=True)
                  if extent > 1)
    reach = 0
    for stride, extent in dims:
        if stride <= reach:
            break
        reach += stride * (extent - 1)
    else:
        return ""
    if any(stride == 0 for stride, _ in dims):
        return "it is broadcast (a stride of 0 where the extent is more than 1)"
    if size > _ALIAS_CHECK_LIMIT:
        return (f"its elements interleave, and with {size} of them opfacade does not check "
                "that they never overlap")
    offsets = np.zeros((), dtype=np.int64)
    for stride, extent in dims:
        offsets = np.add.outer(offsets, np.arange(extent, dtype=np.int64) * stride)
    if np.unique(offsets).size < offsets.size:
        return "some of its elements overlap in memory"
    return ""
