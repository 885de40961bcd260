"""The interop edge: every foreign array is wrapped once, here, into a ``TensorView``.

A ``TensorView`` is the only tensor the rest of opfacade sees: a pointer, a shape, strides in
elements, an ``ElementKind``, a device ordinal (``None`` for host memory) and the name of the
package that owns the memory (which decides the default stream and where scratch comes from).

torch, CuPy and JAX are never imported here unless the caller handed over one of their objects:
the owner is recognised by ``type(obj).__module__`` first, and the package imported only then.
The ``check`` helpers at the bottom are what every op calls to turn a mismatch into a typed error
that names the argument, the expected and the actual value.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ..errors import (
    DeviceMismatch,
    DTypeMismatch,
    InvalidArgument,
    LayoutMismatch,
    ShapeMismatch,
    Unsupported,
)
from ..types import ElementKind

__all__ = [
    "TensorView",
    "c_strides",
    "wrap",
    "as_numpy",
    "dtype_name",
    "numpy_dtype",
    "type_name",
    "expect",
    "expect_aligned",
    "expect_args_type",
    "expect_no_overlap",
    "expect_no_overlaps",
    "expect_writable",
]

# The frameworks' dtype names (numpy, torch without its prefix, ml_dtypes) for each element.
_BY_NAME: dict[str, ElementKind] = {
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
_NAME_OF: dict[ElementKind, str] = {kind: name for name, kind in _BY_NAME.items()}
_NAME_OF[ElementKind.tf32] = "float32"  # tf32 is stored as float32
_SUPPORTED = ", ".join(kind.value for kind in _BY_NAME.values())

# Array-interface type strings without their byte-order character.
_BY_TYPESTR = {"f8": "float64", "f4": "float32", "f2": "float16", "i4": "int32", "i8": "int64",
               "u1": "uint8"}


def dtype_name(element: ElementKind) -> str:
    """The numpy/torch/ml_dtypes name of the storage type of ``element`` (tf32 -> float32)."""
    return _NAME_OF[ElementKind(element)]


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

    def same_layout(self, other: TensorView) -> bool:
        """Same pointer, shape and strides: the two views address exactly the same elements."""
        return (self.ptr, self.shape, self.strides) == (other.ptr, other.shape, other.strides)


# ----------------------------------------------------------------------------- wrapping


def wrap(obj: object, name: str) -> TensorView:
    """Wraps a torch tensor, CuPy/JAX/numba array, NumPy array or DLPack producer.

    Args:
        obj: the user's array; a ``TensorView`` is returned as it is.
        name: the argument's name, used in every error message.

    Raises:
        InvalidArgument: ``obj`` is no array this function knows, or its protocol data is broken.
        DTypeMismatch: its element type is none of opfacade's.
        LayoutMismatch: its strides are not whole elements, or it is not a dense tensor.
        DeviceMismatch: it lives on a device that is neither the host nor a CUDA GPU.
    """
    if isinstance(obj, TensorView):
        return obj
    root = _root_module(obj)
    if root == "torch":
        view = _wrap_torch(obj, name)
        if view is not None:
            return view
    if isinstance(obj, np.ndarray):
        return _wrap_numpy(obj, name)
    interface = _cuda_array_interface(obj, name)
    if interface is not None:
        return _wrap_cuda_array_interface(obj, interface, name, root)
    if hasattr(obj, "__dlpack__"):
        return _wrap_dlpack(obj, name, root)
    raise InvalidArgument(
        f"{name} must be a torch tensor, a CuPy/JAX array, a NumPy array or an object with "
        f"__dlpack__ or __cuda_array_interface__, got {type_name(obj)}",
        argument=name,
    )


def type_name(obj: object) -> str:
    """``list`` for builtins, ``package.module.Class`` for everything else."""
    kind = type(obj)
    module = kind.__module__ or ""
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _root_module(obj: object) -> str:
    return (type(obj).__module__ or "").split(".", 1)[0]


def _unsupported_element(name: str, what: str) -> DTypeMismatch:
    return DTypeMismatch(
        f"{name} has element type {what}, which opfacade does not support; "
        f"expected one of {_SUPPORTED}",
        argument=name,
    )


def _element_from_name(dtype: str, name: str) -> ElementKind:
    element = _BY_NAME.get(dtype)
    if element is None:
        raise _unsupported_element(name, dtype)
    return element


def _element_from_numpy(dtype: np.dtype, name: str) -> ElementKind:
    if dtype.byteorder == ">":
        raise DTypeMismatch(
            f"{name} has big-endian element type {dtype.str}; opfacade needs native byte order",
            argument=name,
        )
    return _element_from_name(dtype.name, name)


def _element_strides(byte_strides, itemsize: int, name: str) -> tuple[int, ...]:
    if any(stride % itemsize for stride in byte_strides):
        raise LayoutMismatch(
            f"{name} has byte strides {tuple(byte_strides)} that are not multiples of its "
            f"element size {itemsize}",
            argument=name,
        )
    return tuple(stride // itemsize for stride in byte_strides)


def c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a dense C-order (row-major) array of ``shape``: the one helper for it.

    A zero extent counts as one, as torch and NumPy lay out empty arrays, so that an empty
    tensor's strides still match what its framework reports."""
    strides, running = [], 1
    for extent in reversed(shape):
        strides.append(running)
        running *= max(extent, 1)
    return tuple(reversed(strides))


