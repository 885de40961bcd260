"""Checks of a plan's promises on a GPU, for opfacade's own tests, `opfacade verify`, and users'
reproducibility tests.

    result = verify_plan(plan)          # fresh random inputs, float64 reference, N runs
    assert result.passed, result.summary()

Inputs come from one of ``DISTRIBUTIONS`` and are rounded to each argument's element type; the
reference runs in float64 on exactly those rounded values, and each output's error is measured
against the op's magnitude reference (``‖out − ref‖ / ‖mag‖``, as PrecisionGuarantee states the
bound). Outputs are poisoned (all bits set: NaN in every float format) before each run, so an
unwritten element cannot pass. Each run gets a new stream and a workspace at a different
address; bitwise equality over the runs is what ``deterministic`` promises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ._internal.checks import layout_aliasing
from ._internal.contract import Descriptor, TensorSpec
from ._internal.device import check_ordinal, current_device, device_count
from ._internal.device_buffers import (  # noqa: F401 (the tests' helpers, from here as before)
    _device_tensor,
    _from_bits,
    _to_bits,
    download_bits,
    still_holds,
    storage_layout,
    uploaded_bits,
)
from ._internal.sku import Workspace
from ._internal.tensors import TensorView, numpy_dtype
from ._registry import op_for
from .errors import BackendUnavailable, InvalidArgument, InvalidProblem
from .plan import Plan
from .types import BackendKind, ElementKind, PlanPreference

__all__ = [
    "DISTRIBUTIONS", "ReferenceCheck", "RepeatResult", "VerificationResult",
    "expect_distinct_elements", "random_inputs", "reference_check",
    "relative_error", "repeat_runs", "verify_plan", "verify_sku",
]

# The input distributions every SKU is verified on (catalog/PRECISION.md):
# - symmetric: uniform in [-1, 1); sums cancel.
# - positive: uniform in [0, 1); nothing cancels, the plain relative error's friendly case.
# - heavy_tailed: Student's t (3 degrees of freedom) with one value in 256 an outlier 16 times
#   further out, scaled by a power of two to a largest magnitude of at most 1: most values are
#   hundreds of times smaller than the few that dominate each sum.
# - large: uniform in [-1, 1) times the op's ``large_scales``: the largest inputs near the top
#   of their type's range, every result still finite.
DISTRIBUTIONS = ("symmetric", "positive", "heavy_tailed", "large")
_OUTLIER_EVERY = 256
_OUTLIER_FACTOR = 16.0

def relative_error(out: np.ndarray, ref: np.ndarray, magnitude: np.ndarray | None = None,
                   allowance: np.ndarray | None = None) -> float:
    """(‖out − ref‖ − ‖allowance‖)⁺ / ‖magnitude‖ in float64 (Frobenius norms): the error beyond
    the underflow allowance (none by default) relative to the magnitude reference (ref by
    default). A bound ``ε`` on it is ``‖out − ref‖ <= ε ‖magnitude‖ + ‖allowance‖``.

    Equal values, infinities included (an empty attention row's -inf log-sum-exp), count as no
    error; any other non-finite value gives inf. The norms are taken after dividing by the
    largest value, so results near float64's range do not overflow their squares.
    """
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.where(out == ref, 0.0, out - ref)
    if not np.isfinite(diff).all():
        return float("inf")
    size = np.abs(np.where(np.isfinite(ref), ref, 0.0) if magnitude is None
                  else np.asarray(magnitude, dtype=np.float64))
    allowed = np.zeros(()) if allowance is None else np.abs(np.asarray(allowance, np.float64))
    largest = max(float(np.max(np.abs(diff), initial=0.0)), float(np.max(size, initial=0.0)),
                  float(np.max(allowed, initial=0.0)))
    if largest == 0.0:
        return 0.0
    error = max(0.0, float(np.linalg.norm(diff / largest) - np.linalg.norm(allowed / largest)))
    scale = float(np.linalg.norm(size / largest))
    return error / scale if scale > 0 else error


def _draw(distribution: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if distribution == "positive":
        return rng.uniform(0.0, 1.0, size=shape)
    if distribution == "heavy_tailed":
        values = rng.standard_t(3, size=shape)
        outliers = rng.random(size=shape) < 1.0 / _OUTLIER_EVERY
        values = np.where(outliers, values * _OUTLIER_FACTOR, values)
        largest = float(np.max(np.abs(values), initial=0.0))
        # A power of two keeps the values' significands: the shape of the tail is the same.
        return values / 2.0 ** np.ceil(np.log2(largest)) if largest > 0 else values
    return rng.uniform(-1.0, 1.0, size=shape)  # symmetric, and large before its scales


def random_inputs(signature: dict[str, TensorSpec], rng: np.random.Generator,
                  distribution: str = "symmetric", scales: dict[str, float] | None = None
                  ) -> dict[str, np.ndarray]:
    """Values from ``distribution`` (one of DISTRIBUTIONS) times ``scales[name]`` where given,
    already rounded to each input's element type, as float64.

    Raises:
        InvalidArgument: an unknown distribution.
    """
    if distribution not in DISTRIBUTIONS:
        raise InvalidArgument(f"distribution must be one of {DISTRIBUTIONS}, got "
                              f"{distribution!r}", argument="distribution")
    inputs = {}
    for name, spec in signature.items():
        if spec.role == "out" or not spec.element.is_float:
            continue  # integer inputs (lengths, seeds) come from the op's verification_inputs
        raw = _draw(distribution, spec.shape, rng) * (scales or {}).get(name, 1.0)
        inputs[name] = _from_bits(_to_bits(raw, spec.element), spec.element)
    return inputs


def verification_problem(op, desc: Descriptor, rng: np.random.Generator,
                         distribution: str = "symmetric") -> dict[str, np.ndarray]:
    """All inputs of one verification run of ``desc``: random values from ``distribution``
    (scaled by the op's ``large_scales`` for "large"), made consistent by the op's
    ``verification_inputs`` (valid lengths, a backward's saved tensors)."""
    scales = (op.large_scales(desc) if distribution == "large" and op.large_scales is not None
              else None)
    inputs = random_inputs(op.signature(desc), rng, distribution, scales)
    if op.verification_inputs is not None:
        inputs = op.verification_inputs(desc, inputs, rng)
    return inputs


def _reference_plan(plan: Plan) -> Plan:
    """The float64 reference plan of the same problem: the inputs are already rounded to the
    plan's element types, so the only difference from the GPU is the arithmetic."""
    update: dict = {"element": ElementKind.f64}
    if getattr(plan.descriptor, "tf32", False):
        update["tf32"] = False  # TF32 math is an f32 option; model_copy validates the copy
    desc = plan.descriptor.model_copy(update=update)
    return type(plan).select(desc, PlanPreference(backends={"reference"}), device="cpu")


def reference_outputs(plan: Plan, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The float64 reference SKU of the plan's op, run on the host on ``inputs``."""
    return reference_check(plan, inputs).expected


@dataclass
class ReferenceCheck:
    """What a plan's outputs are checked against, per output name (PrecisionGuarantee): the
    float64 results, their magnitude references, and the underflow allowances (the plan's
    element-typed intermediates', and each output's own rounding into its subnormals)."""

    expected: dict[str, np.ndarray]
    magnitudes: dict[str, np.ndarray]
    allowances: dict[str, np.ndarray]

    def relative_error(self, name: str, out: np.ndarray) -> float:
        return relative_error(out, self.expected[name], self.magnitudes[name],
                              self.allowances[name])


def reference_check(plan: Plan, inputs: dict[str, np.ndarray]) -> ReferenceCheck:
    """The reference's results for ``plan`` on ``inputs``, with the scale and the allowance its
    declared bound is stated with. An output with no magnitude reference (a bit-mask) is held
    to its own size."""
    op = op_for(plan.descriptor)
    reference = _reference_plan(plan)
    signature = op.signature(reference.descriptor)
    # Outputs start as NaN, as verify poisons the GPU's: rows an op leaves as they were (tokens
    # of no packed sequence) match. A u8 mask output starts as zeros.
    arrays = {name: inputs[name].copy() if name in inputs
              else np.full(spec.shape, np.nan if spec.element.is_float else 0,
                           numpy_dtype(spec.element))
              for name, spec in signature.items()}
    reference.run(op.args(**arrays))
    expected = {name: arrays[name] for name, spec in signature.items()
                if spec.role in ("out", "inout")}
    oracle = reference._live_impl()
    compact = {name: np.ascontiguousarray(value) for name, value in inputs.items()}
    magnitudes = {name: np.abs(np.where(np.isfinite(value), value, 0.0))
                  for name, value in expected.items()}
    magnitudes.update({name: np.broadcast_to(value, expected[name].shape)
                       for name, value in oracle.magnitude(reference.descriptor, compact).items()
                       if name in expected})
    gpu_signature = op.signature(plan.descriptor)
    allowances = {name: np.full(value.shape, gpu_signature[name].element.subnormal_spacing)
                  for name, value in expected.items()}
    if oracle.underflow is not None:
        unit = plan.descriptor.element.subnormal_spacing
        for name, value in oracle.underflow(reference.descriptor, compact, unit=unit).items():
            if name in allowances:
                allowances[name] = allowances[name] + value
    return ReferenceCheck(expected, magnitudes, allowances)


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
    """What one plan did against the reference over ``runs`` runs on fresh inputs from one
    distribution; ``rel_errors`` are relative to each output's magnitude reference."""

    sku: str
    descriptor: dict
    runs: int
    max_rel_error: float
    rel_errors: dict[str, float]
    bitwise_equal: bool
    deterministic_declared: bool
    seconds: float
    distribution: str = "symmetric"
    notes: list[str] = field(default_factory=list)
    inputs_changed: list[str] = field(default_factory=list)  # inputs a run wrote into

    @property
    def within_bound(self) -> bool:
        return all(err <= self.max_rel_error for err in self.rel_errors.values())

    @property
    def passed(self) -> bool:
        return (self.within_bound and (self.bitwise_equal or not self.deterministic_declared)
                and not self.inputs_changed)

    def summary(self) -> str:
        errors = ", ".join(f"{k} {v:.3g}" for k, v in self.rel_errors.items())
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{verdict} {self.sku} {self.descriptor} ({self.distribution} inputs): rel "
                f"errors [{errors}] vs bound "
                f"{self.max_rel_error:.3g}; bitwise equal over {self.runs} runs: "
                f"{self.bitwise_equal} (declared deterministic: {self.deterministic_declared})"
                + (f"; inputs the run wrote into: {self.inputs_changed}"
                   if self.inputs_changed else ""))

    def to_dict(self) -> dict:
        return {"sku": self.sku, "descriptor": self.descriptor, "distribution": self.distribution,
                "runs": self.runs,
                "declared_max_rel_error": self.max_rel_error, "rel_errors": self.rel_errors,
                "bitwise_equal": self.bitwise_equal,
                "declared_deterministic": self.deterministic_declared,
                "inputs_changed": self.inputs_changed,
                "passed": self.passed, "seconds": round(self.seconds, 4)}


def expect_distinct_elements(signature: dict[str, TensorSpec]) -> None:
    """Checks that each tensor of a signature gives every element an address of its own: the
    float64 reference reads one random value per element, which strides that overlap (a
    descriptor's qkv_strides smaller than its extents, say) cannot hold on the GPU.

    Raises:
        InvalidArgument: the first tensor whose strides overlap, with its shape and strides.
    """
    for name, spec in signature.items():
        overlap = spec.strides and layout_aliasing(spec.shape, spec.strides)
        if overlap:
            raise InvalidArgument(f"verify gives every element of {name} a value of its own, "
                                  f"and the problem's strides for it ({spec.strides} for shape "
                                  f"{spec.shape}) cannot hold them: {overlap}", argument="plan")


def verify_plan(plan: Plan, *, runs: int = 3, seed: int | None = None,
                device: int | None = None, distribution: str = "symmetric"
                ) -> VerificationResult:
    """Runs ``plan`` ``runs`` times on one set of fresh random inputs from ``distribution`` (one
    of DISTRIBUTIONS) and checks its guarantee.

    Every run uses a new CuPy stream and a workspace at a different address; outputs are
    poisoned before each run and compared bitwise across runs and, in float64, to the reference
    (the error relative to the op's magnitude reference). Each input (role "in") must still hold
    the bits uploaded into it after the run: nothing a caller passes in is written unless it is
    an output.
    """
    _check_gpu_run("verify_plan", plan, runs, device)
    if distribution not in DISTRIBUTIONS:
        raise InvalidArgument(f"distribution must be one of {DISTRIBUTIONS}, got "
                              f"{distribution!r}", argument="distribution")
    import cupy

    start = time.perf_counter()
    device = plan.target.device if device is None else device
    device = current_device() if device is None else device
    op = op_for(plan.descriptor)
    signature = op.signature(plan.descriptor)
    expect_distinct_elements(signature)
    rng = np.random.default_rng(seed)
    inputs = verification_problem(op, plan.descriptor, rng, distribution)
    check = reference_check(plan, inputs)
    results: list[dict[str, np.ndarray]] = []
    uploaded = {name: uploaded_bits(inputs[name], spec) for name, spec in signature.items()
                if spec.role == "in" and name in inputs}
    changed: set[str] = set()
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
            results.append({name: download_bits(views[name]) for name in check.expected})
            changed.update(name for name, bits in uploaded.items()
                           if not still_holds(views[name], bits))
    rel_errors = {name: check.relative_error(name, _from_bits(results[0][name],
                                                              signature[name].element))
                  for name in check.expected}
    bitwise = all(r[name].tobytes() == results[0][name].tobytes()
                  for r in results[1:] for name in check.expected)
    guarantee = plan.precision_guarantee
    return VerificationResult(
        sku=plan.sku.id, descriptor=plan.descriptor.model_dump(mode="json"), runs=runs,
        max_rel_error=guarantee.max_rel_error, rel_errors=rel_errors, bitwise_equal=bitwise,
        deterministic_declared=guarantee.deterministic, seconds=time.perf_counter() - start,
        distribution=distribution, inputs_changed=sorted(changed))


def verify_sku(sku_id: str, *, runs: int = 3, seed: int | None = None, device: int | None = None,
               distributions: tuple[str, ...] = DISTRIBUTIONS) -> list[VerificationResult]:
    """verify_plan over every sample problem of the SKU's op that the SKU serves, on inputs from
    each of ``distributions``.

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
                plans = [Plan.select(d, PlanPreference(sku=sku_id), device=device)
                         for d in problems]
                return [verify_plan(plan, runs=runs, seed=seed, device=device,
                                    distribution=distribution)
                        for distribution in distributions for plan in plans]
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
