"""The cuDNN varlen attention SKUs without a GPU: the ragged graphs they declare (UIDs, strides,
shared offsets, masks) pass the frontend's own validation; the kernels around them compile and
receive exactly the parameters they declare; the workspace is laid out as documented; selection
and explain on sm90 say what a GPU run would take, and a workspace limit rejects the
deterministic backward with its size. On a GPU: tests/test_varlen_attention_gpu.py and verify."""

from __future__ import annotations

import numpy as np
import pytest
from ptx import assert_packed_like_declared, kernel_parameters

from opfacade import (
    Plan,
    PlanPreference,
    VarlenAttentionBackwardDescriptor,
    VarlenAttentionDescriptor,
)
from opfacade._backends.cudnn import limits as cudnn_limits
from opfacade._backends.cudnn import runtime
from opfacade._backends.cudnn import varlen as cudnn_varlen
from opfacade._backends.cudnn.ragged import RaggedKey, RaggedLayout
from opfacade._backends.nvrtc import compiler
from opfacade._backends.nvrtc import varlen_ragged as edges
from opfacade.types import ArchSku, ElementKind

SHAPE = dict(batch=4, heads_q=8, heads_kv=2, head_dim=128, max_seqlen_q=256, max_seqlen_kv=512,
             element="bf16")
FORWARD_NAMES = ("q", "k", "v", "out")
BACKWARD_NAMES = ("q", "k", "v", "out", "grad_out", "grad_q", "grad_k", "grad_v")


def _frontend():
    pytest.importorskip("cudnn")
    if runtime.available() is not None:
        pytest.skip(runtime.available())


def _declared(key: RaggedKey):
    builder = key.declare(None)
    builder.graph.validate()  # the frontend's checks of the support surface: no GPU needed
    by_uid = {t.uid: t for t in builder.graph.tensors.values() if not t.is_virtual}
    return builder, {builder.names[uid]: tensor for uid, tensor in by_uid.items()}


def test_a_compact_forward_declares_two_offset_groups_and_the_bucket():
    _frontend()
    desc = VarlenAttentionDescriptor(**SHAPE, causal="bottom_right", save_lse=True)
    key = RaggedKey("forward", desc, 0, False, RaggedLayout.compact(desc, FORWARD_NAMES))
    builder, tensors = _declared(key)
    assert key.layout.groups() == ((0, 8 * 128), (1, 2 * 128))
    assert tuple(tensors["q"].dim) == (4, 8, 256, 128)
    assert tuple(tensors["q"].stride) == (256 * 1024, 128, 1024, 1)
    assert tuple(tensors["k"].stride) == (512 * 256, 128, 256, 1)
    assert tuple(tensors["ragged_offsets_0"].dim) == (5, 1, 1, 1)
    assert tuple(tensors["stats_padded"].dim) == (4, 8, 256, 1)
    assert sorted(builder.names) == [1, 2, 3, 4, 5, 7, 8, 32, 33]
    node = builder.graph.nodes[0]
    assert node.params["diagonal_band_right_bound"] == 0


def test_views_into_one_packed_qkv_share_one_offsets_tensor_per_stride():
    _frontend()
    fields = dict(SHAPE, heads_q=2)
    desc = VarlenAttentionBackwardDescriptor(**fields, window=(64, 0))
    packed = 3 * 2 * 128  # q, k, v: views into [T, 3, H, D]
    strides = tuple((name, packed if name in ("q", "k", "v") else 2 * 128, 128)
                    for name in BACKWARD_NAMES)
    key = RaggedKey("backward", desc, 0, True, RaggedLayout(strides))
    builder, tensors = _declared(key)
    assert key.layout.groups() == ((0, packed), (1, packed), (0, 256), (1, 256))
    assert key.layout.group_of("grad_q") == key.layout.group_of("out") == 2
    assert tuple(tensors["v"].stride) == (512 * packed, 128, packed, 1)
    assert builder.graph.nodes[0].params["use_deterministic_algorithm"] is True
    assert builder.graph.nodes[0].params["diagonal_band_left_bound"] == 65


