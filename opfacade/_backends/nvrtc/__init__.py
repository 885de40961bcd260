"""Bespoke CUDA kernels from native/, compiled by NVRTC to cubins and launched through CuPy.

- ``compiler``: NVRTC compilation and the on-disk cubin cache.
- ``launch``: loading cubins per device (the owned in-process kernel cache) and launching.
- ``alibi``: the alibi family's SKUs; ``linear_act`` and ``linear_grad``: the linear family's
  activation pass and d_pre kernel, which the cuBLASLt SKUs run around their GEMMs.
"""


def clear_caches() -> None:
    """Unloads nothing that runs, but forgets every loaded module and kernel handle."""
    from .launch import KERNELS

    KERNELS.clear()