_torch_elements: dict = {}


def _torch_element(torch, dtype) -> ElementKind | None:
    """ElementKind of a torch dtype, memoised: str(dtype) costs a microsecond per call."""
    element = _torch_elements.get(dtype)
    if element is None:
        name = str(dtype).removeprefix("torch.")
        element = _BY_NAME.get(name)
        if element is not None:
            _torch_elements[dtype] = element
    return element


def _wrap_torch(tensor, name: str) -> TensorView | None:
    import torch

    if not isinstance(tensor, torch.Tensor):
        return None
    # Fast path, a few attribute reads: a dense CUDA or CPU tensor of a supported dtype.
    element = _torch_element(torch, tensor.dtype)
    if (element is not None and tensor.layout is torch.strided and not tensor.is_neg()
            and (tensor.is_cuda or tensor.is_cpu) and not tensor.is_meta):
        try:
            ptr = tensor.data_ptr()
        except RuntimeError as error:  # fake and functional tensors have no storage
            raise InvalidArgument(f"{name} has no data pointer: {error}",
                                  argument=name) from None
        device = tensor.get_device() if tensor.is_cuda else None
        return TensorView(ptr, tuple(tensor.shape), tensor.stride(), element, device, "torch",
                          tensor)
    if tensor.layout != torch.strided:
        raise LayoutMismatch(
            f"{name} is a {str(tensor.layout).removeprefix('torch.')} tensor; opfacade needs a "
            f"dense (strided) tensor",
            argument=name,
        )
    if tensor.is_quantized:
        raise DTypeMismatch(
            f"{name} is a quantized tensor ({tensor.dtype}); opfacade needs a plain dtype, "
            f"one of {_SUPPORTED}",
            argument=name,
        )
    kind = tensor.device.type
    if kind == "meta" or tensor.is_meta:
        raise DeviceMismatch(f"{name} is a meta tensor, which has no storage", argument=name)
    if kind not in ("cpu", "cuda"):
        raise DeviceMismatch(
            f"{name} is on {tensor.device}; opfacade needs a CUDA tensor or host memory",
            argument=name,
        )
    element = _element_from_name(str(tensor.dtype).removeprefix("torch."), name)
    if tensor.is_neg():
        raise LayoutMismatch(
            f"{name} is a lazily negated view; call .resolve_neg() on it first", argument=name
        )
    try:
        ptr = tensor.data_ptr()
    except RuntimeError as error:  # fake and functional tensors have no storage
        raise InvalidArgument(f"{name} has no data pointer: {error}", argument=name) from None
    device = None if kind == "cpu" else tensor.device.index
    return TensorView(ptr, tuple(tensor.shape), tuple(tensor.stride()), element, device, "torch",
                      tensor)


def _wrap_numpy(array: np.ndarray, name: str) -> TensorView:
    element = _element_from_numpy(array.dtype, name)
    strides = _element_strides(array.strides, array.itemsize, name)
    return TensorView(array.ctypes.data, tuple(array.shape), strides, element, None, "numpy",
                      array, readonly=not array.flags.writeable)


# ----------------------------------------------------------------------------- CUDA array interface


def _cuda_array_interface(obj: object, name: str) -> dict | None:
    try:
        interface = obj.__cuda_array_interface__
    except AttributeError:
        return None
    except Exception as error:  # e.g. JAX raises for host or bfloat16 buffers: try DLPack
        if hasattr(obj, "__dlpack__"):
            return None
        raise InvalidArgument(
            f"{name}.__cuda_array_interface__ failed: {error}", argument=name
        ) from error
    if not isinstance(interface, dict) or not {"shape", "typestr", "data"} <= interface.keys():
        raise InvalidArgument(
            f"{name} has a malformed __cuda_array_interface__ (it needs shape, typestr and data), "
            f"got {interface!r}",
            argument=name,
        )
    return interface


