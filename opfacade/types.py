"""The type vocabulary shared by every op: elements, precision, architectures, SKUs, preferences."""

from __future__ import annotations

import enum
import numbers
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ._internal.validation import CheckedModel, validated
from .errors import InvalidProblem

__all__ = [
    "ElementKind",
    "MathPrecision",
    "PrecisionGuarantee",
    "ArchSku",
    "BackendKind",
    "OpCategory",
    "KernelSku",
    "PlanPreference",
]


class ElementKind(enum.StrEnum):
    """Element types of tensors (storage), named the way cuDNN and cuBLASLt users say them."""

    f64 = "f64"
    f32 = "f32"
    tf32 = "tf32"
    f16 = "f16"
    bf16 = "bf16"
    fp8_e4m3 = "fp8_e4m3"
    fp8_e5m2 = "fp8_e5m2"
    i32 = "i32"
    i64 = "i64"
    u8 = "u8"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self not in (ElementKind.i32, ElementKind.i64, ElementKind.u8)

    @property
    def accumulator(self) -> ElementKind:
        """What a floating element's sums and statistics (softmax stats, LSE, ALiBi's slopes)
        are kept in: f64 for f64, f32 for every narrower type."""
        return ElementKind.f64 if self is ElementKind.f64 else ElementKind.f32

    @property
    def unit_roundoff(self) -> float:
        """Half the spacing of the format at 1.0: the relative error of one rounding."""
        return 2.0 ** -_SIGNIFICAND_BITS[self]

    @property
    def subnormal_spacing(self) -> float:
        """The spacing of the format's subnormals: the most a rounding into its underflow range
        can lose, whatever the value's size (2**-24 for f16, 2**-133 for bf16)."""
        return _SUBNORMAL_SPACING[self]

    @property
    def max_exponent(self) -> int:
        """The largest e with 2**e finite in the format: inputs near the top of its range are
        scaled to about 2**(e - 2) by the "large" verification distribution."""
        return _MAX_EXPONENT[self]


_ITEMSIZE = {
    ElementKind.f64: 8, ElementKind.f32: 4, ElementKind.tf32: 4, ElementKind.f16: 2,
    ElementKind.bf16: 2, ElementKind.fp8_e4m3: 1, ElementKind.fp8_e5m2: 1,
    ElementKind.i32: 4, ElementKind.i64: 8, ElementKind.u8: 1,
}
# 2**(smallest normal exponent - significand bits + 1); integers are exact (0). tf32 keeps f32's
# exponent range.
_SUBNORMAL_SPACING = {
    ElementKind.f64: 2.0 ** -1074, ElementKind.f32: 2.0 ** -149, ElementKind.tf32: 2.0 ** -149,
    ElementKind.f16: 2.0 ** -24, ElementKind.bf16: 2.0 ** -133, ElementKind.fp8_e4m3: 2.0 ** -9,
    ElementKind.fp8_e5m2: 2.0 ** -16, ElementKind.i32: 0.0, ElementKind.i64: 0.0,
    ElementKind.u8: 0.0,
}
# floor(log2(largest finite value)); tf32 is stored and accumulated as f32.
_MAX_EXPONENT = {
    ElementKind.f64: 1023, ElementKind.f32: 127, ElementKind.tf32: 127, ElementKind.f16: 15,
    ElementKind.bf16: 127, ElementKind.fp8_e4m3: 8, ElementKind.fp8_e5m2: 15,
    ElementKind.i32: 30, ElementKind.i64: 62, ElementKind.u8: 7,
}
# Significand bits including the implicit one; integers are exact.
_SIGNIFICAND_BITS = {
    ElementKind.f64: 53, ElementKind.f32: 24, ElementKind.tf32: 11, ElementKind.f16: 11,
    ElementKind.bf16: 8, ElementKind.fp8_e4m3: 4, ElementKind.fp8_e5m2: 3,
    ElementKind.i32: 64, ElementKind.i64: 64, ElementKind.u8: 64,
}


class MathPrecision(enum.StrEnum):
    """The precision of the arithmetic a kernel does (products and sums), ordered by bits."""

    fp8 = "fp8"
    bf16 = "bf16"
    f16 = "f16"
    tf32 = "tf32"
    f32 = "f32"
    f64 = "f64"

    @property
    def rank(self) -> int:
        return list(MathPrecision).index(self)

    def at_least(self, other: MathPrecision) -> bool:
        return self.rank >= other.rank


