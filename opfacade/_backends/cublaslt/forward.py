"""linear_forward on cuBLASLt: one cublasLtMatmul with a fused epilogue, or (for the activations
cuBLASLt has no epilogue for) a plain one followed by the NVRTC activation pass.

The aux a training forward saves is the contract's (``ActivationSpec.aux``): the fused GEMM
writes it through its epilogue (GELU's pre-activation, ReLU's bit-mask); the two-pass SKU has the
GEMM write the pre-activation into the aux and the pass read it from there.
"""

from __future__ import annotations

from collections.abc import Callable

from ..._internal.contract import BoundArgs
from ..._internal.sku import Workspace
from ..._internal.tensors import TensorView, expect_aligned
from ...contracts.linear import ACTIVATIONS, LINEAR_FORWARD, ActivationSpec, LinearDescriptor
from ...types import ElementKind, KernelSku
from ..nvrtc import linear_act
from ..nvrtc.launch import available as nvrtc_unavailable
from ..nvrtc.linear_act import ActivationPass
from . import library
from .common import (
    ACT_PASS_BOUND,
    FORWARD_BOUND,
    WORKSPACE_LIMIT,
    LinearCublasLt,
    check_aux,
    check_matrix,
    declare_sku,
    rows_of,
)
from .epilogues import DEFAULT, Epilogue, forward_epilogue
from .layouts import Gemm, Rows, forward_gemm
from .limits import FORWARD_OPERANDS
from .matmul import POINTER_ALIGNMENT, Aux, Matmul, round_workspace
from .recipes import check_workspace

__all__ = ["LinearForwardCublasLt", "LinearForwardCublasLtActPass"]


class ForwardRecipe:
    """One cublasLtMatmul writing into ``pre`` ("out", or "aux" for a separate activation pass
    that saves it), then the activation pass when there is one."""

    def __init__(self, matmul: Matmul, activation: ActivationPass | None = None,
                 pre: str = "out"):
        self.matmul, self.activation, self.pre = matmul, activation, pre
        extra = 16 if matmul.workspace_size and matmul.epilogue is not DEFAULT else 0
        self.workspace_size = round_workspace(matmul.workspace_size + extra)  # nvmath does too
        self.algorithms = matmul.info

    def describe(self) -> str:
        then = "" if self.activation is None else f"; {self.activation.describe()}"
        return f"{self.matmul.epilogue.name}: {self.matmul.info}{then}"

    def bind(self, lt_handle: int, views: dict[str, TensorView | None], workspace: Workspace,
             stream: int | None) -> Callable[[], None]:
        """The cublasLtMatmul (and the activation pass) with every pointer fixed."""
        check_workspace(workspace, self.workspace_size)
        d, bias, residual = views[self.pre], views["bias"], views["residual"]
        aux = views["aux"] if self.matmul.epilogue.aux else None
        gemm = self.matmul.bind(lt_handle, views["weight"].ptr, views["x"].ptr,
                                d.ptr if residual is None else residual.ptr, d.ptr,
                                workspace.ptr, workspace.size, stream,
                                0 if bias is None else bias.ptr, 0 if aux is None else aux.ptr)
        if self.activation is None:
            return gemm
        activation = self.activation.bind(d.ptr, views["out"].ptr, stream)

        def gemm_then_activation() -> None:
            gemm()
            activation()

        return gemm_then_activation