def _element_from_typestr(typestr: str, obj: object, name: str) -> ElementKind:
    order, code = typestr[:1], typestr[1:]
    dtype = _BY_TYPESTR.get(code)
    if dtype is not None and (order in "<|=" or code == "u1"):
        return _BY_NAME[dtype]
    # Element types numpy cannot spell (bfloat16, fp8 export as '<V2', '|V1'): trust obj.dtype.
    own = getattr(getattr(obj, "dtype", None), "name", None)
    if isinstance(own, str) and own in _BY_NAME and code.startswith("V"):
        return _BY_NAME[own]
    try:
        parsed = np.dtype(typestr)
        described = f"raw bytes {typestr!r}" if parsed.kind == "V" else parsed.name
    except TypeError:
        described = repr(typestr)
    if order == ">" and dtype is not None:
        described = f"big-endian {described}"
    raise _unsupported_element(name, described)


def _device_ordinal_of_pointer(ptr: int, name: str) -> int:
    """The CUDA device that owns ``ptr``, asked of the driver (CuPy's runtime as a fallback).

    Only device or managed allocations count: with HMM the driver also reports a device for
    plain host addresses, which a kernel could then silently read or write.
    """
    reason = "the driver does not know it"
    try:
        from cuda.bindings import driver

        driver.cuInit(0)
        attrs = driver.CUpointer_attribute
        status, kind = driver.cuPointerGetAttribute(attrs.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
        _, managed = driver.cuPointerGetAttribute(attrs.CU_POINTER_ATTRIBUTE_IS_MANAGED, ptr)
        if status == driver.CUresult.CUDA_SUCCESS:
            if int(kind) == int(driver.CUmemorytype.CU_MEMORYTYPE_DEVICE) or bool(managed):
                status, ordinal = driver.cuPointerGetAttribute(
                    attrs.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
                if status == driver.CUresult.CUDA_SUCCESS:
                    return int(ordinal)
            reason = "it is not device or managed memory"
            raise LookupError(reason)
    except LookupError:
        raise DeviceMismatch(
            f"{name} exposes __cuda_array_interface__ but its pointer {ptr:#x} is not CUDA "
            f"device memory ({reason})", argument=name) from None
    except Exception:  # no cuda-python, no driver: the CuPy fallback below decides
        pass
    try:
        import cupy

        attributes = cupy.cuda.runtime.pointerGetAttributes(ptr)
        if int(attributes.type) not in (2, 3):  # cudaMemoryTypeDevice, cudaMemoryTypeManaged
            raise LookupError("it is not device or managed memory")
        return int(attributes.device)
    except Exception as error:
        raise DeviceMismatch(
            f"{name} exposes __cuda_array_interface__ but its pointer {ptr:#x} is not CUDA "
            f"memory that this process can see ({error})",
            argument=name,
        ) from None


def _wrap_cuda_array_interface(obj, interface: dict, name: str, root: str) -> TensorView:
    if interface.get("mask") is not None:
        raise InvalidArgument(
            f"{name} is a masked array (__cuda_array_interface__ has a mask); opfacade accepts "
            f"only unmasked arrays",
            argument=name,
        )
    shape = tuple(int(extent) for extent in interface["shape"])
    element = _element_from_typestr(str(interface["typestr"]), obj, name)
    ptr, readonly = interface["data"]
    ptr = int(ptr or 0)
    byte_strides = interface.get("strides")
    if byte_strides is None:
        strides = c_strides(shape)
    else:
        strides = _element_strides(tuple(int(s) for s in byte_strides), element.itemsize, name)
    if root == "cupy":
        package, device = "cupy", int(obj.device.id)
    else:
        package = "jax" if root in ("jax", "jaxlib") else "cuda_array_interface"
        device = _device_ordinal_of_pointer(ptr, name) if ptr else _null_pointer_device()
    readonly = bool(readonly) or package == "jax"  # JAX arrays are immutable
    return TensorView(ptr, shape, strides, element, device, package, obj, readonly=readonly)


def _null_pointer_device() -> int:
    """An empty array may carry no pointer: take the current device (0 when unknown)."""
    try:
        from cuda.bindings import driver

        status, device = driver.cuCtxGetDevice()
        if status == driver.CUresult.CUDA_SUCCESS:
            return int(device)
    except Exception:
        pass
    return 0


# ----------------------------------------------------------------------------- DLPack


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", _DLTensor)]


_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))

_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
# (code, bits) -> ElementKind; codes: 0 int, 1 uint, 2 float, 4 bfloat, 10 e4m3fn, 12 e5m2.
_BY_DLPACK = {
    (2, 64): ElementKind.f64, (2, 32): ElementKind.f32, (2, 16): ElementKind.f16,
    (4, 16): ElementKind.bf16, (10, 8): ElementKind.fp8_e4m3, (12, 8): ElementKind.fp8_e5m2,
    (0, 32): ElementKind.i32, (0, 64): ElementKind.i64, (1, 8): ElementKind.u8,
}
_DLPACK_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}


