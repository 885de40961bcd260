"""DriverRuntime (``_internal/driver.py``), the CUDA runtime's answers from libcuda through ctypes,
driven by a fake libcuda that plays the driver's side of each call (results written through the
pointers it is handed). tests/test_driver_gpu.py checks the real driver against CuPy's runtime."""

from __future__ import annotations

import ctypes
import functools

import pytest

from opfacade._internal import device as device_module
from opfacade._internal.device import Devices
from opfacade._internal.driver import CudaDriverError, DriverRuntime

SUCCESS, NOT_INITIALIZED, INVALID_VALUE, INVALID_CONTEXT = 0, 3, 1, 201


def _write(reference, value) -> None:
    reference._obj.value = value  # a ctypes.byref(...) argument: the cell it points to


def _plain(method):
    def call(*args):
        return method(*args)
    return call


class FakeLibcuda:
    """Two devices, no context current until one is set; records every call by name."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.initialized = False
        self.current = None  # the current context (a device ordinal + 100) or None
        self.capturing = {5}
        self.next_pointer = 0x7000
        # As plain functions, which take the restype and argtypes DriverRuntime declares.
        for name in dir(type(self)):
            if name.startswith("cu"):
                setattr(self, name, _plain(getattr(self, name)))

    def __getitem__(self, name):  # CDLL's item access: a function object of its own
        return _plain(getattr(type(self), name).__get__(self))

    def _record(self, name, *args):
        self.calls.append((name, *args))

    def cuInit(self, flags):
        self._record("cuInit", flags)
        self.initialized = True
        return SUCCESS

    def cuDeviceGetCount(self, count):
        self._record("cuDeviceGetCount")
        if not self.initialized:
            return NOT_INITIALIZED
        _write(count, 2)
        return SUCCESS

    def cuDeviceGet(self, handle, ordinal):
        if not 0 <= ordinal < 2:
            return INVALID_VALUE
        _write(handle, ordinal)
        return SUCCESS

    def cuDeviceGetAttribute(self, value, attribute, handle):
        _write(value, {75: 9, 76: 0, 16: 132 - handle}[attribute])
        return SUCCESS

    def cuDeviceGetName(self, buffer, size, handle):
        ctypes.memmove(buffer, f"Fake H100 #{handle}".encode() + b"\0", 14)
        return SUCCESS

    def cuCtxGetDevice(self, device):
        if self.current is None:
            return INVALID_CONTEXT
        _write(device, self.current - 100)
        return SUCCESS

    def cuDevicePrimaryCtxRetain(self, context, handle):
        self._record("retain", handle)
        _write(context, 100 + handle)
        return SUCCESS

    def cuCtxGetCurrent(self, context):
        _write(context, self.current)
        return SUCCESS

    def cuCtxSetCurrent(self, context):
        self.current = context.value
        self._record("set", context.value)
        return SUCCESS

    def cuCtxSynchronize(self):
        if self.current is None:
            return INVALID_CONTEXT
        self._record("sync", self.current)
        return SUCCESS

    def cuStreamIsCapturing(self, stream, status):
        stream = getattr(stream, "value", stream) or 0  # a c_void_p of 0 holds None
        _write(status, 1 if stream in self.capturing else 0)
        return SUCCESS

    def cuMemAllocAsync(self, pointer, size, stream):
        self._record("alloc", size, stream, self.current)
        _write(pointer, self.next_pointer)
        self.next_pointer += size
        return SUCCESS

    def cuMemFreeAsync(self, pointer, stream):
        self._record("free_async", pointer, stream)
        return SUCCESS

    def cuMemFree_v2(self, pointer):
        if self.current is None:
            return INVALID_CONTEXT
        self._record("free", pointer, self.current)
        return SUCCESS

    def cuGetErrorName(self, status, name):
        names = {INVALID_VALUE: b"CUDA_ERROR_INVALID_VALUE"}
        if status not in names:
            return INVALID_VALUE
        _write(name, names[status])
        return SUCCESS


def test_device_questions_answered_as_the_runtime_does():
    library = FakeLibcuda()
    runtime = DriverRuntime(library)
    assert runtime.getDevice() == 0  # no context current yet: device 0, as the runtime says
    assert runtime.getDeviceCount() == 2 and library.initialized
    properties = runtime.getDeviceProperties(1)
    assert properties == {"major": 9, "minor": 0, "multiProcessorCount": 131,
                          "name": b"Fake H100 #1"}
    runtime.setDevice(1)
    assert runtime.getDevice() == 1
    runtime.setDevice(0)
    runtime.setDevice(1)
    assert runtime.getDevice() == 1
    # Each device's primary context is retained once, then only made current.
    assert [c for c in library.calls if c[0] == "retain"] == [("retain", 1), ("retain", 0)]
    assert [c[1] for c in library.calls if c[0] == "set"] == [101, 100, 101]


def test_driver_initialised_on_the_first_call_that_needs_it():
    library = FakeLibcuda()
    runtime = DriverRuntime(library)
    runtime.setDevice(0)  # cuDeviceGet answers before cuInit in this fake; retain follows
    assert runtime.getDeviceCount() == 2
    assert [c[0] for c in library.calls].count("cuInit") == 1


def test_scratch_calls_on_the_current_context():
    library = FakeLibcuda()
    runtime = DriverRuntime(library)
    runtime.setDevice(1)
    pointer = runtime.mallocAsync(4096, 7)
    runtime.freeAsync(pointer, 7)
    runtime.deviceSynchronize()
    runtime.free(pointer)
    assert ("alloc", 4096, 7, 101) in library.calls
    assert ("free_async", pointer, 7) in library.calls and ("free", pointer, 101) in library.calls
    assert ("sync", 101) in library.calls
    assert runtime.streamIsCapturing(5) and not runtime.streamIsCapturing(7)


def test_a_thread_with_no_context_gets_device_zeros_as_the_runtime_gives_it():
    library = FakeLibcuda()
    runtime = DriverRuntime(library)
    runtime.deviceSynchronize()
    runtime.free(0x7000)
    assert ("sync", 100) in library.calls and ("free", 0x7000, 100) in library.calls
    assert [c for c in library.calls if c[0] == "retain"] == [("retain", 0)]


def test_a_failing_call_names_itself_and_the_drivers_error():
    runtime = DriverRuntime(FakeLibcuda())
    with pytest.raises(CudaDriverError, match="cuDeviceGet failed: CUDA_ERROR_INVALID_VALUE"):
        runtime.setDevice(3)
    library = FakeLibcuda()
    library.cuMemFree_v2 = lambda pointer: 999  # a status the fake has no name for
    with pytest.raises(CudaDriverError, match="cuMemFree_v2 failed: CUresult 999"):
        DriverRuntime(library).free(0x10)


def test_devices_ask_the_driver_first(monkeypatch):
    runtime = DriverRuntime(FakeLibcuda())
    monkeypatch.setattr(device_module, "driver_runtime", lambda: runtime)
    devices = Devices()
    assert devices.runtime() is runtime
    assert devices.count() == 2 and devices.name(1) == "Fake H100 #1"
    assert devices.sm_count(0) == 132



def test_the_capture_check_across_many_streams_and_its_failure():
    library = FakeLibcuda()
    library.capturing = {5, 300}
    runtime = DriverRuntime(library)
    answers = [bool(runtime.streamIsCapturing(stream)) for stream in range(400)]
    assert [s for s, capturing in enumerate(answers) if capturing] == [5, 300]
    assert runtime.streamIsCapturing(5) and not runtime.streamIsCapturing(0)

    class Failing(FakeLibcuda):
        def cuStreamIsCapturing(self, stream, status):
            return INVALID_VALUE

    with pytest.raises(CudaDriverError, match="cuStreamIsCapturing failed"):
        DriverRuntime(Failing()).streamIsCapturing(7)


def _bare(library, name):
    """``name`` of the stand-in as driver.bare_function makes libcuda's: no declared types."""
    function = library[name]
    function.restype = ctypes.c_int
    return function


