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
from opfacade.errors import DeviceMismatch, InvalidArgument  # noqa: E402

# Each family's torch ops; a family added to the registry table without torch ops fails here.
TORCH_OPS = {
    "alibi": ("alibi", "alibi_backward"),
    "linear": ("linear", "linear_backward"),
    "sdpa": ("sdpa", "sdpa_backward"),
    "varlen_attention": ("varlen_attention", "varlen_attention_backward"),
    "decode_attention": ("decode_attention",),
    "kv_append": ("kv_append",),
}


def test_every_family_has_its_torch_ops():
    assert set(TORCH_OPS) == {family.name for family in FAMILIES}
    for ops in TORCH_OPS.values():
        for name in ops:
            assert hasattr(torch.ops.opfacade, name), name


def test_the_forward_ops_carry_the_backward_choice_for_autograd():
    for name in ("sdpa", "varlen_attention", "linear"):
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


def test_a_graph_compiled_for_inference_asks_for_no_aux_or_stats():
    # Under no_grad, torch.compile's graph of the drop-ins asks linear for no GELU aux
    # (save_aux, argument 4) and sdpa for no softmax stats (save_stats, argument 9), which only
    # a backward reads: an inference graph writes only its outputs. Dynamo traces fake CUDA
    # tensors here, which needs no GPU under no_grad; tests/test_torch_gpu.py runs compiled
    # graphs in both modes.
    from torch._subclasses.fake_tensor import FakeTensorMode

    def step(x, weight, bias):
        h = oft.linear(x, weight, bias, activation="gelu_tanh")
        q = h.reshape(2, 8, 4, 16).transpose(1, 2)  # [B, H, S, D] over bshd rows, no copy
        return oft.sdpa(q, q, q, is_causal=True), oft.linear(x, weight, None)

    calls: dict[str, list[tuple]] = {}

    def record(graph_module, example_inputs):
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and str(node.target).startswith("opfacade."):
                calls.setdefault(str(node.target), []).append(node.args)
        return graph_module.forward

    torch._dynamo.reset()
    with FakeTensorMode(), torch.no_grad():
        cuda = dict(device="cuda", dtype=torch.bfloat16)
        x, weight, bias = torch.empty(16, 64, **cuda), torch.empty(64, 64, **cuda), torch.empty(
            64, **cuda)
        torch.compile(step, backend=record, fullgraph=True)(x, weight, bias)
    torch._dynamo.reset()
    linears, attentions = calls["opfacade.linear.default"], calls["opfacade.sdpa.default"]
    assert [(args[3], args[4]) for args in linears] == [("gelu_tanh", False), ("none", False)]
    assert len(attentions) == 1 and attentions[0][9] is False
