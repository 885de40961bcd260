"""What GPU a plan runs on: ordinal, architecture, name. CuPy is imported only when asked."""

from __future__ import annotations

import contextlib
from functools import cache

from ..errors import BackendUnavailable, InvalidArgument
from ..types import ArchSku


@cache  # run() asks for the current device on every call
def _runtime():
    try:
        import cupy
    except ImportError as error:
        raise BackendUnavailable(f"CuPy failed to import, so no GPU can be used: {error}") from None
    return cupy.cuda.runtime


def device_count() -> int:
    """Visible CUDA devices; 0 when there is no driver or no GPU (never raises)."""
    try:
        return int(_runtime().getDeviceCount())
    except Exception:
        return 0


def current_device() -> int:
    return _runtime().getDevice()


@contextlib.contextmanager
def on_device(device: int):
    """Makes ``device`` current for the block (the libraries bind and launch on the current
    device), and restores the previous one after it."""
    runtime = _runtime()
    previous = runtime.getDevice()
    if previous == device:
        yield
        return
    runtime.setDevice(device)
    try:
        yield
    finally:
        runtime.setDevice(previous)


def check_ordinal(device: int) -> int:
    count = device_count()
    if not isinstance(device, int) or isinstance(device, bool) or not 0 <= device < count:
        raise InvalidArgument(
            f"device must be a CUDA device ordinal in [0, {count}), got {device!r}",
            argument="device",
        )
    return device


@cache
def device_arch(device: int) -> ArchSku:
    """The newest ArchSku the device covers (an sm_87 part runs what sm86 SKUs need)."""
    props = _runtime().getDeviceProperties(device)
    capability = (int(props["major"]), int(props["minor"]))
    covered = [arch for arch in ArchSku if arch.compute_capability <= capability]
    if not covered:
        raise BackendUnavailable(f"cuda:{device} has compute capability {capability}; "
                                 f"opfacade needs {ArchSku.sm80.compute_capability} or newer")
    return max(covered, key=lambda arch: arch.compute_capability)


@cache
def device_name(device: int) -> str:
    name = _runtime().getDeviceProperties(device)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)
