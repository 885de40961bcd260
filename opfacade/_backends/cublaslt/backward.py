"""linear_backward on cuBLASLt: d_pre (and dbias) from an NVRTC kernel or an epilogue, then the
dW and dx GEMMs, all sharing one workspace."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from ..._internal.contract import BoundArgs
from ..._internal.limits import Limit, workspace_limit
from ..._internal.log import LOG
from ..._internal.sku import Workspace
from ..._internal.tensors import TensorView, expect_aligned
from ...contracts.linear import (
    LINEAR_BACKWARD,
    ActivationSpec,
    LinearBackwardDescriptor,
    padded_row,
)
from ...errors import LaunchFailed
from ...types import ElementKind
from ..nvrtc import linear_grad
from ..nvrtc.launch import available as nvrtc_unavailable
from ..nvrtc.linear_grad import ActivationGrad, partials_bytes
from . import library
from .common import (
    FORWARD_BOUND,
    WORKSPACE_LIMIT,
    LinearCublasLt,
    check_aux,
    check_batch_contiguous,
    check_matrix,
    declare_sku,
    rows_of,
)
from .epilogues import BGRADA, BGRADB, DEFAULT, Epilogue
from .layouts import Gemm, Rows, bias_grad_gemv, input_grad_gemm, weight_grad_gemm
from .limits import BACKWARD_OPERANDS, SUMMED_ROWS
from .matmul import POINTER_ALIGNMENT, Matmul, NoAlgorithm, round_workspace
from .recipes import check_workspace

__all__ = ["LIMITS", "LinearBackwardCublasLt", "fixed_bytes", "workspace_regions"]


@dataclass(frozen=True)
class _Step:
    """One cuBLASLt call of the backward, and which buffers it reads and writes."""

    name: str
    matmul: Matmul
    a: str
    b: str
    c: str
    d: str
    bias: str | None = None
    aux: str | None = None


class BackwardRecipe:
    """The backward's launches in order, and how they share one workspace.

    Workspace: [d_pre | dbias partials | ones | GEMM workspace], each part 256-byte aligned and
    present only when needed; the launches run one after another on the stream, so the GEMMs
    share the last part.
    """

    def __init__(self, rows: int, ones: tuple[int, int], steps: list[_Step],
                 regions: dict[str, int], activation_grad: ActivationGrad | None):
        self.steps, self.rows, self.ones, self.regions = steps, rows, ones, regions
        self.activation_grad = activation_grad
        self.offsets: dict[str, int] = {}
        offset = 0
        for name, nbytes in regions.items():
            self.offsets[name] = offset
            offset += round_workspace(nbytes)
        self.gemm_offset = offset
        need = max((s.matmul.workspace_size for s in steps), default=0)
        self.workspace_size = offset + round_workspace(need + 16 if need else 0)
        self.algorithms = {s.name: s.matmul.info for s in steps}
        self.gemv = any(s.b == "ones" for s in steps)

    def describe(self) -> str:
        parts = [] if self.activation_grad is None else [self.activation_grad.describe()]
        parts += [f"{s.name} {s.matmul.epilogue.name}: {s.matmul.info}" for s in self.steps]
        return "; ".join(parts)

    def bind(self, lt_handle: int, views: dict[str, TensorView | None], workspace: Workspace,
             stream: int | None) -> Callable[[], None]:
        """The launches in order with every pointer fixed once: the kernels' arguments packed
        and each GEMM bound to a matmul descriptor of its own."""
        check_workspace(workspace, self.workspace_size)
        pointers = {name: (0 if view is None else view.ptr) for name, view in views.items()}
        for name, offset in self.offsets.items():
            pointers[name] = workspace.ptr + offset
        launches: list[Callable[[], None]] = []
        if self.activation_grad is not None:
            launches.append(self.activation_grad.bind(pointers, stream))
        if self.gemv:
            launches.append(functools.partial(_fill, pointers["ones"], *self.ones, self.rows,
                                              stream))
        gemm_ws = workspace.ptr + self.gemm_offset
        gemm_size = workspace.size - self.gemm_offset
        for s in self.steps:
            launches.append(s.matmul.bind(
                lt_handle, pointers[s.a], pointers[s.b], pointers[s.c], pointers[s.d], gemm_ws,
                gemm_size, stream, pointers[s.bias] if s.bias else 0,
                pointers[s.aux] if s.aux else 0))
        launches = tuple(launches)

        def run_in_order() -> None:
            for launch in launches:
                launch()

        return run_in_order


# The bit pattern of 1.0 and its width in bytes, per element type.
_ONE = {ElementKind.bf16: (0x3F80, 2), ElementKind.f16: (0x3C00, 2),
        ElementKind.f32: (0x3F800000, 4), ElementKind.tf32: (0x3F800000, 4)}


def _fill(ptr: int, pattern: int, width: int, count: int, stream: int | None) -> None:
    """``count`` copies of a 2- or 4-byte ``pattern`` at ``ptr``, enqueued on ``stream``."""
    from cuda.bindings import driver

    fill = driver.cuMemsetD32Async if width == 4 else driver.cuMemsetD16Async
    (status,) = fill(ptr, pattern, count, stream)
    if status != driver.CUresult.CUDA_SUCCESS:
        raise LaunchFailed(f"filling the ones vector of the bias-gradient GEMV failed: {status}")


def workspace_regions(desc: LinearBackwardDescriptor) -> dict[str, int]:
    """The workspace's own buffers, in bytes: d_pre when it lives there, the dbias partials of
    the d_pre kernel, or the ones vector of the dbias GEMV."""
    item = desc.element.itemsize  # tf32 problems store f32
    rows = desc.m * (desc.batch or 1)
    kernel = desc.activation_spec.d_pre is not None
    regions = {}
    if kernel and not desc.need_pre_grad:
        regions["d_pre"] = rows * padded_row(desc.n) * item
    if kernel and desc.need_bias_grad:
        regions["partials"] = partials_bytes(rows, desc.n, desc.element)
    if not kernel and desc.need_bias_grad:
        regions["ones"] = rows * item  # also when fused: the fallback if cuBLASLt refuses
    return regions


def fixed_bytes(desc: LinearBackwardDescriptor) -> int:
    """Workspace for the intermediate buffers, before the GEMMs' own."""
    return sum(round_workspace(n) for n in workspace_regions(desc).values())


