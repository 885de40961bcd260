"""A kernel that does nothing, for timing what the host pays around a launch or a replay
(the floor under any prepared call): kv_cache_check over no sequence. The probes of this folder
that time launch floors share it; a probe run as ``python3 scripts/<probe>.py`` finds this
module beside it."""

from __future__ import annotations

import numpy as np


def noop_kernel(torch) -> tuple[object, tuple, object]:
    """(the kernel, its arguments, the buffer they point at, to keep alive)."""
    from opfacade._backends.nvrtc import decode as kernels

    verdict = torch.empty(4, dtype=torch.int32, device="cuda")
    args = (*kernels.DecodeCache("contiguous", False, 1, 1, 64, 64).args(0, 0, 0),
            np.uint64(0), np.int32(0), np.int32(1), np.uint64(verdict.data_ptr()))
    return kernels.get_kernel(kernels.APPEND_SOURCE, "kv_cache_check", 0), args, verdict
