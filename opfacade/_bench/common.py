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


def time_ms(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> float:
    """Median GPU milliseconds per call of ``fn`` on the legacy default stream.

    Each sample times a burst of back-to-back calls (about 2 ms of work) between two CUDA
    events, as a training loop issues them: a call's host time overlaps the previous call's GPU
    work, so the figure is device throughput for every peer alike. One untimed call goes first,
    so the GPU is already busy while the host prepares the burst's first call. Host time per
    call is measured separately (the host-overhead rows).
    """
    import cupy

    for _ in range(warmup):
        fn()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(cupy.cuda.Stream.null)
    fn()
    stop.record(cupy.cuda.Stream.null)
    stop.synchronize()
    once = cupy.cuda.get_elapsed_time(start, stop)
    burst = max(1, min(200, int(2.0 / max(once, 1e-3))))
    times = []
    for _ in range(reps):
        fn()  # untimed: keeps the GPU busy while the host issues the burst
        start.record(cupy.cuda.Stream.null)
        for _ in range(burst):
            fn()
        stop.record(cupy.cuda.Stream.null)
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / burst)
    return statistics.median(times)


def format_rows(rows: list[BenchRow]) -> str:
    """A plain table: one line per case, every peer's ratio (peer ms / ours ms) after it."""
    lines = [f"{'op':16} {'case':44} {'ours ms':>9}  {'figure':28} vs peers (peer ms / ours ms)"]
    for r in rows:
        peers = ", ".join(f"{name} {ms / r.ours_ms:.2f}x" for name, ms in r.peers_ms.items())
        lines.append(f"{r.op:16} {r.case:44} {r.ours_ms:9.3f}  {r.figure:28} {peers}")
    return "\n".join(lines)