@pytest.fixture(scope="module")
def stand_in(libcuda_stand_in):
    return ctypes.CDLL(str(libcuda_stand_in))


def test_every_call_crosses_a_real_c_abi(stand_in):
    runtime = DriverRuntime(stand_in)
    assert runtime.getDevice() == 0  # no context current
    assert runtime.getDeviceCount() == 2
    assert runtime.getDeviceProperties(1) == {"major": 9, "minor": 0, "multiProcessorCount": 131,
                                              "name": b"Stand-in H100 #1"}
    runtime.setDevice(1)
    assert runtime.getDevice() == 1
    wide_stream = 0x7FFF00000005  # tells apart only with all 64 bits
    assert runtime.streamIsCapturing(wide_stream) == 1
    assert runtime.streamIsCapturing(5) == 0 and runtime.streamIsCapturing(0) == 0
    pointer = runtime.mallocAsync(1 << 20, wide_stream)
    assert pointer == 0x7F0000000000  # a device pointer above 32 bits, whole
    stand_in.stand_in_last_stream.restype = ctypes.c_void_p
    stand_in.stand_in_last_freed.restype = ctypes.c_uint64
    assert stand_in.stand_in_last_stream() == wide_stream
    runtime.freeAsync(pointer + 256, wide_stream)
    assert stand_in.stand_in_last_freed() == pointer + 256
    runtime.deviceSynchronize()
    runtime.free(pointer)
    assert stand_in.stand_in_last_freed() == pointer
    # A thread with no context current: the free makes device 0's primary context current
    # (0x1000 in the stand-in), where the legacy cuMemFree symbol would have failed.
    stand_in.stand_in_forget_context()
    stand_in.stand_in_current.restype = ctypes.c_void_p
    runtime.free(pointer + 512)
    assert stand_in.stand_in_last_freed() == pointer + 512
    assert stand_in.stand_in_current() == 0x1000
    with pytest.raises(CudaDriverError, match="cuDeviceGet failed: CUDA_ERROR_INVALID_VALUE"):
        runtime.getDeviceProperties(2)


