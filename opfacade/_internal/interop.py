"""Arrays that arrive through a protocol rather than as a package opfacade knows:
``__cuda_array_interface__`` (CuPy, numba, JAX and others) and DLPack capsules (read in place
through ctypes, without a framework).

``tensors.wrap`` calls ``cuda_array_interface`` and the two readers here; nothing else should.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..errors import DeviceMismatch, InvalidArgument
from ..types import ElementKind
from .log import LOG
from .view import (
    ELEMENT_BY_NAME,
    TensorView,
    c_strides,
    element_strides,
    unsupported_element,
)

__all__ = ["cuda_array_interface", "wrap_cuda_array_interface", "wrap_dlpack"]

# Array-interface type strings without their byte-order character.
_BY_TYPESTR = {"f8": "float64", "f4": "float32", "f2": "float16", "i4": "int32", "i8": "int64",
               "u1": "uint8"}


# ----------------------------------------------------------------------------- CUDA array interface


def cuda_array_interface(obj: object, name: str) -> dict | None:
    """``obj.__cuda_array_interface__`` when it has a well-formed one; None when it has none, or
    when reading it raised and ``obj`` also speaks DLPack (which then decides)."""
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
        return ELEMENT_BY_NAME[dtype]
    # Element types numpy cannot spell (bfloat16, fp8 export as '<V2', '|V1'): trust obj.dtype.
    own = getattr(getattr(obj, "dtype", None), "name", None)
    if isinstance(own, str) and own in ELEMENT_BY_NAME and code.startswith("V"):
        return ELEMENT_BY_NAME[own]
    try:
        parsed = np.dtype(typestr)
        described = f"raw bytes {typestr!r}" if parsed.kind == "V" else parsed.name
    except TypeError:
        described = repr(typestr)
    if order == ">" and dtype is not None:
        described = f"big-endian {described}"
    raise unsupported_element(name, described)


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
    except Exception as error:  # no cuda-python, no driver: the CuPy fallback below decides
        LOG.debug("%s: cuda-python cannot place pointer %#x (%s); asking CuPy", name, ptr, error)
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


def wrap_cuda_array_interface(obj, interface: dict, name: str, root: str) -> TensorView:
    """The view of ``obj`` read from its ``interface``; ``root`` is its package ("cupy" reads the
    device from the array, anything else asks the driver which device owns the pointer)."""
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
        strides = element_strides(tuple(int(s) for s in byte_strides), element.itemsize, name)
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
    except Exception as error:
        LOG.debug("no current CUDA context to place a null pointer (%s): cuda:0", error)
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
        raise unsupported_element(name, f"a vector of {dtype.lanes} lanes")
    element = _BY_DLPACK.get((dtype.code, dtype.bits))
    if element is None:
        kind = _DLPACK_CODE_NAMES.get(dtype.code)
        what = f"{kind}{dtype.bits}" if kind else f"DLPack code {dtype.code} ({dtype.bits} bits)"
        raise unsupported_element(name, what)
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


def wrap_dlpack(obj, name: str, root: str) -> TensorView:
    """The view of ``obj``'s DLPack capsule, read in place; JAX (``root``) exports are
    read-only."""
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
