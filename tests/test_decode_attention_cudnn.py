"""The cuDNN decode SKUs without a GPU: the graph they declare (pools or contiguous caches as
cuDNN's containers in both layouts, a paged cache's table as both tables, the lengths, no causal
mask, stats only with lse) passes the frontend's own validation; selection and explain say what
they serve and why not; the workspace is the graph's plus the ones; a smaller batch and layouts
cuDNN cannot load are typed errors; and one prepared call fills the ones, runs cuDNN's graph
(faked) on the caller's pointers and zeroes the sequences of length 0 (the edge kernel emulated
on host memory posing as cuda:0, its arguments packed as its PTX declares them), in stream
order, behind checked mode's device check when asked. On a GPU: the cuDNN section of
tests/test_decode_attention_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
from test_sdpa_edges import FakeKernel, at, emulate, host_view

from opfacade import BufferTooSmall, LayoutMismatch, Plan, PlanPreference, Unsupported
from opfacade._backends.cudnn import decode as cudnn_decode
from opfacade._backends.cudnn import graphs, limits, runtime
from opfacade._backends.cudnn.sdpa import FORWARD_BOUND
from opfacade._backends.nvrtc import kv_cache as nvrtc_kv_cache
from opfacade._backends.nvrtc import sdpa_edges
from opfacade._internal.limits import INT32_MAX
from opfacade._internal.selection import Target
from opfacade._internal.sku import ReasonCode, Workspace
from opfacade._registry import op_named
from opfacade.contracts.decode_attention import (
    DECODE_ATTENTION,
    DecodeAttentionArgs,
    DecodeAttentionDescriptor,
)
from opfacade.contracts.kv_cache import cache_shape, verification_pages
from opfacade.errors import ShapeMismatch
from opfacade.types import ArchSku, ElementKind

SHAPE = dict(batch=4, heads_q=8, heads_kv=2, head_dim=128, element="bf16", cache="paged",
             page_size=16, max_pages=9)
CONTIGUOUS = {**SHAPE, "cache": "contiguous", "max_seq": 144, "page_size": None,
              "max_pages": None}
# The graph's operands in ascending UID order, as a run finds their pointers.
NAMES = ("q", "k_cache", "v_cache", "out", "lse", "seq_len_q", "seq_lens", "page_table_k",
         "page_table_v")
CUDNN = PlanPreference(backends={"cudnn"})
BF16 = {"sentinel": 0x7FC0, "written": 0x3F80}  # a bf16 NaN, and 1.0


def _impl(element: str = "bf16") -> cudnn_decode.DecodeAttentionCudnn:
    return next(i for i in cudnn_decode.SKUS["decode_attention"]
                if i.sku.element.value == element)


def _frontend():
    pytest.importorskip("cudnn")
    if runtime.available() is not None:
        pytest.skip(runtime.available())


# ----------------------------------------------------------------------------- the graph


@pytest.mark.parametrize(("kv_layout", "pool_strides"), [
    ("nhd", (16 * 2 * 128, 128, 2 * 128, 1)), ("hnd", (2 * 16 * 128, 16 * 128, 128, 1))])
@pytest.mark.parametrize("save_lse", [False, True])
def test_the_declared_graph_passes_the_frontends_validation(kv_layout, pool_strides, save_lse):
    _frontend()
    cudnn = pytest.importorskip("cudnn")
    desc = DecodeAttentionDescriptor(**SHAPE, kv_layout=kv_layout, save_lse=save_lse)
    key = cudnn_decode.DecodeKey(cudnn_decode.direction(desc), desc, 0, False,
                                 cudnn_decode.CacheLayout.compact(desc))
    builder = key.declare(None)
    builder.graph.validate()  # the frontend's checks of the support surface: no GPU needed
    tensors = {builder.names[t.uid]: t for t in builder.graph.tensors.values()
               if not t.is_virtual}
    pages = verification_pages(desc)
    assert pages == 4 * 9 + 3
    assert (tensors["q"].dim, tensors["q"].stride) == ([4, 8, 1, 128], [1024, 128, 1024, 1])
    assert (tensors["out"].dim, tensors["out"].stride) == ([4, 8, 1, 128], [1024, 128, 1024, 1])
    for name in ("k_cache", "v_cache"):
        assert tensors[name].dim == [pages, 2, 16, 128]
        assert tuple(tensors[name].stride) == pool_strides
    for name in ("page_table_k", "page_table_v"):
        assert (tensors[name].dim, tensors[name].stride) == ([4, 1, 9, 1], [9, 9, 1, 1])
        assert tensors[name].data_type == cudnn.data_type.INT32
    for name in ("seq_len_q", "seq_lens"):
        assert tensors[name].dim == [4, 1, 1, 1]
        assert tensors[name].data_type == cudnn.data_type.INT32
    assert ("lse" in tensors) is save_lse
    if save_lse:
        assert tensors["lse"].dim == [4, 8, 1, 1]
        assert tensors["lse"].data_type == cudnn.data_type.FLOAT
    ordered = tuple(builder.names[uid] for uid in sorted(builder.names))
    assert ordered == tuple(n for n in NAMES if save_lse or n != "lse")
    node = builder.graph.nodes[0]
    inputs = {port: t.uid for port, t in node.inputs.items() if t is not None}
    assert inputs == {"q": 1, "k": 2, "v": 3, "seq_len_q": 7, "seq_len_kv": 8,
                      "paged_attention_k_table": 40, "paged_attention_v_table": 41}
    params = node.params
    assert params["use_padding_mask"] is True and params["generate_stats"] is save_lse
    assert params["paged_attention_max_seq_len_kv"] == 144
    # Never a causal mask (cuDNN's known decode bug with Hq != Hkv), nor any band.
    assert not {"use_causal_mask", "use_causal_mask_bottom_right", "diagonal_alignment",
                "diagonal_band_right_bound", "diagonal_band_left_bound"} & params.keys()


@pytest.mark.parametrize(("kv_layout", "cache_strides"), [
    ("nhd", (144 * 2 * 128, 128, 2 * 128, 1)), ("hnd", (2 * 144 * 128, 144 * 128, 128, 1))])
def test_a_contiguous_caches_graph_reads_it_in_place_without_tables(kv_layout, cache_strides):
    _frontend()
    desc = DecodeAttentionDescriptor(**CONTIGUOUS, kv_layout=kv_layout, save_lse=True)
    key = cudnn_decode.DecodeKey(cudnn_decode.direction(desc), desc, 0, False,
                                 cudnn_decode.CacheLayout.compact(desc))
    assert key.direction == "contiguous_decode" and key.layout.pages == 0
    builder = key.declare(None)
    builder.graph.validate()
    tensors = {builder.names[t.uid]: t for t in builder.graph.tensors.values()
               if not t.is_virtual}
    for name in ("k_cache", "v_cache"):  # [B, Hkv, max_seq, D] over the caller's cache
        assert tensors[name].dim == [4, 2, 144, 128]
        assert tuple(tensors[name].stride) == cache_strides
    assert not {"page_table_k", "page_table_v"} & tensors.keys()
    ordered = tuple(builder.names[uid] for uid in sorted(builder.names))
    assert ordered == NAMES[:7]
    node = builder.graph.nodes[0]
    inputs = {port: t.uid for port, t in node.inputs.items() if t is not None}
    assert inputs == {"q": 1, "k": 2, "v": 3, "seq_len_q": 7, "seq_len_kv": 8}
    params = node.params
    assert params["use_padding_mask"] is True and "paged_attention_max_seq_len_kv" not in params
    assert not {"use_causal_mask", "use_causal_mask_bottom_right", "diagonal_alignment",
                "diagonal_band_right_bound", "diagonal_band_left_bound"} & params.keys()


# ----------------------------------------------------------------------------- selection


def test_the_skus_follow_ours_in_the_table_and_declare_what_cudnn_promises():
    ids = [impl.sku.id for impl in op_named("decode_attention").skus]
    assert ids == ["decode_attention.nvrtc.f32", "decode_attention.nvrtc.f16",
                   "decode_attention.nvrtc.bf16", "decode_attention.cudnn.f16",
                   "decode_attention.cudnn.bf16", "decode_attention.reference"]
    for impl in cudnn_decode.SKUS["decode_attention"]:
        g = impl.sku.precision_guarantee
        assert not (g.deterministic or g.bit_stable or g.batch_invariant)
        assert g.capture_safe and g.accumulator is ElementKind.f32
        assert g.max_rel_error == FORWARD_BOUND[impl.sku.element]


def test_ours_come_first_and_the_cudnn_preference_picks_cudnn():
    _frontend()
    desc = DecodeAttentionDescriptor(**SHAPE)
    assert Plan.select(desc, arch="sm90").sku.id == "decode_attention.nvrtc.bf16"
    plan = Plan.select(desc, CUDNN, arch="sm90")
    assert plan.sku.id == "decode_attention.cudnn.bf16"
    assert plan.workspace_size == 256  # no graph bytes known without a GPU, the 4 ones
    report = str(Plan.explain(desc, CUDNN, arch="sm90"))
    note = cudnn_decode.note(desc)
    assert note in report
    assert "runs the envelope's batch" in note and "page table" in note and "finite" in note


def test_a_contiguous_cache_is_served_with_its_own_note_and_no_paged_gates():
    _frontend()
    desc = DecodeAttentionDescriptor(**CONTIGUOUS)
    assert Plan.select(desc, arch="sm90").sku.id == "decode_attention.nvrtc.bf16"
    assert Plan.select(desc, CUDNN, arch="sm90").sku.id == "decode_attention.cudnn.bf16"
    note = cudnn_decode.note(desc)
    assert note in str(Plan.explain(desc, CUDNN, arch="sm90"))
    assert "page table" not in note and "slots past its sequence's length must be finite" in note
    # Paged caches' version gates are theirs alone.
    assert _impl()._data_unfit(desc, limits.Context(ArchSku.sm90, 90400)) is None


@pytest.mark.parametrize(("fields", "code", "detail"), [
    (dict(cache="pointers", max_seq=64, page_size=None, max_pages=None),
     ReasonCode.feature_unsupported, "cuDNN decode serves a paged or contiguous cache; problem "
                                     "has a pointers cache"),
    (dict(q_len=4), ReasonCode.feature_unsupported,
     "cuDNN decode serves q_len 1; problem has q_len 4"),
    (dict(window=(100, None)), ReasonCode.feature_unsupported,
     "cuDNN decode serves no sliding window; problem has window=(100, None)"),
    (dict(head_dim=96), ReasonCode.shape_unsupported,
     "cuDNN decode serves head_dim = head_dim_v in (64, 128, 256); problem has "
     "head_dim=96, head_dim_v=96"),
    (dict(head_dim_v=64), ReasonCode.shape_unsupported, "head_dim=128, head_dim_v=64"),
    (dict(element="f32"), ReasonCode.element_unsupported, "serves bf16, problem is f32"),
])
def test_explain_says_what_the_cudnn_skus_do_not_serve(fields, code, detail):
    desc = DecodeAttentionDescriptor(**{**SHAPE, **fields})
    report = Plan.explain(desc, CUDNN, arch="sm90")
    verdict = next(v for v in report.verdicts if v.sku.id == "decode_attention.cudnn.bf16")
    assert verdict.code is code and detail in verdict.detail


@pytest.mark.parametrize(("version", "head_dim", "blocked"), [
    (90400, 64, "paged caches need cuDNN 9.5.0"),
    (90900, 256, "head dims above 128 need cuDNN 9.10.0"),
    (90900, 128, None),
    (91000, 128, "known SDPA f16/bf16 bugs"),
    (91900, 256, None),
])
def test_version_gates_of_paged_caches(version, head_dim, blocked):
    desc = DecodeAttentionDescriptor(**{**SHAPE, "head_dim": head_dim})
    unfit = _impl()._data_unfit(desc, limits.Context(ArchSku.sm90, version))
    if blocked is None:
        assert unfit is None
    else:
        assert unfit.code is ReasonCode.version_blocked and blocked in unfit.detail


def test_the_capacity_is_held_to_cuDNNs_int32_lengths():
    inside = DecodeAttentionDescriptor(**{**SHAPE, "batch": 1, "heads_kv": 1, "heads_q": 1,
                                          "head_dim": 64, "page_size": 1,
                                          "max_pages": INT32_MAX})
    assert _impl().unfit_on(inside, Target(ArchSku.sm90)) is None
    outside = DecodeAttentionDescriptor(**{**inside.model_dump(), "page_size": 2,
                                           "max_pages": 2**30})
    unfit = _impl().unfit_on(outside, Target(ArchSku.sm90))
    assert unfit.code is ReasonCode.shape_unsupported
    assert unfit.detail == ("page_size*max_pages = 2147483648 tokens exceeds cuDNN's int32 "
                            "sequence lengths (seq_len_kv, paged_attention_max_seq_len_kv) "
                            "(2147483647)")


def test_selection_on_a_device_takes_the_graphs_verdict_and_its_exact_workspace(monkeypatch):
    """The device branch of selection, with the cache standing in for a GPU: the graph built
    for compact tensors and the signature's pool, its bytes plus the ones."""
    asked = []
    answer = graphs.BuiltGraph(None, (), 1000, "stand-in", None)
    monkeypatch.setattr(graphs.GRAPHS, "get", lambda key: asked.append(key) or answer)
    desc = DecodeAttentionDescriptor(**SHAPE)
    target = Target(ArchSku.sm90, device=0)
    assert _impl().unfit_on(desc, target) is None
    assert _impl().workspace_size_on(desc, target) == 1024 + 256
    assert asked[0].layout == cudnn_decode.CacheLayout((1024, 128), (1024, 128), 39)
    answer = graphs.Declined("cuDNN 9.19.0: not supported")
    unfit = _impl().unfit_on(desc, target)
    assert unfit.code is ReasonCode.feature_unsupported and "not supported" in unfit.detail