def test_a_thread_without_a_context_gets_device_0s_for_the_capture_check(stand_in):
    """run()'s capture check is the first driver call a thread makes when torch served its own
    calls there from its caching allocator (an H100 raised CUDA_ERROR_INVALID_CONTEXT from
    cuStreamIsCapturing on such a thread): device 0's primary context is made current, as the
    runtime's first call would, and the check answers."""
    stand_in.stand_in_current.restype = ctypes.c_void_p
    runtime = DriverRuntime(stand_in)
    stand_in.stand_in_forget_context()
    assert runtime.streamIsCapturing(0x7FFF00000005) == 1
    assert stand_in.stand_in_current() == 0x1000
    runtime.setDevice(1)  # a context current: nothing is rebound
    assert not runtime.bind_if_unbound()
    assert runtime.streamIsCapturing(5) == 0 and stand_in.stand_in_current() == 0x1001


class _NoDevice:
    """Stands for cupy.cuda.Device in the launches' retries: enters without CuPy's runtime."""

    def __init__(self, device):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_kernel_launch_on_a_thread_without_a_context(stand_in, monkeypatch):
    """A packed NVRTC launch that is a thread's first CUDA work (kv_append on a serving thread:
    an H100 raised LaunchFailed, CUresult 201, where CuPy's Device, which sets nothing when the
    runtime already reports that device, could not help): device 0's primary context made
    current, then the launch; another failure still ends in LaunchFailed."""
    import numpy as np

    from opfacade._backends.nvrtc import launch as launching
    from opfacade.errors import LaunchFailed

    bare = functools.partial(_bare, stand_in)
    stand_in.stand_in_current.restype = ctypes.c_void_p
    stand_in.stand_in_last_launch.restype = ctypes.POINTER(ctypes.c_uint64)
    monkeypatch.setattr(launching, "_driver_launch", lambda: bare("cuLaunchKernel"))
    monkeypatch.setattr(launching, "bind_default_context",
                        DriverRuntime(stand_in).bind_if_unbound)
    function = type("F", (), {"ptr": 0x7F00CAFEF00D})()
    packed = launching.PackedLaunch(function, (8,), (64,), (np.int32(3),), 0x7FFF00000009, 0)
    stand_in.stand_in_forget_context()
    packed()
    assert stand_in.stand_in_current() == 0x1000
    assert stand_in.stand_in_last_launch()[0] == 0x7F00CAFEF00D

    cupy = pytest.importorskip("cupy")
    monkeypatch.setattr(cupy.cuda, "Device", _NoDevice)
    packed._launch = lambda *args: 1  # CUDA_ERROR_INVALID_VALUE, every time
    with pytest.raises(LaunchFailed, match="CUresult 1"):
        packed()


def test_a_cupy_launch_on_a_thread_without_a_context(monkeypatch):
    """An NVRTC kernel launched through CuPy as its thread's first CUDA work (varlen's ragged
    offsets before cuDNN's execute, with a workspace given): the launch's
    CUDA_ERROR_INVALID_CONTEXT makes device 0's primary context current and the launch is made
    again, once; any other failure is a LaunchFailed at once."""
    cupy = pytest.importorskip("cupy")
    from opfacade._backends.nvrtc import launch as launching
    from opfacade.errors import LaunchFailed

    def failure(status):  # CuPy's error without its constructor, which asks libcuda for a name
        error = cupy.cuda.driver.CUDADriverError.__new__(cupy.cuda.driver.CUDADriverError)
        error.status = status
        return error

    bound, calls = [], []

    def kernel(grid, block, args, shared_mem, stream):
        calls.append(grid)
        if not bound:
            raise failure(201)

    monkeypatch.setattr(cupy.cuda, "Device", _NoDevice)
    monkeypatch.setattr(launching, "cupy_stream", lambda stream, device: None)
    monkeypatch.setattr(launching, "bind_default_context", lambda: bound.append(1) or True)
    launching.launch(kernel, (4,), (32,), (), 0, 0)
    assert calls == [(4,), (4,)] and bound == [1]

    def failing(grid, block, args, shared_mem, stream):
        calls.append(grid)
        raise failure(1)

    calls.clear()
    with pytest.raises(LaunchFailed, match="launch of"):
        launching.launch(failing, (8,), (32,), (), 0, 0)
    assert calls == [(8,)] and bound == [1]


