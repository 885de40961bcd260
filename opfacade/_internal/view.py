"""What a wrapped array is: ``TensorView``, the element types opfacade knows by their frameworks'
names, and the one C-order stride helper.

This module sits below the wrappers (``tensors.py`` for torch and NumPy, ``interop.py`` for
``__cuda_array_interface__`` and DLPack) and the checks (``checks.py``); ``tensors.py``
re-exports its public names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import DTypeMismatch, LayoutMismatch, Unsupported
from ..types import ElementKind

__all__ = [
    "ELEMENT_BY_NAME",
    "SUPPORTED_ELEMENTS",
    "TORCH_DTYPES",
    "TensorView",
    "c_strides",
    "dtype_name",
    "element_from_name",
    "element_strides",
    "numpy_dtype",
    "unsupported_element",
]

# The frameworks' dtype names (numpy, torch without its prefix, ml_dtypes) for each element.
ELEMENT_BY_NAME: dict[str, ElementKind] = {
    "float64": ElementKind.f64,
    "float32": ElementKind.f32,
    "float16": ElementKind.f16,
    "bfloat16": ElementKind.bf16,
    "float8_e4m3fn": ElementKind.fp8_e4m3,
    "float8_e5m2": ElementKind.fp8_e5m2,
    "int32": ElementKind.i32,
    "int64": ElementKind.i64,
    "uint8": ElementKind.u8,
}
_NAME_OF: dict[ElementKind, str] = {kind: name for name, kind in ELEMENT_BY_NAME.items()}
_NAME_OF[ElementKind.tf32] = "float32"  # tf32 is stored as float32
SUPPORTED_ELEMENTS = ", ".join(kind.value for kind in ELEMENT_BY_NAME.values())


def dtype_name(element: ElementKind) -> str:
    """The numpy/torch/ml_dtypes name of the storage type of ``element`` (tf32 -> float32)."""
    return _NAME_OF[ElementKind(element)]


class _TorchDtypes(dict):
    """torch's dtype storing each element, looked up once (``dtype_name`` names it)."""

    def __missing__(self, element: ElementKind):
        import torch  # asked only for torch tensors, so torch is imported already

        self[element] = dtype = getattr(torch, dtype_name(element))
        return dtype


# ElementKind -> torch.dtype: a dict lookup on the per-call allocation paths.
TORCH_DTYPES = _TorchDtypes()


def numpy_dtype(element: ElementKind) -> np.dtype:
    """The NumPy dtype storing ``element``; bf16 and fp8 need ml_dtypes (else Unsupported)."""
    name = dtype_name(element)
    if hasattr(np, name):
        return np.dtype(name)
    try:
        import ml_dtypes
    except ImportError:
        raise Unsupported(
            f"NumPy needs the ml_dtypes package to hold {element.value} arrays; "
            f"pip install ml_dtypes"
        ) from None
    return np.dtype(getattr(ml_dtypes, name))


@dataclass(frozen=True, slots=True)
class TensorView:
    """One foreign array as opfacade sees it; ``obj`` keeps the user's memory alive.

    Strides are in elements. ``device`` is the CUDA ordinal, ``None`` for host memory.
    ``package`` is one of "torch", "cupy", "jax", "numpy", "dlpack", "cuda_array_interface".
    For DLPack imports ``obj`` is ``(original, capsule)`` so that the producer's deleter runs only
    when the view dies. Equality and hashing ignore ``obj``.
    """

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    element: ElementKind
    device: int | None
    package: str
    obj: object = field(compare=False, repr=False)
    readonly: bool = False

    def __post_init__(self) -> None:
        # Views are also built by hand (raw buffers, bf16 in CuPy memory): accept "bf16" and
        # lists. The wrappers already pass the right types, so the common case costs two checks.
        if type(self.element) is not ElementKind:
            object.__setattr__(self, "element", ElementKind(self.element))
        if type(self.shape) is not tuple or type(self.strides) is not tuple:
            object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
            object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.element.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def is_contiguous(self) -> bool:
        """C-contiguous; the strides of size-1 dimensions do not matter, nor any of an empty one."""
        if self.size == 0:
            return True
        expected = 1
        for extent, stride in zip(reversed(self.shape), reversed(self.strides), strict=True):
            if extent != 1 and stride != expected:
                return False
            expected *= extent
        return True

    def byte_span(self) -> tuple[int, int]:
        """The half-open address range ``[lo, hi)`` the elements touch; (ptr, ptr) when empty."""
        if self.size == 0:
            return self.ptr, self.ptr
        low = high = 0
        for extent, stride in zip(self.shape, self.strides, strict=True):
            reach = stride * (extent - 1)
            if reach < 0:
                low += reach
            else:
                high += reach
        return self.ptr + low * self.itemsize, self.ptr + (high + 1) * self.itemsize

    def overlaps(self, other: TensorView) -> bool:
        """True when the two byte spans share an address (conservative for interleaved views)."""
        lo, hi = self.byte_span()
        other_lo, other_hi = other.byte_span()
        return lo < hi and other_lo < other_hi and lo < other_hi and other_lo < hi

    def at(self, ptr: int) -> TensorView:
        """The same view at another address, every other fact unchanged (a checked call's view
        re-pointed by run()'s memo, which has verified the rest)."""
        moved = object.__new__(TensorView)
        for name in TensorView.__slots__:
            object.__setattr__(moved, name, getattr(self, name))
        object.__setattr__(moved, "ptr", ptr)
        return moved

    def same_layout(self, other: TensorView) -> bool:
        """Same pointer, shape and strides: the two views address exactly the same elements."""
        return (self.ptr, self.shape, self.strides) == (other.ptr, other.shape, other.strides)


def c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a dense C-order (row-major) array of ``shape``: the one helper for it.

    A zero extent counts as one, as torch and NumPy lay out empty arrays, so that an empty
    tensor's strides still match what its framework reports."""
    strides, running = [], 1
    for extent in reversed(shape):
        strides.append(running)
        running *= max(extent, 1)
    return tuple(reversed(strides))


def unsupported_element(name: str, what: str) -> DTypeMismatch:
    """The error for argument ``name`` whose element type (described as ``what``) is none of
    opfacade's."""
    return DTypeMismatch(
        f"{name} has element type {what}, which opfacade does not support; "
        f"expected one of {SUPPORTED_ELEMENTS}",
        argument=name,
    )


def element_from_name(dtype: str, name: str) -> ElementKind:
    """The element a framework's dtype name (``float32``, ``bfloat16``) stands for."""
    element = ELEMENT_BY_NAME.get(dtype)
    if element is None:
        raise unsupported_element(name, dtype)
    return element


def element_strides(byte_strides, itemsize: int, name: str) -> tuple[int, ...]:
    """Byte strides as element strides; LayoutMismatch when one is not whole elements."""
    if any(stride % itemsize for stride in byte_strides):
        raise LayoutMismatch(
            f"{name} has byte strides {tuple(byte_strides)} that are not multiples of its "
            f"element size {itemsize}",
            argument=name,
        )
    return tuple(stride // itemsize for stride in byte_strides)
