"""opfacade.torch without a GPU: every family has its ops with the schemas the GPU tests drive,
the Linear module is nn.Linear's drop-in, and host tensors are a typed error before anything
runs. Fake kernels, autograd, opcheck and torch.compile need CUDA tensors (a CPU-only torch
aborts on fake CUDA tensors' device guards once autograd records them), so they run in
tests/test_torch_gpu.py; only a graph traced for inference is read here."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import opfacade.torch as oft  # noqa: E402
from opfacade._registry import FAMILIES  # noqa: E402
from opfacade.errors import DeviceMismatch, InvalidArgument, Unsupported  # noqa: E402

# Each family's torch ops (the forward first); a family added to the registry table without
# torch ops fails here.
TORCH_OPS = {
    "alibi": ("alibi", "alibi_backward"),
    "linear": ("linear", "linear_backward", "linear_inference"),
    "sdpa": ("sdpa", "sdpa_backward", "sdpa_train", "sdpa_train_backward", "sdpa_inference"),
    "varlen_attention": ("varlen_attention", "varlen_attention_backward"),
    "decode_attention": ("decode_attention",),
    "kv_append": ("kv_append",),
}
# The op a graph compiled for inference calls, where a family has one beside its forward.
INFERENCE_OPS = {"linear": "linear_inference", "sdpa": "sdpa_inference"}


def test_every_family_has_its_torch_ops():
    assert set(TORCH_OPS) == {family.name for family in FAMILIES}
    for ops in TORCH_OPS.values():
        for name in ops:
            assert hasattr(torch.ops.opfacade, name), name


def test_the_forward_ops_carry_the_backward_choice_for_autograd():
    for name in ("sdpa", "sdpa_train", "varlen_attention", "linear"):
        schema = getattr(torch.ops.opfacade, name).default._schema
        assert "bool deterministic" in str(schema), name


HOST = torch.ones(2, 4, 8, 16)
LENS = torch.ones(2, dtype=torch.int32)


@pytest.mark.parametrize("call,argument", [
    (lambda: oft.linear(HOST[0, 0], HOST[0, 0]), "x"),
    (lambda: oft.sdpa(HOST, HOST, HOST), "query"),
    (lambda: oft.varlen_attention(HOST[0], HOST[0], HOST[0], LENS, LENS, max_seqlen_q=4,
                                  max_seqlen_kv=4), "q"),
    (lambda: oft.alibi(HOST, HOST[0, :, 0, 0]), "scores"),
    (lambda: oft.decode_attention(HOST, HOST, HOST, LENS), "q"),
    (lambda: oft.kv_append(HOST, HOST, HOST, HOST, LENS), "k_new"),
    (lambda: torch.ops.opfacade.linear(HOST[0, 0], HOST[0, 0], None, "none", False, False),
     "x"),
    (lambda: torch.ops.opfacade.linear_inference(HOST[0, 0], HOST[0, 0], None, "none", False),
     "x"),
    (lambda: torch.ops.opfacade.sdpa_inference(HOST, HOST, HOST, False, None), "q"),
    (lambda: torch.ops.opfacade.sdpa_train(HOST, HOST, HOST, False, None, False), "q"),
    (lambda: torch.ops.opfacade.sdpa_train_backward(HOST, HOST, HOST, HOST, HOST, HOST, False,
                                                    None, False), "q"),
])
def test_host_tensors_are_a_device_mismatch_naming_the_argument(call, argument):
    with pytest.raises(DeviceMismatch, match="must be a CUDA tensor") as raised:
        call()
    assert raised.value.argument == argument


@pytest.mark.parametrize("call,argument", [
    (lambda: oft.linear(None, HOST[0, 0]), "x"),
    (lambda: oft.Linear(16, 8)(None), "x"),
    (lambda: oft.sdpa(None, HOST, HOST), "query"),
    # An odd dropout_p is not read before the tensors are known (hypothesis found it).
    (lambda: oft.sdpa(None, None, None, None, torch.tensor([])), "query"),
    (lambda: oft.varlen_attention(None, HOST[0], HOST[0], LENS, LENS, max_seqlen_q=4,
                                  max_seqlen_kv=4), "q"),
    (lambda: oft.alibi(None, HOST[0, :, 0, 0]), "scores"),
    (lambda: oft.decode_attention(None, HOST, HOST, LENS), "q"),
    (lambda: oft.kv_append(None, HOST, HOST, HOST, LENS), "k_new"),
])
def test_a_required_tensor_given_none_is_an_invalid_argument_naming_it(call, argument):
    # Optional tensors (a bias, a mask, a page table) may be None; the others name themselves
    # rather than fail later on a None's missing attribute.
    with pytest.raises(InvalidArgument, match="must be a torch.Tensor, got None") as raised:
        call()
    assert raised.value.argument == argument


@pytest.mark.parametrize("call,shape,name", [
    (lambda x, y: torch.ops.opfacade.sdpa_inference(x, y, y, False, None), (2, 4, 8, 16), "q"),
    (lambda x, y: torch.ops.opfacade.linear_inference(y, x, None, "relu", False), (8, 16),
     "weight"),
])
def test_an_inference_op_refuses_a_call_that_wants_a_gradient(call, shape, name):
    # Its autograd key falls through, so autograd would record nothing: a typed error instead
    # of an output without a gradient, naming the tensor. Under no_grad the same call goes on
    # (to the device check, here).
    y = torch.ones(shape)
    x = y.clone().requires_grad_()
    with pytest.raises(Unsupported, match=f"{name} requires grad; opfacade::") as refused:
        call(x, y)
    assert refused.value.argument == name
    with torch.no_grad(), pytest.raises(DeviceMismatch):
        call(x, y)
    # The fake kernel refuses it too, so a graph traced with grad does not get past it.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), pytest.raises(Unsupported, match=f"{name} requires grad"):
        y = torch.empty(shape, device="cuda")
        call(y.clone().requires_grad_(), y)


def test_on_one_gpu_says_no_to_host_tensors_non_tensors_and_none():
    from opfacade.torch._common import on_one_gpu

    assert not on_one_gpu(HOST)
    assert not on_one_gpu(torch.nn.Parameter(HOST))
    assert not on_one_gpu(None)
    assert not on_one_gpu(HOST.numpy())
    assert not on_one_gpu(HOST, optional=HOST)


def test_linear_loads_an_nn_linear_state_dict():
    reference = torch.nn.Linear(32, 24)
    layer = oft.Linear(32, 24, activation="relu")
    layer.load_state_dict(reference.state_dict())
    assert torch.equal(layer.weight, reference.weight) and torch.equal(layer.bias, reference.bias)
    assert reference.load_state_dict(layer.state_dict()) is not None
    copy = oft.Linear.from_torch(torch.nn.Linear(32, 24, bias=False), activation="silu")
    assert copy.bias is None and copy.activation == "silu"
    assert "activation='silu'" in repr(copy)


def test_every_drop_in_traces_into_one_inference_graph_that_saves_nothing_for_a_backward():
    # torch.compile(fullgraph=True) traces one inference step through every family's drop-in:
    # no graph break, and each family's forward op in dynamo's graph (a family added to the
    # registry without one fails here). Under no_grad, linear and sdpa call their inference ops
    # (no GELU aux, no softmax stats) and varlen_attention asks for no LSE (save_lse): only a
    # backward reads them. Dynamo traces fake CUDA tensors here, which
    # needs no GPU under no_grad; tests/test_torch_gpu.py runs compiled graphs in both modes.
    from torch._subclasses.fake_tensor import FakeTensorMode

    def step(x, weight, bias, scores, slopes, packed, cu_seqlens, k_cache, v_cache, lens,
             k_new, v_new, q_new):
        h = oft.linear(x, weight, bias, activation="gelu_tanh")
        q = h.reshape(2, 8, 4, 16).transpose(1, 2)  # [B, H, S, D] over bshd rows, no copy
        oft.kv_append(k_new, v_new, k_cache, v_cache, lens)
        return (oft.sdpa(q, q, q, is_causal=True), oft.linear(x, weight, None),
                oft.alibi(scores, slopes),
                oft.varlen_attention(packed, packed, packed, cu_seqlens, cu_seqlens,
                                     max_seqlen_q=6, max_seqlen_kv=6, causal=True),
                oft.decode_attention(q_new, k_cache, v_cache, lens))

    calls: dict[str, list[dict]] = {}  # each op's calls, their arguments by schema name

    def record(graph_module, example_inputs):
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and str(node.target).startswith("opfacade."):
                names = [a.name for a in node.target._schema.arguments]
                calls.setdefault(str(node.target).split(".")[1], []).append(
                    dict(zip(names, node.args, strict=True)))
        return graph_module.forward

    torch._dynamo.reset()
    with FakeTensorMode(), torch.no_grad():
        bf16 = dict(device="cuda", dtype=torch.bfloat16)
        lengths = dict(device="cuda", dtype=torch.int32)
        caches = [torch.empty(2, 32, 2, 64, **bf16) for _ in range(2)]
        news = [torch.empty(2, 1, 2, 64, **bf16) for _ in range(2)]
        outs = torch.compile(step, backend=record, fullgraph=True)(
            torch.empty(16, 64, **bf16), torch.empty(64, 64, **bf16), torch.empty(64, **bf16),
            torch.empty(2, 4, 16, 16, **bf16), torch.empty(4, device="cuda"),
            torch.empty(10, 4, 64, **bf16), torch.empty(3, **lengths), *caches,
            torch.empty(2, **lengths), *news, torch.empty(2, 1, 8, 64, **bf16))
        shapes = [tuple(out.shape) for out in outs]
    torch._dynamo.reset()
    assert set(calls) == {INFERENCE_OPS.get(family, ops[0])
                          for family, ops in TORCH_OPS.items()}
    # The inference ops have no output a backward reads; the other forwards are asked for none.
    assert [(call["activation"], call["bias"] is None) for call in calls["linear_inference"]
            ] == [("gelu_tanh", False), ("none", True)]
    assert calls["sdpa_inference"][0]["causal"] is True
    assert calls["varlen_attention"][0]["save_lse"] is False
    assert shapes == [(2, 4, 8, 16), (16, 64), (2, 4, 16, 16), (10, 4, 64), (2, 1, 8, 64)]


def test_autocast_inputs_cast_as_torch_autocast_casts_a_lower_precision_ops():
    """Floating CUDA tensors other than float64 go to the autocast dtype; float64, integer, bool
    and host tensors and None stay as they are, and a tensor already in the dtype is passed on
    itself. (Fake CUDA tensors without grad, which a CPU-only torch cannot differentiate: the
    drop-ins under a real torch.autocast, gradients included, run in tests/test_torch_gpu.py.)"""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from opfacade.torch._common import autocast_inputs

    with FakeTensorMode():
        f32 = torch.empty(4, 8, device="cuda")
        bf16, f64 = (torch.empty(4, device="cuda", dtype=t) for t in (torch.bfloat16,
                                                                       torch.float64))
        i32, flags = (torch.empty(4, device="cuda", dtype=t) for t in (torch.int32, torch.bool))
        host = torch.empty(4)
        not_a_tensor = [1.0]  # left for the drop-in's typed check
        kept = (bf16, f64, i32, flags, host, None, not_a_tensor)
        cast = autocast_inputs(torch.bfloat16, f32, *kept)
        assert cast[0].dtype == torch.bfloat16 and cast[0].shape == (4, 8)
        assert all(after is before for after, before in zip(cast[1:], kept, strict=True))
        assert autocast_inputs(torch.float16, bf16)[0].dtype == torch.float16


@pytest.fixture
def cuda_autocast_on():
    """torch.autocast("cuda")'s state turned on by hand (the context manager turns itself off
    on a CPU-only torch; the dispatcher's AutocastCUDA key works without a GPU)."""
    enabled, dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", torch.float16)
    yield torch.float16
    torch.set_autocast_enabled("cuda", enabled)
    torch.set_autocast_dtype("cuda", dtype)


