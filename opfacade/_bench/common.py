"""What every op's benchmark shares: CUDA-event timing in bursts, host time per call, the
judgement of a row timed again from CUDA graphs (``graph_timing``), and the row it reports."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from . import graph_timing
from .sustained import SUSTAINED_S


@dataclass
class BenchRow:
    """One case: our time, the peers' times, and what the ratios mean (peer time / ours).

    ``ours_ms`` and ``peers_ms`` are GPU milliseconds per call in back-to-back bursts (what a
    training loop sees). ``host_ms`` is each contestant's host time per call ("ours" included).
    Where a contestant's host time is at least its GPU time (``host_bound``), the burst measures
    the host, not the GPU: every contestant is then timed again from a CUDA graph that replays
    its captured calls (``graph_ms``, "ours" under that name), and the GPU ratios to read are
    those. A host-bound row without ``graph_ms`` says in its notes why (not captured, or the
    graph timing was implausible). ``sustained_ms``, where a row has it, is each contestant
    alone, back to back for a second ("ours" included; ``_bench/sustained.py``): the figure a
    loop of one power-hungry kernel gets, which the alternating bursts can flatter.
    """

    op: str
    case: str
    ours_ms: float
    figure: str  # e.g. "2.71 TB/s, 91% of copy" or "612 TFLOP/s"
    peers_ms: dict[str, float] = field(default_factory=dict)
    notes: str = ""
    host_ms: dict[str, float] = field(default_factory=dict)
    graph_ms: dict[str, float] = field(default_factory=dict)
    host_bound: list[str] = field(default_factory=list)
    sustained_ms: dict[str, float] = field(default_factory=dict)

    def speedup(self, peer: str) -> float:
        return self.peers_ms[peer] / self.ours_ms

    @property
    def best_peer(self) -> str | None:
        return min(self.peers_ms, key=self.peers_ms.get) if self.peers_ms else None


# Each timed sample is a burst of back-to-back calls lasting about this long: long enough that
# the two event records and the host's issue of the first call are noise, short enough to take
# many samples.
BURST_MS = 5.0
# Calls in one burst at most (a CUDA graph of calls holds no more either).
MAX_BURST_CALLS = 400
# The bytes a settle (``settle_by_copying``) copies: with the copy's destination more than any
# GPU's L2 (50 MB on an H100, 60 MB on an H200), as Triton's do_bench flushes the L2 between
# timings.
SETTLE_BYTES = 128 << 20


def settle_by_copying(torch, nbytes: int = SETTLE_BYTES) -> Callable[[], object]:
    """A settle for ``time_interleaved``: a device copy of ``nbytes`` between two scratch buffers
    (a ``functools.partial`` of the destination's ``copy_``).

    Why (docs/DECODE.md, "What the torch peer leaves behind"): on an H200 the decode step ran
    2-3.4% slower after a burst of torch's flash or cuDNN attention kernels (the torch peer
    among them) than after a copy, and stayed slow for as long as only it, the peer or a
    spinning kernel ran. With two contestants each always follows the other, so one of them was
    always timed in the state the other left. A copy of 4 MiB or more cleared it in full, a
    memset of 128 MiB in part. A copy before every burst gives each contestant the same start."""
    import functools

    source = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    return functools.partial(torch.empty_like(source).copy_, source)


def burst_calls(ms_per_call: float) -> int:
    """Calls making up about BURST_MS of work at ``ms_per_call``, at most MAX_BURST_CALLS."""
    return max(1, min(MAX_BURST_CALLS, int(BURST_MS / max(ms_per_call, 1e-3))))


def call_ms(fn: Callable[[], object]) -> float:
    """GPU milliseconds of one call of ``fn``, between two CUDA events on the legacy default
    stream: what a burst (``burst_calls``) or a sustained run (``sustained.py``) is sized by."""
    import cupy

    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(cupy.cuda.Stream.null)
    fn()
    stop.record(cupy.cuda.Stream.null)
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop)


def time_ms(fn: Callable[[], object], reps: int = 20, warmup: int = 3) -> float:
    """Median GPU milliseconds per call of ``fn``, timed as ``time_interleaved`` times each of
    its functions."""
    return time_interleaved({"fn": fn}, reps, warmup)["fn"]


def time_interleaved(fns: dict[str, Callable[[], object]], reps: int = 20,
                     warmup: int = 3, settle: Callable[[], object] | None = None
                     ) -> dict[str, float]:
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
    burst starts at). ``settle``, where given, runs untimed before every burst (and its untimed
    first call): ``settle_by_copying``.
    """
    import cupy

    bursts = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        bursts[name] = burst_calls(call_ms(fn))
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for round_ in range(reps):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            fn = fns[name]
            if settle is not None:
                settle()
            fn()  # untimed: keeps the GPU busy while the host issues the burst
            start.record(cupy.cuda.Stream.null)
            for _ in range(bursts[name]):
                fn()
            stop.record(cupy.cuda.Stream.null)
            stop.synchronize()
            samples[name].append(cupy.cuda.get_elapsed_time(start, stop) / bursts[name])
    return {name: statistics.median(times) for name, times in samples.items()}


