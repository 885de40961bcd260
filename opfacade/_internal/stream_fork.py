"""A stream of our own forked from a caller's stream and joined back (``forked``): how one
step runs two launch sequences side by side, in a CUDA graph or directly."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["forked"]


def forked(on: int, device: int) -> tuple[int, list[Callable[[], None]],
                                          list[Callable[[], None]]]:
    """A stream of our own forked from ``on`` and joined back: (its handle, the fork's calls,
    the join's calls). The calls record an event on one stream and make the other wait for it,
    so work launched on the side stream between them follows what ``on`` held before the fork
    and precedes what ``on`` runs after the join; under a stream capture the side stream joins
    the capture, as CUDA allows."""
    import cupy

    runtime = cupy.cuda.runtime
    with cupy.cuda.Device(device):
        side = cupy.cuda.Stream(non_blocking=True)
        forks, joins = cupy.cuda.Event(disable_timing=True), cupy.cuda.Event(disable_timing=True)

    def fork() -> None:
        runtime.eventRecord(forks.ptr, on)
        runtime.streamWaitEvent(side.ptr, forks.ptr, 0)

    def join() -> None:
        runtime.eventRecord(joins.ptr, side.ptr)
        runtime.streamWaitEvent(on, joins.ptr, 0)

    return side.ptr, [fork], [join]
