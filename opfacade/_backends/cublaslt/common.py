"""What the linear SKUs on cuBLASLt share: element types and error bounds, the SKU declaration,
the argument checks, and the base class that selects, builds and runs a recipe.

Selection runs the heuristic on the current GPU when there is one (``workspace_size`` is then the
chosen algorithm's exact need); without a GPU, a plan selected for an ``arch`` reports the
workspace limit as its workspace and the algorithm is chosen on the first run. Every run takes
one path, ``prepared``: the recipe for the tensors' layout (recipes.py), bound to their pointers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..._internal.contract import BoundArgs, OpContract
from ..._internal.device import current_device, device_count, on_device
from ..._internal.graph_replay import library_call
from ..._internal.limits import Limit, check
from ..._internal.log import LOG
from ..._internal.sku import ReasonCode, SkuImpl, Unfit, Workspace
from ..._internal.tensors import TensorView, expect_aligned
from ...contracts.linear import (
    ActivationSpec,
    AuxLayout,
    LinearBackwardDescriptor,
    LinearDescriptor,
)
from ...errors import BackendUnavailable, LaunchFailed, LayoutMismatch, Unsupported
from ...types import (
    ArchSku,
    BackendKind,
    ElementKind,
    KernelSku,
    MathPrecision,
    PlanPreference,
    PrecisionGuarantee,
)
from . import library
from .layouts import Rows, batch_contiguous
from .matmul import (
    ALL_SCHEMES,
    DETERMINISTIC_SCHEMES,
    MAX_ALIGNMENT,
    POINTER_ALIGNMENT,
    AlgoInfo,
    NoAlgorithm,
)
from .recipes import Recipe, Recipes

if TYPE_CHECKING:
    from ..._internal.selection import Target

__all__ = [
    "ACT_PASS_BOUND", "ELEMENTS", "FORWARD_BOUND", "LinearCublasLt", "WORKSPACE_LIMIT",
    "check_aux", "check_batch_contiguous", "check_matrix", "declare_sku", "rows_of",
    "rows_of_view",
]

# The heuristic's workspace budget when the preference sets none (what torch gives cuBLASLt on
# Hopper); a smaller workspace_limit is honoured.
WORKSPACE_LIMIT = 32 << 20
ELEMENTS = (ElementKind.bf16, ElementKind.f16, ElementKind.tf32, ElementKind.f32)
_MATH = {ElementKind.bf16: MathPrecision.bf16, ElementKind.f16: MathPrecision.f16,
         ElementKind.tf32: MathPrecision.tf32, ElementKind.f32: MathPrecision.f32}
# ||out - ref|| / ||ref|| on uniform [-1, 1) inputs: bf16/f16 outputs are one rounding of an f32
# accumulator (2u covers it); f32 sums K products in f32; TF32 rounds the inputs to 10 bits. The
# backward rounds d_pre to the element type before its two GEMMs, so its bounds are twice these.
FORWARD_BOUND = {ElementKind.bf16: 2 * ElementKind.bf16.unit_roundoff,
                 ElementKind.f16: 2 * ElementKind.f16.unit_roundoff,
                 ElementKind.tf32: 4e-3, ElementKind.f32: 1e-5}
# The separate activation pass rounds twice: pre to the element type (an error act' <= 1.13
# carries on, relative to ||act(pre)|| ~ ||pre|| / 1.4-1.7 on symmetric inputs), then act(pre).
# That is ~3u at worst; 6u keeps the one-pass bound's 2x margin. f32 and TF32 are dominated by
# the GEMM's own error.
ACT_PASS_BOUND = {**FORWARD_BOUND, ElementKind.bf16: 6 * ElementKind.bf16.unit_roundoff,
                  ElementKind.f16: 6 * ElementKind.f16.unit_roundoff}

D = TypeVar("D", LinearDescriptor, LinearBackwardDescriptor)


def declare_sku(op: OpContract, element: ElementKind, deterministic: bool, bound: float,
                epilogue: str, description: str, variant: str = "") -> KernelSku:
    """One linear SKU's catalog entry."""
    return op.sku(
        BackendKind.cublaslt, element, variant=variant,
        qualifier="deterministic" if deterministic else "",
        layout="row-major x [.., M, K], W [K, N] (kn) or [N, K] (nk), out [.., M, N]; "
               "16-byte aligned pointers",
        epilogue=epilogue,
        arch=ArchSku.sm80,
        guarantee=PrecisionGuarantee(
            math_precision=_MATH[element], accumulator=ElementKind.f32,
            deterministic=deterministic, bit_stable=False, max_rel_error=bound),
        description=description + (" Deterministic: split-K only with out-of-place reductions, "
                                   "no epilogue reductions." if deterministic else ""),
    )


# -- layouts and argument checks ---------------------------------------------------------------

