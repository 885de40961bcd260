"""Checks of a plan's promises on a GPU, for opfacade's own tests, `opfacade verify`, and users'
reproducibility tests.

    result = verify_plan(plan)          # fresh random inputs, float64 reference, N runs
    assert result.passed, result.summary()

Inputs are drawn uniformly from [-1, 1) and rounded to each argument's element type; the
reference runs in float64 on exactly those rounded values. Outputs are poisoned (all bits set:
NaN in every float format) before each run, so an unwritten element cannot pass. Each run gets a
new stream and a workspace at a different address; bitwise equality over the runs is what
``deterministic`` promises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ._internal.contract import Descriptor, TensorSpec
from ._internal.device import check_ordinal, current_device, device_count
from ._internal.sku import Workspace
from ._internal.tensors import TensorView, numpy_dtype
from ._registry import op_for
from .errors import BackendUnavailable, InvalidArgument, InvalidProblem
from .plan import Plan
from .types import BackendKind, ElementKind, PlanPreference

__all__ = [
    "RepeatResult", "VerificationResult", "random_inputs", "relative_error", "repeat_runs",
    "verify_plan", "verify_sku",
]

_STORAGE = {
    ElementKind.f64: np.float64, ElementKind.f32: np.float32, ElementKind.f16: np.float16,
    ElementKind.bf16: np.uint16,  # bit patterns; NumPy has no bfloat16
    ElementKind.i32: np.int32, ElementKind.i64: np.int64, ElementKind.u8: np.uint8,
}


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (Frobenius norms); NaN anywhere gives inf."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not (np.isfinite(out).all() and np.isfinite(ref).all()):
        return float("inf")
    scale = np.linalg.norm(ref)
    diff = np.linalg.norm(out - ref)
    return float(diff / scale) if scale > 0 else float(diff)


def _to_bits(values: np.ndarray, element: ElementKind) -> np.ndarray:
    """float64 values to the element's storage, rounding to nearest even."""
    if element is ElementKind.bf16:
        bits = values.astype(np.float32).view(np.uint32)
        rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))
        return (rounded >> 16).astype(np.uint16)
    return values.astype(_STORAGE[element])


def _from_bits(bits: np.ndarray, element: ElementKind) -> np.ndarray:
    if element is ElementKind.bf16:
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return bits.astype(np.float64)


def random_inputs(signature: dict[str, TensorSpec], rng: np.random.Generator
                  ) -> dict[str, np.ndarray]:
    """Uniform [-1, 1) values already rounded to each input's element type, as float64."""
    inputs = {}
    for name, spec in signature.items():
        if spec.role == "out" or not spec.element.is_float:
            continue  # integer inputs (lengths, seeds) come from the op's verification_inputs
        raw = rng.uniform(-1.0, 1.0, size=spec.shape)
        inputs[name] = _from_bits(_to_bits(raw, spec.element), spec.element)
    return inputs


def _device_tensor(spec: TensorSpec, device: int, values: np.ndarray | None) -> TensorView:
    """A CuPy buffer holding ``values`` (or poison) described by a TensorView of spec.element,
    laid out with ``spec.strides`` when given (a permuted dense layout), else in C order."""
    import cupy

    shape = tuple(spec.shape)
    # Storage order: dimensions from the largest stride to the smallest.
    order = (sorted(range(len(shape)), key=lambda d: -spec.strides[d]) if spec.strides
             else list(range(len(shape))))
    with cupy.cuda.Device(device):
        if values is None:
            array = cupy.empty([shape[d] for d in order], dtype=_STORAGE[spec.element])
            array.view(cupy.uint8).fill(0xFF)
        else:
            bits = _to_bits(np.asarray(values).reshape(shape), spec.element)
            array = cupy.asarray(np.ascontiguousarray(bits.transpose(order)))
    strides = [0] * len(shape)
    for axis, d in enumerate(order):
        strides[d] = array.strides[axis] // array.itemsize
    if spec.strides and any(n > 1 and s != w for n, s, w in zip(shape, strides, spec.strides,
                                                                   strict=True)):
        raise ValueError(f"strides {spec.strides} are not a permuted dense layout of {shape}")
    return TensorView(array.data.ptr, shape, tuple(strides), spec.element, device, "cupy", array)


def download_bits(view: TensorView) -> np.ndarray:
    """The raw bits of a view made by _device_tensor, indexed in its logical order."""
    host = view.obj.get()
    return np.lib.stride_tricks.as_strided(
        host, view.shape, tuple(s * host.itemsize for s in view.strides)).copy()


