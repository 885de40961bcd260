"""Every cache opfacade keeps, and the one call that clears them all.

Each cache is an object owned by the module that fills it:

- plans: ``plan.PLAN_CACHE`` (the functional forms' and ``Plan.cached``'s plans), and
  ``plan.FACTS_CACHE``, the functional forms' shortcut to them;
- cuDNN graphs (and cuDNN's genuine "not supported" verdicts): ``_backends/cudnn``;
- cuBLASLt recipes (matmul descriptors, layouts, the heuristic's algorithm):
  ``_backends/cublaslt``;
- compiled NVRTC kernels loaded on each device: ``_backends/nvrtc`` (cubins also persist on disk
  in ``$OPFACADE_CACHE_DIR``, which clearing leaves alone: they are checked on load);
- stream objects wrapping raw handles for CuPy and torch: ``_internal/streams.py``.

``plan.free()`` releases what one plan holds; ``clear_caches()`` drops everything (tests call it
between cases that must not share state). Plans already handed out keep working: what they need
is built again on their next run.
"""

from __future__ import annotations

from ._backends import cublaslt, cudnn, nvrtc

__all__ = ["clear_caches"]


def clear_caches() -> None:
    """Drops every in-process cache: plans, cuDNN graphs, cuBLASLt recipes, loaded kernels,
    stream objects."""
    from ._internal import streams
    from .plan import FACTS_CACHE, PLAN_CACHE

    PLAN_CACHE.clear()
    FACTS_CACHE.clear()
    streams.cupy_stream.clear()
    streams.torch_stream.clear()
    for backend in (cudnn, cublaslt, nvrtc):
        backend.clear_caches()
