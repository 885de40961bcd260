"""The one place a ``stream=`` argument becomes a raw ``cudaStream_t`` handle (an int).

``stream=None`` means the current stream of the package that owns the tensors: torch's or CuPy's
current stream on the plan's device. JAX, numba and bare DLPack or ``__cuda_array_interface__``
producers have no current stream opfacade can ask for, so ``None`` means handle 0, the legacy
default stream, which synchronises with every other blocking stream on the device. A mix of
torch and CuPy device tensors has no single current stream: ``owning_package`` asks for an
explicit ``stream=``.
Host tensors (``device=None``) need no stream: ``None`` resolves to 0 without asking anyone.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterable

from ..errors import InvalidArgument
from .tensors import TensorView, type_name

__all__ = [
    "current_cupy_stream", "current_torch_stream", "cupy_stream", "owning_package",
    "resolve_stream",
]

# Packages with a notion of a "current stream", in the order they win when the caller passed one.
_CURRENT_STREAM_OWNERS = ("torch", "cupy")


def _bad_stream(stream: object) -> InvalidArgument:
    return InvalidArgument(
        "stream must be None, a non-negative int handle, a torch.cuda.Stream, a CuPy stream or "
        f"an object with __cuda_stream__, got {type_name(stream)}",
        argument="stream",
    )


def _checked_handle(handle: object, stream: object) -> int:
    if isinstance(handle, bool) or not isinstance(handle, int):
        raise _bad_stream(stream)
    if handle < 0:
        raise InvalidArgument(f"stream must be a non-negative handle, got {handle}",
                              argument="stream")
    return handle


def resolve_stream(stream: object, package: str, device: int | None) -> int:
    """The raw ``cudaStream_t`` to run on.

    Args:
        stream: None, an int handle, a torch stream (``.cuda_stream``), a CuPy stream (``.ptr``),
            an object implementing ``__cuda_stream__`` (cuda.core's protocol) or a
            ``cuda.bindings`` ``CUstream``/``cudaStream_t``.
        package: the owning package (``owning_package``), asked only when ``stream`` is None.
        device: the plan's device, whose current stream ``None`` stands for; ``None`` (host).

    Raises:
        InvalidArgument: ``stream`` is none of the above, or a negative handle.
    """
    if stream is None:
        return 0 if device is None else _current_stream(package, device)
    if isinstance(stream, int) and not isinstance(stream, bool):
        return _checked_handle(stream, stream)
    protocol = getattr(stream, "__cuda_stream__", None)
    if callable(protocol):
        result = protocol()
        if not isinstance(result, tuple) or len(result) != 2:
            raise InvalidArgument(
                f"stream.__cuda_stream__() must return (version, handle), got {result!r}",
                argument="stream",
            )
        return _checked_handle(result[1], stream)
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream, torch.cuda.ExternalStream
        return _checked_handle(stream.cuda_stream, stream)
    if hasattr(stream, "ptr"):  # cupy.cuda.Stream, cupy.cuda.ExternalStream
        return _checked_handle(stream.ptr, stream)
    if type(stream).__module__.startswith("cuda.bindings") and hasattr(stream, "getPtr"):
        return _checked_handle(int(stream), stream)
    raise _bad_stream(stream)


def _current_stream(package: str, device: int) -> int:
    if package == "torch":
        return current_torch_stream(device)
    if package == "cupy":
        return current_cupy_stream(device)
    return 0  # jax, numpy, dlpack, cuda_array_interface: the legacy default stream


# The two readers of a package's current stream. run()'s memo calls them on every call, so they
# take the package from sys.modules (the caller's tensors prove it is imported).
def current_torch_stream(device: int) -> int:
    """torch's current stream on ``device``, read the cheap way when torch has it."""
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def current_cupy_stream(device: int) -> int:
    """CuPy's current stream on ``device``."""
    return sys.modules["cupy"].cuda.get_current_stream(device).ptr


def owning_package(views: Iterable[TensorView], stream: object = None) -> str:
    """The package whose current stream and allocator serve a call on these tensors.

    Device tensors decide; host tensors only when there are none; "cupy" when there are no views
    at all. torch wins over CuPy, CuPy over the rest. Mixing torch and CuPy device tensors is
    ambiguous only for the stream, so it is an error only when ``stream`` is None.

    Raises:
        InvalidArgument: torch and CuPy device tensors together with ``stream=None``.
    """
    views = list(views)
    packages = [view.package for view in views if view.device is not None]
    packages = packages or [view.package for view in views]
    if not packages:
        return "cupy"
    if stream is None and all(owner in packages for owner in _CURRENT_STREAM_OWNERS):
        raise InvalidArgument(
            "stream must be passed explicitly when the device tensors come from both torch and "
            "CuPy, whose current streams may differ; got stream=None",
            argument="stream",
        )
    for owner in _CURRENT_STREAM_OWNERS:
        if owner in packages:
            return owner
    return packages[0]


class _StreamHandle:
    """A bare handle speaking the CUDA stream protocol, for ``cupy.cuda.Stream.from_external``."""

    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self.handle


@functools.lru_cache(maxsize=128)
def cupy_stream(handle: int, device: int):
    """A CuPy stream object for a raw handle on ``device``, to launch CuPy work on it.

    CuPy 14 deprecates ``ExternalStream`` for ``Stream.from_external``; older CuPy has only the
    former. Cached per ``(handle, device)``: the objects own nothing.
    """
    import cupy

    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        with cupy.cuda.Device(device):
            return from_external(_StreamHandle(handle))
    return cupy.cuda.ExternalStream(handle, device)