def test_a_kernel_module_loads_on_a_thread_without_a_context(monkeypatch):
    """Loading an NVRTC module needs a context: on a thread whose first CUDA work is loading one
    (a serving thread that selects the first plan of a family), device 0's primary context is
    made current before CuPy's Device is entered and the module loaded."""
    cupy = pytest.importorskip("cupy")
    from opfacade._backends.nvrtc import launch as launching

    order = []

    class Module:
        def load(self, cubin):
            order.append(("load", cubin))

    monkeypatch.setattr(launching, "bind_default_context", lambda: order.append("bind"))
    monkeypatch.setattr(launching, "compile_cubin",
                        lambda source, arch: type("Compiled", (), {"cubin": b"cubin"})())
    monkeypatch.setattr(launching, "device_arch", lambda device: "sm90")
    monkeypatch.setattr(cupy.cuda, "Device", lambda device: (order.append("device"),
                                                              _NoDevice(device))[1])
    monkeypatch.setattr(cupy.cuda.function, "Module", Module)
    launching.KernelCache()._module("decode_attention.cu", 0)
    assert order == ["bind", "device", ("load", b"cubin")]


def test_a_kernel_is_allowed_its_shared_memory_once_per_size(monkeypatch):
    """allow_shared sets a kernel's dynamic shared memory attribute once: a launch path that
    asks at every memo miss (decode's staged build, flash_f32) pays no driver call again for a
    size already allowed; a larger size sets it again, and a driver refusal is a LaunchFailed
    naming the kernel."""
    cupy = pytest.importorskip("cupy")
    from opfacade._backends.nvrtc import launch as launching
    from opfacade.errors import LaunchFailed

    calls = []
    monkeypatch.setattr(cupy.cuda, "Device", lambda device: _NoDevice(device))
    monkeypatch.setattr(cupy.cuda.driver, "funcSetAttribute",
                        lambda ptr, attribute, value: calls.append((ptr, value)))
    cache, kernel = launching.KernelCache(), type("Kernel", (), {"ptr": 0xF00})()
    for shared in (60000, 60000, 50000, 70000):
        assert cache.allow_shared(kernel, "k", 0, shared) is kernel
    assert calls == [(0xF00, 60000), (0xF00, 70000)]
    cache.clear()
    cache.allow_shared(kernel, "k", 0, 60000)
    assert calls[-1] == (0xF00, 60000)

    def refuse(ptr, attribute, value):  # the error, made without the driver it would name
        error_type = cupy.cuda.driver.CUDADriverError
        raise error_type.__new__(error_type)

    monkeypatch.setattr(cupy.cuda.driver, "funcSetAttribute", refuse)
    with pytest.raises(LaunchFailed, match="k cannot have 300000 bytes"):
        cache.allow_shared(kernel, "k", 0, 300000)


def test_a_graph_replay_on_a_thread_without_a_context(stand_in, monkeypatch):
    """GraphedLaunches' own capture check (a run with a workspace reaches it first): device 0's
    context made current, then the replay; another failure of the check is a LaunchFailed."""
    from opfacade._internal import graph_replay
    from opfacade.errors import LaunchFailed

    bare = functools.partial(_bare, stand_in)
    stand_in.stand_in_current.restype = ctypes.c_void_p
    stand_in.stand_in_last_launch.restype = ctypes.POINTER(ctypes.c_uint64)
    runtime = DriverRuntime(stand_in)
    monkeypatch.setattr(graph_replay, "bare_function", bare)
    monkeypatch.setattr(graph_replay, "bind_default_context", runtime.bind_if_unbound)
    stand_in.stand_in_forget_context()
    graphed = graph_replay.GraphedLaunches(lambda on: [], 0x7FFF00000009, 0)
    graphed._exec, graphed._exec_handle = 0x7E0000000002, ctypes.c_void_p(0x7E0000000002)
    graphed._calls = 5
    try:
        graphed()
        assert stand_in.stand_in_current() == 0x1000
        assert stand_in.stand_in_last_launch()[0] == 0x7E0000000002
        graphed._capturing = lambda stream, reference: 1  # CUDA_ERROR_INVALID_VALUE
        with pytest.raises(LaunchFailed, match="cuStreamIsCapturing failed.*CUresult 1"):
            graphed()
    finally:
        graphed._exec = None  # made up: __del__ must not hand it to a driver


