"""The linear (GEMM + epilogue) SKUs on cuBLASLt: forward and backward, per element type.

Two SKUs per element type. The plain one takes the heuristic's best algorithm under every
reduction scheme and declares ``deterministic=False``: cuBLASLt's INPLACE split-K adds the
partial sums into the output in an order its counters serialise but its documentation does not
fix, and the bias-gradient epilogues reduce across thread blocks in an undocumented way. The
``.deterministic`` one restricts the heuristic to the schemes whose partial sums land in their own
workspace slots and are reduced in a fixed order (NONE, COMPUTE_TYPE, OUTPUT_TYPE), computes
dbias with a plain GEMM against a vector of ones instead of a BGRAD epilogue (with an activation,
both SKUs take d_pre and dbias from a fixed-order NVRTC kernel), and declares
``deterministic=True``; ``tests/test_gemm_gpu.py`` checks both claims. Neither is ``bit_stable``:
the heuristic's choice depends on the device's SM count.

cuBLASLt has no epilogue for the exact (erf) GELU or SiLU. For those, a second pair of SKUs per
element type (``linear_forward.cublaslt+act.*``) lets the GEMM write ``x @ W + bias (+ residual)``
and applies the activation in an NVRTC pass of its own (nvrtc/linear_act.py); it declares the
extra rounding in its bound. The backward serves every activation: its d_pre kernel takes each
derivative from the saved pre-activation.

Selection runs the heuristic on the current GPU when there is one (``workspace_size`` is then the
chosen algorithm's exact need); without a GPU, a plan selected for an ``arch`` reports the
workspace limit as its workspace and the algorithm is chosen on the first run. Prepared matmuls
are cached per (descriptor, device, tensor strides); a run given less workspace than the cached
algorithm needs uses the best algorithm within what it was given.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from ..._internal.contract import BoundArgs, OpContract
from ..._internal.device import current_device, device_count
from ..._internal.lru import BuildOnceLRU
from ..._internal.sku import ReasonCode, SkuImpl, Unfit, Workspace
from ..._internal.tensors import TensorView, expect_aligned
from ...contracts.linear import LINEAR_BACKWARD, LINEAR_FORWARD
from ...errors import BackendUnavailable, LaunchFailed, LayoutMismatch, Unsupported
from ...types import (
    ArchSku,
    BackendKind,
    ElementKind,
    KernelSku,
    MathPrecision,
    PrecisionGuarantee,
)
from ..nvrtc import linear_act
from ..nvrtc.launch import available as nvrtc_unavailable
from ..nvrtc.linear_act import ActivationPass
from ..nvrtc.linear_grad import ActivationGrad, partials_bytes
from . import library
from .epilogues import (
    BGRADA,
    BGRADB,
    DEFAULT,
    forward_epilogue,
    relu_mask_bytes,
    unsupported,
)
from .layouts import (
    Rows,
    batch_contiguous,
    bias_grad_gemv,
    forward_gemm,
    input_grad_gemm,
    weight_grad_gemm,
)
from .matmul import (
    ALL_SCHEMES,
    DETERMINISTIC_SCHEMES,
    MAX_ALIGNMENT,
    POINTER_ALIGNMENT,
    Aux,
    Matmul,
    NoAlgorithm,
    round_workspace,
)

__all__ = ["SKUS", "WORKSPACE_LIMIT"]

# The heuristic's workspace budget when the preference sets none (what torch gives cuBLASLt on
# Hopper); a smaller workspace_limit is honoured.
WORKSPACE_LIMIT = 32 << 20
ELEMENTS = (ElementKind.bf16, ElementKind.f16, ElementKind.tf32, ElementKind.f32)
_MATH = {ElementKind.bf16: MathPrecision.bf16, ElementKind.f16: MathPrecision.f16,
         ElementKind.tf32: MathPrecision.tf32, ElementKind.f32: MathPrecision.f32}
# ||out - ref|| / ||ref|| on uniform [-1, 1) inputs: bf16/f16 outputs are one rounding of an f32
# accumulator (2u covers it); f32 sums K products in f32; TF32 rounds the inputs to 10 bits. The
# backward rounds d_pre to the element type before its two GEMMs, so its bounds are twice these.
_FORWARD_BOUND = {ElementKind.bf16: 2 * ElementKind.bf16.unit_roundoff,
                  ElementKind.f16: 2 * ElementKind.f16.unit_roundoff,
                  ElementKind.tf32: 4e-3, ElementKind.f32: 1e-5}
# The separate activation pass rounds twice: pre to the element type (an error act' <= 1.13
# carries on, relative to ||act(pre)|| ~ ||pre|| / 1.4-1.7 on symmetric inputs), then act(pre).
# That is ~3u at worst; 6u keeps the one-pass bound's 2x margin. f32 and TF32 are dominated by
# the GEMM's own error.
_ACT_PASS_BOUND = {**_FORWARD_BOUND, ElementKind.bf16: 6 * ElementKind.bf16.unit_roundoff,
                   ElementKind.f16: 6 * ElementKind.f16.unit_roundoff}
_CACHE_CAPACITY = 1024


def _rows(view: TensorView) -> Rows:
    """Row and batch strides of a 2-D or 3-D view."""
    if view.ndim == 3:
        return Rows(view.strides[1], view.strides[0])
    return Rows(view.strides[0])


def _contiguous_rows(r: int, c: int, batched: bool, ld: int | None = None) -> Rows:
    ld = c if ld is None else ld
    return Rows(ld, r * ld if batched else 0)


def _check_matrix(view: TensorView | None, name: str, output: bool) -> None:
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


def _check_aux(view: TensorView | None, name: str, activation: str) -> None:
    """cuBLASLt's leading-dimension rules for the aux matrix (see epilogues.py)."""
    if view is None:
        return
    rows = _rows(view)
    unit = 16 if activation == "relu" else 8
    what = "bytes (128 mask bits)" if activation == "relu" else "elements"
    for stride, label in ((rows.ld, "row"), (rows.batch_stride, "batch")):
        if stride % unit:
            raise LayoutMismatch(f"{name} must have a {label} stride that is a multiple of {unit} "
                                 f"{what}, as cuBLASLt requires of its aux matrix, got {stride}; "
                                 f"allocate the rows padded and pass a view", argument=name)


