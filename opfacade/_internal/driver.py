"""The CUDA driver (libcuda) through ctypes, in the CUDA runtime's terms: the device questions and
the stream-ordered scratch that every GPU call needs, without importing a framework.

Every process that runs a GPU call has libcuda loaded already, and opening it costs nothing. CuPy,
the runtime these questions used to go to, cost a torch user's first call 107-132 ms for its
import alone on the lent H100s (scripts/runtime_import_probe.py; cuda.bindings' runtime module
83-124 ms, its driver module 17-19 ms). Per call, ctypes costs more than CuPy's compiled
bindings: the capture check run() asks on every call took 0.81 us through a ctypes function with
declared argument types and 0.18 us through CuPy (scripts/capture_check_ab.py, H100), so the two
questions asked per call are built as lean closures (``_capturing_reader``).

``DriverRuntime`` answers as the CUDA runtime does: the current device is that of the thread's
current context (0 where none is current), and setting a device makes its primary context current,
retained once per device for the life of the process, as the runtime retains it; a call that needs
a context on a thread with none makes device 0's current first, as the runtime's first call does.
A failing call raises ``CudaDriverError`` with the driver's name for the error.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable

__all__ = ["INVALID_CONTEXT", "CudaDriverError", "DriverRuntime", "bare_function",
           "bind_default_context", "driver_runtime", "libcuda"]

# cuda.h's CUresult values and CUdevice_attribute ids read here.
_SUCCESS, _NOT_INITIALIZED, INVALID_CONTEXT = 0, 3, 201
_MAJOR, _MINOR, _SM_COUNT = 75, 76, 16
_CAPTURING = "cuStreamIsCapturing"


@functools.cache
def libcuda():
    """libcuda opened by name, once, or None (callers then take a path that needs no ctypes).
    One object for every caller: argument types declared on its functions hold for all."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def bare_function(name: str, library=None):
    """libcuda's ``name`` (``library``'s, where given) as a function object of its own (CDLL's
    item access), returning the CUresult and declaring no argument types, or None where libcuda
    cannot be opened. For calls
    on a hot path, made with ctypes objects built once: ctypes then converts nothing (a launch of
    11 arguments took 0.5 us less so on a development host than through declared types). An
    argument must then be a ctypes object (or None for NULL): a bare Python int would pass as a
    C int."""
    library = libcuda() if library is None else library
    if library is None:
        return None
    function = library[name]
    function.restype = ctypes.c_int
    return function


class CudaDriverError(RuntimeError):
    """A CUDA driver call that failed; the message names the call and the driver's error."""


# name: (argument types, in cuda.h's order); every entry point returns a CUresult (int). The
# names are the exported symbols, not cuda.h's macros: where cuda.h defines a name as a versioned
# one (cuMemFree is cuMemFree_v2), the bare symbol is the legacy entry point (cuMemFree's takes a
# 32-bit pointer and failed with CUDA_ERROR_INVALID_CONTEXT on the lent H100s).
_SIGNATURES = {
    "cuInit": (ctypes.c_uint,),
    "cuDeviceGetCount": (ctypes.POINTER(ctypes.c_int),),
    "cuDeviceGet": (ctypes.POINTER(ctypes.c_int), ctypes.c_int),
    "cuDeviceGetAttribute": (ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int),
    "cuDeviceGetName": (ctypes.c_char_p, ctypes.c_int, ctypes.c_int),
    "cuCtxGetDevice": (ctypes.POINTER(ctypes.c_int),),
    "cuCtxGetCurrent": (ctypes.POINTER(ctypes.c_void_p),),
    "cuCtxSetCurrent": (ctypes.c_void_p,),
    "cuCtxSynchronize": (),
    "cuDevicePrimaryCtxRetain": (ctypes.POINTER(ctypes.c_void_p), ctypes.c_int),
    "cuStreamIsCapturing": (ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)),
    "cuMemAllocAsync": (ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_void_p),
    "cuMemFreeAsync": (ctypes.c_uint64, ctypes.c_void_p),
    "cuMemFree_v2": (ctypes.c_uint64,),
    "cuGetErrorName": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
}


