"""SDPA's edges without a GPU: the dropout offset stride, the dropout counter's binding, the
reference's rows without keys, the edge kernels compiling, and the cuDNN forward's one prepared
call running cuDNN's graph (faked) and the edge kernels (emulated on host memory posing as
cuda:0) in stream order, with nothing added when there is no padding and no counter (nor ever
to the backward). On a GPU:
test_sdpa_edges_gpu.py."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from opfacade import ArchSku, InvalidArgument, LayoutMismatch, Plan
from opfacade._backends.cudnn import graphs, runtime
from opfacade._backends.cudnn import sdpa as cudnn_sdpa
from opfacade._backends.nvrtc import compiler, sdpa_edges
from opfacade._backends.reference import sdpa as reference
from opfacade._internal import graph_replay
from opfacade._internal.graph_replay import GraphedLaunches
from opfacade._internal.sku import Workspace
from opfacade._internal.tensors import TensorView, c_strides
from opfacade.contracts.sdpa import (
    SDPA_BACKWARD,
    SDPA_FORWARD,
    _bind_backward,
    _bind_forward,
    dense_strides,
)
from opfacade.ops.sdpa import (
    DropoutDraw,
    DropoutState,
    SdpaArgs,
    SdpaBackwardArgs,
    SdpaBackwardDescriptor,
    SdpaDescriptor,
    sdpa,
    sdpa_backward,
)
from opfacade.types import ElementKind

NATIVE = Path(__file__).resolve().parents[1] / "native"
COMMON = dict(batch=3, heads_q=4, heads_kv=2, seq_q=6, seq_kv=5, head_dim=8, element="bf16")
BF16 = {"sentinel": 0x7FC0, "written": 0x3F80}  # a bf16 NaN, and 1.0: what the fake graph writes


# ----------------------------------------------------------------------------- the stride


def test_dropout_offset_stride_covers_one_output_per_padded_score_element():
    plain = SdpaDescriptor(**COMMON)
    assert plain.dropout_offset_stride == 0  # no dropout, nothing consumed
    for fields in (COMMON, dict(COMMON, seq_q=129, seq_kv=1000), dict(COMMON, batch=1,
                                                                      heads_q=1, heads_kv=1)):
        desc = SdpaDescriptor(**fields, dropout_p=0.1)
        stride = desc.dropout_offset_stride
        elements = desc.batch * desc.heads_q * desc.seq_q * desc.seq_kv
        padded = desc.batch * desc.heads_q * 128 * -(-desc.seq_q // 128) * 128 * -(
            -desc.seq_kv // 128)
        assert stride >= padded >= elements and stride < 2 * padded
        assert stride & (stride - 1) == 0  # a power of two
    backward = SdpaBackwardDescriptor(**COMMON, dropout_p=0.1)
    assert backward.dropout_offset_stride == SdpaDescriptor(**COMMON,
                                                            dropout_p=0.1).dropout_offset_stride


# ----------------------------------------------------------------------------- binding


def host_view(array: np.ndarray, element=None, shape=None, strides=None) -> TensorView:
    """Host memory posing as cuda:0 (nothing here dereferences it on a device)."""
    element = element or ElementKind(
        {np.dtype(np.int64): "i64", np.dtype(np.int32): "i32", np.dtype(np.float32): "f32",
         np.dtype(np.uint16): "bf16"}[array.dtype])
    if strides is None:
        shape, strides = array.shape, tuple(s // array.itemsize for s in array.strides)
    return TensorView(array.ctypes.data, shape, strides, element, 0, "cupy", array)


def forward_args(desc: SdpaDescriptor, **extra) -> SdpaArgs:
    arrays = {name: np.zeros(shape, np.uint16) for name, shape in (
        ("q", desc.q_shape), ("k", desc.k_shape), ("v", desc.v_shape), ("out", desc.o_shape))}
    views = {name: host_view(a) for name, a in arrays.items()}
    if desc.dropout_p > 0:
        views["dropout_seed"] = host_view(np.array([7], np.int64))
        views["dropout_offset"] = host_view(np.array([0], np.int64))
    return SdpaArgs(**views, **extra)


def test_dropout_counter_is_optional_refused_without_dropout_and_checked():
    desc = SdpaDescriptor(**COMMON, dropout_p=0.2)
    bound = _bind_forward(desc, forward_args(desc))
    assert "dropout_counter" not in bound.views and "dropout_offset" not in bound.outputs
    counter = host_view(np.array([5], np.int64))
    bound = _bind_forward(desc, forward_args(desc, dropout_counter=counter))
    assert bound["dropout_counter"] is counter
    assert bound.outputs[-2:] == ("dropout_offset", "dropout_counter")  # both are written
    with pytest.raises(InvalidArgument, match="dropout_counter must be None unless dropout_p > 0"):
        plain = SdpaDescriptor(**COMMON)
        _bind_forward(plain, forward_args(plain, dropout_counter=counter))
    with pytest.raises(InvalidArgument, match=r"dropout_counter must have shape \(1,\)"):
        _bind_forward(desc, forward_args(desc, dropout_counter=host_view(np.zeros(2, np.int64))))
    with pytest.raises(InvalidArgument, match="dropout_counter must have element type i64"):
        _bind_forward(desc, forward_args(desc, dropout_counter=host_view(np.zeros(1, np.int32))))
    args = forward_args(desc)
    with pytest.raises(LayoutMismatch, match="overlaps"):  # the draw writes both
        _bind_forward(desc, SdpaArgs(**{**vars(args), "dropout_counter": args.dropout_offset}))


def test_functional_forms_take_a_state_forward_and_its_draw_backward_only():
    q = np.zeros((1, 2, 4, 8))
    state = DropoutState.create(seed=11, like=q, offset=3)
    assert state.seed.tolist() == [11] and state.offset.tolist() == [3]
    assert state.seed.dtype == np.int64
    with pytest.raises(InvalidArgument, match="dropout must be None unless dropout_p > 0"):
        sdpa(q, q, q, dropout=state)
    with pytest.raises(InvalidArgument, match="dropout must be None when dropout_seed"):
        sdpa(q, q, q, dropout_p=0.1, dropout=state, dropout_seed=state.seed)
    with pytest.raises(InvalidArgument, match="dropout must be a DropoutState, got DropoutDraw"):
        sdpa(q, q, q, dropout_p=0.1, dropout=DropoutDraw(state.seed, state.offset))
    with pytest.raises(InvalidArgument, match="pass the DropoutDraw the forward returned"):
        sdpa_backward(q, q, q, q, q, q[..., :1], dropout_p=0.1, dropout=state)


# ----------------------------------------------------------------------------- the reference


def test_reference_gives_sequences_without_keys_zero_out_minus_inf_stats_and_no_gradient():
    rng = np.random.default_rng(3)
    q, k, v, d_out = (rng.uniform(-1, 1, s) for s in ((3, 2, 5, 4), (3, 2, 6, 4), (3, 2, 6, 4),
                                                      (3, 2, 5, 4)))
    len_q, len_kv = np.array([5, 3, 4]), np.array([6, 0, 2])
    out, lse = reference.sdpa_forward(q, k, v, seq_len_q=len_q, seq_len_kv=len_kv)
    assert (out[1] == 0).all() and (lse[1] == -np.inf).all()
    assert np.isfinite(out).all() and np.isfinite(lse[0]).all()
    grads = reference.sdpa_backward(q, k, v, d_out, seq_len_q=len_q, seq_len_kv=len_kv)
    assert (grads["dq"][1] == 0).all() and (grads["dk"][1] == 0).all()
    assert (grads["dv"][1] == 0).all()
    # The sequences with keys are what they are alone.
    alone, _ = reference.sdpa_forward(q[2:, :, :4], k[2:, :, :2], v[2:, :, :2])
    np.testing.assert_allclose(out[2:, :, :4], alone, rtol=1e-12)


# ----------------------------------------------------------------------------- the kernels


@pytest.mark.parametrize("arch", [ArchSku.sm80, ArchSku.sm90])
def test_edge_kernels_compile_and_define_every_name_the_launchers_ask_for(arch):
    """From this checkout's native/ (an installed opfacade.native may be another tree's)."""
    source = (NATIVE / sdpa_edges.SOURCE).read_text()
    cubin = compiler.compile_cubin(sdpa_edges.SOURCE, arch, source=source, use_cache=False).cubin
    names = [sdpa_edges.DropoutDraw.name] + [f"sdpa_padding_rows_{e.value}"
                                             for e in sdpa_edges.PADDING_ROWS_ELEMENTS]
    for name in names:
        assert name.encode() + b"\0" in cubin, name


def test_launchers_refuse_what_their_kernels_do_not_serve():
    with pytest.raises(ValueError, match="stride must be positive"):
        sdpa_edges.DropoutDraw(0, 0)
    with pytest.raises(ValueError, match="element must be one of"):
        sdpa_edges.PaddingRows(ElementKind.f64, 0, (1, 1, 1, 8), (8, 8, 8, 1), None)


# ----------------------------------------------------------------------------- the launch path


def at(ptr: int, shape, strides, dtype) -> np.ndarray:
    """The host array at ``ptr`` with element ``strides``."""
    dtype = np.dtype(dtype)
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
    buffer = (ctypes.c_char * (span * dtype.itemsize)).from_address(ptr)
    flat = np.frombuffer(buffer, dtype)
    return np.lib.stride_tricks.as_strided(flat, shape, [s * dtype.itemsize for s in strides])


class FakeKernel:
    def __init__(self, name: str):
        self.name = name


def emulate(kernel: FakeKernel, grid, block, args, stream, device, calls: list) -> None:
    """native/sdpa_edges.cu on host memory, from the arguments exactly as packed."""
    calls.append((kernel.name, stream, device))
    if kernel.name == "sdpa_dropout_draw":
        counter, offset, stride = args
        held = at(int(counter), (1,), (1,), np.int64)
        at(int(offset), (1,), (1,), np.int64)[0] = held[0]
        held[0] += stride
        return
    rows, stats, len_q, len_kv, batch, heads, seq, dim, *strides = (int(a) for a in args)
    dtype = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[kernel.name.rsplit("_")[-1]]
    rows = at(rows, (batch, heads, seq, dim), (*strides[:3], 1), dtype)
    stats = at(stats, (batch, heads, seq), strides[3:], np.float32) if stats else None
    lengths_q = at(len_q, (batch,), (1,), np.int32)
    lengths_kv = at(len_kv, (batch,), (1,), np.int32)
    for b in range(batch):
        first = 0 if lengths_kv[b] == 0 else min(max(lengths_q[b], 0), seq)
        rows[b, :, first:] = 0
        if stats is not None:
            stats[b, :, first:] = np.where(np.arange(first, seq) < lengths_q[b], -np.inf, 0.0)


@pytest.fixture
def faked(monkeypatch):
    """cuDNN's graph faked (it writes 1.0 into the rows it serves and stats 5), the handle and
    the device faked, and the edge kernels emulated; ``faked.calls`` is everything, in order."""

    class Faked:
        calls: list = []
        fill = None  # what the fake graph writes: set per test

    fake = Faked()
    fake.calls = []

    class Launch:
        def bind(self, pointers, workspace, handle):
            def execute():
                fake.calls.append(("cudnn", pointers))
                fake.fill()

            return execute

    def build(key):  # the graph's operands: the signature's (never the dropout counter)
        op = SDPA_FORWARD if key.direction == "forward" else SDPA_BACKWARD
        return graphs.BuiltGraph(None, tuple(op.signature(key.desc)), 0, "fake", Launch())

    monkeypatch.setattr(graphs, "GRAPHS", graphs.GraphCache(build=build))
    monkeypatch.setattr(runtime, "handle_for", lambda device: "handle")
    monkeypatch.setattr(runtime, "stream_setter", lambda: lambda handle, stream: None)
    monkeypatch.setattr(cudnn_sdpa, "current_device", lambda: 0)
    monkeypatch.setattr(sdpa_edges, "get_kernel", lambda source, name, device: FakeKernel(name))
    monkeypatch.setattr(sdpa_edges, "launch", lambda *a: emulate(*a, fake.calls))
    cudnn_sdpa.clear()
    yield fake
    cudnn_sdpa.clear()


def impl_for(sku_id: str):
    return next(i for impls in cudnn_sdpa.SKUS.values() for i in impls if i.sku.id == sku_id)


def padded_views(desc, len_q, len_kv, names_shapes, layout="bshd"):
    """Views of [B, H, S, D] tensors stored in ``layout`` order (bf16 sentinel-filled), the
    stats, the lengths; and the logical numpy arrays, by name."""
    arrays, views = {}, {}
    for name, shape in names_shapes:
        order = {"bhsd": (0, 1, 2, 3), "bshd": (0, 2, 1, 3)}[layout]
        memory = np.full([shape[i] for i in order], BF16["sentinel"], np.uint16)
        arrays[name] = memory.transpose([order.index(i) for i in range(4)])
        views[name] = host_view(memory, ElementKind.bf16, shape, dense_strides(layout, *shape))
    views["seq_len_q"] = host_view(np.array(len_q, np.int32))
    views["seq_len_kv"] = host_view(np.array(len_kv, np.int32))
    return arrays, views


def test_padded_forward_runs_cudnn_then_writes_the_rows_without_keys_and_past_seq_len_q(faked):
    desc = SdpaDescriptor(**COMMON, layout="bshd", padding=True, save_stats=True)
    len_q, len_kv = [6, 4, 2], [5, 0, 3]
    arrays, views = padded_views(desc, len_q, len_kv, (
        ("q", desc.q_shape), ("k", desc.k_shape), ("v", desc.v_shape), ("out", desc.o_shape)))
    stats = np.full(desc.stats_shape, np.nan, np.float32)
    views["stats"] = host_view(stats)

    def cudnn_writes():  # the rows it serves: inside seq_len_q, of sequences with keys
        for b in range(desc.batch):
            if len_kv[b]:
                arrays["out"][b, :, :len_q[b]] = BF16["written"]
                stats[b, :, :len_q[b]] = 5.0

    faked.fill = cudnn_writes
    impl = impl_for("sdpa_forward.cudnn.bf16")
    bound = _bind_forward(desc, SdpaArgs(**views))
    impl.check_args(desc, bound)
    prepared = impl.prepared(desc, bound, Workspace.empty(), stream=42)
    prepared()
    assert [c[0] for c in faked.calls] == ["cudnn", "sdpa_padding_rows_bf16"]
    assert faked.calls[1][1:] == (42, 0)  # the run's stream and device
    out = arrays["out"]
    assert (out[0] == BF16["written"]).all() and (stats[0] == 5.0).all()
    assert (out[1] == 0).all() and (stats[1, :, :4] == -np.inf).all()
    assert (stats[1, :, 4:] == 0).all()
    assert (out[2, :, :2] == BF16["written"]).all() and (out[2, :, 2:] == 0).all()
    assert (stats[2, :, :2] == 5.0).all() and (stats[2, :, 2:] == 0).all()
    # Without stats the same fix-up leaves the stats alone (none are bound).
    no_stats = SdpaDescriptor(**COMMON, layout="bshd", padding=True)
    faked.calls.clear()
    bound = _bind_forward(no_stats, SdpaArgs(**{**views, "stats": None}))
    impl.prepared(no_stats, bound, Workspace.empty(), stream=42)()
    assert [c[0] for c in faked.calls] == ["cudnn", "sdpa_padding_rows_bf16"]


def graph_alone(prepared) -> bool:
    """Whether a prepared call (replayed as a CUDA graph from its second call) launches the
    cuDNN graph's own call and nothing around it."""
    return (isinstance(prepared, GraphedLaunches)
            and prepared._capture_at == graph_replay.LIBRARY_CAPTURE_AT
            and [launch.__name__ for launch in prepared._direct] == ["run_prepared"])