def test_the_forward_ops_cast_under_autocast_as_torchs_do(cuda_autocast_on):
    """torch.ops.opfacade's forward ops, called directly under autocast, take their floating
    inputs in autocast's dtype, as F.linear and F.scaled_dot_product_attention do (their
    AutocastCUDA kernels: fake CUDA tensors here, the real ones in tests/test_torch_gpu.py).
    A float64 input stays as it is; backward ops and decode have no autocast rule."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops = torch.ops.opfacade
    with FakeTensorMode():
        x, w = torch.empty(8, 16, device="cuda"), torch.empty(24, 16, device="cuda")
        assert ops.linear(x, w, None, "relu", True, False)[0].dtype == torch.float16
        assert ops.linear_inference(x, w, None, "none", False).dtype == torch.float16
        x64, w64 = x.double(), w.double()
        assert ops.linear_inference(x64, w64, None, "none", False).dtype == torch.float64
        q = torch.empty(1, 2, 64, 64, device="cuda")
        assert ops.sdpa(q, q, q, None, True, None, 0.0, None, None, True, False)[0].dtype \
            == torch.float16
        assert ops.sdpa_train(q, q, q, True, None, False)[0].dtype == torch.float16
        assert ops.sdpa_inference(q, q, q, False, None).dtype == torch.float16
        packed = torch.empty(20, 2, 64, device="cuda")
        cu = torch.tensor([0, 7, 20], device="cuda", dtype=torch.int32)
        out, _ = ops.varlen_attention(packed, packed, packed, cu, cu, 13, 13, None, "none",
                                      None, None, True, False)
        assert out.dtype == torch.float16
    for name in ("linear_backward", "sdpa_backward", "sdpa_train_backward",
                 "varlen_attention_backward", "decode_attention", "alibi", "alibi_backward"):
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"opfacade::{name}",
                                                                  "AutocastCUDA"), name


def test_the_drop_ins_ask_autocast_only_for_its_dtype(monkeypatch):
    """With torch.autocast("cuda") off (always so on a machine without CUDA), the drop-ins
    cast nothing; on, they pass their floating inputs through autocast_inputs (the GPU test
    checks the outputs against torch's under a real autocast)."""
    from opfacade.torch import _common

    assert _common.autocast_dtype() is None
    monkeypatch.setattr(_common, "_autocast_enabled", lambda device: device == "cuda")
    assert _common.autocast_dtype() == torch.get_autocast_dtype("cuda")
