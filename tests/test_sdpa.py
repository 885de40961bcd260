"""SDPA on the host (no GPU): descriptor validation, the contract's layouts, explain and
selection, and the float64 host plan with bad input. What the cuDNN backend tells cuDNN is
test_sdpa_cudnn.py; its graph cache and run path test_sdpa_graphs.py; GPU behaviour
test_sdpa_gpu.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opfacade import (
    ArchSku,
    DTypeMismatch,
    InvalidArgument,
    InvalidProblem,
    LayoutMismatch,
    NoKernelSku,
    Plan,
    PlanPreference,
    ReasonCode,
    ShapeMismatch,
)
from opfacade._backends.cudnn.sdpa import SKUS as SDPA_SKUS
from opfacade._backends.reference import sdpa as reference
from opfacade._internal.tensors import TensorView
from opfacade.contracts.sdpa import (
    LAYOUTS,
    MEMORY_ORDER,
    SDPA_BACKWARD,
    SDPA_FORWARD,
    QkvStrides,
    dense_strides,
    layout_by_order,
    layout_of,
    output_layout,
    reference_options,
    stats_strides,
)
from opfacade.contracts.sdpa_samples import verification_inputs
from opfacade.ops.sdpa import (
    SdpaArgs,
    SdpaBackwardArgs,
    SdpaBackwardDescriptor,
    SdpaBackwardPlan,
    SdpaDescriptor,
    SdpaForwardPlan,
    SlidingWindow,
    sdpa,
    sdpa_backward,
)
from opfacade.plan import Target
from opfacade.testing import _from_bits, _to_bits, random_inputs
from opfacade.types import ElementKind

FORWARD_SKUS, BACKWARD_SKUS = SDPA_SKUS["sdpa_forward"], SDPA_SKUS["sdpa_backward"]

# Small enough for the host reference, and a shape cuDNN serves: on a machine with a GPU the
# selections below build real graphs (the target-less SKU calls use the current device).
COMMON = dict(batch=2, heads_q=4, heads_kv=2, seq_q=16, seq_kv=24, head_dim=64)


def forward(element="bf16", **kw):
    return SdpaDescriptor(**{**COMMON, "element": element, **kw})


def backward(element="bf16", **kw):
    return SdpaBackwardDescriptor(**{**COMMON, "element": element, **kw})


def codes(report):
    return {v.sku.id: v.code for v in report.verdicts}


def details(report):
    return {v.sku.id: v.detail for v in report.verdicts}


# ----------------------------------------------------------------------------- descriptors


@pytest.mark.parametrize("field,value,message", [
    ("heads_kv", 3, "heads_q 4 must be a multiple of heads_kv 3"),
    ("batch", 0, "greater than or equal to 1"),
    ("head_dim", -8, "greater than or equal to 1"),
    ("element", "i32", "f64, f32, f16 or bf16"),
    ("element", "tf32", "f64, f32, f16 or bf16"),
    ("dropout_p", 1.0, "less than 1"),
    ("dropout_p", -0.1, "greater than or equal to 0"),
    ("layout", "bsdh", "bhsd"),
    ("scale", float("nan"), "finite"),
    ("scale", 0.0, "non-zero"),
    ("causal", "bottom_left", "top_left"),
    ("bias", "2hqk", "bhqk"),
    ("window", (None, None), "left or a right bound"),
    ("window", (-1, 0), "greater than or equal to 0"),
    ("window", "1,2,3", "left,right"),
])
def test_descriptor_rejects_impossible_problems_naming_the_field(field, value, message):
    with pytest.raises(InvalidProblem, match=message) as caught:
        forward(**{field: value})
    assert caught.value.field.split(".")[0] == field


def test_cross_field_rules_name_the_later_field():
    with pytest.raises(InvalidProblem, match="window alignment bottom_right") as caught:
        forward(causal="top_left", window={"left": 2, "alignment": "bottom_right"})
    assert caught.value.field == "window"
    with pytest.raises(InvalidProblem, match="need_bias_grad needs a bias") as caught:
        backward(need_bias_grad=True)
    assert caught.value.field == "need_bias_grad"
    with pytest.raises(InvalidProblem, match="bacth"):
        forward(bacth=2)
    with pytest.raises(InvalidProblem, match="SlidingWindow"):
        SlidingWindow()


def test_descriptor_forms_json_round_trip_and_hash():
    desc = backward(causal=True, window="8,none", bias="1hqk", need_bias_grad=True, scale=0.3,
                    padding=True, dropout_p=0.25, layout="bshd")
    assert desc.causal == "top_left" and desc.window == SlidingWindow(left=8)
    again = SdpaBackwardDescriptor.from_json(desc.model_dump_json())
    assert again == desc and hash(again) == hash(desc)
    assert forward(window=[4, 2]) == forward(window={"left": 4, "right": 2})
    assert forward(causal=False).causal is None


def test_derived_properties_follow_the_reference_conventions():
    desc = forward(head_dim_v=16, bias="b1qk", causal="bottom_right", window=(5, 3))
    assert desc.dim_v == 16 and desc.o_shape == (2, 4, 16, 16) and desc.v_shape == (2, 2, 24, 16)
    assert desc.bias_shape == (2, 1, 16, 24) and desc.stats_shape == (2, 4, 16, 1)
    assert desc.right_bound == 0 and desc.left_bound == 5 and desc.alignment == "bottom_right"
    assert math.isclose(desc.softmax_scale, 1 / 8)
    windowed = forward(window={"left": 3, "right": 2, "alignment": "bottom_right"})
    assert (windowed.right_bound, windowed.left_bound, windowed.alignment) == (
        2, 3, "bottom_right")
    assert forward().right_bound is None and forward().alignment == "top_left"
    assert forward(element="f64").stats_element == "f64"
    assert forward().stats_element == "f32"


def test_layouts_are_the_memory_orders_the_signature_and_layout_of_agree_on():
    """Each layout's strides are those of a C-order array in its memory order; layout_of
    recognises them (the strides of size-1 extents aside); the signature carries them, and the
    stats in the contract's stats layout."""
    shape = (2, 3, 5, 8)
    for layout in LAYOUTS:
        memory = np.empty([shape[axis] for axis in MEMORY_ORDER[layout]], np.float32)
        inverse = [MEMORY_ORDER[layout].index(axis) for axis in range(4)]
        view = memory.transpose(inverse)
        assert view.shape == shape
        assert dense_strides(layout, *shape) == tuple(s // 4 for s in view.strides)
        assert layout_of(shape, dense_strides(layout, *shape)) == layout
    assert layout_of((2, 1, 5, 8), (40, 7, 8, 1)) == "bhsd"  # a size-1 extent's stride is free
    assert layout_of(shape, (240, 80, 16, 1)) is None  # padded rows: no dense layout
    with pytest.raises(ValueError, match="layout must be one of"):
        dense_strides("hbsd", *shape)
    desc = forward(layout="sbhd", save_stats=True)
    signature = SDPA_FORWARD.signature(desc)
    assert signature["q"].strides == dense_strides("sbhd", *desc.q_shape)
    assert signature["stats"].strides == stats_strides(desc) == (64, 16, 1, 1)


def _packed_views(batch=2, seq=16, heads_q=4, heads_kv=2, dim=64, pad=0, device=0):
    """q, k, v as views into one packed [B, S, Hq + 2 Hkv, D] bf16 projection whose rows are
    ``pad`` elements longer, [B, H, S, D] indexed (only their strides matter: nothing is
    read)."""
    width = (heads_q + 2 * heads_kv) * dim + pad
    strides = (seq * width, dim, width, 1)
    return tuple(TensorView(4096 + 2 * offset * dim, (batch, heads, seq, dim), strides,
                            ElementKind.bf16, device, "cupy", None)
                 for heads, offset in ((heads_q, 0), (heads_kv, heads_q),
                                       (heads_kv, heads_q + heads_kv)))


def test_packed_qkv_views_are_described_by_their_own_strides():
    """Views into one packed QKV projection follow bshd without being dense in it: the
    functional form describes them by their strides (out stays dense bshd), the signature
    carries them, and a non-unit dim stride is refused by the descriptor."""
    from opfacade.ops.sdpa import _layouts

    q, k, v = _packed_views()
    assert layout_of(q.shape, q.strides) is None
    assert layout_by_order(q.shape, q.strides) == output_layout(q.shape, q.strides) == "bshd"
    layout, strides = _layouts(q, k, v)
    assert layout == "bshd" and strides == QkvStrides(q=q.strides, k=k.strides, v=v.strides)
    desc = forward(seq_q=16, seq_kv=16, layout=layout, qkv_strides=strides, save_stats=True)
    signature = SDPA_FORWARD.signature(desc)
    assert signature["q"].strides == q.strides and signature["v"].strides == v.strides
    assert signature["out"].strides == dense_strides("bshd", *desc.o_shape)
    assert SDPA_BACKWARD.signature(backward(seq_q=16, seq_kv=16, layout=layout,
                                            qkv_strides=strides))["grad_q"].strides == \
        dense_strides("bshd", *desc.q_shape)
    # Dense inputs keep the plain descriptor (one cache entry, one stored graph).
    dense = TensorView(4096, (2, 4, 16, 64), dense_strides("sbhd", 2, 4, 16, 64), "bf16", 0,
                       "cupy", None)
    kv = TensorView(4096, (2, 2, 16, 64), dense_strides("sbhd", 2, 2, 16, 64), "bf16", 0,
                    "cupy", None)
    assert _layouts(dense, kv, kv) == ("sbhd", None)
    with pytest.raises(InvalidProblem, match="dim stride must be 1"):
        forward(qkv_strides={"q": (1, 2, 3, 4), "k": (1, 2, 3, 1), "v": (1, 2, 3, 1)})
    transposed = TensorView(4096, (2, 4, 16, 64), (4096, 1024, 1, 16), "bf16", 0, "cupy", None)
    with pytest.raises(LayoutMismatch, match="q must have non-negative strides and a unit dim"):
        _layouts(transposed, k, v)


def test_cudnn_refuses_packed_strides_it_cannot_load_and_says_why():
    """cuDNN loads 16 bytes at a time: packed rows 8 elements longer than the heads still
    load, rows 4 longer (196 bf16 elements) do not, so explain names the stride there; the f32
    kernel, which reads any strides, serves the same problem in f32."""
    def described(pad):
        q, k, v = _packed_views(heads_q=1, heads_kv=1, pad=pad)
        return SdpaDescriptor(batch=2, heads_q=1, heads_kv=1, seq_q=16, seq_kv=16,
                              head_dim=64, element="bf16", layout="bshd",
                              qkv_strides=QkvStrides(q=q.strides, k=k.strides, v=v.strides))

    assert codes(Plan.explain(described(8), arch="sm90"))["sdpa_forward.cudnn.bf16"] is \
        ReasonCode.chosen
    verdict = next(v for v in Plan.explain(described(4), arch="sm90").verdicts
                   if v.sku.id == "sdpa_forward.cudnn.bf16")
    assert verdict.code is ReasonCode.shape_unsupported
    assert "qkv_strides.q (3136, 64, 196, 1)" in verdict.detail
    assert "multiples of 8 elements" in verdict.detail
    f32 = described(4).model_copy(update={"element": ElementKind.f32})
    assert Plan.select(f32, arch="sm90").sku.id == "sdpa_forward.nvrtc.f32"


# ----------------------------------------------------------------------------- explain


def test_explain_without_a_gpu_gives_every_candidate_a_reason():
    report = Plan.explain(forward(save_stats=True), arch="sm90")
    found = codes(report)
    assert found["sdpa_forward.cudnn.bf16"] is ReasonCode.chosen
    assert found["sdpa_forward.cudnn.f16"] is ReasonCode.element_unsupported
    assert found["sdpa_forward.reference"] is ReasonCode.reference_is_oracle
    assert isinstance(Plan.select(forward(), arch="sm90"), SdpaForwardPlan)
    assert Plan.select(forward(element="f32"), arch="sm90").sku.id == "sdpa_forward.nvrtc.f32"
    with pytest.raises(NoKernelSku) as caught:
        Plan.select(forward(element="f64"), arch="sm90")
    assert "serves bf16, problem is f64" in str(caught.value)


@pytest.mark.parametrize("kind,kw,code,message", [
    ("forward", dict(head_dim=100), ReasonCode.shape_unsupported, "multiples of 8"),
    ("forward", dict(head_dim=264), ReasonCode.shape_unsupported, "exceed the 256"),
    ("forward", dict(head_dim=64, head_dim_v=260), ReasonCode.shape_unsupported, "multiples"),
    ("forward", dict(alibi=True), ReasonCode.feature_unsupported, "ALiBi"),
    ("forward", dict(alibi=True, causal="bottom_right"), ReasonCode.feature_unsupported,
     "ALiBi"),
    ("forward", dict(causal="bottom_right", bias="11qk"), ReasonCode.feature_unsupported,
     "without bias, ALiBi and dropout"),
    ("forward", dict(window={"right": 4, "alignment": "bottom_right"}, dropout_p=0.1),
     ReasonCode.feature_unsupported, "without bias"),
    ("forward", dict(causal="bottom_right", seq_q=32, seq_kv=24), ReasonCode.shape_unsupported,
     "seq_q <= seq_kv"),
    ("forward", dict(window=(4, None), seq_q=32, seq_kv=24), ReasonCode.shape_unsupported,
     "left window bound needs seq_q <= seq_kv"),
    ("backward", dict(seq_q=1, seq_kv=1), ReasonCode.shape_unsupported, "seq_q = seq_kv = 1"),
])
def test_limits_as_data_reject_on_a_machine_without_a_gpu(kind, kw, code, message):
    desc = (forward if kind == "forward" else backward)(**kw)
    report = Plan.explain(desc, arch="sm90")
    sku = f"sdpa_{kind}.cudnn.bf16"
    assert codes(report)[sku] is code
    assert message in details(report)[sku]
    assert report.chosen is None
    # The host reference serves every one without dropout (it is the oracle, not a limit).
    if not desc.dropout_p:
        host = desc.model_copy(update={"element": ElementKind.f64})
        assert Plan.select(host, device="cpu").sku.backend == "reference"


def test_bottom_right_with_padding_lifts_the_length_rule():
    assert Plan.explain(forward(causal="bottom_right", seq_q=32, padding=True),
                        arch="sm90").chosen is not None


def test_deterministic_backward_declines_broadcast_dbias_but_the_default_serves_it():
    desc = backward(bias="1hqk", need_bias_grad=True)
    found = codes(Plan.explain(desc, arch="sm90"))
    assert found["sdpa_backward.cudnn.bf16"] is ReasonCode.chosen
    assert found["sdpa_backward.cudnn.bf16.deterministic"] is ReasonCode.feature_unsupported
    with pytest.raises(NoKernelSku, match="bias 'bhqk'"):
        Plan.select(desc, {"deterministic": True}, arch="sm90")
    full = backward(bias="bhqk", need_bias_grad=True)
    assert Plan.select(full, {"deterministic": True}, arch="sm90").sku.id == \
        "sdpa_backward.cudnn.bf16.deterministic"


def test_training_pair_selects_a_backward_that_can_run():
    desc = forward(save_stats=True, causal="top_left")
    pair = SdpaForwardPlan.select_for_training(desc, arch="sm90")
    assert pair.forward.sku.id == "sdpa_forward.cudnn.bf16"
    assert pair.backward.sku.id == "sdpa_backward.cudnn.bf16"
    assert isinstance(pair.backward, SdpaBackwardPlan)
    strict = SdpaForwardPlan.select_for_training(desc, {"deterministic": True}, arch="sm90")
    assert strict.backward.sku.id == "sdpa_backward.cudnn.bf16.deterministic"
    assert strict.workspace_size == strict.backward.workspace_size
    with pytest.raises(NoKernelSku):  # no backward fits in no workspace: no forward either
        SdpaForwardPlan.select_for_training(desc, {"workspace_limit": 0}, arch="sm90")
    with pytest.raises(InvalidProblem, match="save_stats") as caught:
        SdpaForwardPlan.select_for_training(forward(), arch="sm90")
    assert caught.value.field == "save_stats"
    # The forward serves seq 1 x 1; its backward does not, so training is refused whole.
    with pytest.raises(NoKernelSku, match="seq_q = seq_kv = 1"):
        SdpaForwardPlan.select_for_training(forward(seq_q=1, seq_kv=1, save_stats=True),
                                          arch="sm90")


def test_catalog_lists_the_skus_with_honest_guarantees():
    ids = {impl.sku.id: impl.sku for impl in (*FORWARD_SKUS, *BACKWARD_SKUS)}
    assert set(ids) == {"sdpa_forward.cudnn.f16", "sdpa_forward.cudnn.bf16",
                        "sdpa_backward.cudnn.f16", "sdpa_backward.cudnn.bf16",
                        "sdpa_backward.cudnn.f16.deterministic",
                        "sdpa_backward.cudnn.bf16.deterministic"}
    for sku in ids.values():
        g = sku.precision_guarantee
        assert g.accumulator == "f32" and g.math_precision == sku.element and not g.bit_stable
        assert g.deterministic == (sku.op == "sdpa_forward" or sku.id.endswith("deterministic"))
        assert sku.arch is ArchSku.sm80 and sku.backend == "cudnn"


def test_cli_explain_takes_masks_as_strings(capsys):
    from opfacade.cli import main

    code = main(["explain", "sdpa_backward", "batch=2", "heads_q=8", "heads_kv=2", "seq_q=256",
                 "seq_kv=256", "head_dim=128", "element=bf16", "causal=top_left",
                 "window=64,none", "--arch", "sm90", "--deterministic"])
    out = capsys.readouterr().out
    assert code == 0 and "sdpa_backward.cudnn.bf16.deterministic" in out and "chosen" in out


# ----------------------------------------------------------------------------- host plans


def host_arrays(desc, rng, dtype=np.float64):
    arrays = {
        "q": rng.uniform(-1, 1, desc.q_shape).astype(dtype),
        "k": rng.uniform(-1, 1, desc.k_shape).astype(dtype),
        "v": rng.uniform(-1, 1, desc.v_shape).astype(dtype),
        "out": np.empty(desc.o_shape, dtype),
    }
    if getattr(desc, "save_stats", True):
        arrays["stats"] = np.empty(desc.stats_shape, np.float64 if dtype == np.float64 else
                                   np.float32)
    if desc.bias is not None:
        arrays["bias"] = rng.uniform(-1, 1, desc.bias_shape).astype(dtype)
    if desc.padding:
        arrays["seq_len_q"] = np.array([desc.seq_q, desc.seq_q - 3], np.int32)
        arrays["seq_len_kv"] = np.array([desc.seq_kv - 2, desc.seq_kv], np.int32)
    return arrays


@pytest.mark.parametrize("kw", [
    dict(), dict(causal="bottom_right", bias="1hqk", padding=True),
    dict(window=(3, 1), alibi=False, head_dim_v=4, layout="sbhd"),
    dict(alibi=True, causal="top_left", scale=0.5),
])
def test_host_plan_is_the_reference_with_the_stats_contract(kw):
    desc = forward(element="f64", save_stats=True, **kw)
    rng = np.random.default_rng(5)
    a = host_arrays(desc, rng)
    with Plan.select(desc, device="cpu") as plan:
        assert plan.sku.id == "sdpa_forward.reference"
        plan.run(SdpaArgs(**a))
    out, lse = reference.sdpa_forward(a["q"], a["k"], a["v"], bias=a.get("bias"),
                                      seq_len_q=a.get("seq_len_q"),
                                      seq_len_kv=a.get("seq_len_kv"),
                                      **reference_options(desc))
    np.testing.assert_array_equal(a["out"], out)
    np.testing.assert_array_equal(a["stats"][..., 0], lse)


def test_host_backward_and_functional_forms():
    rng = np.random.default_rng(6)
    q, k, v = (rng.uniform(-1, 1, s) for s in ((2, 4, 8, 8), (2, 2, 10, 8), (2, 2, 10, 8)))
    bias = rng.uniform(-1, 1, (1, 4, 8, 10))
    out, stats = sdpa(q, k, v, causal=True, bias=bias, return_stats=True)
    assert stats.shape == (2, 4, 8, 1)
    d_out = rng.uniform(-1, 1, out.shape)
    dq, dk, dv, dbias = sdpa_backward(q, k, v, out, d_out, stats, causal=True,
                                                     bias=bias, need_bias_grad=True)
    grads = reference.sdpa_backward(q, k, v, d_out, causal="top_left", bias=bias,
                                    need_bias_grad=True)
    for ours, name in ((dq, "dq"), (dk, "dk"), (dv, "dv"), (dbias, "dbias")):
        np.testing.assert_allclose(ours, grads[name], rtol=1e-12, atol=1e-14)
    assert sdpa(q, k, v).shape == (2, 4, 8, 8)


def test_host_plan_bad_input_is_typed_and_named():
    desc = forward(element="f64", save_stats=True, padding=True, bias="b1qk")
    plan = Plan.select(desc, device="cpu")
    rng = np.random.default_rng(7)
    good = host_arrays(desc, rng)

    def check(error, match, **change):
        with pytest.raises(error, match=match) as caught:
            plan.can_implement(SdpaArgs(**{**good, **change}))
        return caught.value

    assert check(ShapeMismatch, r"stats must have shape \(2, 4, 16, 1\)",
                 stats=np.empty((2, 4, 16))).argument == "stats"
    assert check(DTypeMismatch, "stats must have element type f64",
                 stats=np.empty(desc.stats_shape, np.float32)).argument == "stats"
    assert check(DTypeMismatch, "seq_len_q must have element type i32",
                 seq_len_q=np.array([16, 3], np.int64)).argument == "seq_len_q"
    assert check(ShapeMismatch, r"seq_len_kv must have shape \(2,\)",
                 seq_len_kv=np.array([3, 4, 5], np.int32)).argument == "seq_len_kv"
    assert check(InvalidArgument, "seq_len_q is required when the descriptor has padding",
                 seq_len_q=None).argument == "seq_len_q"
    assert check(ShapeMismatch, r"bias must have shape \(2, 1, 16, 24\)",
                 bias=np.empty((1, 4, 16, 24))).argument == "bias"
    assert check(ShapeMismatch, "k must have shape", k=np.empty((2, 3, 24, 8))).argument == "k"
    assert check(DTypeMismatch, "q must have element type f64",
                 q=good["q"].astype(np.float32)).argument == "q"
    assert check(LayoutMismatch, "out overlaps q", out=good["q"]).argument == "out"
    assert check(InvalidArgument, "dropout_seed must be None unless dropout_p > 0",
                 dropout_seed=np.zeros(1, np.int64)).argument == "dropout_seed"
    no_stats = Plan.select(forward(element="f64"), device="cpu")
    with pytest.raises(InvalidArgument, match="stats must be None unless save_stats"):
        no_stats.can_implement(SdpaArgs(**host_arrays(forward(element="f64",
                                                                   save_stats=True), rng)))
    with pytest.raises(InvalidArgument, match="args must be SdpaArgs"):
        plan.run(SdpaBackwardArgs(*range(9)))


def test_host_backward_bad_input_is_typed_and_named():
    desc = backward(element="f64", bias="bhqk", need_bias_grad=True)
    plan = Plan.select(desc, device="cpu")
    rng = np.random.default_rng(8)
    arrays = dict(q=rng.uniform(-1, 1, desc.q_shape), k=rng.uniform(-1, 1, desc.k_shape),
                  v=rng.uniform(-1, 1, desc.v_shape), out=rng.uniform(-1, 1, desc.o_shape),
                  grad_out=rng.uniform(-1, 1, desc.o_shape), stats=np.zeros(desc.stats_shape),
                  grad_q=np.empty(desc.q_shape), grad_k=np.empty(desc.k_shape),
                  grad_v=np.empty(desc.v_shape), bias=rng.uniform(-1, 1, desc.bias_shape),
                  grad_bias=np.empty(desc.bias_shape))
    plan.can_implement(SdpaBackwardArgs(**arrays))
    with pytest.raises(ShapeMismatch, match="stats must have shape") as caught:
        plan.can_implement(SdpaBackwardArgs(**{**arrays, "stats": np.zeros((2, 4, 16))}))
    assert caught.value.argument == "stats"
    with pytest.raises(InvalidArgument, match="grad_bias is required") as caught:
        plan.can_implement(SdpaBackwardArgs(**{**arrays, "grad_bias": None}))
    size_q, size_k = math.prod(desc.q_shape), math.prod(desc.k_shape)
    flat = np.empty(size_q + size_k)
    sharing = {**arrays, "grad_q": flat[:size_q].reshape(desc.q_shape),
               "grad_k": flat[size_q - 8:size_q - 8 + size_k].reshape(desc.k_shape)}
    with pytest.raises(LayoutMismatch, match="grad_q overlaps grad_k"):
        plan.can_implement(SdpaBackwardArgs(**sharing))


def test_functional_bad_input_names_the_argument():
    rng = np.random.default_rng(9)
    q, k, v = (rng.uniform(-1, 1, s) for s in ((2, 6, 8, 8), (2, 4, 10, 8), (2, 4, 10, 8)))
    with pytest.raises(InvalidProblem, match="heads_q 6 must be a multiple of heads_kv 4") as e:
        sdpa(q, k, v)
    assert e.value.field == "heads_kv"
    q4 = q[:, :4]
    with pytest.raises(ShapeMismatch, match="bias must have shape") as e:
        sdpa(q4, k, v, bias=np.zeros((2, 3, 8, 10)))
    assert e.value.argument == "bias"
    with pytest.raises(ShapeMismatch, match="q must be 4-D"):
        sdpa(q4[0], k, v)
    with pytest.raises(NoKernelSku, match="Philox"):
        sdpa(q4, k, v, dropout_p=0.1, dropout_seed=np.zeros(1, np.int64),
                            dropout_offset=np.zeros(1, np.int64))


def test_verification_inputs_are_consistent_for_the_backward():
    desc = backward(element="bf16", causal="bottom_right", padding=True, seq_q=20)
    rng = np.random.default_rng(10)
    floats = {name: spec for name, spec in SDPA_BACKWARD.signature(desc).items()
              if spec.element.is_float}
    inputs = verification_inputs(desc, random_inputs(floats, rng), rng)
    len_q, len_kv = inputs["seq_len_q"], inputs["seq_len_kv"]
    assert inputs["seq_len_q"].dtype == np.int32 and (len_q >= 1).all()
    assert (len_q <= np.minimum(len_kv, desc.seq_q)).all()  # no empty row under bottom-right
    out, lse = reference.sdpa_forward(inputs["q"], inputs["k"], inputs["v"], seq_len_q=len_q,
                                      seq_len_kv=len_kv, causal="bottom_right")
    np.testing.assert_array_equal(inputs["out"], _from_bits(_to_bits(out, desc.element),
                                                            desc.element))
    finite = np.isfinite(lse)  # padded rows: unspecified, given a finite value
    np.testing.assert_allclose(inputs["stats"][..., 0][finite], lse[finite], rtol=1e-6)
    assert np.isfinite(inputs["stats"]).all()


def test_plan_preference_objects_and_dicts_agree():
    desc = backward()
    a = Plan.explain(desc, PlanPreference(deterministic=True), arch="sm90")
    b = Plan.explain(desc, {"deterministic": True}, arch="sm90")
    assert codes(a) == codes(b)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fields=st.fixed_dictionaries(
        {"batch": st.integers(-1, 9), "heads_q": st.sampled_from([0, 1, 3, 4, 8, 32]),
         "heads_kv": st.sampled_from([1, 2, 3, 8]), "seq_q": st.integers(0, 9000),
         "seq_kv": st.integers(1, 9000), "head_dim": st.sampled_from([0, 8, 60, 64, 256, 520]),
         "element": st.sampled_from(["f16", "bf16", "f32", "i32", "x"])},
        optional={"head_dim_v": st.sampled_from([None, 32, 100]),
                  "causal": st.sampled_from([None, True, "top_left", "bottom_right", "up"]),
                  "window": st.sampled_from([None, (4, None), (None, 0), (3, 3), "2,x", (-1, 2),
                                             {"left": 1, "alignment": "bottom_right"}]),
                  "bias": st.sampled_from([None, "bhqk", "11qk", "hq"]),
                  "alibi": st.booleans(), "dropout_p": st.floats(-0.5, 1.5),
                  "padding": st.booleans(), "layout": st.sampled_from(["bhsd", "sbhd", "hsd"]),
                  "need_bias_grad": st.booleans()}),
    backward_op=st.booleans(),
    arch=st.sampled_from(list(ArchSku)),
)
def test_random_problems_get_typed_errors_or_reasons_never_crashes(fields, backward_op, arch):
    """Descriptors validate themselves; the data limits answer every valid problem for every
    arch without a GPU, with a reason or a workspace estimate."""
    cls = SdpaBackwardDescriptor if backward_op else SdpaDescriptor
    if not backward_op:
        fields.pop("need_bias_grad", None)
    try:
        desc = cls(**fields)
    except InvalidProblem as error:
        assert error.field
        return
    impls = BACKWARD_SKUS if backward_op else FORWARD_SKUS
    for impl in impls:
        unfit = impl.unfit_on(desc, Target(arch))
        assert unfit is None or (unfit.code in ReasonCode and unfit.detail)
        assert impl.workspace_size_on(desc, Target(arch)) >= 0
    report = Plan.explain(desc, {"backends": ["reference"]}, device="cpu")
    assert report.chosen is not None or desc.dropout_p > 0 or desc.element in ("f16", "bf16")
