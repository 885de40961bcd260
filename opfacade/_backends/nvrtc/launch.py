"""Loading NVRTC cubins onto a device and launching their kernels through CuPy.

Modules load lazily, once per (source file, device), under a lock that is checked again after it
is taken; compilation goes through the disk cache in compiler.py.
"""

from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np

from ..._internal.config import with_install_hint
from ..._internal.device import device_arch
from ..._internal.driver import INVALID_CONTEXT, bare_function, bind_default_context
from ..._internal.log import timed
from ..._internal.streams import cupy_stream
from ...errors import BackendUnavailable, LaunchFailed
from ...types import ElementKind
from .compiler import compile_cubin

__all__ = ["KERNELS", "KernelCache", "PackedLaunch", "available", "element_suffix", "get_kernel",
           "launch", "pointer", "programmatic", "resident_blocks"]


@functools.cache
def available() -> str | None:
    """Why NVRTC kernels cannot run in this process (with what to install), or None; asked
    once per process."""
    try:
        import cupy  # noqa: F401
        from cuda.bindings import nvrtc  # noqa: F401
    except Exception as error:  # ImportError, or a broken install raising anything else
        return with_install_hint(f"CuPy or cuda-python failed to import: {error}")
    return None


def element_suffix(element: ElementKind) -> str:
    """The element part of a linear kernel's name: TF32 problems store f32 (the kernels read and
    write storage types only)."""
    return "f32" if element in (ElementKind.f32, ElementKind.tf32) else element.value


def on_device(device: int):
    """``cupy.cuda.Device(device)`` for a call that needs a context (a module load, an occupancy
    query), on any thread: where none is current (a thread whose first CUDA work is opfacade's),
    device 0's primary context is made current first, as the runtime's first call would; CuPy's
    Device sets nothing where the runtime already reports the device, as it reports 0 there."""
    import cupy

    bind_default_context()
    return cupy.cuda.Device(device)


