"""What every op's benchmark shares: CUDA-event timing and the row it reports."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class BenchRow:
    """One case: our time, the peers' times, and what the ratios mean (peer time / ours)."""

    op: str
    case: str
    ours_ms: float
    figure: str  # e.g. "2.71 TB/s, 91% of copy" or "612 TFLOP/s"
    peers_ms: dict[str, float] = field(default_factory=dict)
    notes: str = ""

    def speedup(self, peer: str) -> float:
        return self.peers_ms[peer] / self.ours_ms

    @property
    def best_peer(self) -> str | None:
        return min(self.peers_ms, key=self.peers_ms.get) if self.peers_ms else None


# Each timed sample is a burst of back-to-back calls lasting about this long: long enough that
# the two event records and the host's issue of the first call are noise, short enough to take
# many samples.
BURST_MS = 5.0


def time_ms(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> float:
    """Median GPU milliseconds per call of ``fn``, timed as ``time_interleaved`` times each of
    its functions."""
    return time_interleaved({"fn": fn}, reps, warmup)["fn"]


def time_interleaved(fns: dict[str, Callable[[], object]], reps: int = 20,
                     warmup: int = 3) -> dict[str, float]:
    """Median GPU milliseconds per call of each function, sampled in alternating rounds.

    Each sample times a burst of back-to-back calls (about BURST_MS of work) between two CUDA
    events on the legacy default stream, as a training loop issues them: a call's host time
    overlaps the previous call's GPU work, so the figure is device throughput for every peer
    alike. One untimed call goes first, so the GPU is already busy while the host issues the
    burst. Host time per call is measured separately (the host-overhead rows).

    Each round times one burst of every function in turn, so a drift of the GPU's clocks or
    temperature lands on every peer alike instead of on whichever was timed last: back-to-back
    single measurements of one GEMM differ by up to 8% on an H100. The order rotates every
    round, so no function always follows the same one (a heavy peer changes the clocks the next
    burst starts at).
    """
    import cupy

    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    bursts = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        start.record(cupy.cuda.Stream.null)
        fn()
        stop.record(cupy.cuda.Stream.null)
        stop.synchronize()
        once = cupy.cuda.get_elapsed_time(start, stop)
        bursts[name] = max(1, min(400, int(BURST_MS / max(once, 1e-3))))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for round_ in range(reps):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            fn = fns[name]
            fn()  # untimed: keeps the GPU busy while the host issues the burst
            start.record(cupy.cuda.Stream.null)
            for _ in range(bursts[name]):
                fn()
            stop.record(cupy.cuda.Stream.null)
            stop.synchronize()
            samples[name].append(cupy.cuda.get_elapsed_time(start, stop) / bursts[name])
    return {name: statistics.median(times) for name, times in samples.items()}


def host_us_interleaved(fns: dict[str, Callable[[], object]], calls: int, rounds: int = 7
                        ) -> dict[str, float]:
    """Median host microseconds per call of each function: every round times a batch of
    ``calls`` back-to-back calls of each in turn (rotating the order), the GPU idle at the start
    of each batch. Batches must be short enough never to fill the launch queue, or the figure
    becomes the GPU's time instead of the host's."""
    import time

    import cupy

    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for fn in fns.values():  # warm up
        for _ in range(calls):
            fn()
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            fn = fns[name]
            cupy.cuda.runtime.deviceSynchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    cupy.cuda.runtime.deviceSynchronize()
    return {name: statistics.median(times) for name, times in samples.items()}


def format_rows(rows: list[BenchRow]) -> str:
    """A plain table: one line per case, every peer's ratio (peer ms / ours ms) after it."""
    lines = [f"{'op':16} {'case':44} {'ours ms':>9}  {'figure':28} vs peers (peer ms / ours ms)"]
    for r in rows:
        peers = ", ".join(f"{name} {ms / r.ours_ms:.2f}x" for name, ms in r.peers_ms.items())
        lines.append(f"{r.op:16} {r.case:44} {r.ours_ms:9.3f}  {r.figure:28} {peers}")
    return "\n".join(lines)