class PrecisionGuarantee(CheckedModel):
    """What a SKU promises about its numbers; each field is checked on a GPU by the tests.

    ``max_rel_error`` is the ε of ``‖out − ref‖ <= ε ‖mag‖ + ‖ufl‖`` (Frobenius norms), for
    every output. ``ref`` is the float64 reference run on the same (already rounded) inputs;
    ``ufl`` allows what rounding into the element's subnormals loses (the output's own, and
    that of intermediates a kernel holds in the element type); ``mag`` is the op's magnitude
    reference, the same computation over the inputs' absolute values (``|x| @ |W| +
    |bias|`` for a GEMM, ``sum |dY| |j - i|`` for the ALiBi slope gradient, ``P @ |V|`` for
    attention), which is what rounding-error analyses bound a reduction's error by (cuBLAS's and
    LAPACK's ``|C - Ĉ| <= γ_k |A| |B|``). As ``|ref| <= mag``, the bound never exceeds the plain
    relative error where nothing cancels, and it holds whatever cancels: for any finite input
    whose results are finite in the output types (catalog/PRECISION.md states each op's
    magnitude reference and the input distributions verify checks). ``deterministic``:
    bitwise-equal outputs run after run on the same device and configuration, whatever the
    workspace address or stream. ``bit_stable``: the order of every reduction is fixed by the
    descriptor alone (not the device's size, the alignment of the tensors or the workspace), so
    results also agree across GPUs of the same architecture. ``batch_invariant``: an item's
    results (a sequence's, in attention) are bitwise the same whatever else shares its batch and
    wherever it sits in it, because no reduction's order or split depends on the batch.
    ``capture_safe``: run() does no
    host sync, no allocation when given a workspace, and no host read of device data, so it may
    be captured in a CUDA graph.
    """

    math_precision: MathPrecision
    accumulator: ElementKind
    deterministic: bool
    bit_stable: bool
    max_rel_error: float = Field(gt=0.0, allow_inf_nan=False)
    capture_safe: bool = True
    batch_invariant: bool = False

    @model_validator(mode="after")
    def _stability_implies_determinism(self) -> PrecisionGuarantee:
        for name in ("bit_stable", "batch_invariant"):
            if getattr(self, name) and not self.deterministic:
                raise ValueError(f"a {name} guarantee must also be deterministic")
        return self


class ArchSku(enum.StrEnum):
    """GPU architectures by compute capability; a SKU names the oldest one it runs on."""

    sm80 = "sm80"
    sm86 = "sm86"
    sm89 = "sm89"
    sm90 = "sm90"
    sm100 = "sm100"
    sm120 = "sm120"

    @property
    def compute_capability(self) -> tuple[int, int]:
        return _CAPABILITY[self]

    @property
    def nvrtc_arch(self) -> str:
        """The ``-arch`` value NVRTC takes to emit a cubin for this architecture."""
        return "sm_" + self.value[2:]

    @classmethod
    def parse(cls, text: str | ArchSku | tuple[int, int]) -> ArchSku:
        """Accepts ``sm90``, ``sm_90``, ``9.0``, ``90`` or ``(9, 0)``."""
        if isinstance(text, ArchSku):
            return text
        if not isinstance(text, str | tuple | numbers.Real):
            raise InvalidProblem(f"arch must be a string such as 'sm90' or '9.0', or a (major, "
                                 f"minor) pair, got {type(text).__name__}", field="arch")
        if isinstance(text, tuple):
            if len(text) != 2 or not all(isinstance(n, numbers.Integral | str) for n in text):
                raise InvalidProblem(f"arch as a tuple must be (major, minor) compute capability, "
                                     f"e.g. (9, 0), got {text!r}", field="arch")
            digits = f"{text[0]}{text[1]}"
        else:
            raw = str(text).strip().lower().removeprefix("sm").lstrip("_")
            digits = raw.replace(".", "")
        if not digits.isdigit():
            raise InvalidProblem(f"arch must look like 'sm90' or '9.0', got {text!r}", field="arch")
        value = cls._value2member_map_.get("sm" + digits)
        if value is None:
            known = ", ".join(a.value for a in cls)
            raise InvalidProblem(f"arch must be one of {known}, got {text!r}", field="arch")
        return value  # type: ignore[return-value]

    def covers(self, required: ArchSku) -> bool:
        """True when a device of this arch can run a SKU that needs ``required``."""
        return self.compute_capability >= required.compute_capability


_CAPABILITY = {arch: (int(arch.value[2:-1]), int(arch.value[-1])) for arch in ArchSku}


class BackendKind(enum.StrEnum):
    cudnn = "cudnn"
    cublaslt = "cublaslt"
    nvrtc = "nvrtc"
    reference = "reference"


class OpCategory(enum.StrEnum):
    attention = "attention"
    varlen_attention = "varlen_attention"
    decode_attention = "decode_attention"
    gemm = "gemm"
    positional_bias = "positional_bias"


class KernelSku(CheckedModel):
    """One kernel offering: what it computes, on what, where it runs and what it guarantees."""

    id: str
    category: OpCategory
    op: str
    element: ElementKind
    aux_element: ElementKind | None = None
    layout: str
    epilogue: str | None = None
    arch: ArchSku | None  # None: runs on the host (the reference backend)
    backend: BackendKind
    precision_guarantee: PrecisionGuarantee
    description: str = ""

    def catalog_row(self) -> dict:
        """The JSON object ``opfacade catalog --json`` prints for this SKU."""
        return self.model_dump(mode="json")


class PlanPreference(CheckedModel):
    """What the caller requires (filters) and prefers (ranking) among the candidate SKUs."""

    deterministic: bool = False
    bit_stable: bool = False
    batch_invariant: bool = False
    min_math_precision: MathPrecision | None = None
    max_rel_error: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)  # None: no bound
    backends: frozenset[BackendKind] | None = None
    workspace_limit: int | None = Field(default=None, ge=0)
    objective: Literal["speed", "memory"] = "speed"
    sku: str | None = None  # pin one SKU by id (verification, bisecting a numerical issue)

    @field_validator("backends", mode="before")
    @classmethod
    def _one_name_or_a_collection(cls, value):
        # One name stands for a set of one; pydantic checks the rest (a list, set or tuple of
        # backend names) and rejects anything else with the field's name.
        return [value] if isinstance(value, str | BackendKind) else value

    @classmethod
    def coerce(cls, value: PlanPreference | dict | None) -> PlanPreference:
        """Options accept ``None``, a dict or the model."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return validated(cls, value)
        raise InvalidProblem(
            f"pref must be a PlanPreference, a dict or None, got {type(value).__name__}",
            field="pref",
        )
