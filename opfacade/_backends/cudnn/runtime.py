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
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..._internal.config import with_install_hint
from ..._internal.device import on_device
from ..._internal.handles import PerThreadHandles

__all__ = ["BUILD_STREAM", "HANDLES", "available", "backend_version", "bind_build_stream",
           "cudnn_module", "handle_for", "not_supported_types", "set_stream", "stream_setter"]

# cudaStreamPerThread: a stream that always exists, and that another stream's capture does not
# make unusable (the legacy stream 0 is, during a capture in global mode).
BUILD_STREAM = 0x2


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


def bind_build_stream(handle) -> None:
    """Binds ``handle`` to BUILD_STREAM before a graph is built or deserialized. A handle keeps
    the stream of its last run, which the caller may have destroyed since (verify runs each
    problem on a new CuPy stream); the frontend's deserialize asks that stream whether it is
    capturing, and with cuDNN 9.19 and frontend 1.32 on an H200 a destroyed stream made it
    fail ("invalid resource handle") or segfault (forty-fifth session,
    scripts/plan_store_free_probe.py). Every run binds its own stream again."""
    set_stream(handle, BUILD_STREAM)


def stream_setter() -> Callable[[object, int], None]:
    """The frontend's own ``set_stream(handle, stream)``, for a prepared run to bind once and
    call on every run: through ``set_stream`` each call would pay two more Python frames."""
    return cudnn_module().set_stream