def host_us_interleaved(fns: dict[str, Callable[[], object]], calls: int, rounds: int = 7,
                        first_untimed: bool = False) -> dict[str, float]:
    """Median host microseconds per call of each function: every round times a batch of
    ``calls`` back-to-back calls of each in turn (rotating the order), the GPU idle at the start
    of each batch. Batches must be short enough never to fill the launch queue, or the figure
    becomes the GPU's time instead of the host's.

    ``first_untimed``: each batch's first call runs before the clock starts, so the figure is
    what the calls after it cost. The first call after the host's wait on the GPU cost 12-150 us
    on an H100 host where the next ones cost 5-12 (the longer the wait, the more;
    scripts/host_batch_probe.py, catalog/probes/host_batch_probe_H100.json): in a batch of 20
    that one call adds up to 7 us a call."""
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
            if first_untimed:
                fn()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    cupy.cuda.runtime.deviceSynchronize()
    return {name: statistics.median(times) for name, times in samples.items()}


def format_rows(rows: list[BenchRow]) -> str:
    """A plain table: one line per case, every peer's ratio (peer ms / ours ms) after it; a
    host-bound row says who is host-bound and gives the ratios of the CUDA-graph replays."""
    lines = [f"{'op':16} {'case':44} {'ours ms':>9}  {'figure':28} vs peers (peer ms / ours ms)"]
    for r in rows:
        peers = ", ".join(f"{name} {ms / r.ours_ms:.2f}x" for name, ms in r.peers_ms.items())
        lines.append(f"{r.op:16} {r.case:44} {r.ours_ms:9.3f}  {r.figure:28} {peers}")
        if r.host_bound:
            lines.append(f"{'':16} {'  HOST-BOUND: ' + ', '.join(r.host_bound):44} "
                         f"{r.graph_ms.get('ours', float('nan')):9.3f}  {'CUDA-graph replay':28} "
                         f"{_graph_ratios(r)}")
        if "ours" in r.sustained_ms:
            ours = r.sustained_ms["ours"]
            ratios = ", ".join(f"{name} {r.sustained_ms[name] / ours:.2f}x"
                               for name in r.peers_ms if name in r.sustained_ms)
            lines.append(f"{'':16} {'  SUSTAINED (each alone)':44} {ours:9.3f}  "
                         f"{f'back to back, {SUSTAINED_S:g} s':28} {ratios}")
    return "\n".join(lines)


def _graph_ratios(row: BenchRow) -> str:
    graph = row.graph_ms
    if "ours" not in graph:
        return "no CUDA-graph figures (see notes)"
    return ", ".join(f"{name} {graph[name] / graph['ours']:.2f}x" if name in graph
                     else f"{name} not captured" for name in row.peers_ms)


