"""Loading NVRTC cubins onto a device and launching their kernels through CuPy.

Modules load lazily, once per (source file, device), under a lock that is checked again after it
is taken; compilation goes through the disk cache in compiler.py.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from ..._internal.config import with_install_hint
from ..._internal.device import device_arch
from ..._internal.log import timed
from ..._internal.streams import cupy_stream
from ...errors import BackendUnavailable, LaunchFailed
from ...types import ElementKind
from .compiler import compile_cubin

__all__ = ["KERNELS", "KernelCache", "available", "element_suffix", "get_kernel", "launch",
           "pointer"]


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


class KernelCache:
    """Modules loaded per (source file, device) and their kernels, built once under a lock that
    is checked again after it is taken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._modules: dict[tuple[str, int], object] = {}
        self._functions: dict[tuple[str, str, int], object] = {}

    def _module(self, source: str, device: int):
        key = (source, device)
        module = self._modules.get(key)
        if module is None:
            with self._lock:
                module = self._modules.get(key)
                if module is None:
                    import cupy

                    compiled = compile_cubin(source, device_arch(device))
                    with timed("load %s on cuda:%d", source, device), cupy.cuda.Device(device):
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

    def clear(self) -> None:
        with self._lock:
            self._modules.clear()
            self._functions.clear()


KERNELS = KernelCache()


def get_kernel(source: str, name: str, device: int):
    """The CuPy Function for kernel ``name`` of native/<source> on ``device``."""
    return KERNELS.get(source, name, device)


def pointer(view) -> np.uint64:
    """A kernel pointer argument: the address of a view, or null for an absent one."""
    return np.uint64(0 if view is None else view.ptr)


def launch(function, grid: tuple[int, ...], block: tuple[int, ...], args: tuple,
           stream: int, device: int, shared_mem: int = 0) -> None:
    """Enqueues one kernel on ``stream``; launch errors become LaunchFailed."""
    import cupy

    try:
        with cupy.cuda.Device(device):
            function(grid, block, args, shared_mem=shared_mem, stream=cupy_stream(stream, device))
    except cupy.cuda.driver.CUDADriverError as error:
        raise LaunchFailed(f"launch of {grid}x{block} failed on cuda:{device}: {error}") from error