def reference_outputs(plan: Plan, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The float64 reference SKU of the plan's op, run on the host on ``inputs``.

    The reference runs the same problem stated in f64: the inputs are already rounded to the
    plan's element types, so the only difference from the GPU is the arithmetic.
    """
    op = op_for(plan.descriptor)
    update: dict = {"element": ElementKind.f64}
    if getattr(plan.descriptor, "tf32", False):
        update["tf32"] = False  # TF32 math is an f32 option; model_copy validates the copy
    desc = plan.descriptor.model_copy(update=update)
    reference = type(plan).select(desc, PlanPreference(backends={"reference"}), device="cpu")
    signature = op.signature(desc)
    arrays = {name: inputs[name].copy() if name in inputs
              else np.empty(spec.shape, numpy_dtype(spec.element))  # f64, or a u8 mask
              for name, spec in signature.items()}
    reference.run(op.args(**arrays))
    return {name: arrays[name] for name, spec in signature.items()
            if spec.role in ("out", "inout")}


def _check_gpu_run(function: str, plan: Plan, runs: int, device: int | None = None) -> None:
    """What verify_plan and repeat_runs need before they touch a GPU, as typed errors: a live
    GPU plan, a positive number of runs, and a visible device."""
    if not isinstance(plan, Plan):
        raise InvalidArgument(f"{function} takes a Plan, got {type(plan).__name__}",
                              argument="plan")
    if plan.target.is_host:
        raise InvalidArgument(f"{function} checks GPU plans; {plan.sku.id} is the float64 "
                              "reference itself (select with device=<ordinal> or arch=...)",
                              argument="plan")
    plan._live_impl()  # PlanFreed for a freed plan
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise InvalidArgument(f"runs must be a positive int, got {runs!r}", argument="runs")
    if device_count() == 0:
        raise BackendUnavailable(f"{function} runs {plan.sku.id} on a GPU, and no CUDA device "
                                 "is visible")
    if device is not None:
        check_ordinal(device)


@dataclass
class VerificationResult:
    """What one plan did against the reference over ``runs`` runs on fresh inputs."""

    sku: str
    descriptor: dict
    runs: int
    max_rel_error: float
    rel_errors: dict[str, float]
    bitwise_equal: bool
    deterministic_declared: bool
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def within_bound(self) -> bool:
        return all(err <= self.max_rel_error for err in self.rel_errors.values())

    @property
    def passed(self) -> bool:
        return self.within_bound and (self.bitwise_equal or not self.deterministic_declared)

    def summary(self) -> str:
        errors = ", ".join(f"{k} {v:.3g}" for k, v in self.rel_errors.items())
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{verdict} {self.sku} {self.descriptor}: rel errors [{errors}] vs bound "
                f"{self.max_rel_error:.3g}; bitwise equal over {self.runs} runs: "
                f"{self.bitwise_equal} (declared deterministic: {self.deterministic_declared})")

    def to_dict(self) -> dict:
        return {"sku": self.sku, "descriptor": self.descriptor, "runs": self.runs,
                "declared_max_rel_error": self.max_rel_error, "rel_errors": self.rel_errors,
                "bitwise_equal": self.bitwise_equal,
                "declared_deterministic": self.deterministic_declared,
                "passed": self.passed, "seconds": round(self.seconds, 4)}


def verify_plan(plan: Plan, *, runs: int = 3, seed: int | None = None,
                device: int | None = None) -> VerificationResult:
    """Runs ``plan`` ``runs`` times on one set of fresh random inputs and checks its guarantee.

    Every run uses a new CuPy stream and a workspace at a different address; outputs are
    poisoned before each run and compared bitwise across runs and, in float64, to the reference.
    """
    _check_gpu_run("verify_plan", plan, runs, device)
    import cupy

    start = time.perf_counter()
    device = plan.target.device if device is None else device
    device = current_device() if device is None else device
    op = op_for(plan.descriptor)
    signature = op.signature(plan.descriptor)
    rng = np.random.default_rng(seed)
    inputs = random_inputs(signature, rng)
    if op.verification_inputs is not None:
        inputs = op.verification_inputs(plan.descriptor, inputs, rng)
    expected = reference_outputs(plan, inputs)
    results: list[dict[str, np.ndarray]] = []
    with cupy.cuda.Device(device):
        pool = cupy.empty(plan.workspace_size + runs * Workspace.ALIGNMENT + Workspace.ALIGNMENT,
                          dtype=cupy.uint8)
        base = Workspace.round_up(pool.data.ptr)
        for run in range(runs):
            views = {name: _device_tensor(spec, device, inputs.get(name) if spec.role != "out"
                                          else None)
                     for name, spec in signature.items()}
            workspace = Workspace(base + run * Workspace.ALIGNMENT, plan.workspace_size, device,
                                  pool)
            # Uploads and poison went to the legacy stream, which a non-blocking stream does not
            # wait for: finish them before the run.
            cupy.cuda.runtime.deviceSynchronize()
            stream = cupy.cuda.Stream(non_blocking=True)
            plan.run(op.args(**views), workspace=workspace, stream=stream.ptr)
            stream.synchronize()
            results.append({name: download_bits(views[name]) for name in expected})
    rel_errors = {name: relative_error(_from_bits(results[0][name], signature[name].element), ref)
                  for name, ref in expected.items()}
    bitwise = all(r[name].tobytes() == results[0][name].tobytes()
                  for r in results[1:] for name in expected)
    guarantee = plan.precision_guarantee
    return VerificationResult(
        sku=plan.sku.id, descriptor=plan.descriptor.model_dump(mode="json"), runs=runs,
        max_rel_error=guarantee.max_rel_error, rel_errors=rel_errors, bitwise_equal=bitwise,
        deterministic_declared=guarantee.deterministic, seconds=time.perf_counter() - start)


def verify_sku(sku_id: str, *, runs: int = 3, seed: int | None = None, device: int | None = None
               ) -> list[VerificationResult]:
    """verify_plan over every sample problem of the SKU's op that the SKU serves.

    Raises:
        InvalidProblem: no SKU has this id (``opfacade catalog`` lists them).
        InvalidArgument: it is a float64 reference SKU, the oracle the others are checked
            against.
    """
    from ._registry import all_ops

    for op in all_ops():
        for impl in op.skus:
            if impl.sku.id == sku_id:
                if impl.sku.backend is BackendKind.reference:
                    raise InvalidArgument(f"{sku_id} is the float64 reference, the oracle "
                                          "verify_sku checks the GPU SKUs against",
                                          argument="sku_id")
                if device_count() == 0:
                    raise BackendUnavailable(f"verify_sku runs {sku_id} on a GPU, and no CUDA "
                                             "device is visible")
                problems: list[Descriptor] = [d for d in op.sample_problems(impl.sku.element)
                                              if impl.unfit(d) is None]
                return [verify_plan(Plan.select(d, PlanPreference(sku=sku_id), device=device),
                                    runs=runs, seed=seed, device=device) for d in problems]
    raise InvalidProblem(f"no SKU has the id {sku_id!r}; `opfacade catalog` lists them",
                         field="sku")


@dataclass
class RepeatResult:
    """Whether ``runs`` runs of a plan on the caller's own tensors wrote the same bits."""

    sku: str
    runs: int
    bitwise_equal: bool
    differing_outputs: list[str]


def _output_bytes(view: TensorView) -> bytes:
    """The raw bytes an output spans (its strides included), copied to the host."""
    import cupy

    lo, hi = view.byte_span()
    host = np.empty(hi - lo, dtype=np.uint8)
    if hi > lo:
        cupy.cuda.runtime.memcpy(host.ctypes.data, lo, hi - lo,
                                 cupy.cuda.runtime.memcpyDeviceToHost)
    return host.tobytes()


def repeat_runs(plan: Plan, args, *, runs: int = 5) -> RepeatResult:
    """Runs ``plan`` on ``args`` (the caller's tensors) ``runs`` times, each with a new stream
    and a workspace at a different address, and compares the outputs bitwise.

    For reproducibility tests of a user's own model: the inputs must not alias the outputs.
    """
    _check_gpu_run("repeat_runs", plan, runs)
    plan.can_implement(args)  # the typed error run() would raise, before anything runs
    import cupy

    op = op_for(plan.descriptor)
    bound = op.bind(plan.descriptor, args)
    outputs = {name: bound[name] for name in bound.outputs if bound[name] is not None}
    device = next(iter(bound.present().values())).device
    snapshots = []
    with cupy.cuda.Device(device):
        cupy.cuda.runtime.deviceSynchronize()  # the caller's producers, on whatever stream
        pool = cupy.empty(plan.workspace_size + (runs + 1) * Workspace.ALIGNMENT, cupy.uint8)
        base = Workspace.round_up(pool.data.ptr)
        for run in range(runs):
            workspace = Workspace(base + run * Workspace.ALIGNMENT, plan.workspace_size, device,
                                  pool)
            stream = cupy.cuda.Stream(non_blocking=True)
            plan.run(args, workspace=workspace, stream=stream.ptr)
            stream.synchronize()
            snapshots.append({name: _output_bytes(view) for name, view in outputs.items()})
    differing = sorted({name for snap in snapshots[1:] for name in outputs
                        if snap[name] != snapshots[0][name]})
    return RepeatResult(plan.sku.id, runs, not differing, differing)
