"""run()'s memo of checked calls (``_internal/call_memo.py``): a repeated call launches what the
full path would, any changed fact is checked again, the memo keeps no user tensor alive, and the
stream, thread, workspace and plan lifetime are honoured. The tests marked by ``path`` run with
torch's TensorGuards (the default where it passes its self-test) and with the public-API facts."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

from opfacade import (
    DeviceMismatch,
    DTypeMismatch,
    LayoutMismatch,
    PlanFreed,
    ShapeMismatch,
    Workspace,
)
from opfacade._internal.call_keys import ArgumentReader, torch_guards
from opfacade._internal.call_memo import CallMemo
from opfacade._internal.memory import STREAM_SCRATCH
from opfacade.ops.linear import (
    LinearArgs,
    LinearBackwardArgs,
    LinearBackwardDescriptor,
    LinearDescriptor,
    LinearForwardPlan,
)
from opfacade.plan import Plan

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

M, N, K = 96, 80, 64


def _linear(seed: int = 0, dtype=None):
    dtype = dtype or torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def uniform(*shape):
        return (torch.rand(shape, device="cuda", generator=gen) * 2 - 1).to(dtype)

    return uniform(M, K), uniform(N, K), uniform(N)


def _plan(element: str = "bf16", path: str = "default"):
    """A plan; ``path`` "guards" or "public" gives its memo a reader that reads torch tensors
    that way."""
    desc = LinearDescriptor(m=M, n=N, k=K, element=element, activation="gelu_tanh",
                            weight_layout="nk")
    plan = LinearForwardPlan.select(desc, device=0)
    if path != "default":
        if path == "guards" and torch_guards(torch)[0] is None:
            pytest.skip(f"this torch has no usable TensorGuards: {torch_guards(torch)[1]}")
        reader = ArgumentReader(use_torch_guards=path == "guards")
        plan._calls = CallMemo(plan._checked_launch, reader)
    return plan


@pytest.fixture(params=["guards", "public"])
def path(request) -> str:
    return request.param


def call_key(args, workspace, stream):
    """The key a fresh reader reads (the default: TensorGuards where it passes its self-test)."""
    return ArgumentReader().call_key(args, workspace, stream)


def _expected(x, w, b):
    return torch.nn.functional.gelu(x.float() @ w.float().t() + b.float(), approximate="tanh")


def _assert_matches(out, x, w, b, plan) -> None:
    torch.cuda.synchronize()
    want = _expected(x, w, b)
    assert (out.float() - want).norm() / want.norm() < plan.precision_guarantee.max_rel_error


def _problem(seed: int, path: str = "default"):
    """A plan, its inputs, an output and the args binding them."""
    x, w, b = _linear(seed)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    return _plan(path=path), x, w, b, out, LinearArgs(x, w, b, out=out)


def _entries(plan) -> int:
    return len(plan._calls.table())


def test_repeated_call_hits_and_matches_the_full_path(path):
    plan = _plan(path=path)
    x, w, b = _linear()
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    args = LinearArgs(x, w, b, out=out)
    ws = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)
    plan.run(args, workspace=ws)
    first = out.clone()
    out.fill_(float("nan"))
    plan.run(args, workspace=ws)  # served from the memo
    assert _entries(plan) == 1
    assert torch.equal(out, first)
    prepared = torch.empty_like(out)
    plan.prepare(LinearArgs(x, w, b, out=prepared), workspace=ws)()
    assert torch.equal(prepared, first)
    _assert_matches(out, x, w, b, plan)


def test_new_contents_same_buffers_give_new_results():
    plan, x, w, b, out, args = _problem(1)
    plan.run(args)
    x.copy_(_linear(2)[0])  # same address, new values: the memo holds no results
    plan.run(args)
    _assert_matches(out, x, w, b, plan)


def test_every_changed_fact_is_checked_again(path):
    plan = _plan(path=path)
    x, w, b = _linear(3)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    plan.run(LinearArgs(x, w, b, out=out))
    wide = torch.empty(M, K + 1, device="cuda", dtype=torch.bfloat16)
    misaligned = wide[:, 1:]  # same shape, a pointer 2 bytes off 16-byte alignment
    with pytest.raises(LayoutMismatch) as error:
        plan.run(LinearArgs(misaligned, w, b, out=out))
    assert error.value.argument == "x"
    with pytest.raises(DTypeMismatch) as error:
        plan.run(LinearArgs(x.half(), w, b, out=out))
    assert error.value.argument == "x"
    with pytest.raises(ShapeMismatch) as error:
        plan.run(LinearArgs(x, w, b[:-8], out=out))
    assert error.value.argument == "bias"
    with pytest.raises(DeviceMismatch) as error:
        plan.run(LinearArgs(x.cpu(), w, b, out=out))
    assert error.value.argument == "x"
    with pytest.raises(LayoutMismatch) as error:  # a lazily negated view shares every other fact
        plan.run(LinearArgs(torch._neg_view(x), w, b, out=out))
    assert error.value.argument == "x"
    assert _entries(plan) == 1  # failed checks store nothing


def test_memo_keeps_no_tensor_alive():
    plan = _plan()
    x, w, b = _linear(4)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    ws = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)
    plan.run(LinearArgs(x, w, b, out=out), workspace=ws)
    refs = [weakref.ref(t) for t in (x, w, b, out, ws)]
    del x, w, b, out, ws
    gc.collect()
    assert all(ref() is None for ref in refs)
    assert _entries(plan) == 1


def test_stream_none_follows_the_current_stream(path):
    plan, x, w, b, out, args = _problem(5, path)
    side = torch.cuda.Stream()
    plan.run(args)
    with torch.cuda.stream(side):
        side.wait_stream(torch.cuda.default_stream())
        torch.cuda._sleep(50_000_000)  # holds the side stream so a wrong ordering shows
        out.fill_(0)
        plan.run(args)  # must queue behind the fill on the side stream
    side.synchronize()
    assert _entries(plan) == 2  # one launch per stream
    _assert_matches(out, x, w, b, plan)


def test_each_thread_has_its_own_entries():
    plan, x, w, b, out, args = _problem(6)
    plan.run(args, stream=0)
    counts = []

    def other() -> None:
        plan.run(args, stream=0)
        plan.run(args, stream=0)
        counts.append(_entries(plan))

    worker = threading.Thread(target=other)
    worker.start()
    worker.join()
    torch.cuda.synchronize()
    assert counts == [1] and _entries(plan) == 1
    _assert_matches(out, x, w, b, plan)


def test_freed_plan_raises_after_a_memoised_call():
    plan = _plan()
    x, w, b = _linear(7)
    args = LinearArgs(x, w, b, out=torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
    plan.run(args)
    plan.free()
    with pytest.raises(PlanFreed):
        plan.run(args)


def _backward_problem(seed: int):
    """A linear backward whose workspace holds intermediate buffers, and its arguments: the
    plan, (x, w, b), dy, aux (the pre-activation, in padded rows) and the gradients to fill."""
    desc = LinearBackwardDescriptor(m=M, n=N, k=K, element="bf16", activation="gelu_tanh",
                                    weight_layout="nk")
    plan = Plan.select(desc, device=0)
    x, w, b = _linear(seed)
    aux = torch.empty(M, -(-N // 8) * 8, device="cuda", dtype=torch.bfloat16)[:, :N]
    aux.copy_(x.float() @ w.float().t() + b.float())
    dy = (torch.rand(M, N, device="cuda") * 2 - 1).to(torch.bfloat16)
    grads = (torch.empty_like(x), torch.empty_like(w), torch.empty_like(b))
    return plan, (x, w, b), dy, aux, grads


def test_workspace_none_gets_scratch_on_its_stream():
    """A backward with intermediate buffers in its workspace, run twice with workspace=None:
    each call gets scratch on its stream (the stream's block, see StreamScratch)."""
    plan, (x, w, b), dy, aux, grads = _backward_problem(8)
    assert plan.workspace_size > 0
    args = LinearBackwardArgs(dy, x, w, aux, *grads)
    plan.run(args)
    stream = torch.cuda.current_stream().cuda_stream
    block = STREAM_SCRATCH.pointer(plan.workspace_size, 0, stream)
    assert block  # the call above made the current stream's block
    first = [g.clone() for g in grads]
    for g in grads:
        g.fill_(float("nan"))
    plan.run(args)
    torch.cuda.synchronize()
    assert _entries(plan) == 1
    assert STREAM_SCRATCH.pointer(plan.workspace_size, 0, stream) == block
    xr, wr, br = (t.detach().float().requires_grad_() for t in (x, w, b))
    ref = torch.autograd.grad(torch.nn.functional.gelu(
        torch.nn.functional.linear(xr, wr, br), approximate="tanh"), (xr, wr, br), dy.float())
    for got, again, want in zip(grads, first, ref, strict=True):
        assert torch.isfinite(got.float()).all()
        err = (got.float() - want).norm() / want.norm()
        assert err < 2e-2
        assert (again.float() - want).norm() / want.norm() < 2e-2


def test_cupy_arrays_take_the_memo_with_cupys_current_stream():
    import cupy

    plan = _plan("f32")
    rng = np.random.default_rng(9)
    x, w, b = (cupy.asarray(rng.uniform(-1, 1, s).astype(np.float32)) for s in ((M, K), (N, K),
                                                                                (N,)))
    out = cupy.empty((M, N), dtype=cupy.float32)
    args = LinearArgs(x, w, b, out=out)
    stream = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.runtime.deviceSynchronize()
    with stream:
        plan.run(args)
        plan.run(args)
        key, _ = call_key(args, None, None)
    stream.synchronize()
    assert key is not None and key[-1] == stream.ptr
    assert _entries(plan) == 1
    pre = x.get().astype(np.float64) @ w.get().astype(np.float64).T + b.get()
    want = 0.5 * pre * (1 + np.tanh(np.sqrt(2 / np.pi) * (pre + 0.044715 * pre ** 3)))
    assert np.linalg.norm(out.get() - want) / np.linalg.norm(want) < 1e-5


def test_unreadable_arguments_take_the_full_path():
    x, w, b = _linear(10)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    key, tensors = call_key(LinearArgs(x, w, b, out=out), None, None)
    assert key is not None and len(tensors) in (0, 4)  # 4 when torch's guard serves
    assert call_key(LinearArgs(np.zeros((M, K)), w, b, out=out), None, None) == (None, None)
    assert call_key(LinearArgs(x, w, b, out=out), None, torch.cuda.Stream()) == (None, None)
    assert call_key(LinearArgs(x, w, b, out=out), object(), 0) == (None, None)
    assert call_key({"x": x}, None, 0) == (None, None)
    assert call_key(LinearArgs(x, w, b, out=out), Workspace(0, 0, None), 0)[0][-2] == (0, 0, None)


def test_same_address_and_shape_with_other_strides_is_checked_again(path):
    """A padded view at the same address must not reuse the dense view's launch (the key holds
    addresses; strides are the guard's, or the public facts')."""
    plan, x, w, b, _, _ = _problem(11, path)
    storage = torch.full((M * (N + 8),), float("nan"), device="cuda", dtype=torch.bfloat16)
    dense = storage[:M * N].view(M, N)
    padded = storage.as_strided((M, N), (N + 8, 1))
    assert dense.data_ptr() == padded.data_ptr()
    plan.run(LinearArgs(x, w, b, out=dense))
    torch.cuda.synchronize()
    storage.fill_(float("nan"))
    plan.run(LinearArgs(x, w, b, out=padded))
    # The guard's key holds no strides: the checked padded call replaced the dense one. The
    # public facts hold them: a second entry.
    assert _entries(plan) == (1 if path == "guards" else 2)
    _assert_matches(padded, x, w, b, plan)
    assert torch.isnan(storage.view(M, N + 8)[:, N:].float()).all()  # the padding untouched


def test_scratch_under_capture_comes_from_the_graph_not_the_streams_block():
    """run() without a workspace, captured into a CUDA graph: the capture allocates its scratch
    per call (the graph's pool) rather than baking in a stream's block, and each replay
    computes what the eager calls did, however many eager calls run between replays."""
    plan, (x, w, _), dy, aux, grads = _backward_problem(11)
    args = LinearBackwardArgs(dy, x, w, aux, *grads)
    capture = torch.cuda.Stream()
    with torch.cuda.stream(capture):
        plan.run(args)  # eager on the capture stream: its block exists before the capture
        torch.cuda.synchronize()
        eager = [g.clone() for g in grads]
        blocks = len(STREAM_SCRATCH)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=capture):
            plan.run(args)
    assert len(STREAM_SCRATCH) == blocks
    for g in grads:
        g.fill_(float("nan"))
    graph.replay()
    plan.run(LinearBackwardArgs(dy, x, w, aux, *(torch.empty_like(g) for g in grads)))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(grads, eager, strict=True):
        assert torch.equal(got, want)


def test_a_prepared_call_owns_its_scratch_when_the_streams_block_is_replaced():
    """prepare() without a workspace allocates memory the prepared call keeps, never the
    stream's block, which a bigger request on the stream replaces (and frees in stream order)
    while the prepared call may still launch."""
    plan, (x, w, _), dy, aux, grads = _backward_problem(12)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        prepared = plan.prepare(LinearBackwardArgs(dy, x, w, aux, *grads))
        block = STREAM_SCRATCH.pointer(plan.workspace_size, 0, stream.cuda_stream)
        assert prepared._workspace.ptr != block
        prepared()
        first = [g.clone() for g in grads]
        # A request bigger than the block replaces it; the prepared call must not notice.
        assert STREAM_SCRATCH.pointer(STREAM_SCRATCH.LIMIT, 0, stream.cuda_stream) != block
        for g in grads:
            g.fill_(float("nan"))
        prepared()
    torch.cuda.synchronize()
    for got, want in zip(grads, first, strict=True):
        assert torch.equal(got, want)
