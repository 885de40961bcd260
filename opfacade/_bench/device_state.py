"""What the GPU ran at while the bench measured it: SM and memory clocks (now and the most it
allows), the power limit and draw, the temperature and the driver's active clock-event reasons,
read through NVML (libnvidia-ml, by ctypes: nothing is imported).

Why: H200 hosts of the same kind read the same decode kernel 8 points of a copy apart (the kq
tile's register build 90% on one, 98% on another; catalog/probes/decode_kq_bulk_H200.json)
while their device copies agreed within 1%. A bench record that carries the clocks and power it
ran under lets such rows be compared across hosts. Every reading is best-effort: a host without
NVML, or a field the driver refuses, gives None, never an error.
"""

from __future__ import annotations

import ctypes
import functools

__all__ = ["device_state", "forget", "format_state"]

# nvmlClockType_t and nvmlTemperatureSensors_t (nvml.h).
_SM, _MEMORY = 1, 2
_GPU_SENSOR = 0
# nvmlClocksEventReasons (nvml.h): why the SM clock is below its most, bit by bit.
REASONS = {0x1: "idle", 0x2: "applications clocks", 0x4: "software power cap",
           0x8: "hardware slowdown", 0x10: "sync boost", 0x20: "software thermal",
           0x40: "hardware thermal", 0x80: "hardware power brake", 0x100: "display clock"}


@functools.cache
def _nvml():
    """libnvidia-ml opened and initialised once a process, or None."""
    try:
        library = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    return library if library.nvmlInit_v2() == 0 else None


def _pci_bus_id(device: int) -> bytes | None:
    """The CUDA ordinal's PCI bus id (CUDA and NVML number devices differently)."""
    from .._internal.driver import libcuda

    library = libcuda()
    if library is None:
        return None
    handle, bus = ctypes.c_int(0), ctypes.create_string_buffer(32)
    if library.cuDeviceGet(ctypes.byref(handle), device) != 0:
        return None
    if library.cuDeviceGetPCIBusId(bus, len(bus), handle) != 0:
        return None
    return bus.value


@functools.cache
def _handle(device: int) -> tuple | None:
    """(NVML, its handle of CUDA device ``device``), looked up once: sustained.py reads the
    state every 20 ms while kernels run."""
    nvml = _nvml()
    bus = _pci_bus_id(device) if nvml is not None else None
    if bus is None:
        return None
    handle = ctypes.c_void_p()
    if nvml.nvmlDeviceGetHandleByPciBusId_v2(bus, ctypes.byref(handle)) != 0:
        return None
    return nvml, handle


def forget() -> None:
    """Drops NVML's library and handles (opfacade.clear_caches()): the next reading looks them
    up again."""
    _nvml.cache_clear()
    _handle.cache_clear()


def device_state(device: int = 0) -> dict | None:
    """NVML's readings of CUDA device ``device`` (MHz, W, degrees C, the reasons as NVML's
    bitmask), or None where NVML or the device cannot be reached."""
    found = _handle(device)
    if found is None:
        return None
    nvml, handle = found

    def read(function: str, *args, scale: float = 1.0):
        value = ctypes.c_ulonglong(0) if function.endswith("Reasons") else ctypes.c_uint(0)
        try:
            status = getattr(nvml, function)(handle, *args, ctypes.byref(value))
        except AttributeError:  # an older libnvidia-ml without this entry point
            return None
        return None if status != 0 else (value.value * scale if scale != 1.0 else value.value)

    return {
        "sm_clock_mhz": read("nvmlDeviceGetClockInfo", _SM),
        "sm_clock_max_mhz": read("nvmlDeviceGetMaxClockInfo", _SM),
        "memory_clock_mhz": read("nvmlDeviceGetClockInfo", _MEMORY),
        "memory_clock_max_mhz": read("nvmlDeviceGetMaxClockInfo", _MEMORY),
        "power_limit_w": read("nvmlDeviceGetEnforcedPowerLimit", scale=1e-3),
        "power_draw_w": read("nvmlDeviceGetPowerUsage", scale=1e-3),
        "temperature_c": read("nvmlDeviceGetTemperature", _GPU_SENSOR),
        "clock_event_reasons": read("nvmlDeviceGetCurrentClocksEventReasons"),
    }


def format_state(state: dict | None) -> str:
    """One line of ``device_state``'s readings for the bench's console."""
    if state is None:
        return "device state: NVML not available"

    def value(key: str, unit: str) -> str:
        found = state.get(key)
        return "?" if found is None else f"{found:.0f} {unit}"

    reasons = state.get("clock_event_reasons")
    named = "?" if reasons is None else hex(reasons) + "".join(
        f" {name}" for bit, name in REASONS.items() if reasons & bit)
    return (f"device state: SM {value('sm_clock_mhz', 'MHz')} (max "
            f"{value('sm_clock_max_mhz', 'MHz')}), memory {value('memory_clock_mhz', 'MHz')}, "
            f"power {value('power_draw_w', 'W')} of {value('power_limit_w', 'W')}, "
            f"{value('temperature_c', 'C')}, clock-event reasons {named}")