# ----------------------------------------------------------------------------- arguments


def aligned(shape, dtype, fill=0) -> np.ndarray:
    """A C-order host array on a 256-byte boundary."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    raw = np.empty(count * dtype.itemsize + 256, np.uint8)
    start = -raw.ctypes.data % 256
    array = raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)
    array[...] = fill
    return array


def _bf16(array: np.ndarray):
    return host_view(array, ElementKind.bf16)


class Step:
    """A step's host arrays (16-bit floats as uint16, NaN sentinels in the outputs) and their
    views."""

    def __init__(self, desc: DecodeAttentionDescriptor, lengths, pages: int = 39,
                 sequences: int | None = None):
        b = desc.batch if sequences is None else sequences
        self.element = desc.element
        paged = desc.cache == "paged"
        pool = cache_shape(desc, desc.head_dim, pages if paged else b)
        self.q = aligned((b, 1, desc.heads_q, desc.head_dim), np.uint16)
        self.k, self.v = aligned(pool, np.uint16), aligned(pool, np.uint16)
        self.table = None
        if paged:
            self.table = aligned((b, desc.max_pages), np.int32)
            self.table[...] = np.arange(b * desc.max_pages).reshape(b, desc.max_pages) % pages
        self.seq_lens = aligned((b,), np.int32)
        self.seq_lens[...] = lengths
        self.out = aligned((b, 1, desc.heads_q, desc.dim_v), np.uint16, BF16["sentinel"])
        self.lse = aligned((b, 1, desc.heads_q), np.float32, np.nan) if desc.save_lse else None

    def args(self, **overrides) -> DecodeAttentionArgs:
        def half(array):
            return host_view(array, self.element)

        fields = dict(q=half(self.q), k_cache=half(self.k), v_cache=half(self.v),
                      seq_lens=host_view(self.seq_lens), out=half(self.out),
                      page_table=None if self.table is None else host_view(self.table),
                      lse=None if self.lse is None else host_view(self.lse))
        fields.update(overrides)
        return DecodeAttentionArgs(**fields)


def _bound(desc, step: Step, **overrides):
    bound = DECODE_ATTENTION.bind(desc, step.args(**overrides))
    _impl(desc.element.value).check_args(desc, bound)
    return bound


def test_a_batch_smaller_than_the_envelope_is_a_shape_mismatch_naming_q():
    desc = DecodeAttentionDescriptor(**SHAPE)
    step = Step(desc, [3, 0, 1], sequences=3)
    with pytest.raises(ShapeMismatch, match="pad the batch with seq_len 0 sequences") as raised:
        _bound(desc, step)
    assert raised.value.argument == "q"
    assert "runs the envelope's batch = 4" in str(raised.value)


def test_layouts_cudnn_cannot_load_are_a_layout_mismatch_naming_the_argument():
    desc = DecodeAttentionDescriptor(**SHAPE, save_lse=True)
    step = Step(desc, [5, 0, 1, 144])
    _bound(desc, step)  # compact: fine
    wide = aligned((4, 1, 12, 128), np.uint16)[:, :, :8]  # a slice of a fused projection
    _bound(desc, step, q=_bf16(wide))
    padded = aligned((4, 1, 8, 132), np.uint16)[..., :128]  # head stride 132: not 16-byte steps
    with pytest.raises(LayoutMismatch, match=r"strides \(1056, 1056, 132, 1\)") as raised:
        _bound(desc, step, q=_bf16(padded))
    assert raised.value.argument == "q"
    strided = aligned((39, 16, 4, 128), np.uint16)[:, :, :2]  # a pool that is not dense
    with pytest.raises(LayoutMismatch, match="k_cache must be dense") as raised:
        _bound(desc, step, k_cache=_bf16(strided), v_cache=_bf16(strided))
    assert raised.value.argument == "k_cache"
    off = aligned((39 * 16 * 2 * 128 + 8,), np.uint16)[1:1 + 39 * 16 * 2 * 128].reshape(
        39, 16, 2, 128)
    with pytest.raises(LayoutMismatch, match="k_cache must be 16-byte aligned"):
        _bound(desc, step, k_cache=_bf16(off))
    with pytest.raises(LayoutMismatch, match="lse must be dense") as raised:
        _bound(desc, step, lse=host_view(aligned((4, 1, 16), np.float32)[..., :8]))
    assert raised.value.argument == "lse"


# ----------------------------------------------------------------------------- the launch path


@pytest.fixture
def faked(monkeypatch):
    """cuDNN's graph faked (it checks the ones, then writes 1.0 into every row and lse 5), the
    handle, the device and the memset faked, the edge kernel emulated; ``faked.calls`` is
    everything, in order, and ``faked.built`` every graph asked for."""

    class Faked:
        calls: list = []
        built: list = []
        graph_bytes = 1000
        batch = 0

    fake = Faked()
    fake.calls, fake.built = [], []

    class Launch:
        def __init__(self, names):
            self.names = names

        def bind(self, pointers, workspace, handle):
            def execute():
                ones = at(pointers[self.names.index("seq_len_q")], (fake.batch,), (1,),
                          np.int32)
                assert (ones == 1).all()
                fake.calls.append(("cudnn", pointers, workspace))
                fake.fill(pointers)

            return execute

    def build(key):
        fake.built.append(key)
        fake.batch = key.desc.batch
        names = tuple(n for n in NAMES if (key.desc.save_lse or n != "lse")
                      and (key.desc.cache == "paged" or not n.startswith("page_table")))
        return graphs.BuiltGraph(None, names, fake.graph_bytes, "fake", Launch(names))

    def fill_ones(ptr, count, stream):
        fake.calls.append(("ones", ptr, count, stream))
        at(ptr, (count,), (1,), np.int32)[...] = 1

    monkeypatch.setattr(graphs, "GRAPHS", graphs.GraphCache(build=build))
    monkeypatch.setattr(runtime, "handle_for", lambda device: "handle")
    monkeypatch.setattr(runtime, "stream_setter", lambda: lambda handle, stream: None)
    monkeypatch.setattr(cudnn_decode, "current_device", lambda: 0)
    monkeypatch.setattr(cudnn_decode, "_fill_ones", fill_ones)
    monkeypatch.setattr(sdpa_edges, "get_kernel", lambda source, name, device: FakeKernel(name))
    monkeypatch.setattr(sdpa_edges, "launch", lambda *a: emulate(*a, fake.calls))
    return fake


def _workspace(size: int) -> tuple[np.ndarray, Workspace]:
    memory = aligned((size,), np.uint8, 0xFF)
    return memory, Workspace(memory.ctypes.data, size, 0, memory)


@pytest.mark.parametrize("kv_layout", ["nhd", "hnd"])
def test_one_prepared_call_fills_the_ones_runs_cudnn_then_zeroes_empty_sequences(faked,
                                                                                 kv_layout):
    desc = DecodeAttentionDescriptor(**SHAPE, kv_layout=kv_layout, save_lse=True)
    lengths = [144, 0, 1, 50]
    step = Step(desc, lengths)

    def cudnn_writes(pointers):  # every row, the empty sequence's too: the edge must win
        step.out[...] = BF16["written"]
        step.lse[...] = 5.0

    faked.fill = cudnn_writes
    impl = _impl()
    # Selected for an arch alone (no device to build on, GPU or not): the ones alone.
    assert impl.workspace_size_on(desc, Target(ArchSku.sm90)) == 256
    memory, workspace = _workspace(1024 + 256)
    bound = _bound(desc, step)
    prepared = impl.prepared(desc, bound, workspace, stream=42)
    for _ in range(2):  # the ones are filled on every call: the workspace may be shared
        memory[1024:] = 0xFF
        prepared()
    assert [c[0] for c in faked.calls] == ["ones", "cudnn", "sdpa_padding_rows_bf16"] * 2
    base = workspace.ptr
    assert faked.calls[0][1:] == (base + 1024, 4, 42)  # past the graph's 1000 bytes, rounded
    _, pointers, graph_workspace = faked.calls[1]
    assert graph_workspace == base
    views = bound.views
    assert pointers == [views["q"].ptr, views["k_cache"].ptr, views["v_cache"].ptr,
                        views["out"].ptr, views["lse"].ptr, base + 1024, views["seq_lens"].ptr,
                        views["page_table"].ptr, views["page_table"].ptr]
    assert faked.calls[2][1:] == (42, 0)  # the run's stream and device
    assert (step.out[1] == 0).all() and (step.lse[1] == -np.inf).all()
    kept = [0, 2, 3]
    assert (step.out[kept] == BF16["written"]).all() and (step.lse[kept] == 5.0).all()
    assert [key.layout.pages for key in faked.built] == [39]


@pytest.mark.parametrize("kv_layout", ["nhd", "hnd"])
def test_a_contiguous_caches_call_passes_the_caches_in_place_and_no_table(faked, kv_layout):
    desc = DecodeAttentionDescriptor(**CONTIGUOUS, kv_layout=kv_layout, save_lse=True)
    step = Step(desc, [144, 0, 1, 50])

    def cudnn_writes(pointers):
        step.out[...] = BF16["written"]
        step.lse[...] = 5.0

    faked.fill = cudnn_writes
    memory, workspace = _workspace(1024 + 256)
    bound = _bound(desc, step)
    _impl().prepared(desc, bound, workspace, stream=9)()
    assert [c[0] for c in faked.calls] == ["ones", "cudnn", "sdpa_padding_rows_bf16"]
    views = bound.views
    assert faked.calls[1][1] == [views["q"].ptr, views["k_cache"].ptr, views["v_cache"].ptr,
                                 views["out"].ptr, views["lse"].ptr, workspace.ptr + 1024,
                                 views["seq_lens"].ptr]
    assert (step.out[1] == 0).all() and (step.lse[1] == -np.inf).all()
    assert (step.out[[0, 2, 3]] == BF16["written"]).all()
    (key,) = faked.built
    assert key.direction == "contiguous_decode" and key.layout.pages == 0


def test_without_lse_the_edge_writes_out_alone(faked):
    desc = DecodeAttentionDescriptor(**{**SHAPE, "element": "f16"})
    step = Step(desc, [0, 0, 7, 9])
    faked.fill = lambda pointers: step.out.fill(0x3C00)  # f16 1.0
    _, workspace = _workspace(2048)
    bound = _bound(desc, step)
    _impl("f16").prepared(desc, bound, workspace, stream=5)()
    assert [c[0] for c in faked.calls] == ["ones", "cudnn", "sdpa_padding_rows_f16"]
    assert len(faked.calls[1][1]) == len(NAMES) - 1
    assert (step.out[:2] == 0).all() and (step.out[2:] == 0x3C00).all()


def test_another_pool_gets_its_own_graph_and_a_short_workspace_is_refused(faked):
    desc = DecodeAttentionDescriptor(**SHAPE)
    faked.fill = lambda pointers: None
    step = Step(desc, [1, 2, 3, 4], pages=50)
    _, workspace = _workspace(1024 + 256)
    _impl().prepared(desc, _bound(desc, step), workspace, stream=1)()
    assert [key.layout.pages for key in faked.built] == [50]
    faked.graph_bytes = 5000  # the next build needs more than the plan holds
    bigger = Step(desc, [1, 2, 3, 4], pages=60)
    with pytest.raises(BufferTooSmall, match="needs 5376") as raised:
        _impl().prepared(desc, _bound(desc, bigger), workspace, stream=1)
    assert raised.value.argument == "workspace"
    _impl().release(desc)
    assert len(graphs.GRAPHS) == 0


def test_a_graph_cudnn_declines_at_run_time_is_unsupported(monkeypatch):
    monkeypatch.setattr(graphs, "GRAPHS", graphs.GraphCache(
        build=lambda key: graphs.Declined("cuDNN 9.19.0: no engine")))
    desc = DecodeAttentionDescriptor(**SHAPE)
    _, workspace = _workspace(4096)
    with pytest.raises(Unsupported, match="no engine"):
        _impl().prepared(desc, _bound(desc, Step(desc, [1, 2, 3, 4])), workspace, stream=0)


@pytest.mark.parametrize(("shape", "expected"), [
    (SHAPE, nvrtc_kv_cache.DecodeCache("paged", False, 144, 2, 128, 128, 16, 9, 39)),
    (CONTIGUOUS, nvrtc_kv_cache.DecodeCache("contiguous", False, 144, 2, 128, 128, 0, 0, 0))],
    ids=["paged", "contiguous"])
def test_checked_mode_runs_the_nvrtc_familys_device_check_first(faked, monkeypatch, shape,
                                                                expected):
    checks = []

    def check_call(device, cache, sequences, q_len, k, v, table, seq_lens, stream, run):
        checks.append((device, cache, sequences, q_len, k, v, table, seq_lens, stream))

        def check_then_run():
            faked.calls.append(("kv_cache_check",))
            run()

        return check_then_run

    monkeypatch.setattr(nvrtc_kv_cache, "check_call", check_call)
    desc = DecodeAttentionDescriptor(**shape, checked=True)
    faked.fill = lambda pointers: None
    step = Step(desc, [144, 0, 3, 4])
    _, workspace = _workspace(2048)
    bound = _bound(desc, step)
    _impl().prepared(desc, bound, workspace, stream=3)()
    assert [c[0] for c in faked.calls] == ["kv_cache_check", "ones", "cudnn",
                                           "sdpa_padding_rows_bf16"]
    (device, cache, sequences, q_len, k, v, table, seq_lens, stream), = checks
    assert (device, sequences, q_len, stream) == (0, 4, 1, 3)
    assert cache == expected
    views = bound.views
    assert (k, v, seq_lens) == (views["k_cache"].ptr, views["v_cache"].ptr,
                                views["seq_lens"].ptr)
    assert table == (views["page_table"].ptr if desc.cache == "paged" else 0)


def test_the_edge_kernel_gets_the_parameters_it_declares(faked, monkeypatch):
    """sdpa_padding_rows over out [B, 1, Hq, Dv] and lse [B, 1, Hq], packed exactly as the PTX
    NVRTC makes of native/sdpa_edges.cu declares them."""
    from ptx import assert_packed_like_declared, kernel_parameters

    packed = []
    monkeypatch.setattr(sdpa_edges, "launch", lambda kernel, grid, block, args, stream, device:
                        packed.append((kernel.name, grid, block, args)))
    desc = DecodeAttentionDescriptor(**SHAPE, save_lse=True)
    faked.fill = lambda pointers: None
    _, workspace = _workspace(2048)
    _impl().prepared(desc, _bound(desc, Step(desc, [1, 0, 2, 3])), workspace, stream=7)()
    ((name, grid, block, args),) = packed
    assert_packed_like_declared(name, args, kernel_parameters(sdpa_edges.SOURCE))
    assert (grid, block) == ((4 * 8,), (sdpa_edges.THREADS,))  # a block per (sequence, head)
    assert [int(a) for a in args[4:]] == [4, 8, 1, 128, 1024, 128, 1024, 8, 1, 8]
