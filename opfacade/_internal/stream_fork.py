"""A stream of our own forked from a caller's stream and joined back (``forked``): how one
step runs two launch sequences side by side, in a CUDA graph or directly."""

from __future__ import annotations

from collections.abc import Callable

from .lru import BuildOnceLRU

__all__ = ["SIDE_STREAMS", "forked"]

# One side stream and its two events per (device, caller's stream), made on the first fork from
# that stream: a call prepared again for new addresses (run()'s retargeted calls) would otherwise
# create a stream and two events each time. Work on a caller's stream runs in its order, so
# steps forked from it may share one side stream; two callers' streams never share one, which
# would order their work against each other. A fork's calls hold their objects, so an entry
# evicted while a prepared call still forks through it stays alive for that call.
# opfacade.clear_caches() empties it.
SIDE_STREAMS: BuildOnceLRU[tuple] = BuildOnceLRU("side stream", 64)


def _side(device: int) -> tuple:
    import cupy

    with cupy.cuda.Device(device):
        return (cupy.cuda.Stream(non_blocking=True), cupy.cuda.Event(disable_timing=True),
                cupy.cuda.Event(disable_timing=True))


def forked(on: int, device: int) -> tuple[int, list[Callable[[], None]],
                                          list[Callable[[], None]]]:
    """A stream of our own forked from ``on`` and joined back: (its handle, the fork's calls,
    the join's calls). The calls record an event on one stream and make the other wait for it,
    so work launched on the side stream between them follows what ``on`` held before the fork
    and precedes what ``on`` runs after the join; under a stream capture the side stream joins
    the capture, as CUDA allows."""
    import cupy

    runtime = cupy.cuda.runtime
    side, forks, joins = SIDE_STREAMS.get((device, on), lambda: _side(device))

    def fork() -> None:
        runtime.eventRecord(forks.ptr, on)
        runtime.streamWaitEvent(side.ptr, forks.ptr, 0)

    def join() -> None:
        runtime.eventRecord(joins.ptr, side.ptr)
        runtime.streamWaitEvent(on, joins.ptr, 0)

    return side.ptr, [fork], [join]
