"""SDPA on a real GPU, numerics: every feature and supported combination against the float64
reference within the SKU's declared bound, forward determinism and the deterministic backward
bitwise over fresh workspaces and streams, the verify samples, and dropout repeatable by seed and
checked with cuDNN's own mask. The cases and helpers are sdpa_gpu_cases.py; the graph lifecycle,
bad input and interop test_sdpa_lifecycle_gpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from sdpa_gpu_cases import (
    BASE,
    CASES,
    backward_case,
    case_inputs,
    dropout_mask,
    forward_case,
    relative_errors,
    rng_for,
    run_plan,
    same_bits,
)

from opfacade import Plan, PlanPreference
from opfacade._backends.reference import sdpa as reference
from opfacade._backends.reference.skus import _sdpa_backward as _reference_backward
from opfacade._backends.reference.skus import _sdpa_forward as _reference_forward
from opfacade.contracts.sdpa import SDPA_BACKWARD, SDPA_FORWARD, reference_options
from opfacade.ops.sdpa import SdpaBackwardDescriptor, SdpaDescriptor
from opfacade.testing import _from_bits, _to_bits, random_inputs, verify_plan

pytestmark = pytest.mark.gpu

F16_CASES = ("plain", "causal_bottom_right", "bias_1hqk_causal", "alibi", "padding", "gqa",
             "window_left_right")
PARAMS = [pytest.param("bf16", name, id=f"bf16-{name}") for name in CASES] + [
    pytest.param("f16", name, id=f"f16-{name}") for name in F16_CASES]
DETERMINISTIC = ("plain", "causal_bottom_right", "causal_bottom_right_square",
                 "gqa_bias_window_bshd_d128", "padding_bias",
                 "alibi", "window_left_right")


# ----------------------------------------------------------------------------- features


@pytest.mark.parametrize("element,name", PARAMS)
def test_forward_matches_the_reference_and_repeats_bitwise(element, name):
    desc = forward_case(element, name)
    plan = Plan.select(desc, device=0)
    assert plan.sku.id == f"sdpa_forward.cudnn.{element}"
    signature = SDPA_FORWARD.signature(desc)
    inputs = case_inputs(desc, signature, rng_for("fwd", element, name))
    expected = _reference_forward(desc, inputs)
    results = run_plan(plan, signature, inputs, runs=2)
    errors = relative_errors(desc, signature, results[0], expected, inputs)
    bound = plan.precision_guarantee.max_rel_error
    assert all(e <= bound for e in errors.values()), f"{errors} vs bound {bound}"
    assert same_bits(results), "the forward is declared deterministic"


@pytest.mark.parametrize("element,name", PARAMS)
def test_backward_matches_the_reference(element, name):
    desc = backward_case(element, name)
    plan = Plan.select(desc, device=0)
    assert plan.sku.id == f"sdpa_backward.cudnn.{element}"
    signature = SDPA_BACKWARD.signature(desc)
    inputs = case_inputs(desc, signature, rng_for("bwd", element, name))
    expected = _reference_backward(desc, inputs)
    results = run_plan(plan, signature, inputs)
    errors = relative_errors(desc, signature, results[0], expected, inputs)
    bound = plan.precision_guarantee.max_rel_error
    assert all(e <= bound for e in errors.values()), f"{errors} vs bound {bound}"


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_deterministic_backward_is_bitwise_repeatable(name):
    desc = backward_case("bf16", name)
    plan = Plan.select(desc, PlanPreference(deterministic=True), device=0)
    assert plan.sku.id == "sdpa_backward.cudnn.bf16.deterministic"
    default = Plan.select(desc, device=0)
    assert plan.workspace_size >= default.workspace_size  # the dP workspace is reported
    signature = SDPA_BACKWARD.signature(desc)
    inputs = case_inputs(desc, signature, rng_for("det", name))
    results = run_plan(plan, signature, inputs, runs=4)
    assert same_bits(results), "declared deterministic, but bits differ across runs"
    errors = relative_errors(desc, signature, results[0], _reference_backward(desc, inputs),
                     inputs)
    assert all(e <= plan.precision_guarantee.max_rel_error for e in errors.values()), errors


@pytest.mark.parametrize("element", ["bf16", "f16"])
def test_verify_plan_passes_every_forward_sample(element):
    for desc in SDPA_FORWARD.sample_problems(element):
        result = verify_plan(Plan.select(desc, device=0), runs=2)
        assert result.passed, result.summary()


def test_forward_without_stats_writes_only_out():
    desc = SdpaDescriptor(**{**BASE, **CASES["causal_top_left"]}, element="bf16")
    plan = Plan.select(desc, device=0)
    signature = SDPA_FORWARD.signature(desc)
    assert "stats" not in signature
    inputs = case_inputs(desc, signature, rng_for("nostats"))
    errors = relative_errors(desc, signature, run_plan(plan, signature, inputs)[0],
                     _reference_forward(desc, inputs), inputs)
    assert errors["out"] <= plan.precision_guarantee.max_rel_error


# ----------------------------------------------------------------------------- dropout


@pytest.mark.parametrize("element,extra", [
    ("bf16", dict(causal="top_left")),
    ("f16", dict(bias="1hqk", padding=True, seq_q=200, seq_kv=300)),
])
def test_dropout_forward_repeats_by_seed_and_matches_the_reference_with_cudnns_mask(element,
                                                                                     extra):
    p = 0.2
    desc = SdpaDescriptor(**{**BASE, **extra}, element=element, dropout_p=p,
                               save_stats=True)
    plan = Plan.select(desc, device=0)
    signature = SDPA_FORWARD.signature(desc)
    inputs = case_inputs(desc, signature, rng_for("dropout", element))
    first, second = run_plan(plan, signature, inputs, runs=2)
    assert same_bits([first, second]), "same seed and offset must give the same bits"
    reseeded = run_plan(plan, signature, {**inputs, "dropout_seed": inputs["dropout_seed"] + 1})[0]
    assert reseeded["out"].tobytes() != first["out"].tobytes()
    mask = dropout_mask(desc, inputs)
    assert set(np.unique(mask)) <= {0.0, 1.0}
    scores = np.ones((desc.batch, 1, desc.seq_q, desc.seq_kv), bool)
    if desc.padding:
        scores = reference.sdpa_mask(desc.batch, desc.seq_q, desc.seq_kv,
                                     seq_len_q=inputs["seq_len_q"],
                                     seq_len_kv=inputs["seq_len_kv"])[:, None]
    kept = mask[np.broadcast_to(scores, mask.shape)]
    assert abs(kept.mean() - (1 - p)) < 0.02
    out, lse = reference.sdpa_forward(
        inputs["q"], inputs["k"], inputs["v"], bias=inputs.get("bias"),
        seq_len_q=inputs.get("seq_len_q"), seq_len_kv=inputs.get("seq_len_kv"),
        dropout_keep=mask > 0, **{**reference_options(desc)})
    errors = relative_errors(desc, signature, first, {"out": out, "stats": lse[..., None]}, inputs)
    assert all(e <= plan.precision_guarantee.max_rel_error for e in errors.values()), errors


@pytest.mark.parametrize("deterministic", [False, True])
def test_dropout_backward_uses_the_forwards_mask(deterministic):
    p = 0.15
    common = dict(BASE, heads_q=8, heads_kv=2, causal="top_left", element="bf16",
                  dropout_p=p)
    fwd = SdpaDescriptor(**common, save_stats=True)
    desc = SdpaBackwardDescriptor(**common)
    signature = SDPA_BACKWARD.signature(desc)
    rng = rng_for("dropout-bwd", deterministic)
    floats = {n: s for n, s in signature.items() if s.element.is_float and s.role != "out"}
    inputs = random_inputs(floats, rng)
    inputs["dropout_seed"] = np.array([1234567], np.int64)
    inputs["dropout_offset"] = np.array([89], np.int64)
    keep = dropout_mask(fwd, inputs) > 0
    options = reference_options(desc)
    out, lse = reference.sdpa_forward(inputs["q"], inputs["k"], inputs["v"], dropout_keep=keep,
                                      **options)
    inputs["out"] = _from_bits(_to_bits(out, desc.element), desc.element)
    inputs["stats"] = lse[..., None].astype(np.float32).astype(np.float64)
    grads = reference.sdpa_backward(inputs["q"], inputs["k"], inputs["v"], inputs["grad_out"],
                                    dropout_keep=keep, **options)
    expected = {"grad_q": grads["dq"], "grad_k": grads["dk"], "grad_v": grads["dv"]}
    plan = Plan.select(desc, PlanPreference(deterministic=deterministic), device=0)
    results = run_plan(plan, signature, inputs, runs=3 if deterministic else 1)
    errors = relative_errors(desc, signature, results[0], expected, inputs)
    assert all(e <= plan.precision_guarantee.max_rel_error for e in errors.values()), errors
    if deterministic:
        assert same_bits(results)