def test_a_forward_without_lse_makes_no_stats():
    _frontend()
    desc = VarlenAttentionDescriptor(**SHAPE)
    key = RaggedKey("forward", desc, 0, False, RaggedLayout.compact(desc, FORWARD_NAMES))
    builder, tensors = _declared(key)
    assert "stats_padded" not in tensors and 5 not in builder.names


def test_workspace_regions_follow_the_graph_on_256_byte_lines():
    regions = edges.RaggedWorkspace.plan(1000, batch=3, heads_q=2, seq_q=100, stats=True)
    assert (regions.graph, regions.offsets) == (0, 1024)
    assert regions.starts == 1024 + 256  # 8 groups x 4 offsets x 8 bytes = 256
    assert regions.lens == regions.starts + 256 and regions.stats == regions.lens + 256
    assert regions.size == regions.stats + 2560  # 3 x 2 x 100 f32, rounded up
    assert edges.RaggedWorkspace.plan(0, 3, 2, 100, stats=False).stats is None


@pytest.fixture(scope="module")
def signatures() -> dict[str, list[str]]:
    return kernel_parameters(edges.SOURCE)


def test_the_kernels_compile_for_sm90_and_get_the_parameters_they_declare(monkeypatch,
                                                                          signatures):
    launched = []
    monkeypatch.setattr(edges, "get_kernel", lambda source, name, device: name)
    monkeypatch.setattr(edges, "launch", lambda kernel, grid, block, args, stream, device:
                        launched.append((kernel, grid, block, args)))
    regions = edges.RaggedWorkspace.plan(4096, 4, 8, 256, stats=True)
    mask = edges.RaggedMask(True, 64, 0)
    edges.prepare_call(0, 0x1000, 0x2000, 3, 300, 700, 4, 256, 512, 0x10000, regions,
                       ((0, 1024), (1, 256)), 7)()
    edges.forward_rows_call(ElementKind.bf16, 0, 0x3000, (1024, 128), 0x4000, 300, 0x10000,
                            regions, 4, 8, 256, 128, mask, 7)()
    edges.gather_stats_call(0, 0x4000, 300, 0x10000, regions, 4, 8, 256, 7)()
    edges.backward_rows_call(ElementKind.f16, 0, (0x5000, 0x6000, 0x7000),
                             ((1024, 128), (256, 128), (256, 128)), 0x10000, regions, 4, 8, 2,
                             128, 128, 256, 512, mask, 7)()
    assert [name for name, *_ in launched] == ["ragged_prepare", "ragged_forward_rows_bf16",
                                               "ragged_gather_stats",
                                               "ragged_backward_rows_f16"]
    for name, _, _, args in launched:
        assert_packed_like_declared(name, args, signatures)
    assert launched[1][1] == (2, 8, 4)  # 256 rows / 128 threads, heads, sequences
    assert launched[3][1] == (4, 8, 4)  # the longer side: 512 keys


def test_cubin_builds_for_sm90():
    cubin = compiler.compile_cubin(edges.SOURCE, ArchSku.sm90, use_cache=False).cubin
    assert cubin[:4] == b"\x7fELF"


def test_explain_on_sm90_picks_cudnn_for_bf16_and_names_the_path():
    _frontend()
    desc = VarlenAttentionDescriptor(**SHAPE, causal="bottom_right", save_lse=True)
    plan = Plan.select(desc, arch="sm90")
    assert plan.sku.id == "varlen_attention_forward.cudnn.bf16"
    report = str(Plan.explain(desc, arch="sm90"))
    assert "ragged offsets, the bucket as graph dimensions" in report
    f32 = Plan.select(desc.model_copy(update={"element": ElementKind.f32}), arch="sm90")
    assert f32.sku.id == "varlen_attention_forward.nvrtc.f32"


@pytest.mark.parametrize("version, offered", [
    (91900, []), (92100, ["override shapes"]), (92401, ["override shapes", "cu_seq_len inputs"]),
    (None, ["override shapes", "cu_seq_len inputs"])])
def test_the_path_says_why_a_newer_cudnns_inputs_are_not_used(version, offered):
    path = cudnn_varlen._path(version)
    assert path.split(":")[0] == ("cuDNN" if version is None
                                  else f"cuDNN {cudnn_limits.format_version(version)}")
    assert "ragged offsets, the bucket as graph dimensions" in path
    for name in ("override shapes", "cu_seq_len inputs"):
        assert (f"{name} (" in path) == (name in offered)
    assert ("not used" in path) == bool(offered)
    if "cu_seq_len inputs" in offered:
        assert "clamp" in path  # the reason that holds on any version