def rows_of_view(view: TensorView) -> Rows:
    """Row and batch strides of a 2-D or 3-D view."""
    if view.ndim == 3:
        return Rows(view.strides[1], view.strides[0])
    return Rows(view.strides[0])


def rows_of(strides: tuple) -> Rows:
    """Row and batch strides from a recipe key's strides of a 2-D or 3-D tensor."""
    return Rows(strides[-2], strides[0] if len(strides) == 3 else 0)


def check_matrix(view: TensorView | None, name: str, output: bool) -> None:
    """16-byte aligned, rows that do not overlap, and (for outputs) batch entries that do not."""
    if view is None:
        return
    if view.ptr % POINTER_ALIGNMENT:
        expect_aligned(view, name, POINTER_ALIGNMENT)  # raises, naming the argument
    shape, strides = view.shape, view.strides
    if len(shape) < 2:
        return
    r, c, ld = shape[-2], shape[-1], strides[-2]
    if r > 1 and ld < c:
        raise LayoutMismatch(f"{name} must have rows at least {c} elements apart (its row "
                             f"length), got row stride {ld}", argument=name)
    if len(shape) == 3 and shape[0] > 1 and (
            strides[0] < 0 or (output and strides[0] < r * max(ld, c))):
        raise LayoutMismatch(f"{name} must have batch entries that do not overlap: batch "
                             f"stride {strides[0]} is less than {r} rows of {max(ld, c)}",
                             argument=name)


def check_aux(view: TensorView | None, name: str, aux: AuxLayout | None) -> None:
    """cuBLASLt's leading-dimension rules for the aux matrix (the contract's AuxLayout)."""
    if view is None or aux is None:
        return
    rows = rows_of_view(view)
    for stride, label in ((rows.ld, "row"), (rows.batch_stride, "batch")):
        if stride % aux.row_multiple:
            raise LayoutMismatch(f"{name} must have a {label} stride that is a multiple of "
                                 f"{aux.row_multiple} {aux.unit}, as cuBLASLt requires of its aux "
                                 f"matrix, got {stride}; allocate the rows padded and pass a view",
                                 argument=name)


def check_batch_contiguous(view: TensorView | None, name: str, m: int, why: str) -> None:
    if view is None or view.ndim != 3 or view.shape[0] == 1:
        return
    rows = rows_of_view(view)
    if not batch_contiguous(rows, m):
        raise LayoutMismatch(f"{name} must be contiguous across the batch (batch stride = M * row "
                             f"stride = {m * rows.ld}) {why}, got batch stride "
                             f"{rows.batch_stride}", argument=name)


def _element_unfit(sku_element: ElementKind,
                   desc: LinearDescriptor | LinearBackwardDescriptor) -> Unfit | None:
    if sku_element is ElementKind.tf32:
        if desc.element is not ElementKind.f32 or not desc.tf32:
            return Unfit(ReasonCode.element_unsupported,
                         f"serves f32 with tf32=True; problem is {desc.element.value}"
                         f"{' with tf32=True' if desc.tf32 else ''}")
        return None
    if desc.element is not sku_element:
        return Unfit(ReasonCode.element_unsupported,
                     f"serves {sku_element.value}, problem is {desc.element.value}")
    return None


def _gpu_device(target: Target | None) -> int | None:
    """The device the heuristic runs on: the target's, else the current one, else None."""
    if target is not None and target.device is not None:
        return target.device
    return current_device() if device_count() > 0 else None


# -- the SKUs' shared machinery ------------------------------------------------------------------