@dataclass
class Contest:
    """One row's contestants: each call as the bursts time it; for a call that must be built on
    the capture stream to be captured (an autograd backward runs on its forward's stream, a raw
    cuDNN handle on the stream it is bound to), a maker ``make(stream) -> call``; and the tensors
    our call writes (the graph probe checks that a replay wrote them)."""

    fns: dict[str, Callable[[], object]]
    makers: dict[str, graph_timing.Maker] = field(default_factory=dict)
    outputs: tuple = ()
    notes: str = ""


@dataclass
class Timings:
    """Each contestant's GPU time in bursts, host time per call, and (when one is host-bound)
    GPU time replayed from a CUDA graph; ``ours`` names our contestant; ``graph_notes`` says
    what kept contestants or the row from graph figures."""

    gpu_ms: dict[str, float]
    host_ms: dict[str, float]
    graph_ms: dict[str, float]
    host_bound: list[str]
    graph_notes: str = ""
    ours: str = "ours"

    def row(self, op: str, case: str, figure: Callable[[float], str], notes: str = ""
            ) -> BenchRow:
        """The bench row: ``figure(ours_ms)`` reads our GPU time (from the graph replay when a
        contestant is host-bound and ours was captured)."""
        ours_ms = self.gpu_ms[self.ours]
        peers = {name: ms for name, ms in self.gpu_ms.items() if name != self.ours}
        graph = {("ours" if name == self.ours else name): ms for name, ms in self.graph_ms.items()}
        if self.host_bound:
            bound = ", ".join(
                f"{name} (host {self.host_ms[name]:.3f} ms per call"
                + (f" >= GPU {self.graph_ms[name]:.3f} ms)" if name in self.graph_ms
                   else f", burst {self.gpu_ms[name]:.3f} ms)")
                for name in self.host_bound)
            notes = "; ".join(filter(None, (notes, f"host-bound: {bound}", self.graph_notes)))
        figure_ms = graph.get("ours", ours_ms)
        return BenchRow(op, case, ours_ms, figure(figure_ms), peers, notes,
                        host_ms={("ours" if n == self.ours else n): ms
                                 for n, ms in self.host_ms.items()},
                        graph_ms=graph, host_bound=list(self.host_bound))


# Host time per call is a batch of this many calls, short enough never to fill the launch queue.
HOST_CALLS = 20
# A burst's time per call is the GPU's only when the host issues calls faster than the GPU runs
# them. A contestant whose host time is at least this fraction of its burst time may be measuring
# its host: the row is timed again from CUDA graphs, which show the GPU's own time.
SUSPECT_FRACTION = 0.5
# A contestant that is not suspect has a burst that is the GPU's time; replaying the same calls
# from a graph removes only the gaps between launches, so it cannot take less than this fraction
# of the burst. Less means the graph or its timing is wrong (a graph missing calls, events on
# another stream), and the row keeps its burst figures.
PLAUSIBLE_FRACTION = 0.5
# Rows with a suspect are timed again from CUDA graphs unless `opfacade bench --no-graphs`.
RETIME_IN_GRAPHS = True


def step_host_note(run_call: Callable[[], object], step: Callable[[], object],
                   floor: Callable[[], object] | None = None) -> str:
    """The decode and kv_append rows' host figures (issue 13 §5): run() with a workspace and the
    prepared step, each timed in batches of HOST_CALLS begun on an idle GPU, and again with each
    batch's first call untimed: the host's wake-up from its wait on the GPU, which that first
    call pays, left out (host_us_interleaved's first_untimed). ``floor`` (host_floor.replay_floor),
    timed among them: one graph replay of a kernel that does nothing, what this host and driver
    take for any prepared step (the hosts differ by 2x)."""
    fns = {"run": run_call, "step": step, **({"floor": floor} if floor else {})}
    batch = host_us_interleaved(fns, HOST_CALLS)
    steady = host_us_interleaved(fns, HOST_CALLS, first_untimed=True)
    floor_note = (f", one graph replay of a kernel that does nothing {steady['floor']:.1f} us"
                  if floor else "")
    return (f"host per call: run() {batch['run']:.1f} us, prepared step() {batch['step']:.1f} "
            f"us; after each batch's first call: run() {steady['run']:.1f} us, prepared step() "
            f"{steady['step']:.1f} us{floor_note}")