def test_a_workspace_limit_rejects_the_deterministic_backward_with_the_number():
    _frontend()
    desc = VarlenAttentionBackwardDescriptor(**SHAPE, causal="bottom_right")
    deterministic = Plan.select(desc, PlanPreference(deterministic=True), arch="sm90")
    assert deterministic.sku.id == "varlen_attention_backward.cudnn.bf16.deterministic"
    size = deterministic.workspace_size
    # dP of the whole bucket in 2 bytes: 4 x 8 x 256 x 512 x 2 = 8 MiB, and more.
    assert size > 4 * 8 * 256 * 512 * 2
    report = str(Plan.explain(desc, PlanPreference(deterministic=True, workspace_limit=size - 1),
                              arch="sm90"))
    assert f"needs {size} bytes of workspace, limit is {size - 1}" in report


def test_the_default_backward_comes_first_and_is_not_deterministic():
    skus = cudnn_varlen.SKUS["varlen_attention_backward"]
    assert [s.sku.id for s in skus] == [
        "varlen_attention_backward.cudnn.f16", "varlen_attention_backward.cudnn.bf16",
        "varlen_attention_backward.cudnn.f16.deterministic",
        "varlen_attention_backward.cudnn.bf16.deterministic"]
    assert [s.sku.precision_guarantee.deterministic for s in skus] == [False, False, True, True]
    assert all(s.sku.precision_guarantee.capture_safe for s in skus)


def test_a_head_dim_cudnn_does_not_serve_is_explained_without_a_gpu():
    desc = VarlenAttentionDescriptor(**dict(SHAPE, head_dim=100))
    report = str(Plan.explain(desc, arch="sm90"))
    assert "multiples of 8" in report


@pytest.mark.parametrize("mask", [dict(causal="bottom_right"),
                                  dict(causal="bottom_right", window=(5, 0)),
                                  dict(window={"left": 4, "right": 2,
                                               "alignment": "bottom_right"})])
def test_a_square_graph_declares_the_same_mask_top_left(mask):
    """One cu_seqlens buffer for both sides: each sequence has as many queries as keys, where a
    bottom-right diagonal is the top-left one (the float64 reference agrees bit for bit, and
    differs once the key counts differ); the square graph declares it top-left."""
    from opfacade._backends.reference import varlen_forward
    from opfacade.contracts.varlen_attention import reference_options

    _frontend()
    cudnn = pytest.importorskip("cudnn")
    desc = VarlenAttentionDescriptor(**SHAPE, **mask)
    options = reference_options(desc)
    top_left = dict(options, alignment="top_left",
                    causal="top_left" if options["causal"] else None)
    assert desc.alignment == "bottom_right"
    rng = np.random.default_rng(0)
    cu = np.array([0, 7, 7, 8, 30])
    q, k, v = (rng.standard_normal((30, 2, 8)) for _ in range(3))
    ours, theirs = (varlen_forward(q, k, v, cu, cu, **o) for o in (options, top_left))
    np.testing.assert_array_equal(ours[0], theirs[0])
    unequal = np.array([0, 3, 9, 12, 30])  # with other key counts they differ
    assert not np.array_equal(varlen_forward(q, k, v, cu, unequal, **options)[0],
                              varlen_forward(q, k, v, cu, unequal, **top_left)[0])
    layout = RaggedLayout.compact(desc, FORWARD_NAMES)
    for square, declared in ((False, "BOTTOM_RIGHT"), (True, "TOP_LEFT")):
        builder, _ = _declared(RaggedKey("forward", desc, 0, False, layout, square))
        node = builder.graph.nodes[0]
        assert node.params["diagonal_alignment"] == getattr(cudnn.diagonal_alignment, declared)
        assert (node.params.get("diagonal_band_left_bound"),
                node.params.get("diagonal_band_right_bound")) == (
            None if desc.left_bound is None else desc.left_bound + 1, desc.right_bound)


