"""Scratch and output memory, taken from the allocator of the package that owns the tensors.

torch tensors get torch's caching allocator, everything else CuPy's memory pool (CuPy is a
dependency of opfacade; torch is not). Either way the memory is allocated with the run's stream
current, so the pool ties the block to that stream: when the owner dies the block returns to that
stream's pool and is reused only by work ordered after the run on the same stream.
"""

from __future__ import annotations

import contextlib

from ..errors import InvalidArgument, Unsupported
from ..types import ElementKind
from .streams import cupy_stream, current_torch_stream, torch_stream
from .tensors import dtype_name, numpy_dtype

__all__ = ["OutputAllocator", "allocate_bytes", "allocate_like"]


class _DeviceNames(dict):
    """The torch device strings ("cuda:0", ...), each made once: formatting one per call
    costs more than looking it up."""

    def __missing__(self, device: int) -> str:
        self[device] = name = f"cuda:{device}"
        return name


_TORCH_DEVICES = _DeviceNames()

# CuPy (numpy's dtypes) cannot hold bfloat16 or fp8.
_CUPY_ELEMENTS = frozenset({ElementKind.f64, ElementKind.f32, ElementKind.tf32, ElementKind.f16,
                            ElementKind.i32, ElementKind.i64, ElementKind.u8})


def _on_torch_stream(torch, stream: int, device: int) -> contextlib.AbstractContextManager:
    """Makes ``stream`` torch's current stream on ``device`` unless it already is (read the
    cheap way: this runs on every call that lets opfacade allocate)."""
    if current_torch_stream(device) == stream:
        return contextlib.nullcontext()
    return torch.cuda.stream(torch_stream(stream, device))


def allocate_bytes(nbytes: int, device: int, package: str, stream: int,
                   stream_is_current: bool = False) -> tuple[int, object]:
    """``nbytes`` of device memory usable on ``stream``; ``stream_is_current``: the caller knows
    ``stream`` is torch's current stream on ``device`` (nothing to read or switch).

    Returns:
        ``(pointer, owner)``; the memory lives as long as ``owner`` does. ``(0, None)`` for 0 bytes.

    Raises:
        InvalidArgument: ``nbytes`` is negative.
    """
    if nbytes < 0:
        raise InvalidArgument(f"nbytes must be non-negative, got {nbytes}", argument="nbytes")
    if nbytes == 0:
        return 0, None
    if package == "torch":
        import torch

        # torch's allocator serves the current stream of the device named, whichever device is
        # current: only the stream may need switching.
        if stream_is_current:
            buffer = torch.empty(nbytes, dtype=torch.uint8, device=_TORCH_DEVICES[device])
            return int(buffer.data_ptr()), buffer
        with _on_torch_stream(torch, stream, device):
            buffer = torch.empty(nbytes, dtype=torch.uint8, device=_TORCH_DEVICES[device])
        return int(buffer.data_ptr()), buffer
    import cupy

    with cupy.cuda.Device(device), cupy_stream(stream, device):
        memory = cupy.cuda.alloc(nbytes)
    return int(memory.ptr), memory


def allocate_like(
    shape: tuple[int, ...],
    element: ElementKind,
    device: int | None,
    package: str,
    stream: int,
) -> object:
    """An uninitialised array for an output: a torch tensor for torch, else a CuPy array.

    ``device=None`` (host memory) gives a CPU torch tensor for torch, else a NumPy array
    (bf16/fp8 through ml_dtypes); ``stream`` is then ignored.

    Raises:
        Unsupported: bf16 or fp8 requested from CuPy (or from NumPy without ml_dtypes).
    """
    element = ElementKind(element)
    shape = tuple(shape)
    if package == "torch":
        import torch

        dtype = getattr(torch, dtype_name(element))
        if device is None:
            return torch.empty(shape, dtype=dtype)
        with _on_torch_stream(torch, stream, device):
            return torch.empty(shape, dtype=dtype, device=_TORCH_DEVICES[device])
    if device is None:
        import numpy as np

        return np.empty(shape, dtype=numpy_dtype(element))
    if element not in _CUPY_ELEMENTS:
        raise Unsupported(
            f"CuPy cannot hold {element.value} arrays, so opfacade cannot allocate a "
            f"{element.value} output for {package} inputs; pass torch tensors or an output array"
        )
    import cupy

    with cupy.cuda.Device(device), cupy_stream(stream, device):
        return cupy.empty(shape, dtype=dtype_name(element))


class OutputAllocator:
    """Outputs for a functional call: the framework and stream of ``like``, resolved once.

    torch tensors with no stream named take the short way: torch's caching allocator already
    serves the current stream of the tensor's device, so nothing is resolved or switched (the
    stream lookups and context managers cost more host time than the allocation)."""

    __slots__ = ("device", "owner", "stream", "_torch_device")

    def __init__(self, like, stream: object):
        self.device = like.device
        if stream is None and like.package == "torch":  # the short way: nothing to resolve
            self.owner, self.stream, self._torch_device = "torch", None, like.obj.device
            return
        from .streams import owning_package, resolve_stream

        self.owner = owning_package([like], stream)
        self._torch_device = None
        self.stream = resolve_stream(stream, self.owner, self.device)

    def __call__(self, shape: tuple[int, ...], element: ElementKind) -> object:
        if self._torch_device is not None:
            import torch

            return torch.empty(tuple(shape), dtype=getattr(torch, dtype_name(element)),
                               device=self._torch_device)
        return allocate_like(shape, element, self.device, self.owner, self.stream)
