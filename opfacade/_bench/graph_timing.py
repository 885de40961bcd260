"""GPU time per call replayed from CUDA graphs, for rows whose bursts may be timing the host.

A graph replays its captured calls with no host work between them, so its time per call is the
GPU's whatever each call costs the host. Capturing goes through ``CUDAGraph.capture_begin`` and
``capture_end`` inside our own stream context rather than ``torch.cuda.graph``: that context's
exit ends the capture before it restores the current stream, so a capture that fails to end (an
invalidated one) leaves torch's current stream on the capture stream for the rest of the process.
Everything launched afterwards then runs on that non-blocking stream, which the bursts' events on
the legacy default stream do not wait for: the bursts time the host's issue alone (the
64x8192x8192 forward "at 370 TFLOP/s" of the first H100 run with graphs). So each contestant gets
a fresh capture stream, a failed capture is ended and its memory pool released here, and after
every capture the process must be back on the stream it started on with nothing capturing, or
the bench stops.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from dataclasses import dataclass

# Only the capturing thread's unsafe calls invalidate a capture (autograd's worker threads and
# the allocator's own threads go on as they do outside a capture).
CAPTURE_MODE = "thread_local"
# Calls on the capture stream before capturing: plans, call memos, cuBLAS workspaces and the
# allocator's blocks are made for that stream outside the capture.
WARMUP_CALLS = 3
# Replays are 5 ms each and all alike: a few rounds give a stable median at small cost.
MAX_REPLAY_ROUNDS = 10

Maker = Callable[[object], Callable[[], object]]


class CaptureFailed(Exception):
    """A contestant's calls could not be captured, or the graph does not hold them all."""


@dataclass
class Captured:
    """A graph holding ``calls`` back-to-back calls of one contestant, the call it captured (kept
    alive with the graph: an autograd backward's saved tensors, made outside the graph's pool,
    are what its replays read), and its node counts where the graph could be read: all nodes,
    and the work nodes (kernels, copies, memsets), counted into child graphs."""

    graph: object
    calls: int
    call: Callable[[], object]
    nodes: int | None = None
    work_nodes: int | None = None


def work_count_problem(work_nodes: int | None, calls: int) -> str | None:
    """Why a graph of ``calls`` identical calls cannot be holding them all, or None. Each call
    launches the same kernels, copies and memsets, so the graph's work nodes are a non-zero
    multiple of the calls; fewer would make the replay's time per call less than a call's."""
    if work_nodes is None or (work_nodes >= calls and work_nodes % calls == 0):
        return None
    return f"the graph holds {work_nodes} kernel, copy and memset nodes for {calls} calls"


def capture(torch, make: Maker, calls: int) -> Captured:
    """``calls`` calls of ``make(stream)``'s function captured on a fresh stream, warmed up on it
    first. Raises CaptureFailed (the capture ended and discarded) when the capture fails or the
    graph holds fewer work nodes than calls; RuntimeError when the process could not be brought
    back to a clean state."""
    before = torch.cuda.current_stream()
    stream = torch.cuda.Stream()
    graph, kept = _new_graph(torch)
    pool = torch.cuda.graph_pool_handle()
    torch.cuda.synchronize()  # the inputs, made on the default stream, are ready
    try:
        with torch.cuda.stream(stream):
            fn = make(stream)
            for _ in range(WARMUP_CALLS):
                fn()
            torch.cuda.synchronize()
            graph.capture_begin(pool=pool, capture_error_mode=CAPTURE_MODE)
            for _ in range(calls):
                fn()
            graph.capture_end()
    except Exception as error:
        _abandon(torch, graph, stream, pool)
        raise CaptureFailed(f"{type(error).__name__}: {_first_line(error)}") from error
    finally:
        _require_clean(torch, stream, before)
    nodes, work = count_nodes(graph) if kept else (None, None)
    problem = work_count_problem(work, calls)
    if problem:
        graph.reset()
        raise CaptureFailed(problem)
    if kept:
        graph.instantiate()  # now, not inside the first timed replay
    return Captured(graph, calls, fn, nodes, work)


def _new_graph(torch) -> tuple[object, bool]:
    """A graph that keeps its cudaGraph_t for counting nodes (torch >= 2.7), else a plain one."""
    try:
        return torch.cuda.CUDAGraph(keep_graph=True), True
    except TypeError:
        return torch.cuda.CUDAGraph(), False


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [""])[0][:120]


def _quietly(call: Callable, *args) -> None:
    """Cleanup of a capture that already failed: that failure is the one reported."""
    with contextlib.suppress(Exception):
        call(*args)


def _abandon(torch, graph, stream, pool) -> None:
    """Ends a failed capture and releases what it holds. torch's ``capture_end`` raises before
    telling the allocator to stop filling the graph's pool when the driver refuses to end an
    invalidated capture, so that is done here (torch's private calls, where present)."""
    with torch.cuda.stream(stream):
        if torch.cuda.is_current_stream_capturing():
            _quietly(graph.capture_end)
        if torch.cuda.is_current_stream_capturing():  # capture_end refused: end it in the driver
            _end_capture_in_driver(stream.cuda_stream)
    try:
        graph.pool()  # raises unless capture_end got through, after which reset releases the pool
    except RuntimeError:
        device = torch.cuda.current_device()
        for name in ("_cuda_endAllocateToPool", "_cuda_releasePool"):
            release = getattr(torch._C, name, None)
            if release is not None:
                _quietly(release, device, tuple(pool))
    _quietly(graph.reset)


