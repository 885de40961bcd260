"""Verify's device buffers, bit for bit: values rounded to an element type's storage
(``_to_bits``; bf16 as uint16 patterns, NumPy having no bfloat16) and back, inputs uploaded to
CuPy buffers in the layout a signature's strides give (``_device_tensor``; strides that are no
dense layout get a spanning buffer whose gaps hold poison), read back in logical order
(``download_bits``), and the check that a run left an input as uploaded (``still_holds``).
``opfacade.testing`` uses and re-exports them."""

from __future__ import annotations

import numpy as np

from ..types import ElementKind
from .contract import TensorSpec
from .view import TensorView

_STORAGE = {
    ElementKind.f64: np.float64, ElementKind.f32: np.float32, ElementKind.f16: np.float16,
    ElementKind.bf16: np.uint16,  # bit patterns; NumPy has no bfloat16
    ElementKind.i32: np.int32, ElementKind.i64: np.int64, ElementKind.u8: np.uint8,
}


def _to_bits(values: np.ndarray, element: ElementKind) -> np.ndarray:
    """float64 values to the element's storage, rounding to nearest even."""
    if element is ElementKind.bf16:
        bits = values.astype(np.float32).view(np.uint32)
        rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))
        return (rounded >> 16).astype(np.uint16)
    return values.astype(_STORAGE[element])


def _from_bits(bits: np.ndarray, element: ElementKind) -> np.ndarray:
    if element is ElementKind.bf16:
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return bits.astype(np.float64)


def storage_layout(spec: TensorSpec) -> tuple[list[int], tuple[int, ...]]:
    """(storage order, strides) of a buffer holding ``spec`` densely in the order its strides
    give (C order without them): dimensions from the largest stride to the smallest, and the
    strides a framework reports for that buffer, those of extent-1 dimensions included."""
    shape = tuple(spec.shape)
    order = (sorted(range(len(shape)), key=lambda d: -spec.strides[d]) if spec.strides
             else list(range(len(shape))))
    dense = [0] * len(shape)
    running = 1
    for d in reversed(order):
        dense[d] = running
        running *= shape[d]
    return order, tuple(dense)


def _device_tensor(spec: TensorSpec, device: int, values: np.ndarray | None) -> TensorView:
    """A CuPy buffer holding ``values`` (or poison) described by a TensorView of spec.element,
    laid out with ``spec.strides`` when given, else in C order. Strides that are no permuted
    dense layout (q sliced from a packed QKV, say) get a buffer spanning them whose gaps hold
    poison (NaN for floats), which must never reach an output."""
    import cupy

    shape = tuple(spec.shape)
    order, dense = storage_layout(spec)
    if spec.strides and any(n > 1 and s != w for n, s, w in zip(shape, dense, spec.strides,
                                                                   strict=True)):
        return _spanning_tensor(spec, device, values)
    with cupy.cuda.Device(device):
        if values is None:
            array = cupy.empty([shape[d] for d in order], dtype=_STORAGE[spec.element])
            array.view(cupy.uint8).fill(0xFF)
        else:
            bits = _to_bits(np.asarray(values).reshape(shape), spec.element)
            array = cupy.asarray(np.ascontiguousarray(bits.transpose(order)))
    return TensorView(array.data.ptr, shape, dense, spec.element, device, "cupy", array)


def _spanning_tensor(spec: TensorSpec, device: int, values: np.ndarray | None) -> TensorView:
    import cupy

    shape, strides = tuple(spec.shape), tuple(spec.strides)
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
    with cupy.cuda.Device(device):
        flat = cupy.empty(span, dtype=_STORAGE[spec.element])
        flat.view(cupy.uint8).fill(0xFF)
        if values is not None:
            bits = _to_bits(np.asarray(values).reshape(shape), spec.element)
            view = cupy.lib.stride_tricks.as_strided(
                flat, shape, tuple(s * flat.itemsize for s in strides))
            view[...] = cupy.asarray(bits)
    return TensorView(flat.data.ptr, shape, strides, spec.element, device, "cupy", flat)


def uploaded_bits(values: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """The bits _device_tensor uploads for ``values``, in logical order: what still_holds
    compares an input with (worked out once per problem, not once per run)."""
    return np.ascontiguousarray(_to_bits(np.asarray(values).reshape(spec.shape), spec.element))


def still_holds(view: TensorView, uploaded: np.ndarray) -> bool:
    """Whether an input made by _device_tensor still holds the bits uploaded into it
    (``uploaded_bits``), element by element in its logical order (a run wrote nothing there)."""
    return download_bits(view).tobytes() == uploaded.tobytes()


def download_bits(view: TensorView) -> np.ndarray:
    """The raw bits of a view made by _device_tensor, indexed in its logical order."""
    host = view.obj.get()
    return np.lib.stride_tricks.as_strided(
        host, view.shape, tuple(s * host.itemsize for s in view.strides)).copy()
