"""What every attention family's problem shares: heads (GQA/MQA), head dims, the element type,
the softmax scale, the causal mask and the sliding window, with one set of rules and one
vocabulary (the float64 reference's, ``_backends/reference/sdpa.py``).

With ``d`` the diagonal offset (0 top-left, ``len_kv - len_q`` bottom-right, per sequence),
``causal`` keeps keys ``j <= i + d`` and ``window=(left, right)`` keeps
``i + d - left <= j <= i + d + right``. A window takes the causal mask's alignment, else its own,
else top-left.

``AttentionMask`` holds the rules (validators) and the derived facts; each family's descriptor
declares the fields (heads_q, heads_kv, head_dim, head_dim_v, element, scale, causal, window) in
its own order beside its own.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from .._internal.contract import Descriptor, bits_for
from .._internal.validation import CheckedModel, one_of
from ..types import ElementKind

__all__ = ["ELEMENTS", "MAX_EXTENT", "Alignment", "AttentionMask", "SlidingWindow",
           "floating_element", "large_backward_scales", "large_forward_scales"]

Alignment = Literal["top_left", "bottom_right"]
MAX_EXTENT = 1 << 31
# The element types an attention problem may be stated in (the float64 reference serves each).
ELEMENTS = (ElementKind.f64, ElementKind.f32, ElementKind.f16, ElementKind.bf16)


def floating_element(element: ElementKind) -> ElementKind:
    """The element rule of every attention and KV-cache descriptor: one of ELEMENTS."""
    if element not in ELEMENTS:
        raise ValueError(f"element must be {one_of(ELEMENTS)}")
    return element


class SlidingWindow(CheckedModel):
    """Keys ``i + d - left <= j <= i + d + right`` (a None side unbounded), ``d`` set by the
    alignment; without one, the window takes the causal mask's alignment, else top-left."""

    left: int | None = Field(default=None, ge=0, lt=MAX_EXTENT)
    right: int | None = Field(default=None, ge=0, lt=MAX_EXTENT)
    alignment: Alignment | None = None

    @model_validator(mode="after")
    def _bounded(self) -> SlidingWindow:
        if self.left is None and self.right is None:
            raise ValueError("a window needs a left or a right bound")
        return self


def _parse_window(value: Any) -> Any:
    """Accepts a SlidingWindow, a dict, a (left, right) pair or the CLI's "left,right"."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        if len(parts) != 2:
            raise ValueError("window must be 'left,right' (either side may be 'none')")
        value = [None if p.lower() in ("", "none") else int(p) for p in parts]
    if isinstance(value, list | tuple):
        if len(value) != 2:
            raise ValueError(f"window must be a pair (left, right), got {value!r}")
        return {"left": value[0], "right": value[1]}
    return value


class AttentionMask(Descriptor):
    """The rules and derived facts of the fields every attention descriptor declares."""

    @field_validator("heads_kv", check_fields=False)
    @classmethod
    def _divides_heads_q(cls, heads_kv: int, info: ValidationInfo) -> int:
        heads_q = info.data.get("heads_q")
        if heads_q is not None and heads_q % heads_kv:
            raise ValueError(f"heads_q {heads_q} must be a multiple of heads_kv {heads_kv}")
        return heads_kv

    @field_validator("element", check_fields=False)
    @classmethod
    def _floating(cls, element: ElementKind) -> ElementKind:
        return floating_element(element)

    @field_validator("scale", check_fields=False)
    @classmethod
    def _finite(cls, scale: float | None) -> float | None:
        if scale is not None and not (math.isfinite(scale) and scale != 0.0):
            raise ValueError("scale must be finite and non-zero (None for 1/sqrt(head_dim))")
        return scale

    @field_validator("causal", mode="before", check_fields=False)
    @classmethod
    def _causal_flag(cls, value: Any) -> Any:
        if value is True:
            return "top_left"
        return None if value is False else value

    @field_validator("window", mode="before", check_fields=False)
    @classmethod
    def _window_forms(cls, value: Any) -> Any:
        return _parse_window(value)

    @field_validator("window", check_fields=False)
    @classmethod
    def _one_alignment(cls, window: SlidingWindow | None, info: ValidationInfo):
        causal = info.data.get("causal")
        if window is not None and causal and window.alignment not in (None, causal):
            raise ValueError(f"window alignment {window.alignment} must match causal {causal}")
        return window

    # -- derived -------------------------------------------------------------------------------
    @property
    def dim_v(self) -> int:
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def softmax_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim) if self.scale is None else self.scale

    @property
    def alignment(self) -> str:
        """The diagonal's alignment, shared by the causal mask and the window."""
        if self.causal is not None:
            return self.causal
        return (self.window.alignment if self.window else None) or "top_left"

    @property
    def right_bound(self) -> int | None:
        """Keys ``j <= i + d + right`` (reference convention); 0 under a causal mask."""
        if self.causal is not None:
            return 0
        return self.window.right if self.window else None

    @property
    def left_bound(self) -> int | None:
        """Keys ``j >= i + d - left`` (reference convention)."""
        return self.window.left if self.window else None



# -- the "large" verification distribution, for every attention family -------------------------
#
# Its largest scores are about 2**12. Scores far beyond what models make exercise the softmax's
# max subtraction and exp underflow, while an f32 score and the f32 log-sum-exp a backward reads
# still resolve them to ~2**-12 (at 2**24 they would not resolve them at all: no kernel that
# saves the log-sum-exp in f32 can have a backward there).
_LARGE_SCORES = 12


def _large_qk(desc: AttentionMask) -> int:
    """The exponent of two for q and k that puts |scale| D |q| |k| near 2**_LARGE_SCORES."""
    return math.floor((_LARGE_SCORES - math.log2(abs(desc.softmax_scale) * desc.head_dim)) / 2)


def large_forward_scales(desc: AttentionMask) -> dict[str, float]:
    """The "large" distribution's multipliers for a forward: v near the top of its range (out
    is a convex combination of its rows), q and k making scores of about 2**_LARGE_SCORES."""
    qk = 2.0 ** _large_qk(desc)
    return {"q": qk, "k": qk, "v": 2.0 ** (desc.element.max_exponent - 2)}


def large_backward_scales(desc: AttentionMask, seq_q: int, seq_kv: int) -> dict[str, float]:
    """The "large" distribution's multipliers for a backward whose sequences are at most
    ``seq_q`` and ``seq_kv`` long. dS = P (dO.V - rowsum(dO O)) is up to 2 D |dO| |V|, and dq
    (dk) sums Skv (Sq times the group) terms of scale |dS| |k| (|q|): q and k as in the
    forward, v as near the top of the range as a normal grad_out allows, and grad_out as small
    as keeps dq, dk and dv finite."""
    element = desc.element
    top = element.max_exponent - 2
    qk = _large_qk(desc)
    group = desc.heads_q // desc.heads_kv
    reach = bits_for(2.0 * abs(desc.softmax_scale) * desc.head_dim * max(seq_kv, seq_q * group))
    grad = max(-qk - reach, 3 - element.max_exponent)  # v at top - 1, else the smallest normal
    grad = min(grad, top - bits_for(seq_q * group) - 1)  # dv sums Sq*group of P dO
    v = min(top - 1, top - qk - reach - 1 - grad)
    return {"q": 2.0 ** qk, "k": 2.0 ** qk, "v": 2.0 ** v, "grad_out": 2.0 ** grad}