def _end_capture_in_driver(handle: int) -> None:
    from cuda.bindings import driver

    _, graph = driver.cuStreamEndCapture(driver.CUstream(handle))
    if graph is not None and int(graph):
        driver.cuGraphDestroy(graph)


def _require_clean(torch, stream, before) -> None:
    """After a capture, failed or not: back on ``before``, no capture underway on either stream,
    no error left on the device (synchronize raises one). Anything else would make every later
    figure of the process wrong, so it stops the bench."""
    if torch.cuda.current_stream() != before:
        torch.cuda.set_stream(before)
    for where in (stream, before):
        with torch.cuda.stream(where):
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"a CUDA graph capture is still underway on {where} after "
                                   "capturing ended: later timings of this process would be wrong")
    torch.cuda.synchronize()


def count_nodes(graph) -> tuple[int | None, int | None]:
    """(all nodes, work nodes) of a graph made with ``keep_graph=True``, counting into child
    graphs; (None, None) where the graph or cuda.bindings cannot be read (the count is a check
    on top of the timing, never a reason to lose it; the probe prints what it got)."""
    try:
        from cuda.bindings import driver

        return _count(driver, driver.CUgraph(graph.raw_cuda_graph()))
    except Exception:  # an older torch or cuda.bindings, or a binding that changed its calls
        return None, None


def _count(driver, graph) -> tuple[int | None, int | None]:
    error, _, count = driver.cuGraphGetNodes(graph, 0)
    if error != driver.CUresult.CUDA_SUCCESS:
        return None, None
    error, nodes, _ = driver.cuGraphGetNodes(graph, count)
    if error != driver.CUresult.CUDA_SUCCESS:
        return None, None
    types = driver.CUgraphNodeType
    work_types = (types.CU_GRAPH_NODE_TYPE_KERNEL, types.CU_GRAPH_NODE_TYPE_MEMCPY,
                  types.CU_GRAPH_NODE_TYPE_MEMSET)
    total = work = 0
    for node in nodes:
        error, kind = driver.cuGraphNodeGetType(node)
        if error != driver.CUresult.CUDA_SUCCESS:
            return None, None
        if kind == types.CU_GRAPH_NODE_TYPE_GRAPH:
            inner = _count(driver, driver.cuGraphChildGraphNodeGetGraph(node)[1])
            if None in inner:
                return None, None
            total, work = total + inner[0], work + inner[1]
        else:
            total += 1
            work += kind in work_types
    return total, work


def replay_ms(torch, captured: dict[str, Captured], rounds: int,
              settle: Callable[[], object] | None = None) -> dict[str, float]:
    """Median GPU milliseconds per call of each graph, replayed on torch's current stream (the
    default one, where the events are recorded too), in alternating rounds as the bursts are,
    ``settle`` (untimed) before each as before each burst."""
    stream = torch.cuda.current_stream()
    if stream != torch.cuda.default_stream():
        raise RuntimeError(f"graph replays are timed on the default stream, but torch's current "
                           f"stream is {stream}")
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples: dict[str, list[float]] = {name: [] for name in captured}
    names = list(captured)
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            graph = captured[name].graph
            if settle is not None:
                settle()
            graph.replay()  # untimed: the GPU is busy when the timed replay starts
            start.record(stream)
            graph.replay()
            stop.record(stream)
            stop.synchronize()
            samples[name].append(start.elapsed_time(stop) / captured[name].calls)
    return {name: statistics.median(times) for name, times in samples.items()}


def release(torch, captured: dict[str, Captured]) -> None:
    """Drops the graphs and their private memory pools before the next row allocates."""
    torch.cuda.synchronize()
    for item in captured.values():
        item.graph.reset()
    captured.clear()
    torch.cuda.empty_cache()


def time_in_cuda_graphs(fns: dict[str, Callable[[], object]], makers: dict[str, Maker],
                        calls: dict[str, int], reps: int,
                        settle: Callable[[], object] | None = None
                        ) -> tuple[dict[str, float], dict[str, str]]:
    """Median GPU milliseconds per call of each contestant replayed from a CUDA graph of
    ``calls[name]`` of its calls (``makers[name](stream)`` builds the call to capture on the
    capture stream, e.g. an autograd backward whose forward must run there; otherwise
    ``fns[name]``), each replay after ``settle`` where given (``common.settle_by_copying``).
    Returns (times, why each contestant that has no time failed)."""
    import torch

    captured: dict[str, Captured] = {}
    failed: dict[str, str] = {}
    try:
        for name, fn in fns.items():
            make = makers.get(name, lambda stream, fn=fn: fn)
            try:
                captured[name] = capture(torch, make, calls[name])
            except CaptureFailed as error:  # reported in the row, never hidden
                failed[name] = str(error)
        times = (replay_ms(torch, captured, min(reps, MAX_REPLAY_ROUNDS), settle) if captured
                 else {})
    finally:
        release(torch, captured)
    return times, failed
