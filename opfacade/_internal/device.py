"""What GPU a plan runs on: ordinal, architecture, name. Nothing is imported to answer.

``Devices`` is the one reader of the process's GPUs, through the CUDA driver (driver.py; CuPy's
runtime where libcuda cannot be opened): the device count is
read once (CUDA_VISIBLE_DEVICES cannot change once CUDA is up), and a process that sees exactly
one GPU always has device 0 current, so ``current_device`` then answers without asking the
runtime. The module functions below ask the process's one ``Devices``; run()'s memo binds its
``current_reader()`` once.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable

from ..errors import BackendUnavailable, InvalidArgument
from ..types import ArchSku
from .config import with_install_hint
from .driver import driver_runtime
from .log import LOG

__all__ = [
    "DEVICES", "Devices", "check_ordinal", "current_device", "device_arch", "device_count",
    "device_name", "device_sm_count", "on_device",
]


def _default_runtime():
    """The driver's answers through ctypes (driver.DriverRuntime: no import, where CuPy's cost a
    torch user's first call over 100 ms), else CuPy's runtime. Either way only where CuPy is
    installed: without it opfacade runs no GPU SKU, and BackendUnavailable names what to install
    (asked of the import system, which finds CuPy without importing it)."""
    try:
        installed = importlib.util.find_spec("cupy") is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a broken entry
        installed = False
    if not installed:
        raise BackendUnavailable(with_install_hint(
            "CuPy is not installed, so no GPU can be used"))
    found = driver_runtime()
    if found is not None:
        return found
    try:
        import cupy
    except ImportError as error:
        raise BackendUnavailable(with_install_hint(
            f"CuPy failed to import, so no GPU can be used: {error}")) from None
    return cupy.cuda.runtime


def _device_zero() -> int:
    return 0


class Devices:
    """The GPUs this process sees, read through a CUDA runtime (the driver's by default, else
    CuPy's; or any object with their ``getDeviceCount``, ``getDevice``, ``setDevice`` and
    ``getDeviceProperties``).

    Holds the runtime, the device count and each device's architecture and name, all read once;
    ``clear()`` forgets them. The current device is asked of the runtime on every call (a
    function looked up each time, so that a stand-in's replacement is seen), except with one GPU.
    """

    def __init__(self, runtime: object | None = None) -> None:
        self._given = runtime
        self.clear()

    def clear(self) -> None:
        """Forgets the runtime, the count and every device's properties."""
        self._runtime = self._given
        self._count: int | None = None
        self._arch: dict[int, ArchSku] = {}
        self._names: dict[int, str] = {}
        self._sm_counts: dict[int, int] = {}

    def runtime(self):
        """The CUDA runtime; BackendUnavailable when neither libcuda opens nor CuPy imports."""
        runtime = self._runtime
        if runtime is None:
            runtime = self._runtime = _default_runtime()
        return runtime

    def count(self) -> int:
        """Visible CUDA devices; 0 when there is no CuPy, no driver or no GPU (never raises)."""
        count = self._count
        if count is None:
            try:
                count = int(self.runtime().getDeviceCount())
            except Exception as error:
                LOG.debug("no CUDA device is visible: %s", error)
                count = 0
            self._count = count
        return count

    def current(self) -> int:
        """The current device: 0 when the process sees one GPU, else the runtime's answer."""
        count = self._count
        if count is None:
            count = self.count()
        return 0 if count == 1 else self.runtime().getDevice()

    def current_reader(self) -> Callable[[], int]:
        """The cheapest call that returns the current device, for a caller that asks on every
        run: a constant 0 with one GPU, else ``current``."""
        return _device_zero if self.count() == 1 else self.current

    def arch(self, device: int) -> ArchSku:
        """The newest ArchSku the device covers (an sm_87 part runs what sm86 SKUs need)."""
        found = self._arch.get(device)
        if found is None:
            props = self.runtime().getDeviceProperties(device)
            capability = (int(props["major"]), int(props["minor"]))
            covered = [arch for arch in ArchSku if arch.compute_capability <= capability]
            if not covered:
                raise BackendUnavailable(
                    f"cuda:{device} has compute capability {capability}; opfacade needs "
                    f"{ArchSku.sm80.compute_capability} or newer")
            found = self._arch[device] = max(covered, key=lambda arch: arch.compute_capability)
        return found

    def sm_count(self, device: int) -> int:
        """The device's multiprocessor count (two parts of one name can differ in it)."""
        found = self._sm_counts.get(device)
        if found is None:
            props = self.runtime().getDeviceProperties(device)
            found = self._sm_counts[device] = int(props["multiProcessorCount"])
        return found

    def name(self, device: int) -> str:
        """The device's marketing name ("NVIDIA H100 80GB HBM3")."""
        found = self._names.get(device)
        if found is None:
            name = self.runtime().getDeviceProperties(device)["name"]
            found = self._names[device] = name.decode() if isinstance(name, bytes) else str(name)
        return found


DEVICES = Devices()


def device_count() -> int:
    """Visible CUDA devices; 0 when there is no driver or no GPU (never raises)."""
    return DEVICES.count()


def current_device() -> int:
    """The current CUDA device (0 without asking when the process sees one GPU)."""
    return DEVICES.current()


@contextlib.contextmanager
def on_device(device: int):
    """Makes ``device`` current for the block (the libraries bind and launch on the current
    device), and restores the previous one after it."""
    previous = DEVICES.current()
    if previous == device:
        yield
        return
    runtime = DEVICES.runtime()
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


def device_arch(device: int) -> ArchSku:
    """The newest ArchSku the device covers (an sm_87 part runs what sm86 SKUs need)."""
    return DEVICES.arch(device)


def device_name(device: int) -> str:
    return DEVICES.name(device)


def device_sm_count(device: int) -> int:
    return DEVICES.sm_count(device)