def test_hot_calls_on_arguments_made_once_cross_a_real_c_abi(stand_in, monkeypatch):
    """The bare functions (driver.bare_function) of a packed kernel launch and of a graph
    replay, called on ctypes objects made once: 64-bit pointers and handles arrive whole, the
    launch's 32-bit extents as given, NULL as NULL."""
    import numpy as np

    from opfacade._backends.nvrtc import launch as launching
    from opfacade._internal import graph_replay

    bare = functools.partial(_bare, stand_in)
    stand_in.stand_in_last_launch.restype = ctypes.POINTER(ctypes.c_uint64)
    seen = stand_in.stand_in_last_launch()
    DriverRuntime(stand_in).setDevice(0)  # whatever the tests before left current
    monkeypatch.setattr(launching, "_driver_launch", lambda: bare("cuLaunchKernel"))
    function = type("F", (), {"ptr": 0x7F00DEADBEEF})()
    wide_stream = 0x7FFF00000005
    packed = launching.PackedLaunch(function, (70000, 3), (128,), (np.uint64(1), np.int32(2)),
                                    wide_stream, 0, 49152)
    packed()
    assert [seen[i] for i in range(11)][:9] == [0x7F00DEADBEEF, 70000, 3, 1, 128, 1, 1, 49152,
                                               wide_stream]
    assert seen[9] == ctypes.addressof(packed._params) and seen[10] == 0

    monkeypatch.setattr(graph_replay, "bare_function", bare)
    # The stand-in's capturing stream (wide_stream) gets the launches directly; another wide
    # stream replays the graph.
    for stream, replays in ((wide_stream, False), (0x7FFF00000009, True)):
        direct = []
        graphed = graph_replay.GraphedLaunches(lambda on, d=direct: [lambda: d.append(on)],
                                               stream, 0)
        graphed._exec, graphed._exec_handle = 0x7E0000000001, ctypes.c_void_p(0x7E0000000001)
        graphed._calls = 5  # past the capture: the next call replays unless captured
        try:
            graphed()
        finally:
            # The handle is made up: __del__ must not hand it to a real driver (it segfaulted
            # in cuGraphExecDestroy on a GPU machine).
            graphed._exec = None
        assert (seen[0], seen[8]) == ((0x7E0000000001, stream) if replays
                                      else (0x7F00DEADBEEF, wide_stream))
        assert direct == ([] if replays else [stream])


def test_without_cupy_installed_devices_say_what_to_install(monkeypatch):
    """libcuda opens (a GPU machine), but the GPU stack is not installed: the device questions
    refuse as they did through CuPy's import, naming the install command."""
    import importlib.util

    from opfacade.errors import BackendUnavailable

    real = importlib.util.find_spec
    monkeypatch.setattr(device_module, "driver_runtime", lambda: DriverRuntime(FakeLibcuda()))
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "cupy" else real(name, *a))
    with pytest.raises(BackendUnavailable, match=r"pip install 'opfacade\[cu13\]'"):
        Devices().runtime()
    assert Devices().count() == 0  # count never raises: no usable GPU


def _cuda_header():
    import glob
    import os

    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", *glob.glob("/usr/local/cuda-*")]
    found = [path for root in roots if root and os.path.isfile(path := f"{root}/include/cuda.h")]
    return found[0] if found else None


def test_every_symbol_is_the_one_cuda_h_calls_by_that_name():
    """cuda.h maps some names to versioned symbols (cuMemFree is cuMemFree_v2); the bare symbol
    is then a legacy entry point that fails on a real driver, and neither fake above can tell.
    The per-thread-stream macros (__CUDA_API_PTSZ) apply only under that compile option."""
    import re

    from opfacade._internal.driver import _SIGNATURES

    header = _cuda_header()
    if header is None:
        pytest.skip("no CUDA toolkit header on this machine")
    with open(header) as file:
        text = file.read()
    for name in _SIGNATURES:
        for target in re.findall(rf"^\s*#\s*define\s+{name}\s+(\S+)", text, re.MULTILINE):
            assert target.startswith("__CUDA_API_PTSZ"), f"cuda.h defines {name} as {target}"