def suspects(gpu_ms: dict[str, float], host_ms: dict[str, float]) -> list[str]:
    """The contestants whose burst may be timing their host (in ``gpu_ms``'s order)."""
    return [name for name in gpu_ms if host_ms[name] >= SUSPECT_FRACTION * gpu_ms[name]]


def implausible(gpu_ms: dict[str, float], graph_ms: dict[str, float], suspect: list[str]
                ) -> dict[str, str]:
    """Each contestant whose graph time cannot be its GPU time, with why: one that is not a
    suspect, timed from a graph below PLAUSIBLE_FRACTION of its burst."""
    return {name: f"{name} {ms:.3f} ms per call from the graph against {gpu_ms[name]:.3f} ms in "
                  f"bursts, where its host is not the bound"
            for name, ms in graph_ms.items()
            if name not in suspect and ms < PLAUSIBLE_FRACTION * gpu_ms[name]}


def judge(gpu_ms: dict[str, float], host_ms: dict[str, float], graph_ms: dict[str, float],
          failed: dict[str, str], ours: str = "ours") -> Timings:
    """The timings of a row timed again from graphs: a contestant is host-bound when its host
    time per call is at least its GPU time from the graph, or when it is a suspect that could
    not be captured (then it cannot be told apart). One implausible graph time discards the
    row's graph figures: whatever made it wrong may have touched the others."""
    suspect = suspects(gpu_ms, host_ms)
    problems = [f"{name} not captured in a CUDA graph ({why})" for name, why in failed.items()]
    wrong = implausible(gpu_ms, graph_ms, suspect)
    if wrong:
        problems.append("graph timing implausible, burst figures kept: "
                        + "; ".join(wrong.values()))
        return Timings(gpu_ms, host_ms, {}, suspect, "; ".join(problems), ours)
    bound = [name for name in gpu_ms if name in graph_ms and host_ms[name] >= graph_ms[name]]
    bound += [name for name in suspect if name in failed]
    return Timings(gpu_ms, host_ms, graph_ms if bound else {}, bound, "; ".join(problems), ours)


def time_contestants(fns: dict[str, Callable[[], object]], reps: int = 20, *,
                     makers: dict[str, graph_timing.Maker] | None = None,
                     ours: str = "ours", settle: Callable[[], object] | None = None
                     ) -> Timings:
    """GPU milliseconds per call in bursts (``time_interleaved``) and host milliseconds per call.
    When a contestant's host time comes near its burst time, every contestant is timed again by
    replaying its calls captured in a CUDA graph (``graph_timing``): contestants must launch on
    torch's current stream to be captured, and ``makers`` builds on the capture stream those
    that need it (see ``Contest``). ``settle``: time_interleaved's, before each graph replay too."""
    _require_default_stream()
    gpu = time_interleaved(fns, reps, settle=settle)
    host = {name: us / 1e3 for name, us in host_us_interleaved(fns, HOST_CALLS, rounds=5).items()}
    suspect = suspects(gpu, host)
    if not suspect:
        return Timings(gpu, host, {}, [], "", ours)
    if not RETIME_IN_GRAPHS:
        return Timings(gpu, host, {}, suspect,
                       "host time at least half the burst time: the burst may measure the host "
                       "(graphs off: not timed again from CUDA graphs)", ours)
    graph, failed = graph_timing.time_in_cuda_graphs(
        fns, makers or {}, {name: burst_calls(gpu[name]) for name in fns}, reps, settle)
    return judge(gpu, host, graph, failed, ours)


def _require_default_stream() -> None:
    """The bursts' events are on the legacy default stream, so they time the contestants only
    when those launch there: torch's current stream must be its default one (a capture that
    left it elsewhere made a whole H100 run's later bursts time the host alone)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    current = torch.cuda.current_stream()
    if current != torch.cuda.default_stream():
        raise RuntimeError(f"torch's current stream is {current}, not the default stream the "
                           "bursts are timed on")
