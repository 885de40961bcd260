"""The type vocabulary: parsing, ordering and validation, with typed errors."""

from __future__ import annotations

import pytest

from opfacade import (
    ArchSku,
    ElementKind,
    InvalidProblem,
    MathPrecision,
    PlanPreference,
    PrecisionGuarantee,
)


@pytest.mark.parametrize("text", ["sm90", "sm_90", "9.0", "90", (9, 0), ArchSku.sm90])
def test_arch_parses_every_spelling(text):
    assert ArchSku.parse(text) is ArchSku.sm90


@pytest.mark.parametrize("text", ["sm_91", "hopper", "", "sm"])
def test_arch_rejects_unknown(text):
    with pytest.raises(InvalidProblem, match="arch"):
        ArchSku.parse(text)


def test_arch_coverage_is_by_compute_capability():
    assert ArchSku.sm90.covers(ArchSku.sm80)
    assert not ArchSku.sm86.covers(ArchSku.sm89)
    assert ArchSku.sm90.nvrtc_arch == "sm_90"


def test_element_sizes_and_roundoff():
    assert ElementKind.bf16.itemsize == 2 and ElementKind.f64.itemsize == 8
    assert ElementKind.bf16.unit_roundoff == 2.0**-8
    assert ElementKind.f32.unit_roundoff == 2.0**-24
    assert not ElementKind.i32.is_float


def test_math_precision_is_ordered():
    assert MathPrecision.f32.at_least(MathPrecision.tf32)
    assert not MathPrecision.bf16.at_least(MathPrecision.f16)


@pytest.mark.parametrize("claim", ["bit_stable", "batch_invariant"])
def test_stability_claims_require_deterministic(claim):
    fields = dict(math_precision="f32", accumulator="f32", deterministic=False,
                  bit_stable=False, max_rel_error=1e-6)
    with pytest.raises(InvalidProblem, match=claim):
        PrecisionGuarantee(**{**fields, claim: True})


def test_preference_coercion():
    assert PlanPreference.coerce(None) == PlanPreference()
    pref = PlanPreference.coerce({"deterministic": True, "backends": ["nvrtc"]})
    assert pref.deterministic and pref.backends == frozenset({"nvrtc"})
    assert hash(pref) == hash(PlanPreference(deterministic=True, backends={"nvrtc"}))
    with pytest.raises(InvalidProblem, match="workspace_limit"):
        PlanPreference.coerce({"workspace_limit": -1})
    with pytest.raises(InvalidProblem, match="pref"):
        PlanPreference.coerce(42)


class _Unprintable:
    """Refuses every conversion but repr: what an arch check must not call str() on."""

    def __str__(self):
        raise RuntimeError("no str")

    __int__ = __index__ = __float__ = __str__

    def __repr__(self):
        return "<Unprintable>"


@pytest.mark.parametrize("value", [(9,), (9, 0, 1), (), (_Unprintable(), 0), (9.5, 0), [9, 0],
                                   {"major": 9}, b"sm90", None, _Unprintable(), object()])
def test_arch_rejects_what_is_no_arch_with_invalid_problem(value):
    with pytest.raises(InvalidProblem, match="arch") as caught:
        ArchSku.parse(value)
    assert caught.value.field == "arch"


@pytest.mark.parametrize("value", [90, 9.0, "8.6", ("9", "0"), (8, 6)])
def test_arch_takes_numbers_and_pairs(value):
    assert ArchSku.parse(value) in (ArchSku.sm90, ArchSku.sm86)
