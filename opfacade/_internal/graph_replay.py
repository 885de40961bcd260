"""Launches replayed as one CUDA graph (``GraphedLaunches``), through libcuda (driver.py).

A prepared call that several backends make in a hot loop (the NVRTC decode step, a cuDNN graph's
execute) costs the host one driver call per launch and whatever its library does around it
(cuDNN's execute: 12-14 us on the lent H100 hosts, docs/PERF-NOTES.md). Replayed from a CUDA
graph it is one ``cuGraphLaunch`` (2.6-5.6 us there), whatever it holds.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

from ..errors import LaunchFailed
from .driver import INVALID_CONTEXT, bare_function, bind_default_context
from .log import LOG

__all__ = ["LIBRARY_CAPTURE_AT", "REPLAY", "GraphedLaunches", "library_call"]

# Off: every GraphedLaunches launches directly (the A/B baseline of scripts/gpt_replay_ab.py).
REPLAY = True
# The call at which a library call (a cuDNN graph's execute, a cuBLASLt recipe) is captured. A
# capture (a stream, the launches under capture, the graph's instantiation) costs the host far
# more than a replay saves: in examples/gpt.py's eager training, where run()'s launches are
# re-pointed whenever the allocator hands out new addresses, capturing at the 2nd or the 16th
# call cost 19% and 11% of the tokens/s that direct launches gave in one H100 run, and the 2nd
# 1% in another (scripts/gpt_replay_ab.py). A launch used this often has paid for its capture:
# at 256, that harness gave 537k tokens/s against 531k launched directly (H100, 7 rounds).
LIBRARY_CAPTURE_AT = 256


class GraphedLaunches:
    """A fixed sequence of launches on one stream that replays as one CUDA graph.

    The calls before the ``capture_at``-th launch directly (a call made once never pays for a
    graph). That one captures the launches on a private stream and instantiates the graph; from
    then on a call is one ``cuGraphLaunch`` on the caller's stream, where several launches would
    each cost the driver's launch time. While the caller's stream is itself being captured (the
    caller building their own CUDA graph), the launches go in directly, as nodes of that graph.
    """

    __slots__ = ("_calls", "_capture_at", "_capturing", "_capturing_cell", "_device", "_direct",
                 "_exec", "_exec_handle", "_graph", "_graph_launch", "_keep", "_make",
                 "_stream", "_stream_handle", "_unavailable")

    def __init__(self, make: Callable[[int], list[Callable[[], None]]], stream: int,
                 device: int, capture_at: int = 2):
        self._make, self._stream, self._device = make, int(stream), device
        self._calls, self._exec, self._graph, self._keep = 0, None, None, None  # __del__ reads
        self._direct = make(self._stream)  # may raise (a kernel that cannot load)
        self._capture_at = capture_at
        # The two driver calls of a replay, as bare functions on handle objects made here (the
        # executable graph's once it is built): what a replay costs the host is all ctypes.
        self._capturing, self._graph_launch = (bare_function("cuStreamIsCapturing"),
                                               bare_function("cuGraphLaunch"))
        self._unavailable = self._graph_launch is None
        self._stream_handle, self._exec_handle = ctypes.c_void_p(self._stream), None
        cell = ctypes.c_int(0)
        self._capturing_cell = (cell, ctypes.byref(cell))

    def _launch_direct(self) -> None:
        for launch in self._direct:
            launch()

    def _build(self) -> bool:
        """Captures the launches into a graph; False (launches stay direct, for good) where the
        driver refuses, so a graph is only ever a faster way to run the same launches."""
        import cupy

        runtime = cupy.cuda.runtime
        try:
            with cupy.cuda.Device(self._device):
                private = cupy.cuda.Stream(non_blocking=True)
                launches = self._make(private.ptr)
                # Relaxed: nothing another thread or library does meanwhile can invalidate it.
                runtime.streamBeginCapture(private.ptr, runtime.streamCaptureModeRelaxed)
                try:
                    for launch in launches:
                        launch()
                finally:
                    graph = runtime.streamEndCapture(private.ptr)
                self._graph, self._exec = graph, runtime.graphInstantiate(graph)
                self._exec_handle = ctypes.c_void_p(self._exec)
                self._keep = (private, launches)  # what the graph's parameters point at
        except Exception as error:  # the driver's refusal, whatever its type
            LOG.debug("launches not graphed on cuda:%d, launching directly: %s", self._device,
                      error)
            self._unavailable = True
            return False
        return True

    def __call__(self) -> None:
        self._calls += 1
        if self._unavailable or self._calls < self._capture_at or not REPLAY:
            self._launch_direct()
            return
        cell, reference = self._capturing_cell
        status = self._capturing(self._stream_handle, reference)
        if status:
            self._capture_check_failed(status)
        if cell.value or (self._exec is None and not self._build()):
            self._launch_direct()
            return
        if self._graph_launch(self._exec_handle, self._stream_handle):
            raise LaunchFailed(f"CUDA graph launch failed on cuda:{self._device}")

    def _capture_check_failed(self, status: int) -> None:
        """The capture check failed. On a thread where no context was current
        (CUDA_ERROR_INVALID_CONTEXT: a thread whose calls so far made no driver call), device 0's
        primary context is made current, as the runtime's first call there would, and the check
        is asked again; any other failure is raised."""
        if status == INVALID_CONTEXT and bind_default_context():
            status = self._capturing(self._stream_handle, self._capturing_cell[1])
        if status:
            raise LaunchFailed(f"cuStreamIsCapturing failed on cuda:{self._device}'s stream "
                               f"{self._stream:#x}: CUresult {status}")

    def __del__(self, _finalizing=sys.is_finalizing) -> None:
        # Not at interpreter exit: CuPy and the libraries it calls into may be half torn down,
        # and the process's end frees the graph with its context anyway.
        if self._exec is None or _finalizing():
            return
        try:
            import cupy

            with cupy.cuda.Device(self._device):
                cupy.cuda.runtime.graphExecDestroy(self._exec)
                cupy.cuda.runtime.graphDestroy(self._graph)
        except Exception:  # interpreter shutdown: the driver frees it with the context
            pass


def library_call(make: Callable[[int], list[Callable[[], None]]], stream: int, device: int
                 ) -> GraphedLaunches:
    """A prepared library call (a cuDNN graph's execute, a cuBLASLt recipe) as GraphedLaunches,
    captured at its ``LIBRARY_CAPTURE_AT``-th call."""
    return GraphedLaunches(make, stream, device, LIBRARY_CAPTURE_AT)

