"""This host's floor under a prepared decode or kv_append step: one CUDA graph replay of a
kernel that does nothing (kv_cache_check over no sequence), through the class our steps replay
through. A prepared step is one such replay, so issue 13's 3 us target for it is judged against
what the same host and driver give any replay (docs/DECODE.md, "Not met yet": 2.6-5.6 us on
the lent machines). The probes in scripts/ time the same kernel."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["noop_kernel", "replay_floor"]


def noop_kernel(torch) -> tuple[object, tuple, object]:
    """(the kernel, its arguments, the buffer they point at, to keep alive) on device 0."""
    from .._backends.nvrtc import kv_cache
    from .._backends.nvrtc.launch import get_kernel

    verdict = torch.empty(4, dtype=torch.int32, device="cuda")
    args = (*kv_cache.DecodeCache("contiguous", False, 1, 1, 64, 64).args(0, 0, 0),
            np.uint64(0), np.int32(0), np.int32(1), np.uint64(verdict.data_ptr()))
    return get_kernel(kv_cache.APPEND_SOURCE, "kv_cache_check", 0), args, verdict


def replay_floor(torch) -> Callable[[], None]:
    """One graph replay of the do-nothing kernel on torch's current stream, its graph built."""
    from .._backends.nvrtc.launch import PackedLaunch
    from .._internal.graph_replay import GraphedLaunches

    kernel, args, verdict = noop_kernel(torch)
    stream = torch.cuda.current_stream().cuda_stream
    # The maker holds verdict, which the arguments point at, as long as the graph lives.
    graphed = GraphedLaunches(lambda on, keep=verdict: [
        PackedLaunch(kernel, (1,), (256,), args, on, 0)], stream, 0)
    graphed()
    graphed()  # the second call captures the graph
    return graphed
