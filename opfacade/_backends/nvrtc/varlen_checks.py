"""Checked mode of packed (varlen) attention (native/varlen_checks.cu): the offsets' rules
tested on the device, and the verdict read back, as a typed error naming the argument and its
first bad index.

Off by default: a checked run enqueues the check kernel before its own, then waits for the
stream and reads five ints, so it synchronises the host (and cannot be captured). Unchecked runs
do neither; their kernels clamp every offset into the tensors instead, so garbage offsets give
garbage values in the outputs but never an access outside them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..._internal.contract import BoundArgs
from ...errors import InvalidArgument
from .launch import get_kernel, launch, pointer

__all__ = ["SOURCE", "checked"]

SOURCE = "varlen_checks.cu"
_ARGUMENTS = {1: "cu_seqlens_q", 2: "cu_seqlens_kv"}
_VERDICT_INTS = 5


def _verdict_error(verdict: np.ndarray, maxima: dict[str, int], tokens: dict[str, int]
                   ) -> InvalidArgument:
    """The message the host reference gives for the same offsets (contract.offsets_problem)."""
    argument, rule, index, before, at = (int(v) for v in verdict)
    name = _ARGUMENTS[argument]
    what = {1: f"starts at {at}, not 0 (index 0)",
            2: f"decreases at index {index} ({before} -> {at})",
            3: f"holds a sequence longer than {maxima[name]} at index {index} ({before} -> {at})",
            4: f"ends at {at}, past the tensor's {tokens[name]} tokens (index {index})"}[rule]
    return InvalidArgument(f"{name} {what}", argument=name)


def checked(desc, args: BoundArgs, stream: int, run: Callable[[], None]) -> Callable[[], None]:
    """``run`` preceded by the device check of ``args``' offsets: a call that raises
    InvalidArgument (and runs nothing more) when an offset breaks a rule."""
    import cupy

    device = args["q"].device
    cu_q, cu_kv = args["cu_seqlens_q"], args["cu_seqlens_kv"]
    tokens = {"cu_seqlens_q": args["q"].shape[0], "cu_seqlens_kv": args["k"].shape[0]}
    maxima = {"cu_seqlens_q": desc.max_seqlen_q, "cu_seqlens_kv": desc.max_seqlen_kv}
    with cupy.cuda.Device(device):
        verdict = cupy.zeros(_VERDICT_INTS, dtype=cupy.int32)
    kernel = get_kernel(SOURCE, "varlen_check_offsets", device)
    arguments = (pointer(cu_q), pointer(cu_kv), np.int32(cu_q.shape[0]),
                 np.int32(tokens["cu_seqlens_q"]), np.int32(tokens["cu_seqlens_kv"]),
                 np.int32(desc.max_seqlen_q), np.int32(desc.max_seqlen_kv),
                 np.uint64(verdict.data.ptr))
    host = np.empty(_VERDICT_INTS, dtype=np.int32)

    def check_then_run() -> None:
        launch(kernel, (1,), (32,), arguments, stream, device)
        cupy.cuda.runtime.memcpyAsync(host.ctypes.data, verdict.data.ptr, host.nbytes,
                                      cupy.cuda.runtime.memcpyDeviceToHost, stream)
        cupy.cuda.runtime.streamSynchronize(stream)
        if host[0] != 0:
            raise _verdict_error(host, maxima, tokens)
        run()

    return check_then_run