class KernelCache:
    """Modules loaded per (source file, device) and their kernels, built once under a lock that
    is checked again after it is taken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._modules: dict[tuple[str, int], object] = {}
        self._functions: dict[tuple[str, str, int], object] = {}
        # (kernel handle, threads, dynamic shared bytes) -> CTAs a multiprocessor holds. Keyed
        # by handle, so cleared with the modules: a reloaded kernel may reuse an address.
        self._resident: dict[tuple[int, int, int], int] = {}
        # kernel handle -> the dynamic shared memory it has been allowed (allow_shared).
        self._allowed: dict[int, int] = {}

    def _module(self, source: str, device: int):
        key = (source, device)
        module = self._modules.get(key)
        if module is None:
            with self._lock:
                module = self._modules.get(key)
                if module is None:
                    import cupy

                    compiled = compile_cubin(source, device_arch(device))
                    with timed("load %s on cuda:%d", source, device), on_device(device):
                        module = cupy.cuda.function.Module()
                        module.load(compiled.cubin)
                    self._modules[key] = module
        return module

    def get(self, source: str, name: str, device: int):
        """The CuPy Function for kernel ``name`` of native/<source> on ``device``."""
        key = (source, name, device)
        function = self._functions.get(key)
        if function is None:
            try:
                function = self._module(source, device).get_function(name)
            except Exception as error:
                raise BackendUnavailable(f"cannot load {name} from {source} on cuda:{device}: "
                                         f"{error}") from error
            self._functions[key] = function
        return function

    def resident_blocks(self, function, threads: int, shared_mem: int, device: int) -> int:
        """How many CTAs of ``function`` (``threads`` each, ``shared_mem`` bytes of dynamic
        shared memory) one multiprocessor of ``device`` holds at once
        (cuOccupancyMaxActiveBlocksPerMultiprocessor), asked once per kernel and size."""
        key = (int(function.ptr), threads, shared_mem)
        found = self._resident.get(key)
        if found is not None:
            return found
        from cuda.bindings import driver  # one query per kernel and size: no ctypes fast path

        with on_device(device):
            status, count = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                driver.CUfunction(key[0]), threads, shared_mem)
        if int(status):
            raise LaunchFailed(f"occupancy query failed on cuda:{device}: CUresult "
                               f"{int(status)}")
        self._resident[key] = int(count)
        return int(count)

    def allow_shared(self, kernel, name: str, device: int, shared_bytes: int):
        """Lets ``kernel`` (named ``name``) launch with ``shared_bytes`` of dynamic shared
        memory on ``device`` (past the 48 KiB default a kernel must opt in), once per kernel and
        size: the attribute stays on the loaded kernel, and a launch path that asks for it at
        every call (a memo miss) need not pay a driver call and a device switch each time.
        Returns the kernel."""
        key = int(kernel.ptr)
        if self._allowed.get(key, -1) >= shared_bytes:
            return kernel
        import cupy

        driver = cupy.cuda.driver
        try:
            with cupy.cuda.Device(device):
                driver.funcSetAttribute(kernel.ptr,
                                        driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                        shared_bytes)
        except driver.CUDADriverError as error:
            raise LaunchFailed(f"{name} cannot have {shared_bytes} bytes of shared memory on "
                               f"cuda:{device}: {error}") from error
        self._allowed[key] = shared_bytes
        return kernel

    def clear(self) -> None:
        with self._lock:
            self._modules.clear()
            self._functions.clear()
            self._resident.clear()
            self._allowed.clear()


KERNELS = KernelCache()


def get_kernel(source: str, name: str, device: int):
    """The CuPy Function for kernel ``name`` of native/<source> on ``device``."""
    return KERNELS.get(source, name, device)


def allow_shared(kernel, name: str, device: int, shared_bytes: int):
    """Lets ``kernel`` launch with ``shared_bytes`` of dynamic shared memory (KernelCache's)."""
    return KERNELS.allow_shared(kernel, name, device, shared_bytes)


def kernel_with_shared(source: str, name: str, device: int, shared_bytes: int):
    """Kernel ``name`` of native/<source> on ``device``, allowed ``shared_bytes`` of dynamic
    shared memory."""
    return allow_shared(get_kernel(source, name, device), name, device, shared_bytes)


def resident_blocks(function, threads: int, shared_mem: int, device: int) -> int:
    """CTAs of ``function`` one multiprocessor of ``device`` holds at once (KernelCache's)."""
    return KERNELS.resident_blocks(function, threads, shared_mem, device)


def pointer(view) -> np.uint64:
    """A kernel pointer argument: the address of a view, or null for an absent one."""
    return np.uint64(0 if view is None else view.ptr)


def launch(function, grid: tuple[int, ...], block: tuple[int, ...], args: tuple,
           stream: int, device: int, shared_mem: int = 0) -> None:
    """Enqueues one kernel on ``stream``; launch errors become LaunchFailed. A launch that is
    its thread's first CUDA work fails for want of a context (CuPy's Device sets nothing where
    the runtime already reports the device): device 0's primary context is then made current,
    as the runtime's first call would, and the launch retried once (PackedLaunch does the
    same)."""
    import cupy

    for retry in (False, True):
        try:
            with cupy.cuda.Device(device):
                function(grid, block, args, shared_mem=shared_mem,
                         stream=cupy_stream(stream, device))
            return
        except cupy.cuda.driver.CUDADriverError as error:
            if not retry and error.status == INVALID_CONTEXT and bind_default_context():
                continue
            raise LaunchFailed(f"launch of {grid}x{block} failed on cuda:{device}: "
                               f"{error}") from error


# numpy scalar type -> the ctypes type holding the same bits, for kernel parameters
_CTYPES = {np.uint64: ctypes.c_uint64, np.int64: ctypes.c_int64, np.int32: ctypes.c_int32,
           np.float32: ctypes.c_float}


# cuLaunchKernel's and cuLaunchKernelEx's parameters (cuda.h), as PackedLaunch makes them once.
_LAUNCH_TYPES = (ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p,
                 ctypes.c_void_p)
_LAUNCH_EX_TYPES = (ctypes.c_void_p,) * 4


def _made_once(values: tuple, types: tuple) -> tuple:
    """A bare driver function's arguments (driver.bare_function): each value as its ctypes
    object, None as NULL."""
    return tuple(None if value is None else kind(value)
                 for value, kind in zip(values, types, strict=True))


@functools.cache
def _driver_launch():
    """libcuda's cuLaunchKernel through ctypes (one foreign call, ~1 µs), bare: called on
    arguments made once (_made_once), or None where libcuda cannot be opened by name
    (cuda.bindings' wrapper then launches, several µs slower)."""
    return bare_function("cuLaunchKernel")


def programmatic(device: int) -> bool:
    """Whether kernels on ``device`` may launch as programmatic dependents (sm_90 and newer,
    where griddepcontrol exists: common.cuh's follow_previous_grid)."""
    return device_arch(device).compute_capability >= (9, 0)


# CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h): the kernel may launch before the
# stream's previous kernel completes (programmatic dependent launch, sm_90+), and must wait for it
# in the kernel (griddepcontrol.wait) before reading what it wrote.
_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):
    """cuda.h's CUlaunchAttribute: the id, padding to 8 bytes, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("value", ctypes.c_int64 * 8)]


class _LaunchConfig(ctypes.Structure):
    """cuda.h's CUlaunchConfig."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attributes", ctypes.POINTER(_LaunchAttribute)), ("count", ctypes.c_uint)]