def _dltensor(capsule, name: str) -> tuple[_DLTensor, bool]:
    """The DLTensor inside a legacy or versioned capsule, and whether it is read-only."""
    if _capsule_is_valid(capsule, b"dltensor"):
        managed = _DLManagedTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
        return managed.dl_tensor, False
    if _capsule_is_valid(capsule, b"dltensor_versioned"):
        address = _capsule_pointer(capsule, b"dltensor_versioned")
        managed = _DLManagedTensorVersioned.from_address(address)
        if managed.version.major != 1:
            raise InvalidArgument(
                f"{name} exports DLPack {managed.version.major}.{managed.version.minor}; "
                f"opfacade reads DLPack 0.x and 1.x",
                argument=name,
            )
        return managed.dl_tensor, bool(managed.flags & _DL_READ_ONLY)
    raise InvalidArgument(
        f"{name}.__dlpack__() must return an unused 'dltensor' capsule, got {capsule!r}",
        argument=name,
    )


def _dlpack_element(dtype: _DLDataType, name: str) -> ElementKind:
    if dtype.lanes != 1:
        raise _unsupported_element(name, f"a vector of {dtype.lanes} lanes")
    element = _BY_DLPACK.get((dtype.code, dtype.bits))
    if element is None:
        kind = _DLPACK_CODE_NAMES.get(dtype.code)
        what = f"{kind}{dtype.bits}" if kind else f"DLPack code {dtype.code} ({dtype.bits} bits)"
        raise _unsupported_element(name, what)
    return element


def _dlpack_device(device: _DLDevice, name: str) -> int | None:
    if device.device_type in (_DL_CPU, _DL_CUDA_HOST):
        return None
    if device.device_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        return int(device.device_id)
    raise DeviceMismatch(
        f"{name} is on DLPack device type {device.device_type}; opfacade needs CUDA (2), "
        f"CUDA managed (13) or host memory (1, 3)",
        argument=name,
    )


def _wrap_dlpack(obj, name: str, root: str) -> TensorView:
    try:
        capsule = obj.__dlpack__()
    except (BufferError, TypeError, ValueError, RuntimeError, NotImplementedError) as error:
        raise InvalidArgument(f"{name}.__dlpack__() failed: {error}", argument=name) from error
    tensor, readonly = _dltensor(capsule, name)
    if tensor.ndim < 0:
        raise InvalidArgument(f"{name} has DLPack ndim {tensor.ndim}", argument=name)
    element = _dlpack_element(tensor.dtype, name)
    device = _dlpack_device(tensor.device, name)
    shape = tuple(int(tensor.shape[i]) for i in range(tensor.ndim))
    if tensor.strides:
        strides = tuple(int(tensor.strides[i]) for i in range(tensor.ndim))
    else:
        strides = c_strides(shape)
    ptr = (tensor.data or 0) + tensor.byte_offset
    readonly = readonly or root in ("jax", "jaxlib")
    # The capsule stays unconsumed and referenced: its destructor calls the producer's deleter
    # when the view (and so the tuple) dies.
    return TensorView(ptr, shape, strides, element, device, "dlpack", (obj, capsule),
                      readonly=readonly)


# ----------------------------------------------------------------------------- unwrapping


class _HostBuffer:
    """Lends numpy the view's memory through ``__array_interface__``, keeping the view alive."""

    def __init__(self, view: TensorView, typestr: str):
        self.view = view
        self.__array_interface__ = {
            "version": 3,
            "shape": view.shape,
            "typestr": typestr,
            "data": (view.ptr, view.readonly),
            "strides": tuple(stride * view.itemsize for stride in view.strides),
        }


def as_numpy(view: TensorView, *, name: str = "tensor") -> np.ndarray:
    """A NumPy array over a host view's memory (no copy); the original array for NumPy views.

    Raises:
        InvalidArgument: the view is in device memory.
        Unsupported: bf16/fp8 host memory without ``ml_dtypes`` installed.
    """
    if view.device is not None:
        raise InvalidArgument(
            f"{name} is on cuda:{view.device}; only host memory can be seen as a NumPy array",
            argument=name,
        )
    if view.package == "numpy":
        return view.obj  # type: ignore[return-value]
    dtype = numpy_dtype(view.element)
    if view.size == 0:
        return np.empty(view.shape, dtype=dtype)
    # Lend the bytes as an unsigned integer of the same width, then reinterpret: numpy's typestr
    # cannot spell bfloat16 or fp8.
    array = np.asarray(_HostBuffer(view, f"<u{view.itemsize}"))
    return array.view(dtype)


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


# ----------------------------------------------------------------------------- checks


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


def expect_writable(view: TensorView, name: str) -> None:
    """Checks that the output's producer lets us write into it."""
    if view.readonly:
        raise InvalidArgument(
            f"{name} is read-only (its {view.package} producer marked it so); pass a writable "
            f"array",
            argument=name,
        )