def _check_batch_contiguous(view: TensorView | None, name: str, m: int, why: str) -> None:
    if view is None or view.ndim != 3 or view.shape[0] == 1:
        return
    if not batch_contiguous(_rows(view), m):
        raise LayoutMismatch(f"{name} must be contiguous across the batch (batch stride = M * row "
                             f"stride = {m * _rows(view).ld}) {why}, got batch stride "
                             f"{_rows(view).batch_stride}", argument=name)


def _element_unfit(sku_element: ElementKind, desc) -> Unfit | None:
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


def _gpu_device(target) -> int | None:
    """The device the heuristic runs on: the target's, else the current one, else None."""
    if target is not None and target.device is not None:
        return target.device
    return current_device() if device_count() > 0 else None


# Every SKU's prepared work, keyed by (SKU id, descriptor, (device, layout), workspace): the
# backend's one recipe cache (``opfacade.clear_caches`` clears it, ``Plan.free`` drops its
# problem's entries).
RECIPES: BuildOnceLRU[object] = BuildOnceLRU("cuBLASLt recipe", _CACHE_CAPACITY)


class _Recipes:
    """One SKU's view of RECIPES: prepared work per (descriptor, device, layout, workspace),
    built once; the layout is the tensors' strides and the alignment their pointers share."""

    def __init__(self, build, owner: str):
        self._build = build
        self._owner = owner
        self._last: tuple = (None, None, None)  # (desc, key, recipe): a run skips the hashing

    def get(self, desc, device: int, layout: tuple, available: int):
        last_desc, last_key, recipe = self._last
        key = (device, layout)
        if last_desc is not desc or last_key != key:
            recipe = RECIPES.get((self._owner, desc, key, None),
                                 lambda: self._build(desc, device, layout, None))
            self._last = (desc, key, recipe)
        if recipe.workspace_size > available:  # a smaller workspace: the best within it
            recipe = RECIPES.get((self._owner, desc, key, available),
                                 lambda: self._build(desc, device, layout, available))
        return recipe

    def release(self, desc) -> None:
        self._last = (None, None, None)
        RECIPES.discard(lambda key: key[0] == self._owner and key[1] == desc)