@functools.cache
def _driver_launch_ex():
    """libcuda's cuLaunchKernelEx through ctypes, bare as _driver_launch, or None where libcuda
    cannot be opened by name (a launch then goes without its attributes, which only ever allow
    overlap)."""
    return bare_function("cuLaunchKernelEx")


class PackedLaunch:
    """One kernel launch with its parameters packed once: calling it is a single
    ``cuLaunchKernel`` on the stream it was made for.

    For prepared calls in hot loops (a serving engine's decode step): CuPy's launch packs every
    argument again and switches devices on each call, ~15 µs of host time for a kernel of 25
    parameters; this is the driver call alone. The parameters are fixed, so the call must
    launch the same tensors (their contents may change) on the thread that holds the device's
    context current, as a prepared call's caller does. A failed launch is retried once under the
    device's context (a caller that switched devices), then raised as LaunchFailed.

    ``overlap_previous`` launches it as a programmatic dependent of the stream's previous kernel
    (``cuLaunchKernelEx``; the caller passes it on sm_90+ only): the kernel must wait
    (griddepcontrol.wait) before it reads what that kernel wrote.
    """

    __slots__ = ("_arguments", "_config", "_device", "_launch", "_values", "_params")

    def __init__(self, function, grid: tuple[int, ...], block: tuple[int, ...], args: tuple,
                 stream: int, device: int, shared_mem: int = 0, overlap_previous: bool = False):
        self._values = [_CTYPES[type(arg)](arg.item()) for arg in args]
        self._params = (ctypes.c_void_p * len(args))(
            *[ctypes.addressof(value) for value in self._values])
        grid3, block3 = (*grid, 1, 1)[:3], (*block, 1, 1)[:3]
        self._device, self._config = device, None
        launch_ex = _driver_launch_ex() if overlap_previous else None
        if launch_ex is not None:
            attribute = _LaunchAttribute(_PROGRAMMATIC_STREAM_SERIALIZATION)
            attribute.value[0] = 1  # programmaticStreamSerializationAllowed, an int at offset 0
            self._config = config = _LaunchConfig(
                (ctypes.c_uint * 3)(*grid3), (ctypes.c_uint * 3)(*block3), shared_mem,
                int(stream), ctypes.pointer(attribute), 1)
            self._arguments = _made_once((ctypes.addressof(config), int(function.ptr),
                                          ctypes.addressof(self._params), None),
                                         _LAUNCH_EX_TYPES)
            self._launch = launch_ex
            return
        arguments = (int(function.ptr), *grid3, *block3, shared_mem, int(stream),
                     ctypes.addressof(self._params), None)
        launch = _driver_launch()
        if launch is None:
            self._launch, self._arguments = self._through_bindings, arguments
        else:
            self._launch, self._arguments = launch, _made_once(arguments, _LAUNCH_TYPES)

    @staticmethod
    def _through_bindings(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra) -> int:
        from cuda.bindings import driver

        (status,) = driver.cuLaunchKernel(driver.CUfunction(function), gx, gy, gz, bx, by, bz,
                                          shared, driver.CUstream(stream), params, 0)
        return int(status)

    def __call__(self) -> None:
        status = self._launch(*self._arguments)
        if status:
            self._relaunch(status)

    def _relaunch(self, status: int) -> None:
        """The launch failed. On a thread where no context was current (a serving thread whose
        first CUDA work is this launch), device 0's primary context is made current, as the
        runtime's first call would, and it is retried; then once under the device's context
        (a caller that switched devices; CuPy's Device sets nothing where the runtime already
        reports that device, so it cannot stand for the first)."""
        if status == INVALID_CONTEXT and bind_default_context():
            status = self._launch(*self._arguments)
            if not status:
                return
        import cupy

        with cupy.cuda.Device(self._device):
            status = self._launch(*self._arguments)
        if status:
            raise LaunchFailed(f"launch failed on cuda:{self._device}: CUresult {status}")
