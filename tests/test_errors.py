"""Every error opfacade raises is an OpFacadeError: each escape fuzzing found, pinned by a test.

pydantic's ValidationError becomes InvalidProblem at every public entry point, keeping the field
path and pydantic's error list; selection's arguments, host plans' outputs and the testing
helpers raise typed errors naming what is wrong. ``test_fuzz.py`` searches for new escapes.
"""

from __future__ import annotations

import pytest

import opfacade
from opfacade import (
    AlibiForwardDescriptor,
    InvalidProblem,
    KernelSku,
    LinearDescriptor,
    OpFacadeError,
    Plan,
    PlanPreference,
    PrecisionGuarantee,
    SdpaDescriptor,
    SlidingWindow,
)
from opfacade._internal.validation import one_of
from opfacade._registry import FAMILIES, all_ops
from opfacade.types import ElementKind

ALIBI = dict(batch=1, heads=2, query_len=3, key_len=4, element="f32")
GUARANTEE = dict(math_precision="f32", accumulator="f32", deterministic=True, bit_stable=True,
                 max_rel_error=1e-6)


def alibi(**changes):
    return AlibiForwardDescriptor(**{**ALIBI, **changes})


# -- pydantic's errors are InvalidProblem, with the field path and the error list -----------------

ENTRY_POINTS = {
    "constructor": lambda: AlibiForwardDescriptor(**{**ALIBI, "batch": -1}),
    "model_validate": lambda: AlibiForwardDescriptor.model_validate({**ALIBI, "batch": -1}),
    "model_validate_json": lambda: AlibiForwardDescriptor.model_validate_json(
        '{"batch": -1, "heads": 2, "query_len": 3, "key_len": 4, "element": "f32"}'),
    "model_validate_strings": lambda: AlibiForwardDescriptor.model_validate_strings(
        {**{k: str(v) for k, v in ALIBI.items()}, "batch": "-1"}),
    "from_json": lambda: AlibiForwardDescriptor.from_json(
        alibi().model_dump_json().replace('"batch":1', '"batch":-1')),
    "model_copy": lambda: alibi().model_copy(update={"batch": -1}),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_way_to_make_a_descriptor_raises_invalid_problem(entry):
    with pytest.raises(InvalidProblem, match="batch: Input should be greater than or equal to "
                                             "1") as caught:
        ENTRY_POINTS[entry]()
    assert caught.value.field == "batch"
    errors = caught.value.errors()
    assert [e["loc"] for e in errors] == [("batch",)]
    assert errors[0]["type"] == "greater_than_equal" and errors[0]["input"] in (-1, "-1")


@pytest.mark.parametrize("make, field", [
    (lambda: PlanPreference(backends=5), "backends"),
    (lambda: PlanPreference(backends=["tensorrt"]), "backends.0"),
    (lambda: PlanPreference(deterministic="maybe"), "deterministic"),
    (lambda: PlanPreference(max_rel_error=float("nan")), "max_rel_error"),
    (lambda: PlanPreference(max_rel_error=float("inf")), "max_rel_error"),  # None: no bound
    (lambda: PlanPreference.coerce({"backends": 5}), "backends"),
    (lambda: PlanPreference.coerce({1: 2}), "1"),
    (lambda: PlanPreference.model_validate_json('{"objective": "fast"}'), "objective"),
    (lambda: SlidingWindow(left=-1), "left"),
    (lambda: SlidingWindow(), None),
    (lambda: SdpaDescriptor(batch=1, heads_q=1, heads_kv=1, seq_q=1, seq_kv=1, head_dim=8,
                            element="f16", window={"left": -1}), "window.left"),
    (lambda: KernelSku(id=1), "id"),
    (lambda: PrecisionGuarantee(**{**GUARANTEE, "deterministic": False}), None),
    (lambda: PrecisionGuarantee(**{**GUARANTEE, "max_rel_error": 0}), "max_rel_error"),
    (lambda: PrecisionGuarantee(**{**GUARANTEE, "max_rel_error": float("inf")}),
     "max_rel_error"),
])
def test_every_public_model_raises_invalid_problem_naming_the_field(make, field):
    with pytest.raises(InvalidProblem) as caught:
        make()
    assert caught.value.field == field
    assert caught.value.errors() and all("loc" in e and "msg" in e for e in caught.value.errors())


def test_a_preference_still_takes_one_name_or_any_collection_of_names():
    one = frozenset({"nvrtc"})
    for backends in ("nvrtc", ["nvrtc"], ("nvrtc",), {"nvrtc"}, frozenset({"nvrtc"})):
        assert PlanPreference(backends=backends).backends == one
    with pytest.raises(InvalidProblem, match="backends"):
        Plan.select(alibi(), {"backends": 5}, arch="sm90")


def test_models_take_keyword_arguments_only():
    with pytest.raises(InvalidProblem, match="keyword arguments only"):
        AlibiForwardDescriptor(1, 2)


def test_an_invalid_problem_of_ours_has_an_error_list_too():
    with pytest.raises(InvalidProblem) as caught:
        Plan.explain(alibi(), arch="hopper")
    assert caught.value.errors() == [{"type": "invalid_problem", "loc": ("arch",),
                                      "msg": str(caught.value)}]


@pytest.mark.parametrize("text, message", [
    ("[]", "should be an object"), ("{", "Invalid JSON"), ("[" * 100_000, "Invalid JSON"),
    ("", "Invalid JSON"), ("null", "should be an object"), (5, "takes a JSON string"),
    (None, "takes a JSON string"),
])
def test_from_json_rejects_what_is_not_a_descriptor_object(text, message):
    with pytest.raises(InvalidProblem, match=message):
        AlibiForwardDescriptor.from_json(text)


def test_from_json_round_trips_every_kind_of_field():
    desc = SdpaDescriptor(batch=1, heads_q=4, heads_kv=2, seq_q=5, seq_kv=7, head_dim=8,
                          element="bf16", window=(3, None), bias="1hqk", scale=0.5)
    again = SdpaDescriptor.from_json(desc.model_dump_json().encode())
    assert again == desc and hash(again) == hash(desc)


def test_model_copy_validates_the_copy_before_selection_sees_it():
    desc = LinearDescriptor(m=2, n=3, k=4, element="f32")
    with pytest.raises(InvalidProblem, match="element") as caught:
        Plan.explain(desc.model_copy(update={"element": 3}), arch="sm90")
    assert caught.value.field == "element"
    with pytest.raises(InvalidProblem, match="tf32"):  # a cross-field rule, not just the type
        desc.model_copy(update={"tf32": True, "element": "f16"})
    with pytest.raises(InvalidProblem, match="bogus"):
        desc.model_copy(update={"bogus": 1})
    copy = desc.model_copy(update={"m": 5})
    assert copy.m == 5 and copy == LinearDescriptor(m=5, n=3, k=4, element="f32")
    assert desc.model_copy() == desc


# -- selection's arguments ------------------------------------------------------------------------

@pytest.mark.parametrize("arch", [(9,), (9, 0, 1), (), ("a", "b"), (-9, 0), (9.5, 0)])
def test_an_arch_tuple_that_is_not_major_minor_is_invalid_problem(arch):
    with pytest.raises(InvalidProblem, match="arch") as caught:
        Plan.explain(alibi(), arch=arch)
    assert caught.value.field == "arch"


# -- the names ------------------------------------------------------------------------------------

def test_compile_error_is_public_and_typed():
    from opfacade import CompileError

    assert CompileError is opfacade.errors.CompileError and "CompileError" in opfacade.__all__
    assert issubclass(CompileError, OpFacadeError) and issubclass(CompileError, RuntimeError)
    error = CompileError("alibi_forward", "int x;\nbad y;", ("-arch=sm_90",), "line 2: error")
    assert "alibi_forward" in str(error) and "-arch=sm_90" in str(error)
    assert error.numbered_source() == "1 | int x;\n2 | bad y;"


def test_every_public_error_derives_from_opfacade_error():
    for name in opfacade.errors.__all__:
        assert issubclass(getattr(opfacade, name), OpFacadeError), name


# -- the element types a descriptor accepts are the ones its message lists ----------------------

@pytest.mark.parametrize("op", all_ops(), ids=lambda op: op.name)
def test_the_accepted_elements_are_the_ones_the_message_lists(op):
    family = next(f for f in FAMILIES if any(o.name == op.name for o in f.contract.OPS))
    accepted = family.contract.ELEMENTS
    sample = op.sample_problems(ElementKind.f64)[0]
    for element in ElementKind:
        try:
            sample.model_copy(update={"element": element})
        except InvalidProblem as error:
            assert element not in accepted
            assert error.field == "element" and one_of(accepted) in str(error)
        else:
            assert element in accepted


def test_no_descriptor_accepts_an_element_no_sku_serves_unless_documented():
    # ALiBi states fp8 problems (selection answers element_unsupported); linear has no fp8 SKU,
    # so an fp8 linear problem is invalid, not unsupported.
    served = {op.name: {impl.sku.element for impl in op.skus} for op in all_ops()}
    assert not served["linear_forward"] & {ElementKind.fp8_e4m3, ElementKind.fp8_e5m2}
    with pytest.raises(InvalidProblem, match="element must be f64, f32, f16 or bf16"):
        LinearDescriptor(m=2, n=3, k=4, element="fp8_e4m3")
    with pytest.raises(opfacade.NoKernelSku, match="element_unsupported"):
        Plan.select(alibi(element="fp8_e5m2"), arch="sm90")


# -- the testing helpers --------------------------------------------------------------------------

def _no_gpu(monkeypatch):
    from opfacade import testing

    monkeypatch.setattr(testing, "device_count", lambda: 0)


def test_verify_plan_refuses_a_host_plan_a_freed_plan_and_bad_runs(monkeypatch):
    from opfacade.testing import repeat_runs, verify_plan

    host = Plan.select(alibi(), device="cpu")
    for check in (verify_plan, lambda plan: repeat_runs(plan, None)):
        with pytest.raises(opfacade.InvalidArgument, match="reference itself") as caught:
            check(host)
        assert caught.value.argument == "plan"
        with pytest.raises(opfacade.InvalidArgument, match="takes a Plan, got str"):
            check("alibi_forward.nvrtc.f32")
    gpu = Plan.select(alibi(), arch="sm90")
    for runs in (0, -1, 2.5, True):
        with pytest.raises(opfacade.InvalidArgument, match="runs must be a positive int"):
            verify_plan(gpu, runs=runs)
    gpu.free()
    with pytest.raises(opfacade.PlanFreed):
        verify_plan(gpu)


def test_the_testing_helpers_without_a_gpu_say_so(monkeypatch):
    from opfacade.testing import repeat_runs, verify_plan, verify_sku

    _no_gpu(monkeypatch)
    plan = Plan.select(alibi(), arch="sm90")
    with pytest.raises(opfacade.BackendUnavailable, match="verify_plan runs alibi_forward.nvrtc"
                                                          ".f32 on a GPU"):
        verify_plan(plan)
    with pytest.raises(opfacade.BackendUnavailable, match="repeat_runs"):
        repeat_runs(plan, None)
    with pytest.raises(opfacade.BackendUnavailable, match="verify_sku runs"):
        verify_sku("alibi_forward.nvrtc.f32")


def test_verify_sku_names_an_unknown_or_reference_sku():
    from opfacade.testing import verify_sku

    with pytest.raises(InvalidProblem, match="no SKU has the id 'x'") as caught:
        verify_sku("x")
    assert caught.value.field == "sku"
    with pytest.raises(InvalidProblem):
        verify_sku(None)
    with pytest.raises(opfacade.InvalidArgument, match="float64 reference"):
        verify_sku("alibi_forward.reference")


def test_reference_outputs_of_a_tf32_plan_state_the_problem_in_f64():
    """verify's oracle copies the descriptor to f64; model_copy validates, so TF32 goes too."""
    import numpy as np

    from opfacade.testing import random_inputs, reference_outputs

    desc = LinearDescriptor(m=3, n=4, k=5, element="f32", tf32=True)
    plan = Plan.select(desc, arch="sm90")
    op = plan.op
    inputs = random_inputs(op.signature(desc), np.random.default_rng(0))
    out = reference_outputs(plan, inputs)["out"]
    expected = inputs["x"] @ inputs["weight"].T + inputs["bias"]
    np.testing.assert_allclose(out, expected, rtol=1e-13)