class _LinearCublasLt(SkuImpl):
    """What the forward and backward SKUs share: element rules, selection, the recipe cache."""

    op: OpContract
    fixed_views: tuple[str, ...]

    def __init__(self, sku: KernelSku, element: ElementKind, deterministic: bool):
        self.sku = sku
        self.element = element
        self.deterministic = deterministic
        self.schemes = DETERMINISTIC_SCHEMES if deterministic else ALL_SCHEMES
        self._recipes = _Recipes(self._build, sku.id)

    def release(self, desc) -> None:
        self._recipes.release(desc)

    # -- selection -----------------------------------------------------------------------------
    def _static_unfit(self, desc) -> Unfit | None:
        unfit = _element_unfit(self.element, desc)
        if unfit is not None:
            return unfit
        reason = self._activation_unserved(desc.activation)
        return None if reason is None else Unfit(ReasonCode.feature_unsupported, reason)

    def _activation_unserved(self, activation: str) -> str | None:
        """Why this SKU does not compute ``activation``, or None."""
        raise NotImplementedError

    def plan_for(self, desc, pref=None, target=None) -> tuple[int, str] | Unfit:
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

    def unfit(self, desc) -> Unfit | None:
        return self.unfit_on(desc, None)

    def unfit_on(self, desc, target) -> Unfit | None:
        """Selection's hook with its Target: the heuristic runs on the target's device."""
        planned = self.plan_for(desc, None, target)
        return planned if isinstance(planned, Unfit) else None

    def unavailable(self) -> str | None:
        return library.available()

    def workspace_size(self, desc) -> int:
        return self.workspace_size_on(desc, None)

    def workspace_size_on(self, desc, target) -> int:
        planned = self.plan_for(desc, None, target)
        return 0 if isinstance(planned, Unfit) else planned[0]

    def algorithm(self, desc, device: int | None = None):
        """What runs for ``desc`` on ``device`` (default: the current GPU) with contiguous
        tensors: an AlgoInfo (forward) or {step: AlgoInfo} (backward); None without a GPU."""
        device = _gpu_device(None) if device is None else device
        if device is None or self._static_unfit(desc) is not None:
            return None
        return self._recipes.get(desc, device, self._canonical(desc),
                                 self._fixed_bytes(desc) + WORKSPACE_LIMIT).algorithms

    def _canonical(self, desc) -> tuple:
        """The recipe key of contiguous, 256-byte aligned tensors (what selection assumes)."""
        return self._canonical_strides(desc), MAX_ALIGNMENT

    # -- running -------------------------------------------------------------------------------
    def _recipe(self, desc, views: dict, workspace: Workspace):
        low = MAX_ALIGNMENT
        for view in views.values():
            if view is not None:
                low |= view.ptr
        layout = (tuple([None if views[name] is None else views[name].strides
                         for name in self.fixed_views]), low & -low)  # strides, alignment
        device = views[self.fixed_views[0]].device
        return self._recipes.get(desc, device, layout, workspace.size)

    def launch(self, desc, args: BoundArgs, workspace: Workspace, stream: int | None) -> None:
        """One checked call: the recipe's shared descriptors, nothing built for it."""
        device = args.device
        recipe = self._recipe(desc, args.views, workspace)
        with library.on_device(device):
            recipe.run(library.handle(device), args.views, workspace, stream)

    def prepared(self, desc, args: BoundArgs, workspace: Workspace, stream: int | None):
        import cupy

        device = args.device
        recipe = self._recipe(desc, args.views, workspace)
        run = recipe.bind(library.handle(device), args.views, workspace, stream)
        if cupy.cuda.runtime.getDevice() == device:
            return run

        def on_its_device() -> None:
            with library.on_device(device):
                run()

        return on_its_device

    def _fixed_bytes(self, desc) -> int:
        return 0

    def _canonical_strides(self, desc) -> tuple:
        raise NotImplementedError

    def _build(self, desc, device: int, layout: tuple, available: int | None):
        raise NotImplementedError


