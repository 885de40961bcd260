"""The interop edge: every foreign array is wrapped once, here, into a ``TensorView``.

A ``TensorView`` is the only tensor the rest of opfacade sees: a pointer, a shape, strides in
elements, an ``ElementKind``, a device ordinal (``None`` for host memory) and the name of the
package that owns the memory (which decides the default stream and where scratch comes from).

torch, CuPy and JAX are never imported here unless the caller handed over one of their objects:
the owner is recognised by ``type(obj).__module__`` first, and the package imported only then.
torch tensors and NumPy arrays are read here; ``__cuda_array_interface__`` and DLPack producers in
``interop.py``. ``TensorView`` and its element vocabulary live in ``view.py``, and the ``expect``
checks every op calls, which turn a mismatch into a typed error naming the argument, the expected
and the actual value, in ``checks.py``; this module re-exports both, so that the rest of opfacade
imports the edge from one place.
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import (
    DeviceMismatch,
    DTypeMismatch,
    InvalidArgument,
    LayoutMismatch,
    OpFacadeError,
    Unsupported,
)
from ..types import ElementKind
from .checks import (
    argument_when,
    expect,
    expect_aligned,
    expect_args_type,
    expect_no_overlap,
    expect_no_overlaps,
)
from .interop import cuda_array_interface, wrap_cuda_array_interface, wrap_dlpack
from .view import (
    ELEMENT_BY_NAME,
    SUPPORTED_ELEMENTS,
    TensorView,
    c_strides,
    dtype_name,
    element_from_name,
    element_strides,
    numpy_dtype,
)

__all__ = [
    "PLAIN_TORCH_TYPES",
    "argument_when",
    "plain_torch_types",
    "TensorView",
    "as_numpy",
    "c_strides",
    "dtype_name",
    "expect",
    "expect_aligned",
    "expect_args_type",
    "expect_no_overlap",
    "expect_no_overlaps",
    "numpy_dtype",
    "type_name",
    "wrap",
]


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
    interface = cuda_array_interface(obj, name)
    if interface is not None:
        return wrap_cuda_array_interface(obj, interface, name, root)
    if hasattr(obj, "__dlpack__"):
        return wrap_dlpack(obj, name, root)
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


def _element_from_numpy(dtype: np.dtype, name: str) -> ElementKind:
    if dtype.byteorder == ">":
        raise DTypeMismatch(
            f"{name} has big-endian element type {dtype.str}; opfacade needs native byte order",
            argument=name,
        )
    return element_from_name(dtype.name, name)


_torch_elements: dict = {}

@functools.cache
def plain_torch_types(torch) -> tuple[type, type]:
    """torch.Tensor and nn.Parameter: the tensor types whose attribute reads are exact. Their
    subclasses (fake, functional, distributed tensors) answer differently, so run()'s memo,
    the functional forms' cheap reading and the torch ops' eager paths all treat only these
    as plain tensors. Takes the torch module: opfacade imports torch only when handed it."""
    return (torch.Tensor, torch.nn.Parameter)


# plain_torch_types once wrap has met torch (operands.facts reads these the cheap way).
PLAIN_TORCH_TYPES: set[type] = set()


def _torch_element(dtype) -> ElementKind | None:
    """ElementKind of a torch dtype, memoised: str(dtype) costs a microsecond per call."""
    element = _torch_elements.get(dtype)
    if element is None:
        name = str(dtype).removeprefix("torch.")
        element = ELEMENT_BY_NAME.get(name)
        if element is not None:
            _torch_elements[dtype] = element
    return element


def _storageless(torch, tensor, name: str, error: RuntimeError) -> OpFacadeError:
    """The error for a torch tensor without storage: a torch.func transform's wrapper (vmap's
    batched tensors; grad's, where the op was reached without its autograd.Function) is
    Unsupported, naming the transform; any other (fake, functional) is InvalidArgument."""
    functorch = torch._C._functorch
    if functorch.is_functorch_wrapped_tensor(tensor):
        interpreter = functorch.peek_interpreter_stack()
        transform = "a torch.func transform" if interpreter is None else (
            f"torch.func's {interpreter.key().name} transform")
        return Unsupported(f"{name} is a wrapper of {transform}, which opfacade's kernels cannot "
                           f"read: only torch.func.grad and vjp over opfacade.torch's drop-ins are "
                           f"supported")
    return InvalidArgument(f"{name} has no data pointer: {error}", argument=name)


def _wrap_torch(tensor, name: str) -> TensorView | None:
    import torch

    if not isinstance(tensor, torch.Tensor):
        return None
    # Fast path, a few attribute reads: a dense CUDA or CPU tensor of a supported dtype.
    element = _torch_element(tensor.dtype)
    if (element is not None and tensor.layout is torch.strided and not tensor.is_neg()
            and (tensor.is_cuda or tensor.is_cpu) and not tensor.is_meta):
        try:
            ptr = tensor.data_ptr()
        except RuntimeError as error:  # fake and functional tensors have no storage
            raise _storageless(torch, tensor, name, error) from None
        device = tensor.get_device() if tensor.is_cuda else None
        if type(tensor) not in PLAIN_TORCH_TYPES and type(tensor) in plain_torch_types(torch):
            PLAIN_TORCH_TYPES.add(type(tensor))
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
            f"one of {SUPPORTED_ELEMENTS}",
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
    element = element_from_name(str(tensor.dtype).removeprefix("torch."), name)
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
    strides = element_strides(array.strides, array.itemsize, name)
    return TensorView(array.ctypes.data, tuple(array.shape), strides, element, None, "numpy",
                      array, readonly=not array.flags.writeable)


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
