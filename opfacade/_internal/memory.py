"""Scratch and output memory, taken from the allocator of the package that owns the tensors.

torch tensors get torch's caching allocator, everything else CuPy's memory pool (CuPy is a
dependency of opfacade; torch is not). Either way the memory is allocated with the run's stream
current, so the pool ties the block to that stream: when the owner dies the block returns to that
stream's pool and is reused only by work ordered after the run on the same stream.

Small scratch (a run() without a workspace) comes from ``STREAM_SCRATCH`` instead: one block
kept per (device, stream), outside every framework's pool (see ``StreamScratch``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from ..errors import InvalidArgument, Unsupported
from ..types import ElementKind
from .device import DEVICES, on_device
from .log import LOG
from .streams import cupy_stream, current_torch_stream, torch_stream
from .tensors import dtype_name, numpy_dtype
from .view import TORCH_DTYPES

__all__ = ["STREAM_SCRATCH", "OutputAllocator", "StreamScratch", "allocate_bytes",
           "allocate_like", "scratch_bytes", "torch_empty"]


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


class _DeterministicFill:
    """torch's switches for the fill of uninitialized memory that
    ``torch.use_deterministic_algorithms(True)`` adds to every empty tensor
    (``torch.utils.deterministic.fill_uninitialized_memory``), read from torch once."""

    def __init__(self, torch) -> None:
        c = torch._C
        self.algorithms = c._get_deterministic_algorithms
        self.fills = c._get_deterministic_fill_uninitialized_memory
        self.set_fills = c._set_deterministic_fill_uninitialized_memory


_FILL: list[_DeterministicFill] = []


def torch_empty(torch, shape: tuple[int, ...], dtype, device, strides=None, *, like=None,
                zeroed: bool = False):
    """``torch.empty`` (``torch.empty_strided`` with ``strides``) for memory that opfacade's
    kernels write in full before anything reads it: an op's output or a run's scratch.
    ``zeroed``: filled with zeros on the current stream instead, for an output whose kernel
    leaves some of its bytes as it found them (cuBLASLt's ReLU bit-mask).

    ``like``: a dense tensor of exactly this shape, dtype, device and strides, allocated after as
    ``torch.empty_like(like)``, which keeps them and parses no arguments (1.55 us a call on the
    development host, where empty_strided with its keywords took 2.0). Without strides, a
    tuple's extents go to ``torch.empty`` as separate arguments: its parser took 1.9-2.0 us a
    call so on the development host, 2.9-3.0 us for the same tuple whole (sdpa's stats,
    linear's aux). Zeros without strides come from ``torch.zeros`` in that form (2.3 us there,
    where empty then zero_ took 2.9).

    Under ``torch.use_deterministic_algorithms(True)`` torch fills every empty tensor (NaN,
    or the largest integer), so that a read of uninitialized memory repeats: a kernel launch
    and one more pass over the bytes per allocation. Here nothing reads before it is written,
    so that fill is skipped: switched off around this allocation only. (examples/gpt.py's
    deterministic step ran 163 fills, 0.9 ms of GPU time on an H100; 99 of them were of our
    allocations, and they are gone.) Another thread's allocation in those few hundred
    nanoseconds goes unfilled too; the fill is a debugging aid that no op's result depends on.
    """
    if not _FILL:  # torch's switches, read at the first allocation (torch is imported by then)
        _FILL.append(_DeterministicFill(torch))
    fill = _FILL[0]
    switched = fill.algorithms() and fill.fills()  # the usual case: False after one C call
    if switched:
        fill.set_fills(False)
    try:
        if like is not None:
            output = torch.empty_like(like)
        elif strides is not None:
            output = torch.empty_strided(shape, strides, dtype=dtype, device=device)
        else:
            make = torch.zeros if zeroed else torch.empty
            if type(shape) is tuple and shape:
                return make(*shape, dtype=dtype, device=device)
            return make(shape, dtype=dtype, device=device)  # an int, a Size, or ()
    finally:
        if switched:
            fill.set_fills(True)
    return output.zero_() if zeroed else output


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
            buffer = torch_empty(torch, nbytes, torch.uint8, _TORCH_DEVICES[device])
            return int(buffer.data_ptr()), buffer
        with _on_torch_stream(torch, stream, device):
            buffer = torch_empty(torch, nbytes, torch.uint8, _TORCH_DEVICES[device])
        return int(buffer.data_ptr()), buffer
    import cupy

    with cupy.cuda.Device(device), cupy_stream(stream, device):
        memory = cupy.cuda.alloc(nbytes)
    return int(memory.ptr), memory


class _DriverMemory:
    """The stream-ordered allocator StreamScratch draws from: the CUDA driver's, through the
    runtime ``DEVICES`` asks (device.py: the driver's by ctypes, else CuPy's)."""

    @staticmethod
    def capturing_reader() -> Callable[[int], int]:
        """Whether a stream is being captured (nonzero): the runtime's call itself, bound once
        (it is asked on every run without a workspace)."""
        return DEVICES.runtime().streamIsCapturing

    @staticmethod
    def replace(old: int | None, size: int, device: int, stream: int) -> int:
        """A new block of ``size`` bytes on ``stream``; ``old`` freed after the stream's work."""
        runtime = DEVICES.runtime()
        with on_device(device):
            ptr = runtime.mallocAsync(size, stream)
            if old is not None:
                runtime.freeAsync(old, stream)
        return ptr

    @staticmethod
    def free_when_idle(ptr: int, device: int) -> None:
        runtime = DEVICES.runtime()
        with on_device(device):
            runtime.deviceSynchronize()
            runtime.free(ptr)


class StreamScratch:
    """Scratch kept per (device, stream) for runs that were given no workspace.

    Allocating a run's scratch from the framework costs a few microseconds per call (cuDNN's
    small SDPA graphs want 256 bytes), more than the rest of a memoised run(). One block per
    stream serves instead: work on one stream runs in order, so calls on it never use the block
    at once, and a bigger request replaces it in stream order (freed after the work enqueued
    before). The blocks come from the driver's stream-ordered allocator, outside torch's and
    CuPy's pools: a block that torch.compile's CUDA-graph trees met during their warm-up would
    otherwise belong to their pool and outlive it.

    Not served (``pointer`` gives None, and the caller allocates from the framework per call):
    requests over ``LIMIT`` bytes, which would be held for good, and streams being captured
    into a CUDA graph, whose replays may run beside later calls on another stream. A stream
    handle destroyed with work pending and reused at once by a new stream would share its block
    with that work; torch and CuPy keep their streams, so this is left unguarded.

    Args:
        memory: the allocator (``_DriverMemory``, the CUDA runtime; tests pass a fake).
    """

    LIMIT = 1 << 24  # 16 MiB: forward SDPA and linear scratch; backward dQ buffers go per call
    SMALLEST = 1 << 16  # blocks grow in powers of two from here, so few replacements happen

    def __init__(self, memory=None) -> None:
        self._memory = _DriverMemory() if memory is None else memory
        self._capturing: Callable[[int], int] | None = None  # bound at the first request
        self._blocks: dict[tuple[int, int], tuple[int, int]] = {}  # -> (pointer, bytes)
        self._lock = threading.Lock()

    def pointer(self, nbytes: int, device: int, stream: int) -> int | None:
        """The block for ``stream`` on ``device`` (at least ``nbytes``), or None where it does
        not serve (see the class doc); 0 for 0 bytes."""
        if nbytes == 0:
            return 0
        if nbytes > self.LIMIT:
            return None
        capturing = self._capturing
        if capturing is None:
            capturing = self._capturing = self._memory.capturing_reader()
        if capturing(stream):
            return None
        block = self._blocks.get((device, stream))
        if block is not None and block[1] >= nbytes:
            return block[0]
        return self._grow(nbytes, device, stream)

    def _grow(self, nbytes: int, device: int, stream: int) -> int | None:
        size = max(self.SMALLEST, 1 << (nbytes - 1).bit_length())
        with self._lock:
            block = self._blocks.get((device, stream))
            if block is not None and block[1] >= nbytes:  # another thread grew it
                return block[0]
            try:
                ptr = self._memory.replace(None if block is None else block[0], size, device,
                                           stream)
            except Exception as error:  # out of memory, or a capture elsewhere forbids it
                LOG.debug("no stream scratch of %d bytes on cuda:%d: %s", size, device, error)
                return None
            self._blocks[(device, stream)] = (ptr, size)
            return ptr

    def clear(self) -> None:
        """Frees every block once its device finishes what may still use it (clear_caches)."""
        with self._lock:
            blocks, self._blocks = self._blocks, {}
            for (device, _stream), (ptr, _size) in blocks.items():
                self._memory.free_when_idle(ptr, device)

    def __len__(self) -> int:
        return len(self._blocks)


STREAM_SCRATCH = StreamScratch()


def scratch_bytes(nbytes: int, device: int, package: str, stream: int,
                  stream_is_current: bool = False) -> tuple[int, object]:
    """Scratch for one run on ``stream``: the stream's block (``STREAM_SCRATCH``) where it
    serves, else ``allocate_bytes`` from the framework. Returns ``(pointer, owner)`` as
    ``allocate_bytes`` does (owner None for the stream's block, which is never freed under a
    run)."""
    ptr = STREAM_SCRATCH.pointer(nbytes, device, stream)
    if ptr is not None:
        return ptr, None
    return allocate_bytes(nbytes, device, package, stream, stream_is_current)


def allocate_like(
    shape: tuple[int, ...],
    element: ElementKind,
    device: int | None,
    package: str,
    stream: int,
    zeroed: bool = False,
) -> object:
    """An uninitialised array for an output: a torch tensor for torch, else a CuPy array.
    ``zeroed``: filled with zeros instead, in ``stream``'s order (an output whose kernel leaves
    some of its bytes as it found them).

    ``device=None`` (host memory) gives a CPU torch tensor for torch, else a NumPy array
    (bf16/fp8 through ml_dtypes); ``stream`` is then ignored.

    Raises:
        Unsupported: bf16 or fp8 requested from CuPy (or from NumPy without ml_dtypes).
    """
    element = ElementKind(element)
    shape = tuple(shape)
    if package == "torch":
        import torch

        dtype = TORCH_DTYPES[element]
        if device is None:
            return (torch.zeros if zeroed else torch.empty)(shape, dtype=dtype)
        with _on_torch_stream(torch, stream, device):
            return torch_empty(torch, shape, dtype, _TORCH_DEVICES[device], zeroed=zeroed)
    if device is None:
        import numpy as np

        return (np.zeros if zeroed else np.empty)(shape, dtype=numpy_dtype(element))
    if element not in _CUPY_ELEMENTS:
        raise Unsupported(
            f"CuPy cannot hold {element.value} arrays, so opfacade cannot allocate a "
            f"{element.value} output for {package} inputs; pass torch tensors or an output array"
        )
    import cupy

    with cupy.cuda.Device(device), cupy_stream(stream, device):
        # cupy.zeros fills on the current stream: the one entered here.
        return (cupy.zeros if zeroed else cupy.empty)(shape, dtype=dtype_name(element))


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

    def __call__(self, shape: tuple[int, ...], element: ElementKind, zeroed: bool = False
                 ) -> object:
        if self._torch_device is not None:
            import torch

            return torch_empty(torch, tuple(shape), TORCH_DTYPES[element], self._torch_device,
                               zeroed=zeroed)
        return allocate_like(shape, element, self.device, self.owner, self.stream, zeroed)
