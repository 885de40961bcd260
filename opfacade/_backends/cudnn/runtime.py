"""The cuDNN library in this process: import, version, and handles per (thread, device).

cudnn-frontend is imported lazily, on the first question asked of it. A cuDNN handle must not be
used by two threads at once and belongs to one device, so handles live in ``HANDLES``, a
``PerThreadHandles`` (one table per thread, keyed by device ordinal); built graphs are shared by
every thread. The handle's stream is re-bound before every run (``cudnn.set_stream`` skips the
backend call when it is unchanged).

``clear_caches()`` leaves the handles alone, on purpose: prepared calls (and run()'s memoised
launches) hold their thread's handle, so destroying it under them would make their next launch
use a dead handle, and one thread cannot reach another's table anyway. A thread's handles are
destroyed when the thread ends (never at interpreter exit, when the driver may be gone).

Graphs that declare dynamic shapes are built with ``kernel_cache_for(device)``: one cuDNN kernel
cache per device, so that a graph of a topology built before, at a new shape, binds the kernel
compiled then instead of compiling again (milliseconds instead of hundreds); ``dynamic_shapes``
says which graphs declare them. Builds are serialised by the graph cache's
lock, so no two builds share a kernel cache at once.
"""

from __future__ import annotations

import functools
import os
import threading

from ..._internal.config import with_install_hint
from ..._internal.device import on_device
from ..._internal.handles import PerThreadHandles

__all__ = ["DYNAMIC_SHAPES_VARIABLE", "HANDLES", "available", "backend_version",
           "clear_kernel_caches", "cudnn_module", "dynamic_shapes", "handle_for",
           "kernel_cache_for", "not_supported_types", "set_stream"]

# "0" builds every graph static (no kernel cache); anything else lets dynamic_shapes decide.
DYNAMIC_SHAPES_VARIABLE = "OPFACADE_CUDNN_DYNAMIC_SHAPES"


@functools.cache
def _load():
    """(module, None) or (None, reason); asked once per process."""
    try:
        import cudnn
    except Exception as error:  # ImportError, or a library that fails to load
        return None, f"nvidia-cudnn-frontend failed to import: {type(error).__name__}: {error}"
    try:
        cudnn.backend_version()
    except Exception as error:
        return None, f"the cuDNN library failed to load: {type(error).__name__}: {error}"
    return cudnn, None


def available() -> str | None:
    """Why cuDNN graphs cannot be built in this process (with what to install), or None."""
    why = _load()[1]
    return None if why is None else with_install_hint(why)


def cudnn_module():
    """The ``cudnn`` module (raises BackendUnavailable when it cannot be loaded)."""
    module, why = _load()
    if module is None:
        from ...errors import BackendUnavailable

        raise BackendUnavailable(why)
    return module


@functools.cache
def backend_version() -> int | None:
    """The loaded cuDNN backend's version as an int (91900 for 9.19.0), None when not loadable."""
    module, _ = _load()
    return None if module is None else int(module.backend_version())


def not_supported_types() -> tuple[type[BaseException], ...]:
    """What the frontend raises for 'this graph is not supported' (a decline, not a bug)."""
    cudnn = cudnn_module()
    return (cudnn.cudnnGraphNotSupportedError, NotImplementedError)


def _create(device: int):
    with on_device(device):  # create_handle binds the current device
        return cudnn_module().create_handle()


def _destroy(device: int, handle) -> None:
    cudnn_module().destroy_handle(handle)


HANDLES = PerThreadHandles(_create, _destroy)


def handle_for(device: int):
    """This thread's ``cudnn.Handle`` for ``device``, created on first use."""
    return HANDLES.get(device)


def set_stream(handle, stream: int) -> None:
    """Binds ``handle`` to ``stream`` (the frontend skips the backend call when unchanged)."""
    cudnn_module().set_stream(handle, stream)


def dynamic_shapes(key) -> bool:
    """Whether the graph for ``key`` (a dense, ragged or paged graph's key) declares dynamic
    shapes. With a kernel cache, cuDNN 9.19 built the dense forward, the ragged forward and the
    paged decode at a new shape in 6-9 ms on an H100 (GPU-FACTS.md), against hundreds for a
    cold build; it refuses the ragged backward with dynamic shapes, so backward graphs stay
    static."""
    return key.direction != "backward" and os.environ.get(DYNAMIC_SHAPES_VARIABLE) != "0"


_KERNEL_CACHES: dict[int, object] = {}
_KERNEL_CACHES_LOCK = threading.Lock()


def kernel_cache_for(device: int):
    """The cuDNN kernel cache of ``device``'s dynamic-shape graphs, created on first use."""
    with _KERNEL_CACHES_LOCK:
        cache = _KERNEL_CACHES.get(device)
        if cache is None:
            cache = _KERNEL_CACHES[device] = cudnn_module().create_kernel_cache()
        return cache


def clear_kernel_caches() -> None:
    """Forgets the kernel caches (graphs built with one keep it alive while they live)."""
    with _KERNEL_CACHES_LOCK:
        _KERNEL_CACHES.clear()