def _sku(op: OpContract, element: ElementKind, deterministic: bool, bound: float,
         epilogue: str, description: str, variant: str = "") -> KernelSku:
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


class _ForwardRecipe:
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

    def run(self, lt_handle: int, views: dict, workspace: Workspace, stream: int) -> None:
        self.matmul.run(*self._arguments(lt_handle, views, workspace, stream))
        if self.activation is not None:
            self.activation.bind(views[self.pre].ptr, views["out"].ptr, stream)()

    def bind(self, lt_handle: int, views: dict, workspace: Workspace, stream: int):
        """The cublasLtMatmul (and the activation pass) with every pointer fixed."""
        gemm = self.matmul.bind(*self._arguments(lt_handle, views, workspace, stream))
        if self.activation is None:
            return gemm
        activation = self.activation.bind(views[self.pre].ptr, views["out"].ptr, stream)

        def gemm_then_activation() -> None:
            gemm()
            activation()

        return gemm_then_activation

    def _arguments(self, lt_handle: int, views: dict, workspace: Workspace, stream: int):
        _check_workspace(workspace, self.workspace_size)
        d, bias, residual = views[self.pre], views["bias"], views["residual"]
        aux = views["aux"] if self.matmul.epilogue.aux else None
        return (lt_handle, views["weight"].ptr, views["x"].ptr,
                d.ptr if residual is None else residual.ptr, d.ptr, workspace.ptr,
                workspace.size, stream, 0 if bias is None else bias.ptr,
                0 if aux is None else aux.ptr)