def test_the_backward_runs_the_graph_alone_even_padded(faked):
    """cuDNN's backward writes grad_q 0 for a sequence without keys itself (H100, both
    algorithms): no edge, no extra launch."""
    desc = SdpaBackwardDescriptor(**COMMON, padding=True)
    _, views = padded_views(desc, [6, 3, 2], [0, 5, 5], (
        ("q", desc.q_shape), ("k", desc.k_shape), ("v", desc.v_shape), ("out", desc.o_shape),
        ("grad_out", desc.o_shape), ("grad_q", desc.q_shape), ("grad_k", desc.k_shape),
        ("grad_v", desc.v_shape)), layout="bhsd")
    views["stats"] = host_view(np.zeros(desc.stats_shape, np.float32))
    faked.fill = lambda: None
    for sku_id in ("sdpa_backward.cudnn.bf16", "sdpa_backward.cudnn.bf16.deterministic"):
        bound = _bind_backward(desc, SdpaBackwardArgs(**views))
        prepared = impl_for(sku_id).prepared(desc, bound, Workspace.empty(), stream=9)
        assert graph_alone(prepared)
        prepared()
    assert [c[0] for c in faked.calls] == ["cudnn", "cudnn"]


def test_a_counter_is_drawn_before_the_graph_and_advanced_by_the_stride(faked):
    desc = SdpaDescriptor(**COMMON, dropout_p=0.25)
    counter = np.array([1000], np.int64)
    args = forward_args(desc, dropout_counter=host_view(counter))
    offset = args.dropout_offset.obj
    seen = []
    faked.fill = lambda: seen.append(int(offset[0]))  # what the graph reads when it runs
    impl = impl_for("sdpa_forward.cudnn.bf16")
    prepared = impl.prepared(desc, _bind_forward(desc, args), Workspace.empty(), stream=3)
    for _ in range(3):
        prepared()
    stride = desc.dropout_offset_stride
    assert seen == [1000, 1000 + stride, 1000 + 2 * stride]
    assert counter[0] == 1000 + 3 * stride and offset[0] == 1000 + 2 * stride
    assert [c[0] for c in faked.calls] == ["sdpa_dropout_draw", "cudnn"] * 3
    assert all(c[1] == 3 for c in faked.calls if c[0] != "cudnn")