def test_strides_cudnn_cannot_load_are_a_layout_mismatch_naming_the_argument():
    from opfacade.contracts.varlen_attention import VARLEN_ATTENTION_FORWARD, VarlenAttentionArgs
    from opfacade.errors import LayoutMismatch

    desc = VarlenAttentionDescriptor(**dict(SHAPE, heads_q=2, heads_kv=2, head_dim=64,
                                            element="f16"))
    cu = np.array([0, 4, 10], np.int32)
    k = np.zeros((10, 2, 64), np.float16)
    forward = cudnn_varlen.SKUS["varlen_attention_forward"][0]
    packed_qkv = np.zeros((10, 3, 2, 64), np.float16)[:, 0]  # token stride 384: loadable
    bound = VARLEN_ATTENTION_FORWARD.bind(desc, VarlenAttentionArgs(packed_qkv, k, k, cu, cu,
                                                                     np.zeros_like(k)))
    forward.check_args(desc, bound)
    padded = np.zeros((10, 2, 68), np.float16)[:, :, :64]  # head stride 68: not 16-byte steps
    bound = VARLEN_ATTENTION_FORWARD.bind(desc, VarlenAttentionArgs(padded, k, k, cu, cu,
                                                                     np.zeros_like(k)))
    with pytest.raises(LayoutMismatch, match=r"strides \(136, 68, 1\)") as error:
        forward.check_args(desc, bound)
    assert error.value.argument == "q"


@pytest.mark.parametrize(("one_buffer", "causal", "square"), [
    (True, "bottom_right", True), (False, "bottom_right", False), (True, "top_left", False)])
def test_a_run_asks_for_the_square_graph_only_when_one_buffer_serves_both_sides(
        monkeypatch, one_buffer, causal, square):
    """Which graph a run takes (no GPU: the cache answers with a stand-in of 1 KiB)."""
    from opfacade._backends.cudnn import graphs
    from opfacade._internal.sku import Workspace

    asked = []
    stand_in = graphs.BuiltGraph(None, (), 1024, "stand-in", None)
    monkeypatch.setattr(graphs.GRAPHS, "get", lambda key: asked.append(key) or stand_in)
    desc = VarlenAttentionDescriptor(**dict(SHAPE, element="f16"), causal=causal)
    cu_q, cu_kv = np.array([0, 4, 10], np.int32), np.array([0, 4, 10], np.int32)
    views = {"q": type("V", (), {"device": 0})(),
             "cu_seqlens_q": type("V", (), {"ptr": cu_q.ctypes.data})(),
             "cu_seqlens_kv": type("V", (), {"ptr": (cu_q if one_buffer else cu_kv).ctypes.data})()}
    forward = cudnn_varlen.SKUS["varlen_attention_forward"][0]
    layout = RaggedLayout.compact(desc, FORWARD_NAMES)
    built, regions = forward._graph_for_run(desc, views, layout, Workspace(0, 1 << 30, 0))
    assert built is stand_in and regions.size == forward._size(desc, 1024)
    assert [key.square for key in asked] == [square]
    assert asked[0].desc is desc


def test_selection_on_a_device_takes_the_graphs_verdict_and_its_exact_workspace(monkeypatch):
    """The device branch of selection (cudnn/selection.py), with the cache standing in for a
    GPU: the built graph's bytes plus the ragged buffers, or cuDNN's decline as the reason."""
    from opfacade._backends.cudnn import graphs
    from opfacade._internal.selection import Target
    from opfacade._internal.sku import ReasonCode

    answer = graphs.BuiltGraph(None, (), 4096, "stand-in", None)
    monkeypatch.setattr(graphs.GRAPHS, "get", lambda key: answer)
    desc = VarlenAttentionBackwardDescriptor(**SHAPE, causal="bottom_right")
    backward = cudnn_varlen.SKUS["varlen_attention_backward"][1]  # bf16, default
    target = Target(ArchSku.sm90, device=0)
    assert backward.unfit_on(desc, target) is None
    assert backward.workspace_size_on(desc, target) == backward._size(desc, 4096)
    answer = graphs.Declined("cuDNN 9.19.0: not supported")
    unfit = backward.unfit_on(desc, target)
    assert unfit.code is ReasonCode.feature_unsupported and "not supported" in unfit.detail