LIMITS: tuple[Limit[LinearBackwardDescriptor], ...] = (
    *BACKWARD_OPERANDS,
    SUMMED_ROWS,
    *linear_grad.LIMITS,
    workspace_limit(lambda d: fixed_bytes(d) + WORKSPACE_LIMIT,
                    "d_pre, dbias partials or ones, and the GEMMs' default budget",
                    "the intermediate buffers plus the GEMMs' workspace"),
)


class LinearBackwardCublasLt(LinearCublasLt[LinearBackwardDescriptor]):
    """d_pre = grad_out * act'(aux) [+ dbias], then dW = x^T d_pre and dx = d_pre W^T.

    With an activation, d_pre and the bias gradient come from one bespoke kernel
    (native/linear_grad.cu, see nvrtc/linear_grad.py): it reads grad_out and the aux once, writes
    d_pre, and reduces dbias in a fixed order, so that part is deterministic in both SKUs. (A
    cuBLASLt DGELU_BGRAD epilogue can only be reached through a GEMM whose A and B are zeros and
    whose C is grad_out; on an H100 that ran 5x slower than the kernel.) Without an activation,
    the plain SKU reduces dbias on the dW GEMM (BGRADA for "kn", BGRADB for "nk"); the
    deterministic one uses no epilogue reduction: dbias = grad_out^T @ ones.
    """

    op = LINEAR_BACKWARD
    fixed_views = ("grad_out", "x", "weight", "aux", "grad_x", "grad_weight", "grad_pre")
    limits = LIMITS

    def __init__(self, element: ElementKind, deterministic: bool):
        super().__init__(declare_sku(
            self.op, element, deterministic, 2 * FORWARD_BOUND[element],
            "d_pre + dbias kernel (relu, gelu_tanh, gelu_erf, silu), bgrada/bgradb, dW, dx",
            "grad_out * act'(aux) with the bias gradient in one NVRTC kernel (fixed-order "
            "reduction), then dW and dx in cublasLtMatmul calls sharing one workspace."),
            element, deterministic)

    def unavailable(self) -> str | None:
        return library.available() or nvrtc_unavailable()

    def _activation_unserved(self, spec: ActivationSpec) -> str | None:
        return None  # the d_pre kernel takes every activation's derivative

    def check_args(self, desc: LinearBackwardDescriptor, args: BoundArgs) -> None:
        views = args.views
        for name in ("grad_out", "x", "weight", "aux"):
            check_matrix(views[name], name, output=False)
        for name in ("grad_x", "grad_weight", "grad_pre"):
            check_matrix(views[name], name, output=True)
        if views["grad_bias"] is not None:
            expect_aligned(views["grad_bias"], "grad_bias", POINTER_ALIGNMENT)
        check_aux(views["aux"], "aux", desc.aux_layout)
        for name in ("grad_out", "aux", "grad_pre"):
            check_batch_contiguous(views[name], name, desc.m,
                                   "(the backward treats the batch as more rows)")
        if desc.batch and not desc.weight_batched and desc.need_weight_grad:
            check_batch_contiguous(views["x"], "x", desc.m,
                                   "when one weight serves the batch (dW sums over it)")

    def _bias_by(self, desc: LinearBackwardDescriptor) -> str | None:
        """Who reduces dbias: "kernel" (with the activation's derivative), "weight" (the dW
        GEMM's BGRADA/BGRADB epilogue), "gemv" (d_pre^T @ ones), or None (not asked for)."""
        if not desc.need_bias_grad:
            return None
        if desc.activation_spec.d_pre is not None:
            return "kernel"
        if not self.deterministic and desc.need_weight_grad and not (
                desc.batch and desc.weight_batched):
            return "weight"
        return "gemv"

    def _regions(self, desc: LinearBackwardDescriptor) -> dict[str, int]:
        return workspace_regions(desc)

    def _fixed_bytes(self, desc: LinearBackwardDescriptor) -> int:
        return fixed_bytes(desc)

    def _canonical_strides(self, desc: LinearBackwardDescriptor) -> tuple:
        batched = desc.batch is not None

        def matrix(r: int, c: int, per_batch: bool = True) -> tuple:
            return (r * c, c, 1) if batched and per_batch else (c, 1)

        w_rows, w_cols = (desc.k, desc.n) if desc.weight_layout == "kn" else (desc.n, desc.k)
        aux = desc.aux_strides
        weight = matrix(w_rows, w_cols, desc.weight_batched)
        return (matrix(desc.m, desc.n), matrix(desc.m, desc.k), weight, aux,
                matrix(desc.m, desc.k) if desc.need_input_grad else None,
                weight if desc.need_weight_grad else None,
                matrix(desc.m, desc.n) if desc.need_pre_grad else None)

    def _d_pre(self, desc: LinearBackwardDescriptor,
               rows: tuple[Rows | None, ...]) -> tuple[str, Rows]:
        """Where d_pre lives: grad_out itself (no activation), grad_pre, or the workspace."""
        grad_out, grad_pre = rows[0], rows[6]
        if desc.activation_spec.d_pre is None:
            return "grad_out", grad_out
        if desc.need_pre_grad:
            return "grad_pre", grad_pre
        ld = padded_row(desc.n)
        return "d_pre", Rows(ld, desc.m * ld)

    def _build(self, desc: LinearBackwardDescriptor, device: int, layout: tuple,
               available: int | None) -> BackwardRecipe:
        strides, alignment = layout
        rows = tuple(None if s is None else rows_of(s) for s in strides)
        regions = self._regions(desc)
        fixed = sum(round_workspace(n) for n in regions.values())
        limit = WORKSPACE_LIMIT if available is None else max(0, (available - fixed) // 256 * 256
                                                              - 16)
        bias_by = self._bias_by(desc)
        try:
            steps = self._steps(desc, device, rows, limit, bias_by, alignment)
        except NoAlgorithm as error:
            if bias_by != "weight":
                raise
            LOG.debug("%s: no algorithm with the bias-gradient epilogue on the dW GEMM (%s); "
                      "reducing dbias with a GEMV against ones instead", self.sku.id, error)
            steps = self._steps(desc, device, rows, limit, "gemv", alignment)
        grad, all_rows = None, desc.m * (desc.batch or 1)
        if desc.activation_spec.d_pre is not None:
            d_pre_name, d_pre = self._d_pre(desc, rows)
            grad = ActivationGrad(desc.activation_spec, self.element, device, all_rows, desc.n,
                                  rows[0].ld, rows[3].ld, d_pre.ld, alignment, d_pre_name,
                                  desc.need_bias_grad)
        return BackwardRecipe(all_rows, _ONE[self.element], steps, regions, grad)

    def _steps(self, desc: LinearBackwardDescriptor, device: int, rows: tuple, limit: int,
               bias_by: str | None, alignment: int) -> list[_Step]:
        _, x, w, _, grad_x, grad_w, _ = rows
        types = library.types_for(self.element)

        def matmul(name: str, gemm: Gemm, epilogue: Epilogue) -> Matmul:
            return Matmul(gemm, types, epilogue, device=device, workspace_limit=limit,
                          schemes=self.schemes, alignment=alignment,
                          what=f"{self.sku.id} ({name})")

        d_pre_name, d_pre = self._d_pre(desc, rows)
        steps = []
        if bias_by == "gemv":
            steps.append(_Step("grad_bias", matmul("grad_bias", bias_grad_gemv(desc, d_pre),
                                                   DEFAULT),
                               d_pre_name, "ones", "grad_bias", "grad_bias"))
        if desc.need_weight_grad:
            kn = desc.weight_layout == "kn"
            epilogue = (BGRADA if kn else BGRADB) if bias_by == "weight" else DEFAULT
            a, b = (d_pre_name, "x") if kn else ("x", d_pre_name)
            steps.append(_Step("grad_weight", matmul("grad_weight",
                                                     weight_grad_gemm(desc, x, d_pre, grad_w),
                                                     epilogue),
                               a, b, "grad_weight", "grad_weight",
                               bias="grad_bias" if bias_by == "weight" else None))
        if desc.need_input_grad:
            steps.append(_Step("grad_x", matmul("grad_x", input_grad_gemm(desc, d_pre, w, grad_x),
                                                DEFAULT),
                               "weight", d_pre_name, "grad_x", "grad_x"))
        return steps