def test_without_padding_or_a_counter_the_prepared_call_is_the_graphs_alone(faked):
    desc = SdpaDescriptor(**COMMON, dropout_p=0.25)
    faked.fill = lambda: None
    impl = impl_for("sdpa_forward.cudnn.bf16")
    prepared = impl.prepared(desc, _bind_forward(desc, forward_args(desc)), Workspace.empty(),
                             stream=3)
    assert graph_alone(prepared)  # no wrapper, no extra host work per call
    prepared()
    assert [c[0] for c in faked.calls] == ["cudnn"]


def test_explain_states_the_padding_precondition_beside_the_verdict():
    padded = SdpaDescriptor(**{**COMMON, "head_dim": 64}, padding=True)
    report = Plan.explain(padded, arch="sm90")
    cudnn_verdicts = [v for v in report.verdicts if v.sku.id.startswith("sdpa_forward.cudnn")]
    assert cudnn_verdicts and all(cudnn_sdpa.PADDING_NOTE in v.detail for v in cudnn_verdicts
                                  if v.viable)
    assert "content past the lengths must be finite" in cudnn_sdpa.PADDING_NOTE
    plain = Plan.explain(SdpaDescriptor(**{**COMMON, "head_dim": 64}), arch="sm90")
    assert all(cudnn_sdpa.PADDING_NOTE not in v.detail for v in plain.verdicts)


def test_stats_strides_of_the_fix_up_are_the_contracts():
    desc = SdpaDescriptor(**COMMON, padding=True, save_stats=True)
    fix = sdpa_edges.PaddingRows(desc.element, 0, desc.o_shape,
                                 dense_strides("sbhd", *desc.o_shape), c_strides(desc.stats_shape))
    assert fix.name == "sdpa_padding_rows_bf16" and fix.blocks == desc.batch * desc.heads_q
    assert [int(a) for a in fix.args] == [3, 4, 6, 8, *dense_strides("sbhd", *desc.o_shape)[:3],
                                          *c_strides(desc.stats_shape)[:3]]