class LinearForwardCublasLt(_LinearCublasLt):
    """``out = act(x @ W + bias + residual)`` [+ aux] in one cublasLtMatmul."""

    op = LINEAR_FORWARD
    fixed_views = ("x", "weight", "out", "residual", "aux")

    def __init__(self, element: ElementKind, deterministic: bool, sku: KernelSku | None = None):
        super().__init__(sku or _sku(
            self.op, element, deterministic, _FORWARD_BOUND[element],
            "bias, relu, gelu_tanh (+ aux), residual",
            "act(x @ W + bias + residual) in one cublasLtMatmul with a fused epilogue; the aux "
            "is the GELU pre-activation or cuBLASLt's ReLU bit-mask."), element, deterministic)

    def _activation_unserved(self, activation: str) -> str | None:
        return unsupported(activation)

    def check_args(self, desc, args: BoundArgs) -> None:
        views = args.views
        for name in ("x", "weight", "residual"):
            _check_matrix(views[name], name, output=False)
        for name in ("out", "aux"):
            _check_matrix(views[name], name, output=True)
        if views["bias"] is not None:
            expect_aligned(views["bias"], "bias", POINTER_ALIGNMENT)
        _check_aux(views["aux"], "aux", desc.activation)

    def _canonical_strides(self, desc) -> tuple:
        batched = desc.batch is not None
        w_rows, w_cols = (desc.k, desc.n) if desc.weight_layout == "kn" else (desc.n, desc.k)
        w = (w_rows * w_cols, w_cols, 1) if batched and desc.weight_batched else (w_cols, 1)
        matrix = (desc.m * desc.n, desc.n, 1) if batched else (desc.n, 1)
        aux = None
        if desc.save_aux:
            ld = relu_mask_bytes(desc.n) if desc.activation == "relu" else -(-desc.n // 8) * 8
            aux = (desc.m * ld, ld, 1) if batched else (ld, 1)
        return ((desc.m * desc.k, desc.k, 1) if batched else (desc.k, 1), w, matrix,
                matrix if desc.residual else None, aux)

    def _build(self, desc, device: int, layout: tuple, available: int | None):
        epilogue = forward_epilogue(desc.activation, desc.bias, desc.save_aux)
        return _ForwardRecipe(self._matmul(desc, device, layout, available, "out", epilogue))

    def _rows(self, layout: tuple) -> dict[str, Rows | None]:
        return {name: None if s is None else _rows_of(s)
                for name, s in zip(self.fixed_views, layout[0], strict=True)}

    @staticmethod
    def _gemm(desc, rows: dict, d: str):
        """x @ W written to the view named ``d``; the other [.., M, N] matrices only decide
        whether the batch folds into rows."""
        others = [r for name, r in rows.items()
                  if name not in ("x", "weight", d) and r is not None]
        return forward_gemm(desc, rows["x"], rows["weight"], rows[d], others)

    def _matmul(self, desc, device: int, layout: tuple, available: int | None, d: str,
                epilogue) -> Matmul:
        """The cublasLtMatmul of ``epilogue(x @ W + bias + residual)`` into the view ``d``, with
        the epilogue's aux written to the view "aux"."""
        rows, alignment = self._rows(layout), layout[1]
        gemm = self._gemm(desc, rows, d)
        residual, aux = rows["residual"], None
        if epilogue.aux:
            scale = 8 if desc.activation == "relu" else 1  # the mask's strides count bits
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

    def __init__(self, element: ElementKind, deterministic: bool):
        super().__init__(element, deterministic, _sku(
            self.op, element, deterministic, _ACT_PASS_BOUND[element],
            "bias, residual (+ aux) in cuBLASLt; then gelu_erf or silu in an NVRTC pass",
            "x @ W + bias + residual in a cublasLtMatmul, then the activation cuBLASLt has no "
            "epilogue for (exact GELU, SiLU) in one element-wise NVRTC pass; the aux is the "
            "pre-activation.", variant="act"))

    def _activation_unserved(self, activation: str) -> str | None:
        if activation in linear_act.ACTIVATIONS:
            return None
        return (f"serves only the activations cuBLASLt has no epilogue for "
                f"({', '.join(linear_act.ACTIVATIONS)}); {activation} runs fused in one "
                f"cublasLtMatmul")

    def unavailable(self) -> str | None:
        return library.available() or nvrtc_unavailable()

    def _build(self, desc, device: int, layout: tuple, available: int | None):
        rows, alignment = self._rows(layout), layout[1]
        pre = "aux" if desc.save_aux else "out"
        matmul = self._matmul(desc, device, layout, available, pre,
                              forward_epilogue("none", desc.bias, False))
        activation = ActivationPass(
            desc.activation, self.element, device, desc.batch or 1, desc.m, desc.n,
            (rows[pre].ld, rows[pre].batch_stride), (rows["out"].ld, rows["out"].batch_stride),
            alignment)
        return _ForwardRecipe(matmul, activation, pre)


def _rows_of(strides: tuple) -> Rows:
    return Rows(strides[-2], strides[0] if len(strides) == 3 else 0)


class _BackwardRecipe:
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

    def bind(self, lt_handle: int, views: dict, workspace: Workspace, stream: int):
        """The launches with every pointer fixed once: the kernels' arguments are packed and
        each GEMM is bound to a descriptor of its own."""
        launches = tuple(self._launches(lt_handle, views, workspace, stream, bound=True))

        def run_bound() -> None:
            for launch in launches:
                launch()

        return run_bound

    def run(self, lt_handle: int, views: dict, workspace: Workspace, stream: int) -> None:
        for launch in self._launches(lt_handle, views, workspace, stream, bound=False):
            launch()

    def _launches(self, lt_handle: int, views: dict, workspace: Workspace, stream: int,
                  bound: bool) -> list[Callable[[], None]]:
        """The calls in order. ``bound``: GEMMs get descriptors of their own (for calls made
        again and again); else they run on the shared descriptors (for a call made once)."""
        _check_workspace(workspace, self.workspace_size)
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
            arguments = (lt_handle, pointers[s.a], pointers[s.b], pointers[s.c], pointers[s.d],
                         gemm_ws, gemm_size, stream, pointers[s.bias] if s.bias else 0,
                         pointers[s.aux] if s.aux else 0)
            launches.append(s.matmul.bind(*arguments) if bound
                            else functools.partial(s.matmul.run, *arguments))
        return launches


def _check_workspace(workspace: Workspace, need: int) -> None:
    if workspace.size < need:
        from ...errors import BufferTooSmall

        raise BufferTooSmall(f"workspace has {workspace.size} bytes; this problem needs {need}",
                             argument="workspace")


# The bit pattern of 1.0 and its width in bytes, per element type.
_ONE = {ElementKind.bf16: (0x3F80, 2), ElementKind.f16: (0x3C00, 2),
        ElementKind.f32: (0x3F800000, 4), ElementKind.tf32: (0x3F800000, 4)}


def _fill(ptr: int, pattern: int, width: int, count: int, stream: int) -> None:
    """``count`` copies of a 2- or 4-byte ``pattern`` at ``ptr``, enqueued on ``stream``."""
    from cuda.bindings import driver

    fill = driver.cuMemsetD32Async if width == 4 else driver.cuMemsetD16Async
    (status,) = fill(ptr, pattern, count, stream)
    if status != driver.CUresult.CUDA_SUCCESS:
        raise LaunchFailed(f"filling the ones vector of the bias-gradient GEMV failed: {status}")


class LinearBackwardCublasLt(_LinearCublasLt):
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

    def __init__(self, element: ElementKind, deterministic: bool):
        super().__init__(_sku(
            self.op, element, deterministic, 2 * _FORWARD_BOUND[element],
            "d_pre + dbias kernel (relu, gelu_tanh, gelu_erf, silu), bgrada/bgradb, dW, dx",
            "grad_out * act'(aux) with the bias gradient in one NVRTC kernel (fixed-order "
            "reduction), then dW and dx in cublasLtMatmul calls sharing one workspace."),
            element, deterministic)

    def unavailable(self) -> str | None:
        return library.available() or nvrtc_unavailable()

    def _activation_unserved(self, activation: str) -> str | None:
        return None  # the d_pre kernel takes every activation's derivative

    def check_args(self, desc, args: BoundArgs) -> None:
        views = args.views
        for name in ("grad_out", "x", "weight", "aux"):
            _check_matrix(views[name], name, output=False)
        for name in ("grad_x", "grad_weight", "grad_pre"):
            _check_matrix(views[name], name, output=True)
        if views["grad_bias"] is not None:
            expect_aligned(views["grad_bias"], "grad_bias", POINTER_ALIGNMENT)
        _check_aux(views["aux"], "aux", desc.activation)
        for name in ("grad_out", "aux", "grad_pre"):
            _check_batch_contiguous(views[name], name, desc.m,
                                    "(the backward treats the batch as more rows)")
        if desc.batch and not desc.weight_batched and desc.need_weight_grad:
            _check_batch_contiguous(views["x"], "x", desc.m,
                                    "when one weight serves the batch (dW sums over it)")

    def _bias_by(self, desc) -> str | None:
        """Who reduces dbias: "kernel" (with the activation's derivative), "weight" (the dW
        GEMM's BGRADA/BGRADB epilogue), "gemv" (d_pre^T @ ones), or None (not asked for)."""
        if not desc.need_bias_grad:
            return None
        if desc.activation != "none":
            return "kernel"
        if not self.deterministic and desc.need_weight_grad and not (
                desc.batch and desc.weight_batched):
            return "weight"
        return "gemv"

    def _regions(self, desc) -> dict[str, int]:
        item = self.element.itemsize
        rows = desc.m * (desc.batch or 1)
        regions = {}
        if desc.activation != "none" and not desc.need_pre_grad:
            regions["d_pre"] = rows * -(-desc.n // 8) * 8 * item
        if desc.activation != "none" and desc.need_bias_grad:
            regions["partials"] = partials_bytes(rows, desc.n, self.element)
        if desc.activation == "none" and desc.need_bias_grad:
            regions["ones"] = rows * item  # also when fused: the fallback if cuBLASLt refuses
        return regions

    def _fixed_bytes(self, desc) -> int:
        return sum(round_workspace(n) for n in self._regions(desc).values())

    def _canonical_strides(self, desc) -> tuple:
        batched = desc.batch is not None

        def matrix(r: int, c: int, per_batch: bool = True) -> tuple:
            return (r * c, c, 1) if batched and per_batch else (c, 1)

        w_rows, w_cols = (desc.k, desc.n) if desc.weight_layout == "kn" else (desc.n, desc.k)
        aux = None
        if desc.activation != "none":
            ld = relu_mask_bytes(desc.n) if desc.activation == "relu" else -(-desc.n // 8) * 8
            aux = (desc.m * ld, ld, 1) if batched else (ld, 1)
        weight = matrix(w_rows, w_cols, desc.weight_batched)
        return (matrix(desc.m, desc.n), matrix(desc.m, desc.k), weight, aux,
                matrix(desc.m, desc.k) if desc.need_input_grad else None,
                weight if desc.need_weight_grad else None,
                matrix(desc.m, desc.n) if desc.need_pre_grad else None)

    def _d_pre(self, desc, rows: tuple) -> tuple[str, Rows]:
        """Where d_pre lives: grad_out itself (no activation), grad_pre, or the workspace."""
        grad_out, grad_pre = rows[0], rows[6]
        if desc.activation == "none":
            return "grad_out", grad_out
        if desc.need_pre_grad:
            return "grad_pre", grad_pre
        ld = -(-desc.n // 8) * 8
        return "d_pre", Rows(ld, desc.m * ld)

    def _build(self, desc, device: int, layout: tuple, available: int | None):
        strides, alignment = layout
        rows = tuple(None if s is None else _rows_of(s) for s in strides)
        regions = self._regions(desc)
        fixed = sum(round_workspace(n) for n in regions.values())
        limit = WORKSPACE_LIMIT if available is None else max(0, (available - fixed) // 256 * 256
                                                              - 16)
        bias_by = self._bias_by(desc)
        try:
            steps = self._steps(desc, device, rows, limit, bias_by, alignment)
        except NoAlgorithm:
            if bias_by != "weight":
                raise
            steps = self._steps(desc, device, rows, limit, "gemv", alignment)
        grad = None
        if desc.activation != "none":
            d_pre_name, d_pre = self._d_pre(desc, rows)
            grad = ActivationGrad(desc.activation, self.element, device,
                                  desc.m * (desc.batch or 1), desc.n, rows[0].ld, rows[3].ld,
                                  d_pre.ld, alignment, d_pre_name, desc.need_bias_grad)
        return _BackwardRecipe(desc.m * (desc.batch or 1), _ONE[self.element], steps, regions,
                               grad)

    def _steps(self, desc, device: int, rows: tuple, limit: int, bias_by: str | None,
               alignment: int) -> list:
        _, x, w, _, grad_x, grad_w, _ = rows
        types = library.types_for(self.element)

        def matmul(name, gemm, epilogue) -> Matmul:
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


SKUS = {
    LINEAR_FORWARD.name: (
        *(LinearForwardCublasLt(e, det) for e in ELEMENTS for det in (False, True)),
        *(LinearForwardCublasLtActPass(e, det) for e in ELEMENTS for det in (False, True))),
    LINEAR_BACKWARD.name: tuple(LinearBackwardCublasLt(e, det) for e in ELEMENTS
                                for det in (False, True)),
}