class DriverRuntime:
    """The runtime calls opfacade makes (CuPy's ``cupy.cuda.runtime`` names and meanings), each
    one libcuda call: ``getDeviceCount``, ``getDevice``, ``setDevice``, ``getDeviceProperties``,
    ``streamIsCapturing`` (0 or nonzero, as its callers only test it), ``mallocAsync``,
    ``freeAsync``, ``deviceSynchronize`` and ``free``."""

    def __init__(self, library) -> None:
        self._library = library
        self._calls = {}
        for name, argtypes in _SIGNATURES.items():
            function = getattr(library, name)
            function.restype, function.argtypes = ctypes.c_int, list(argtypes)
            self._calls[name] = function
        self._primary: dict[int, ctypes.c_void_p] = {}
        self._lock = threading.Lock()
        self._initialized = False
        # The two questions asked on every run, as closures over their libcuda function (what
        # the capture check costs: _capturing_reader).
        self.getDevice = self._current_device_reader()
        self.streamIsCapturing = self._capturing_reader()

    def _check(self, name: str, status: int) -> None:
        if status != _SUCCESS:
            label = ctypes.c_char_p()
            known = self._calls["cuGetErrorName"](status, ctypes.byref(label)) == _SUCCESS
            error = label.value.decode() if known and label.value else f"CUresult {status}"
            raise CudaDriverError(f"{name} failed: {error}")

    def _call(self, name: str, *args) -> None:
        status = self._calls[name](*args)
        if status == _NOT_INITIALIZED and not self._initialized:
            self._init()
            status = self._calls[name](*args)
        if status == INVALID_CONTEXT and self.bind_if_unbound():
            status = self._calls[name](*args)
        self._check(name, status)

    def bind_if_unbound(self) -> bool:
        """On a thread where no context is current (one that never made a CUDA call: a clear_caches
        or a run from a new thread, say), makes device 0's primary context current, as the
        runtime's first call that needs a context does there, and returns True (the caller then
        retries the call that failed with CUDA_ERROR_INVALID_CONTEXT); else False."""
        context = ctypes.c_void_p()
        if self._calls["cuCtxGetCurrent"](ctypes.byref(context)) != _SUCCESS or context.value:
            return False
        self.setDevice(0)
        return True

    def _init(self) -> None:
        self._check("cuInit", self._calls["cuInit"](0))
        self._initialized = True

    def _current_device_reader(self) -> Callable[[], int]:
        function, byref, cells = self._calls["cuCtxGetDevice"], ctypes.byref, threading.local()

        def getDevice() -> int:
            # One result cell per thread: ctypes lets go of the GIL during the call, so another
            # thread's call could write a shared cell between this call and its read.
            try:
                cell = cells.cell
            except AttributeError:
                cell = cells.cell = ctypes.c_int(0)
            status = function(byref(cell))
            if status == _SUCCESS:
                return cell.value
            if status in (INVALID_CONTEXT, _NOT_INITIALIZED):
                return 0  # no context current on this thread: the runtime's answer is device 0
            self._check("cuCtxGetDevice", status)

        return getDevice

    def _capturing_reader(self) -> Callable[[int], int]:
        # Asked on every run() without a workspace, so the call is made as cheap as ctypes
        # allows: a bare function (nothing for ctypes to convert), each stream's handle object
        # made once, each thread's result cell and its reference made once. On a lent H100 host
        # the declared-types form cost 0.81 us a call, this one 0.50, CuPy's 0.17.
        function = bare_function(_CAPTURING, self._library)
        handles: dict[int, ctypes.c_void_p] = {}
        cells = threading.local()

        def streamIsCapturing(stream: int) -> int:
            try:
                cell, reference = cells.pair
            except AttributeError:
                cell = ctypes.c_int(0)
                reference = ctypes.byref(cell)
                cells.pair = (cell, reference)
            handle = handles.get(stream)
            if handle is None:
                if len(handles) >= 64:  # streams come and go: keep the recent ones
                    handles.clear()
                handle = handles[stream] = ctypes.c_void_p(stream)
            status = function(handle, reference)
            if status != _SUCCESS:
                # A thread with no context current (torch's calls on it had all been served by
                # its caching allocator, say): the driver refuses until one is.
                if status == INVALID_CONTEXT and self.bind_if_unbound():
                    status = function(handle, reference)
                self._check(_CAPTURING, status)
            return cell.value

        return streamIsCapturing

    def getDeviceCount(self) -> int:
        if not self._initialized:
            self._init()
        count = ctypes.c_int(0)
        self._call("cuDeviceGetCount", ctypes.byref(count))
        return count.value

    def setDevice(self, device: int) -> None:
        context = self._primary.get(device)
        if context is None:
            with self._lock:
                context = self._primary.get(device)
                if context is None:
                    context = ctypes.c_void_p()
                    self._call("cuDevicePrimaryCtxRetain", ctypes.byref(context),
                               self._device(device))
                    self._primary[device] = context
        self._call("cuCtxSetCurrent", context)

    def _device(self, ordinal: int) -> int:
        handle = ctypes.c_int(0)
        self._call("cuDeviceGet", ctypes.byref(handle), ordinal)
        return handle.value

    def getDeviceProperties(self, device: int) -> dict:
        """The properties opfacade reads: major, minor, multiProcessorCount and name."""
        handle = self._device(device)
        values = {}
        for key, attribute in (("major", _MAJOR), ("minor", _MINOR),
                               ("multiProcessorCount", _SM_COUNT)):
            value = ctypes.c_int(0)
            self._call("cuDeviceGetAttribute", ctypes.byref(value), attribute, handle)
            values[key] = value.value
        name = ctypes.create_string_buffer(256)
        self._call("cuDeviceGetName", name, 256, handle)
        values["name"] = name.value
        return values

    def mallocAsync(self, size: int, stream: int) -> int:
        pointer = ctypes.c_uint64(0)
        self._call("cuMemAllocAsync", ctypes.byref(pointer), size, stream)
        return pointer.value

    def freeAsync(self, pointer: int, stream: int) -> None:
        self._call("cuMemFreeAsync", pointer, stream)

    def deviceSynchronize(self) -> None:
        self._call("cuCtxSynchronize")

    def free(self, pointer: int) -> None:
        self._call("cuMemFree_v2", pointer)


@functools.cache
def driver_runtime() -> DriverRuntime | None:
    """The process's DriverRuntime, or None where libcuda cannot be opened (no NVIDIA driver):
    callers then ask CuPy, whose import error names what to install."""
    library = libcuda()
    return None if library is None else DriverRuntime(library)


def bind_default_context() -> bool:
    """``DriverRuntime.bind_if_unbound`` for callers of bare functions (driver.bare_function),
    which fail with CUDA_ERROR_INVALID_CONTEXT on a thread where no context is current: True
    where it made device 0's primary context current, so the failed call may be retried."""
    runtime = driver_runtime()
    return runtime is not None and runtime.bind_if_unbound()
