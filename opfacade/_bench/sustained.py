"""Each contestant alone, called back to back for a second, with the SM clock and power NVML
reads meanwhile: what a loop that runs one kernel over and over gets from a GPU at its power
limit.

Why: the bursts of ``common.time_interleaved`` alternate contestants every few tens of
milliseconds, so a kernel that draws more power than its neighbour runs, in its burst, at a
clock it could not hold alone. On an H200 (700 W) our f32 d128 forward held the power cap at
1845-1905 MHz when run alone and read 0.90-0.96x torch's f32 SDPA (555 W, 1980 MHz), where the
alternating bursts read 0.9986x (scripts/clock_probe.py, catalog/probes/clock_probe_H200.json).
Rows whose kernels are compute-bound give both figures.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .device_state import device_state

__all__ = ["SUSTAINED_S", "Sustained", "nvml_samples", "sustained_note", "time_sustained"]

SUSTAINED_S = 1.0  # sampled seconds of calls a contestant
_UNSAMPLED_S = 0.3  # calls first, so the clock has settled to this load
_SAMPLE_EVERY_S = 0.02
_POWER_CAP = 0x4  # nvmlClocksEventReasons' software power cap
_MOST_CALLS = 2000  # a short kernel's count is bounded by its host time, not this module's aim


@dataclass(frozen=True)
class Sustained:
    """GPU milliseconds per call over the sampled calls; the median SM clock and power NVML
    read meanwhile (None without NVML), and whether the power cap held the clock at any
    sample."""

    ms: float
    sm_clock_mhz: float | None
    power_w: float | None
    power_capped: bool


@contextlib.contextmanager
def nvml_samples(device: int = 0):
    """NVML's readings of ``device`` (``device_state``), one every ``_SAMPLE_EVERY_S`` from a
    thread while the block runs: the list it yields fills meanwhile, and holds the readings
    that succeeded once the block is left."""
    samples, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            samples.append(device_state(device))
            stop.wait(_SAMPLE_EVERY_S)

    reader = threading.Thread(target=sample, daemon=True)
    reader.start()
    try:
        yield samples
    finally:
        stop.set()
        reader.join()
        samples[:] = [reading for reading in samples if reading]


def _calls_lasting(fn: Callable[[], object], seconds: float) -> int:
    """How many calls of ``fn`` take ``seconds`` of GPU time, from one timed call. The count,
    not the host's clock, bounds a run: calls are queued far faster than a long kernel runs,
    so a second of the host's calls can be many seconds of the GPU's."""
    from .common import call_ms  # here: common imports this module

    once = max(call_ms(fn), 1e-3)
    return min(_MOST_CALLS, max(1, round(seconds * 1e3 / once)))


def time_sustained(fns: dict[str, Callable[[], object]], seconds: float = SUSTAINED_S,
                   device: int = 0) -> dict[str, Sustained]:
    """Each of ``fns`` (launching on the legacy default stream, as the bursts' contestants do)
    alone: ``_UNSAMPLED_S`` of GPU time in calls, then ``seconds`` of it between two CUDA events
    while a thread reads NVML every ``_SAMPLE_EVERY_S``."""
    import cupy

    null = cupy.cuda.Stream.null
    results = {}
    for name, fn in fns.items():
        for _ in range(_calls_lasting(fn, _UNSAMPLED_S)):
            fn()
        calls = _calls_lasting(fn, seconds)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        with nvml_samples(device) as read:
            start.record(null)
            for _ in range(calls):
                fn()
            end.record(null)
            end.synchronize()

        def median(key: str, read=read) -> float | None:
            values = [s[key] for s in read if s.get(key) is not None]
            return statistics.median(values) if values else None

        results[name] = Sustained(
            cupy.cuda.get_elapsed_time(start, end) / calls, median("sm_clock_mhz"),
            median("power_draw_w"),
            any((s.get("clock_event_reasons") or 0) & _POWER_CAP for s in read))
    return results


def sustained_note(results: dict[str, Sustained], ours: str = "ours") -> str:
    """The row's note: each contestant's sustained time, clock and power, and the ratios."""
    parts = []
    for name, r in results.items():
        clock = "" if r.sm_clock_mhz is None else f" at SM {r.sm_clock_mhz:.0f} MHz"
        power = "" if r.power_w is None else f", {r.power_w:.0f} W"
        capped = ", power-capped" if r.power_capped else ""
        ratio = ("" if name == ours or ours not in results
                 else f" ({r.ms / results[ours].ms:.2f}x)")
        parts.append(f"{name} {r.ms:.3f} ms{clock}{power}{capped}{ratio}")
    return (f"sustained (each alone, back to back for {SUSTAINED_S:g} s): " + "; ".join(parts))
