"""What the cuDNN backend tells cuDNN, checked without a GPU: the limits as data (per arch and
cuDNN version), the workspace estimate, the mapping of the contract's mask conventions onto
cuDNN's band parameters, cuDNN's ALiBi slopes, and graph declaration up to the first call that
needs a GPU. Building, caching and running graphs is test_sdpa_graphs.py; on a GPU,
test_sdpa_gpu.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opfacade import ArchSku, NoKernelSku, Plan, ReasonCode
from opfacade._backends.cudnn import graphs, limits, runtime
from opfacade._backends.cudnn.sdpa import SKUS as SDPA_SKUS
from opfacade._backends.cudnn.sdpa import estimate_workspace
from opfacade._backends.reference import sdpa as reference
from opfacade.contracts.sdpa import alibi_slopes, dense_strides, reference_options
from opfacade.ops.sdpa import SdpaBackwardDescriptor, SdpaDescriptor
from opfacade.plan import Target
from opfacade.types import ElementKind

FORWARD_SKUS, BACKWARD_SKUS = SDPA_SKUS["sdpa_forward"], SDPA_SKUS["sdpa_backward"]
COMMON = dict(batch=2, heads_q=4, heads_kv=2, seq_q=16, seq_kv=24, head_dim=64)


def forward(element="bf16", **kw):
    return SdpaDescriptor(**{**COMMON, "element": element, **kw})


def backward(element="bf16", **kw):
    return SdpaBackwardDescriptor(**{**COMMON, "element": element, **kw})


def codes(report):
    return {v.sku.id: v.code for v in report.verdicts}


# ----------------------------------------------------------------------------- limits


def facts(direction="backward", **kw):
    base = dict(direction=direction, element=ElementKind.bf16, batch=2, heads_q=4,
                seq_q=128, seq_kv=128, head_dim=128, head_dim_v=128, bias=None, alibi=False,
                dropout=False, padding=False, right_bound=None, left_bound=None,
                bottom_right=False)
    return limits.Facts(**{**base, **kw})


@pytest.mark.parametrize("f,arch,version,code", [
    (facts(head_dim=256, head_dim_v=256), ArchSku.sm90, 91900, None),
    (facts(head_dim=256, head_dim_v=256), ArchSku.sm80, 91900, ReasonCode.shape_unsupported),
    (facts(head_dim=256, head_dim_v=256), ArchSku.sm100, 91900, ReasonCode.shape_unsupported),
    (facts(head_dim=256, head_dim_v=256), ArchSku.sm100, 92300, None),
    (facts(head_dim=192, head_dim_v=128), ArchSku.sm100, 91100, None),
    (facts("forward", head_dim=256, head_dim_v=256), ArchSku.sm80, 90900,
     ReasonCode.shape_unsupported),
    (facts("forward", head_dim=256, head_dim_v=256), ArchSku.sm80, 91002, None),
    (facts(), ArchSku.sm90, 91000, ReasonCode.version_blocked),
    (facts(), ArchSku.sm90, 91001, ReasonCode.version_blocked),
    (facts(), ArchSku.sm90, 80906, ReasonCode.feature_unsupported),
    (facts(seq_kv=2048, left_bound=64), ArchSku.sm90, 91400, ReasonCode.version_blocked),
    (facts(seq_kv=2048, left_bound=64), ArchSku.sm90, 91401, None),
    (facts(seq_kv=2048, left_bound=64, right_bound=0), ArchSku.sm90, 91400, None),
    (facts(seq_q=100, right_bound=0, bottom_right=True), ArchSku.sm90, 90500,
     ReasonCode.feature_unsupported),
    (facts(seq_q=100, right_bound=0, bottom_right=True), ArchSku.sm90, 90600, None),
    (facts(left_bound=8, dropout=True, right_bound=0), ArchSku.sm90, 91001,
     ReasonCode.version_blocked),
    (facts(left_bound=8, dropout=True, right_bound=0), ArchSku.sm90, 90900,
     ReasonCode.feature_unsupported),
    (facts(left_bound=8, dropout=True, right_bound=0), ArchSku.sm90, 91002, None),
    (facts(deterministic=True), ArchSku.sm100, 91700, ReasonCode.feature_unsupported),
    (facts(deterministic=True, dropout=True), ArchSku.sm100, 91900,
     ReasonCode.feature_unsupported),
    (facts(deterministic=True, dropout=True), ArchSku.sm90, 91900, None),
    (facts(bias="bhqk", bias_grad=True, padding=True), ArchSku.sm90, 90400,
     ReasonCode.feature_unsupported),
    (facts(head_dim=512, head_dim_v=512), None, None, ReasonCode.shape_unsupported),
    (facts(head_dim=256, head_dim_v=256), None, None, None),
])
def test_limits_depend_on_arch_and_cudnn_version(f, arch, version, code):
    unfit = limits.check(f, limits.Context(arch, version))
    assert (unfit.code if unfit else None) is code, unfit


def test_sku_limits_use_the_target_arch_when_given_one():
    impl = next(i for i in BACKWARD_SKUS if i.sku.id == "sdpa_backward.cudnn.bf16")
    desc = backward(head_dim=256)
    assert impl.unfit_on(desc, Target(ArchSku.sm90)) is None
    unfit = impl.unfit_on(desc, Target(ArchSku.sm80))
    assert unfit.code is ReasonCode.shape_unsupported and "sm80" in unfit.detail
    # Without a target and without a GPU the most permissive arch applies.
    if runtime.available() is None:
        assert impl.unfit(desc) is None


def test_workspace_is_estimated_without_a_gpu_and_weighed_against_the_limit():
    desc = backward(batch=2, heads_q=16, heads_kv=16, seq_q=4096, seq_kv=4096, head_dim=128)
    default = estimate_workspace(desc, "backward")
    deterministic = estimate_workspace(desc, "backward", deterministic=True)
    # The GPU facts: 68 MB and 1.07 GB measured on an H200 for this problem.
    assert 60e6 < default < 75e6 and 1.0e9 < deterministic < 1.15e9
    assert default % 256 == 0 and deterministic % 256 == 0
    report = Plan.explain(desc, {"workspace_limit": 256 << 20}, arch="sm90")
    assert codes(report)["sdpa_backward.cudnn.bf16.deterministic"] is \
        ReasonCode.workspace_over_limit
    with pytest.raises(NoKernelSku, match="workspace_over_limit"):
        Plan.select(desc, {"deterministic": True, "workspace_limit": 256 << 20}, arch="sm90")
    impl = next(i for i in FORWARD_SKUS if i.sku.element == "bf16")
    arch_only = Target(ArchSku.sm90)  # no device: the estimate, even where a GPU is visible
    assert impl.workspace_size_on(forward(alibi=True, causal=True), arch_only) == 256
    assert impl.workspace_size_on(forward(), arch_only) == 0




# ----------------------------------------------------------------------------- conventions


def cudnn_band_mask(batch, seq_q, seq_kv, alignment, left, right, len_q=None, len_kv=None):
    """cuDNN's diagonal band as cudnn-frontend's composite node builds it: with the offset
    s = seq_len_kv - seq_len_q for bottom-right (else 0), keep col > row + s - left_bound and
    col <= row + s + right_bound, then mask padded rows and columns."""
    len_q = np.full(batch, seq_q) if len_q is None else np.asarray(len_q)
    len_kv = np.full(batch, seq_kv) if len_kv is None else np.asarray(len_kv)
    shift = (len_kv - len_q) if alignment == "bottom_right" else np.zeros(batch, int)
    row = np.arange(seq_q)[None, :, None] + shift[:, None, None]
    col = np.arange(seq_kv)[None, None, :]
    keep = (np.arange(seq_q)[None, :, None] < len_q[:, None, None]) & (col < len_kv[:, None,
                                                                                     None])
    if left is not None:
        keep &= col > row - left
    if right is not None:
        keep &= col <= row + right
    return keep


@pytest.mark.parametrize("kw", [
    dict(causal="top_left"), dict(causal="bottom_right"), dict(window=(3, None)),
    dict(window=(0, 0)), dict(window=(2, 5)), dict(window=(None, 2)),
    dict(causal="top_left", window=(4, None)), dict(causal="bottom_right", window=(1, 7)),
    dict(window={"left": 3, "right": 1, "alignment": "bottom_right"}),
    dict(causal="bottom_right", window=(2, None), padding=True),
    dict(window=(1, 1), padding=True),
])
def test_cudnn_band_parameters_reproduce_the_reference_mask(kw):
    desc = forward(seq_q=9, seq_kv=13, **kw)
    alignment, left, right = graphs.diagonal_band(desc)
    lengths = dict(len_q=[9, 5], len_kv=[13, 11]) if desc.padding else {}
    cudnn_mask = cudnn_band_mask(2, 9, 13, alignment, left, right, **lengths)
    options = reference_options(desc)
    ref_mask = reference.sdpa_mask(
        2, 9, 13, causal=options["causal"], window=options["window"],
        alignment=options["alignment"],
        seq_len_q=np.array(lengths.get("len_q", [9, 9])),
        seq_len_kv=np.array(lengths.get("len_kv", [13, 13])))
    np.testing.assert_array_equal(cudnn_mask, ref_mask)


def test_alibi_slopes_are_cudnns():
    def test_mhas_formula(h):  # the formula cudnn-frontend's own tests check against
        n = 2 ** math.floor(math.log2(h))
        m = [(2.0 ** (-8.0 / n)) ** i for i in range(1, n + 1)]
        m += [(2.0 ** (-4.0 / n)) ** i for i in range(1, 1 + 2 * (h - n), 2)]
        return np.array(m)

    for heads in (1, 2, 3, 6, 8, 12, 32):
        np.testing.assert_allclose(alibi_slopes(heads), test_mhas_formula(heads), rtol=1e-6)
    assert alibi_slopes(8)[0] == 0.5 and alibi_slopes(8)[-1] == 2.0 ** -8


def test_frontend_graphs_declare_the_uids_and_layouts_we_bind():
    cudnn = pytest.importorskip("cudnn")
    if runtime.available() is not None:
        pytest.skip(runtime.available())
    desc = backward(bias="bhqk", need_bias_grad=True, padding=True, dropout_p=0.1,
                    causal="top_left", layout="bshd")
    b = graphs.declare_backward(desc, None, deterministic=True)
    declared = {t.name: t for t in b.graph.tensors.values() if not t.is_virtual}
    assert {declared[name].uid for name in ("q", "k", "v", "out", "grad_out", "stats", "bias",
                                            "seq_len_q", "seq_len_kv", "dropout_seed",
                                            "dropout_offset", "grad_bias")} == \
        {1, 2, 3, 4, 11, 5, 6, 7, 8, 9, 10, 15}
    assert sorted(b.names) == list(range(1, 16))
    assert tuple(declared["q"].stride) == dense_strides("bshd", *desc.q_shape)
    assert tuple(declared["stats"].dim) == desc.stats_shape
    assert declared["seq_len_q"].data_type == cudnn.data_type.INT32
    assert declared["dropout_seed"].data_type == cudnn.data_type.INT64
    node = b.graph.nodes[0]
    assert node.params["diagonal_band_right_bound"] == 0
    assert node.params["use_deterministic_algorithm"] is True
    assert "diagonal_band_left_bound" not in node.params
    fwd = graphs.declare_forward(forward(window=(7, 2), save_stats=True), None)
    assert fwd.graph.nodes[0].params["diagonal_band_left_bound"] == 8  # cuDNN keeps j > i - L
    assert fwd.graph.nodes[0].params["diagonal_band_right_bound"] == 2
    assert sorted(fwd.names) == [1, 2, 3, 4, 5]


def test_packed_qkv_graphs_declare_the_views_strides_and_dense_outputs():
    pytest.importorskip("cudnn")
    if runtime.available() is not None:
        pytest.skip(runtime.available())
    width = (4 + 2 + 2) * 64
    packed = {name: (COMMON["seq_q"] * width, 64, width, 1) for name in "qkv"}
    desc = backward(layout="bshd", qkv_strides=packed, seq_kv=COMMON["seq_q"])
    b = graphs.declare_backward(desc, None)
    declared = {t.name: t for t in b.graph.tensors.values() if not t.is_virtual}
    for name in "qkv":
        assert tuple(declared[name].stride) == packed[name]
    assert tuple(declared["sdpa_backward::dQ"].stride) == dense_strides("bshd", *desc.q_shape)
    assert tuple(declared["out"].stride) == dense_strides("bshd", *desc.o_shape)


@pytest.mark.parametrize("kw", [
    dict(alibi=True), dict(causal="bottom_right", bias="1hqk"),
    dict(causal="bottom_right", seq_q=32), dict(window=(4, None), seq_q=32),
    dict(head_dim=100),
])
def test_the_frontends_own_validation_agrees_with_our_limits(kw):
    """Where the frontend validates without a GPU (its python-native validator, present when
    its CuTe DSL engines are installed), every problem our data rejects it rejects too."""
    pytest.importorskip("cudnn")
    if runtime.available() is not None:
        pytest.skip(runtime.available())
    desc = forward(save_stats=True, **kw)
    assert Plan.explain(desc, arch="sm90").chosen is None
    b = graphs.declare_forward(desc, None)
    if b.graph._python_native_validator() is None:
        pytest.skip("this frontend install validates SDPA graphs in C++, which needs a GPU")
    with pytest.raises(runtime.not_supported_types()):
        b.graph.validate()
    accepted = graphs.declare_forward(forward(save_stats=True, causal="bottom_right"), None)
    accepted.graph.validate()




@pytest.mark.parametrize(("kw", "declared"), [
    (dict(causal="bottom_right", seq_q=24), "TOP_LEFT"),  # seq_q == seq_kv: the same mask
    (dict(causal="bottom_right", window=(4, None), seq_q=24), "TOP_LEFT"),
    (dict(causal="bottom_right"), "BOTTOM_RIGHT"),
    (dict(causal="bottom_right", seq_q=24, padding=True), "BOTTOM_RIGHT"),  # lengths per sequence
])
def test_a_square_bottom_right_band_is_declared_top_left(kw, declared):
    cudnn = pytest.importorskip("cudnn")
    if runtime.available() is not None:
        pytest.skip(runtime.available())
    desc = backward(**kw)
    assert desc.alignment == "bottom_right"
    node = graphs.declare_backward(desc, None).graph.nodes[0]
    assert node.params["diagonal_alignment"] == getattr(cudnn.diagonal_alignment, declared)