class LinearCublasLt(SkuImpl[D]):
    """What the forward and backward SKUs share: element rules, selection, the recipe cache and
    the one execution path (``prepared``; ``launch`` is SkuImpl's ``prepared(...)()``)."""

    op: OpContract[D]
    fixed_views: tuple[str, ...]  # the views whose strides key the recipe; the first's device
    limits: tuple[Limit[D], ...]  # what cuBLASLt and the NVRTC passes index, checked first

    def __init__(self, sku: KernelSku, element: ElementKind, deterministic: bool):
        self.sku = sku
        self.element = element
        self.deterministic = deterministic
        self.schemes = DETERMINISTIC_SCHEMES if deterministic else ALL_SCHEMES
        self._recipes = Recipes(self._build, sku.id)

    def release(self, desc: D) -> None:
        self._recipes.release(desc)

    # -- selection -----------------------------------------------------------------------------
    def _static_unfit(self, desc: D) -> Unfit | None:
        unfit = _element_unfit(self.element, desc)
        if unfit is not None:
            return unfit
        reason = self._activation_unserved(desc.activation_spec)
        if reason is not None:
            return Unfit(ReasonCode.feature_unsupported, reason)
        return check(self.limits, desc)

    def _activation_unserved(self, spec: ActivationSpec) -> str | None:
        """Why this SKU does not compute the activation, or None."""
        raise NotImplementedError

    def plan_for(self, desc: D, pref: PlanPreference | None = None,
                 target: Target | None = None) -> tuple[int, str] | Unfit:
        """(exact workspace bytes, chosen algorithm) for ``desc`` under ``pref`` on ``target``.

        Runs the heuristic on the target's (or the current) GPU; without one, the workspace is
        the limit and the algorithm is chosen on the first run.
        """
        unfit = self._static_unfit(desc)
        if unfit is not None:
            return unfit
        fixed = self._fixed_bytes(desc)
        available = fixed + WORKSPACE_LIMIT
        if pref is not None and pref.workspace_limit is not None:
            available = min(available, pref.workspace_limit)
        if available < fixed:
            return Unfit(ReasonCode.workspace_over_limit,
                         f"needs {fixed} bytes of workspace for its intermediate buffers, limit "
                         f"is {available}")
        device = _gpu_device(target) if library.available() is None else None
        if device is None:
            LOG.debug("%s: no GPU to run the heuristic on at selection; the workspace is the "
                      "limit and the algorithm is chosen on the first run", self.sku.id)
            return (fixed + (available - fixed) // 256 * 256,
                    "algorithm chosen on the first run (no GPU at selection)")
        try:
            recipe = self._recipes.get(desc, device, self._canonical(desc), available)
        except NoAlgorithm as error:
            return Unfit(ReasonCode.shape_unsupported, str(error))
        except BackendUnavailable as error:
            return Unfit(ReasonCode.backend_unavailable, str(error))
        except (Unsupported, LaunchFailed) as error:
            return Unfit(ReasonCode.feature_unsupported, f"cuBLASLt rejects it: {error}")
        return recipe.workspace_size, recipe.describe()

    def unfit(self, desc: D) -> Unfit | None:
        return self.unfit_on(desc, None)

    def unfit_on(self, desc: D, target: Target | None) -> Unfit | None:
        """Selection's hook with its Target: the heuristic runs on the target's device."""
        planned = self.plan_for(desc, None, target)
        return planned if isinstance(planned, Unfit) else None

    def unavailable(self) -> str | None:
        return library.available()

    def workspace_size(self, desc: D) -> int:
        return self.workspace_size_on(desc, None)

    def workspace_size_on(self, desc: D, target: Target | None) -> int:
        planned = self.plan_for(desc, None, target)
        return 0 if isinstance(planned, Unfit) else planned[0]

    def algorithm(self, desc: D,
                  device: int | None = None) -> AlgoInfo | dict[str, AlgoInfo] | None:
        """What runs for ``desc`` on ``device`` (default: the current GPU) with contiguous
        tensors: an AlgoInfo (forward) or {step: AlgoInfo} (backward); None without a GPU."""
        device = _gpu_device(None) if device is None else device
        if device is None or self._static_unfit(desc) is not None:
            return None
        return self._recipes.get(desc, device, self._canonical(desc),
                                 self._fixed_bytes(desc) + WORKSPACE_LIMIT).algorithms

    def _canonical(self, desc: D) -> tuple:
        """The recipe key of contiguous, 256-byte aligned tensors (what selection assumes)."""
        return self._canonical_strides(desc), MAX_ALIGNMENT

    # -- running -------------------------------------------------------------------------------
    def _recipe(self, desc: D, views: dict[str, TensorView | None],
                workspace: Workspace) -> Recipe:
        low = MAX_ALIGNMENT
        for view in views.values():
            if view is not None:
                low |= view.ptr
        layout = (tuple([None if views[name] is None else views[name].strides
                         for name in self.fixed_views]), low & -low)  # strides, alignment
        device = views[self.fixed_views[0]].device
        return self._recipes.get(desc, device, layout, workspace.size)

    def prepared(self, desc: D, args: BoundArgs, workspace: Workspace,
                 stream: int | None) -> Callable[[], None]:
        """The recipe's launches bound to these tensors, workspace and stream: each GEMM with a
        matmul descriptor of its own, each kernel with its arguments packed. On the current
        device they replay from a CUDA graph once made ``LIBRARY_CAPTURE_AT`` times
        (``GraphedLaunches``: one cuGraphLaunch, where each cublasLtMatmul costs the host ~7 us
        on an H100 host)."""
        device = args.device
        recipe = self._recipe(desc, args.views, workspace)
        handle = library.handle(device)
        if current_device() == device:
            return library_call(lambda on: [recipe.bind(handle, args.views, workspace, on)],
                                0 if stream is None else stream, device)
        run = recipe.bind(handle, args.views, workspace, stream)

        def on_its_device() -> None:
            with on_device(device):
                run()

        return on_its_device

    # -- what each SKU says ------------------------------------------------------------------------
    def _fixed_bytes(self, desc: D) -> int:
        """Workspace for intermediate buffers, before the GEMMs' own."""
        return 0

    def _canonical_strides(self, desc: D) -> tuple:
        raise NotImplementedError

    def _build(self, desc: D, device: int, layout: tuple, available: int | None) -> Recipe:
        raise NotImplementedError
