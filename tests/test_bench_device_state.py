"""The bench's record of the clocks and power it ran under (_bench/device_state.py), without a
GPU: NVML's answers through a fake library, each refused field as None, and no NVML at all as
None rather than an error."""

from __future__ import annotations

import ctypes

import pytest

from opfacade._bench import device_state as state_module


@pytest.fixture(autouse=True)
def _fresh_lookups():
    """NVML and each device's handle are looked up once a process: each test looks again."""
    cached = (state_module._nvml, state_module._handle)  # as defined, not as a test patches
    for function in cached:
        function.cache_clear()
    yield
    for function in cached:
        function.cache_clear()


class _FakeNvml:
    """NVML's calls device_state makes, answering from ``values`` (name -> value, or a
    non-zero status where a name is missing)."""

    def __init__(self, values: dict, bus_ids: list):
        self.values, self.bus_ids = values, bus_ids

    def nvmlInit_v2(self):
        return 0

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus, handle):
        self.bus_ids.append(bus)
        return 0

    def __getattr__(self, name):
        def call(_handle, *args):
            key = (name, *args[:-1])
            if key not in self.values:
                return 999  # NVML_ERROR_UNKNOWN
            args[-1]._obj.value = self.values[key]
            return 0
        return call


def test_readings_come_back_in_mhz_watts_and_degrees(monkeypatch):
    values = {("nvmlDeviceGetClockInfo", 1): 1755, ("nvmlDeviceGetMaxClockInfo", 1): 1980,
              ("nvmlDeviceGetClockInfo", 2): 3201, ("nvmlDeviceGetMaxClockInfo", 2): 3201,
              ("nvmlDeviceGetEnforcedPowerLimit",): 700000, ("nvmlDeviceGetPowerUsage",): 612345,
              ("nvmlDeviceGetTemperature", 0): 61,
              ("nvmlDeviceGetCurrentClocksEventReasons",): 0x4}
    bus_ids: list = []
    monkeypatch.setattr(state_module, "_nvml", lambda: _FakeNvml(values, bus_ids))
    monkeypatch.setattr(state_module, "_pci_bus_id", lambda device: b"00000000:19:00.0")
    state = state_module.device_state(3)
    assert bus_ids == [b"00000000:19:00.0"]
    assert state == {"sm_clock_mhz": 1755, "sm_clock_max_mhz": 1980, "memory_clock_mhz": 3201,
                     "memory_clock_max_mhz": 3201, "power_limit_w": pytest.approx(700.0),
                     "power_draw_w": pytest.approx(612.345), "temperature_c": 61,
                     "clock_event_reasons": 4}
    line = state_module.format_state(state)
    assert "SM 1755 MHz (max 1980 MHz)" in line and "power 612 W of 700 W" in line
    assert "61 C" in line and "reasons 0x4 software power cap" in line


def test_a_field_the_driver_refuses_is_none_and_prints_as_unknown(monkeypatch):
    values = {("nvmlDeviceGetClockInfo", 1): 1980}
    monkeypatch.setattr(state_module, "_nvml", lambda: _FakeNvml(values, []))
    monkeypatch.setattr(state_module, "_pci_bus_id", lambda device: b"0")
    state = state_module.device_state(0)
    assert state["sm_clock_mhz"] == 1980
    assert state["power_limit_w"] is None and state["clock_event_reasons"] is None
    assert "power ? of ?" in state_module.format_state(state)


def test_no_nvml_is_none_not_an_error(monkeypatch):
    def refuse(name, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", refuse)
    assert state_module._nvml() is None
    assert state_module.device_state(0) is None
    assert state_module.format_state(None) == "device state: NVML not available"


def test_an_entry_point_an_older_nvml_lacks_is_none(monkeypatch):
    class _Older(_FakeNvml):
        def __getattr__(self, name):
            if name == "nvmlDeviceGetCurrentClocksEventReasons":
                raise AttributeError(name)
            return super().__getattr__(name)

    monkeypatch.setattr(state_module, "_nvml", lambda: _Older({}, []))
    monkeypatch.setattr(state_module, "_pci_bus_id", lambda device: b"0")
    assert state_module.device_state(0)["clock_event_reasons"] is None


def test_clear_caches_forgets_the_handles(monkeypatch):
    import opfacade

    opened = []
    monkeypatch.setattr(ctypes, "CDLL", lambda name: opened.append(name) or _FakeNvml({}, []))
    monkeypatch.setattr(state_module, "_pci_bus_id", lambda device: b"0")
    state_module.device_state(0), state_module.device_state(0)
    assert opened == ["libnvidia-ml.so.1"]  # opened once
    opfacade.clear_caches()
    state_module.device_state(0)
    assert opened == ["libnvidia-ml.so.1"] * 2  # opened again
