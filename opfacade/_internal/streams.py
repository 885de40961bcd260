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

import sys
import threading
from collections.abc import Callable, Iterable

from ..errors import InvalidArgument
from .log import LOG
from .tensors import TensorView, type_name

__all__ = [
    "StreamObjects", "current_cupy_stream", "current_torch_stream", "cupy_stream",
    "owning_package", "resolve_stream", "torch_stream", "torch_stream_reader",
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


# The readers of a package's current stream. run()'s memo binds ``torch_stream_reader``'s answer
# once and calls it on every call; the others take the package from sys.modules (the caller's
# tensors prove it is imported).
def torch_stream_reader(torch) -> Callable[[int], int]:
    """A call returning torch's current stream on a device: torch's private raw-stream reader
    when this torch has it (no stream object is made), else the public
    ``torch.cuda.current_stream`` (logged at DEBUG)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    LOG.debug("torch %s has no torch._C._cuda_getCurrentRawStream: its current stream is read "
              "through torch.cuda.current_stream", getattr(torch, "__version__", "?"))
    current_stream = torch.cuda.current_stream
    return lambda device: current_stream(device).cuda_stream


def current_torch_stream(device: int) -> int:
    """torch's current stream on ``device``, read the cheap way when torch has it."""
    return torch_stream_reader(sys.modules["torch"])(device)


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


class StreamObjects:
    """A package's stream objects for raw handles, one per ``(handle, device)``, made by ``make``
    on first use and kept (at most ``capacity``, the oldest dropped first). They own nothing: the
    handle's creator keeps the stream alive, so dropping one, or ``clear()``, is free."""

    def __init__(self, make: Callable[[int, int], object], capacity: int = 128) -> None:
        self._make = make
        self._capacity = capacity
        self._made: dict[tuple[int, int], object] = {}
        self._lock = threading.Lock()

    def __call__(self, handle: int, device: int):
        found = self._made.get((handle, device))
        if found is None:
            made = self._make(handle, device)
            with self._lock:  # two threads may both make one: the first stored wins
                found = self._made.get((handle, device))
                if found is None:
                    if len(self._made) >= self._capacity:
                        del self._made[next(iter(self._made))]
                    found = self._made[handle, device] = made
        return found

    def clear(self) -> None:
        with self._lock:
            self._made.clear()

    def __len__(self) -> int:
        return len(self._made)


class _StreamHandle:
    """A bare handle speaking the CUDA stream protocol, for ``cupy.cuda.Stream.from_external``."""

    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self.handle


def _cupy_stream_object(handle: int, device: int):
    """A CuPy stream object for a raw handle on ``device``.

    CuPy 14 deprecates ``ExternalStream`` for ``Stream.from_external``; older CuPy has only the
    former (logged at DEBUG).
    """
    import cupy

    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        with cupy.cuda.Device(device):
            return from_external(_StreamHandle(handle))
    LOG.debug("cupy %s has no Stream.from_external: stream %#x on cuda:%d wrapped by "
              "cupy.cuda.ExternalStream", getattr(cupy, "__version__", "?"), handle, device)
    return cupy.cuda.ExternalStream(handle, device)


def _torch_stream_object(handle: int, device: int):
    import torch

    return torch.cuda.ExternalStream(handle, device=torch.device("cuda", device))


# ``cupy_stream(handle, device)``, ``torch_stream(handle, device)``: the package's stream object
# for a raw handle on a device, to launch that package's work (or allocate its memory) on it.
cupy_stream = StreamObjects(_cupy_stream_object)
torch_stream = StreamObjects(_torch_stream_object)