class LinearForwardCublasLt(LinearCublasLt[LinearDescriptor]):
    """``out = act(x @ W + bias + residual)`` [+ aux] in one cublasLtMatmul."""

    op = LINEAR_FORWARD
    fixed_views = ("x", "weight", "out", "residual", "aux")
    limits = FORWARD_OPERANDS

    def __init__(self, element: ElementKind, deterministic: bool, sku: KernelSku | None = None):
        super().__init__(sku or declare_sku(
            self.op, element, deterministic, FORWARD_BOUND[element],
            "bias, relu, gelu_tanh (+ aux), residual",
            "act(x @ W + bias + residual) in one cublasLtMatmul with a fused epilogue; the aux "
            "is the GELU pre-activation or cuBLASLt's ReLU bit-mask."), element, deterministic)

    def _activation_unserved(self, spec: ActivationSpec) -> str | None:
        return spec.unfused

    def check_args(self, desc: LinearDescriptor, args: BoundArgs) -> None:
        views = args.views
        for name in ("x", "weight", "residual"):
            check_matrix(views[name], name, output=False)
        for name in ("out", "aux"):
            check_matrix(views[name], name, output=True)
        if views["bias"] is not None:
            expect_aligned(views["bias"], "bias", POINTER_ALIGNMENT)
        check_aux(views["aux"], "aux", desc.aux_layout)

    def _canonical_strides(self, desc: LinearDescriptor) -> tuple:
        batched = desc.batch is not None
        w_rows, w_cols = (desc.k, desc.n) if desc.weight_layout == "kn" else (desc.n, desc.k)
        w = (w_rows * w_cols, w_cols, 1) if batched and desc.weight_batched else (w_cols, 1)
        matrix = (desc.m * desc.n, desc.n, 1) if batched else (desc.n, 1)
        aux = desc.aux_strides if desc.save_aux else None
        return ((desc.m * desc.k, desc.k, 1) if batched else (desc.k, 1), w, matrix,
                matrix if desc.residual else None, aux)

    def _build(self, desc: LinearDescriptor, device: int, layout: tuple,
               available: int | None) -> ForwardRecipe:
        epilogue = forward_epilogue(desc.activation_spec.epilogue, desc.bias, desc.save_aux)
        return ForwardRecipe(self._matmul(desc, device, layout, available, "out", epilogue))

    def _rows(self, layout: tuple) -> dict[str, Rows | None]:
        return {name: None if s is None else rows_of(s)
                for name, s in zip(self.fixed_views, layout[0], strict=True)}

    @staticmethod
    def _gemm(desc: LinearDescriptor, rows: dict[str, Rows | None], d: str) -> Gemm:
        """x @ W written to the view named ``d``; the other [.., M, N] matrices only decide
        whether the batch folds into rows."""
        others = [r for name, r in rows.items()
                  if name not in ("x", "weight", d) and r is not None]
        return forward_gemm(desc, rows["x"], rows["weight"], rows[d], others)

    def _matmul(self, desc: LinearDescriptor, device: int, layout: tuple, available: int | None,
                d: str, epilogue: Epilogue) -> Matmul:
        """The cublasLtMatmul of ``epilogue(x @ W + bias + residual)`` into the view ``d``, with
        the epilogue's aux written to the view "aux"."""
        rows, alignment = self._rows(layout), layout[1]
        gemm = self._gemm(desc, rows, d)
        residual, aux = rows["residual"], None
        if epilogue.aux:
            scale = epilogue.aux_ld_scale  # the mask's strides count bits
            aux = Aux(scale * rows["aux"].ld,
                      scale * rows["aux"].batch_stride if gemm.batch > 1 else 0)
        limit = WORKSPACE_LIMIT if available is None else max(0, available // 256 * 256 - 16)
        return Matmul(gemm, library.types_for(self.element), epilogue, device=device,
                      workspace_limit=limit, schemes=self.schemes,
                      c=gemm.like_d(residual) if residual is not None else None, aux=aux,
                      alignment=alignment, what=self.sku.id)


class LinearForwardCublasLtActPass(LinearForwardCublasLt):
    """``pre = x @ W + bias + residual`` in one cublasLtMatmul (into the aux when it is saved,
    else into out), then ``out = act(pre)`` in an NVRTC pass: for the activations cuBLASLt has no
    epilogue for."""

    limits = (*FORWARD_OPERANDS, *linear_act.LIMITS)

    def __init__(self, element: ElementKind, deterministic: bool):
        super().__init__(element, deterministic, declare_sku(
            self.op, element, deterministic, ACT_PASS_BOUND[element],
            "bias, residual (+ aux) in cuBLASLt; then gelu_erf or silu in an NVRTC pass",
            "x @ W + bias + residual in a cublasLtMatmul, then the activation cuBLASLt has no "
            "epilogue for (exact GELU, SiLU) in one element-wise NVRTC pass; the aux is the "
            "pre-activation.", variant="act"))

    def _activation_unserved(self, spec: ActivationSpec) -> str | None:
        if spec.act_pass is not None:
            return None
        served = ", ".join(name for name, s in ACTIVATIONS.items() if s.act_pass is not None)
        return (f"serves only the activations cuBLASLt has no epilogue for ({served}); "
                f"{spec.name} runs fused in one cublasLtMatmul")

    def unavailable(self) -> str | None:
        return library.available() or nvrtc_unavailable()

    def _build(self, desc: LinearDescriptor, device: int, layout: tuple,
               available: int | None) -> ForwardRecipe:
        rows, alignment = self._rows(layout), layout[1]
        pre = "aux" if desc.save_aux else "out"
        matmul = self._matmul(desc, device, layout, available, pre,
                              forward_epilogue("", desc.bias, save_aux=False))  # no activation
        activation = ActivationPass(
            desc.activation_spec, self.element, device, desc.batch or 1, desc.m, desc.n,
            (rows[pre].ld, rows[pre].batch_stride), (rows["out"].ld, rows["out"].batch_stride),
            alignment)
        return ForwardRecipe(matmul, activation, pre)
