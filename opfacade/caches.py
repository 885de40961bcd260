"""Every cache opfacade keeps, and the one call that clears them all.

Each cache is an object owned by the module that fills it:

- plans: ``plan.PLAN_CACHE`` (the functional forms' and ``Plan.cached``'s plans), and
  ``plan.FACTS_CACHE``, the functional forms' shortcut to them;
- cuDNN graphs (and cuDNN's genuine "not supported" verdicts): ``_backends/cudnn``;
- cuBLASLt recipes (matmul descriptors, layouts, the heuristic's algorithm):
  ``_backends/cublaslt``;
- compiled NVRTC kernels loaded on each device: ``_backends/nvrtc`` (cubins also persist on disk
  in ``$OPFACADE_CACHE_DIR``, which clearing leaves alone: they are checked on load);
- stream objects wrapping raw handles for CuPy and torch: ``_internal/streams.py``;
- the sdpa and linear forms' plans of repeat torch calls, by tensor guard:
  ``_internal/guarded.py``.

``plan.free()`` releases what one plan holds; ``clear_caches()`` drops everything (tests call it
between cases that must not share state). Plans already handed out keep working: what they need
is built again on their next run.

On disk, under ``$OPFACADE_CACHE_DIR`` (``_internal/config.py``), two caches outlive the process:
NVRTC's cubins and cuDNN's serialized plans. ``disk_caches()`` describes them and
``clear_disk_caches()`` empties them (``opfacade cache [--clear]``); either kind of entry is
checked on load, so clearing is never needed for correctness.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ._backends import cublaslt, cudnn, nvrtc

__all__ = ["DiskCache", "clear_caches", "clear_disk_caches", "disk_caches"]


def clear_caches() -> None:
    """Drops every in-process cache: plans, cuDNN graphs, cuBLASLt recipes, loaded kernels,
    stream objects, the side streams split steps fork onto, the streams' scratch blocks (after
    the devices finish their work), the bench's NVML handles."""
    from ._bench import device_state
    from ._internal import guarded, streams
    from ._internal.memory import STREAM_SCRATCH
    from ._internal.stream_fork import SIDE_STREAMS
    from .plan import FACTS_CACHE, PLAN_CACHE

    PLAN_CACHE.clear()
    FACTS_CACHE.clear()
    streams.cupy_stream.clear()
    streams.torch_stream.clear()
    STREAM_SCRATCH.clear()
    SIDE_STREAMS.clear()
    device_state.forget()
    for backend in (cudnn, cublaslt, nvrtc):
        backend.clear_caches()
    guarded.clear_all()


@dataclass(frozen=True)
class DiskCache:
    """One on-disk cache: what it holds, where, and its entries' count and bytes now."""

    name: str
    path: Path
    suffix: str

    def entries(self) -> list[Path]:
        return sorted(self.path.glob(f"*{self.suffix}")) if self.path.is_dir() else []

    def size(self) -> tuple[int, int]:
        entries = self.entries()
        return len(entries), sum(entry.stat().st_size for entry in entries)


def disk_caches() -> list[DiskCache]:
    """The caches that persist across processes."""
    from ._backends.cudnn import plan_store
    from ._backends.nvrtc import compiler

    return [DiskCache("NVRTC cubins", compiler.directory(), compiler.CUBIN_SUFFIX),
            DiskCache("cuDNN plans", plan_store.directory(), plan_store.ENTRY_SUFFIX)]


def clear_disk_caches() -> int:
    """Deletes every entry (and torn temp file) of the on-disk caches; returns how many."""
    removed = 0
    for cache in disk_caches():
        leftovers = sorted(cache.path.glob(".tmp-*")) if cache.path.is_dir() else []
        for entry in cache.entries() + leftovers:
            entry.unlink(missing_ok=True)
            removed += 1
    return removed
