"""The measured choice among cuBLASLt's heuristic candidates (``PlanPreference(autotune=True)``).

The heuristic ranks up to eight algorithms by a model; on an H100 one of its lower-ranked
candidates was 3-5% faster than its first on 4096^3 and 8192^3 bf16 GEMMs. With autotune, the
recipe times every candidate on scratch buffers laid out like the problem's operands (random
values in the element type, on a private stream) and keeps the fastest. Selection then runs
kernels and allocates as much scratch as the operands take, which is why it is opt-in.

Every candidate comes from the same heuristic query, so each respects the SKU's reduction
schemes (the deterministic SKU stays deterministic) and the workspace limit.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from ...errors import LaunchFailed
from .layouts import Matrix
from .library import CUDA_R_16BF, CUDA_R_16F, handle, on_device
from .matmul import Matmul

__all__ = ["fastest"]

WARMUP = 2
REPS = 5  # calls per timing; the median of ROUNDS timings decides
ROUNDS = 3


def _span(matrix: Matrix, batch: int) -> int:
    """Elements a column-major operand touches, over its batch."""
    extent = matrix.ld * (matrix.cols - 1) + matrix.rows
    return extent + (batch - 1) * matrix.batch_stride if batch > 1 else extent


def _random(cupy, elements: int, data_type: int):
    """Uniform [-1, 1) values stored in the operand's element type (bf16 as the top half of
    the f32 bits)."""
    values = cupy.random.uniform(-1.0, 1.0, max(elements, 1), dtype=cupy.float32)
    if data_type == CUDA_R_16BF:
        return (values.view(cupy.uint32) >> 16).astype(cupy.uint16)
    if data_type == CUDA_R_16F:
        return values.astype(cupy.float16)
    return values


def fastest(matmul: Matmul, workspace_limit: int) -> Matmul:
    """The candidate of ``matmul``'s heuristic query that runs fastest on this device."""
    if matmul.count < 2:
        return matmul
    import cupy

    gemm, batch, data = matmul.gemm, matmul.gemm.batch, matmul.types.data
    with on_device(matmul.device), cupy.cuda.Device(matmul.device):
        a = _random(cupy, _span(gemm.a, batch), data)
        b = _random(cupy, _span(gemm.b, batch), data)
        c = _random(cupy, _span(matmul.c_matrix, batch), data)
        d = cupy.empty_like(c)
        # A bias in (length m), or a bias gradient out (m for BGRADA, n for BGRADB).
        vector = _random(cupy, max(gemm.m, gemm.n) * batch, data)
        aux = None
        if matmul.aux_matrix is not None:  # elements, or bits for the ReLU mask: ample either way
            aux_span = matmul.aux_matrix.ld * gemm.n + (batch - 1) * matmul.aux_matrix.batch_stride
            aux = cupy.zeros(aux_span * matmul.types.itemsize, cupy.uint8)
        workspace = cupy.empty(max(workspace_limit, 256), cupy.uint8)
        stream = cupy.cuda.Stream(non_blocking=True)
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        timed = []
        for index in range(matmul.count):
            if int(matmul.candidates[index].state) != 0:
                continue
            variant = matmul.candidate(index)
            if variant.workspace_size > workspace.nbytes:
                continue
            call = variant.bind(handle(matmul.device), a.data.ptr, b.data.ptr,
                                c.data.ptr if matmul.c_matrix is not gemm.d else d.data.ptr,
                                d.data.ptr, workspace.data.ptr, workspace.nbytes, stream.ptr,
                                vector.data.ptr, 0 if aux is None else aux.data.ptr)
            try:
                for _ in range(WARMUP):
                    call()
                samples = []
                for _ in range(ROUNDS):
                    start.record(stream)
                    for _ in range(REPS):
                        call()
                    stop.record(stream)
                    stop.synchronize()
                    samples.append(cupy.cuda.get_elapsed_time(start, stop) / REPS)
            except LaunchFailed:  # a candidate the library lists but cannot launch here
                continue
            timed.append((statistics.median(samples), index, variant))
        stream.synchronize()
    if not timed:
        return matmul
    best_ms, best, chosen = min(timed, key=lambda entry: (entry[0], entry[1]))
    first_ms = next((ms for ms, index, _ in timed if index == 0), None)
    note = (f"fastest of {len(timed)} timed candidates: #{best} {best_ms:.4f} ms"
            + (f", heuristic's first {first_ms:.4f} ms" if first_ms is not None else ""))
    chosen.info = replace(chosen.info, timing=note)
    return chosen
