"""cuDNN SDPA and cuBLASLt calls replayed from CUDA graphs (``GraphedLaunches``, graph_replay.py) on
a real GPU: a prepared call and run()'s memoised launch execute directly once, then replay one
graph; each replay reads the tensors' current contents and writes the bits a direct execute
writes, on the caller's stream; a caller's own capture takes the launches directly."""

from __future__ import annotations

import pytest

from opfacade import Plan, PlanPreference, Workspace
from opfacade._internal.graph_replay import GraphedLaunches
from opfacade.ops.sdpa import SdpaArgs, SdpaBackwardArgs, SdpaBackwardDescriptor, SdpaDescriptor

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def capture_early(monkeypatch):
    """Library calls captured at their 2nd call (LIBRARY_CAPTURE_AT counts hundreds), so a few
    calls reach the replay."""
    from opfacade._internal import graph_replay

    monkeypatch.setattr(graph_replay, "LIBRARY_CAPTURE_AT", 2)

SHAPE = dict(batch=2, heads_q=8, heads_kv=2, seq_q=200, seq_kv=300, head_dim=64,
             causal="bottom_right", element="bf16")


def _fill(gen, *tensors) -> None:
    """New contents, from a distribution that is not symmetric (positive, heavy-ish tail)."""
    for t in tensors:
        t.copy_(torch.rand(t.shape, device="cuda", generator=gen).pow(3) * 4 - 0.5)


def _forward(desc: SdpaDescriptor):
    def empty(*shape, dtype=torch.bfloat16):
        return torch.empty(shape, device="cuda", dtype=dtype)

    d = desc
    q = empty(d.batch, d.heads_q, d.seq_q, d.head_dim)
    k = empty(d.batch, d.heads_kv, d.seq_kv, d.head_dim)
    v = empty(d.batch, d.heads_kv, d.seq_kv, d.head_dim)
    out = empty(d.batch, d.heads_q, d.seq_q, d.head_dim)
    stats = empty(d.batch, d.heads_q, d.seq_q, 1, dtype=torch.float32)
    return SdpaArgs(q, k, v, out, stats)


def _replays(call) -> GraphedLaunches:
    graphed = call._call if hasattr(call, "_call") else call
    assert isinstance(graphed, GraphedLaunches)
    return graphed


def _workspace(plan) -> Workspace:
    buffer = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)
    return Workspace(buffer.data_ptr(), plan.workspace_size, 0, buffer)


def test_a_prepared_forward_replays_one_graph_over_new_contents():
    desc = SdpaDescriptor(**SHAPE, save_stats=True)
    plan = Plan.select(desc, PlanPreference(backends={"cudnn"}), device=0)
    gen = torch.Generator(device="cuda").manual_seed(1)
    args, fresh = _forward(desc), _forward(desc)
    stream = torch.cuda.Stream()
    prepared = plan.prepare(args, workspace=_workspace(plan), stream=stream)
    for call in range(4):  # direct, captured then replayed, replayed, replayed
        with torch.cuda.stream(stream):
            _fill(gen, args.q, args.k, args.v)
        prepared()
        stream.synchronize()
        for name in ("q", "k", "v"):
            getattr(fresh, name).copy_(getattr(args, name))
        plan.run(fresh, workspace=_workspace(plan))  # a direct execute on other buffers
        torch.cuda.synchronize()
        assert torch.equal(args.out, fresh.out) and torch.equal(args.stats, fresh.stats), call
    assert _replays(prepared)._exec is not None  # the driver gave a graph: it was replayed


def test_runs_on_the_same_tensors_replay_and_a_callers_capture_gets_the_launches():
    """run()'s memo keeps the replayed call; inside a caller's torch.cuda.graph capture the
    same call launches directly into that graph, which then replays with new contents."""
    desc = SdpaBackwardDescriptor(**SHAPE)
    plan = Plan.select(desc, PlanPreference(backends={"cudnn"}, deterministic=True), device=0)
    forward = Plan.select(SdpaDescriptor(**SHAPE, save_stats=True),
                          PlanPreference(backends={"cudnn"}), device=0)
    gen = torch.Generator(device="cuda").manual_seed(2)
    f = _forward(forward.descriptor)
    _fill(gen, f.q, f.k, f.v)
    forward.run(f)
    grad_out = torch.empty_like(f.out)
    grads = [torch.empty_like(t) for t in (f.q, f.k, f.v)]
    args = SdpaBackwardArgs(f.q, f.k, f.v, f.out, grad_out, f.stats, *grads)
    workspace = _workspace(plan)

    def expected():
        other = [torch.empty_like(t) for t in grads]
        plan.prepare(SdpaBackwardArgs(f.q, f.k, f.v, f.out, grad_out, f.stats, *other),
                     workspace=_workspace(plan))()  # one direct execute
        torch.cuda.synchronize()
        return other

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    for call in range(3):
        with torch.cuda.stream(stream):
            _fill(gen, grad_out)
        plan.run(args, workspace=workspace, stream=stream.cuda_stream)
        stream.synchronize()
        want = expected()
        assert all(torch.equal(a, b) for a, b in zip(grads, want, strict=True)), call
    memoised = plan._calls.table()
    assert any(isinstance(launch, GraphedLaunches) and launch._exec is not None
               for launch, _ in memoised.values())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):  # the memoised call, its stream captured
        plan.run(args, workspace=workspace, stream=stream.cuda_stream)
    for call in range(2):
        with torch.cuda.stream(stream):
            _fill(gen, grad_out)
            graph.replay()
        stream.synchronize()
        want = expected()
        assert all(torch.equal(a, b) for a, b in zip(grads, want, strict=True)), call


def test_runs_alternating_at_one_address_keep_their_replays(monkeypatch):
    """Two calls on the same tensors' memory that the memo's guard tells apart (views with
    requires_grad set, as a framework's autograd path and its no-grad path hold them) each keep
    their prepared call: after both have been captured, alternating between them launches
    nothing directly, and every call writes the same bits."""
    from opfacade._internal import graph_replay

    direct = []
    launch_direct = graph_replay.GraphedLaunches._launch_direct
    monkeypatch.setattr(graph_replay.GraphedLaunches, "_launch_direct",
                        lambda self: direct.append(self) or launch_direct(self))
    desc = SdpaDescriptor(**SHAPE, save_stats=True)
    plan = Plan.select(desc, PlanPreference(backends={"cudnn"}), device=0)
    args = _forward(desc)
    _fill(torch.Generator(device="cuda").manual_seed(3), args.q, args.k, args.v)
    views = SdpaArgs(*(t.detach().requires_grad_() for t in (args.q, args.k, args.v)),
                     args.out, args.stats)
    assert views.q.data_ptr() == args.q.data_ptr()
    plan.run(args)
    torch.cuda.synchronize()
    want = args.out.clone(), args.stats.clone()
    for call in (args, views, args, views):  # each: a direct launch, then its capture
        plan.run(call)
    warm = len(direct)
    for round_ in range(3):
        for call in (args, views):
            args.out.zero_()
            plan.run(call)
            torch.cuda.synchronize()
            assert torch.equal(args.out, want[0]) and torch.equal(args.stats, want[1]), round_
    assert len(direct) == warm  # every alternating call replayed its own graph


def test_a_prepared_linear_with_its_epilogue_replays_over_new_contents():
    from opfacade.ops.linear import LinearArgs, LinearDescriptor, LinearForwardPlan

    desc = LinearDescriptor(m=96, n=80, k=64, element="bf16", activation="gelu_tanh",
                            weight_layout="nk")
    plan = LinearForwardPlan.select(desc, device=0)
    gen = torch.Generator(device="cuda").manual_seed(3)
    x, w, b = (torch.empty(shape, device="cuda", dtype=torch.bfloat16)
               for shape in ((96, 64), (80, 64), (80,)))
    out = torch.empty(96, 80, device="cuda", dtype=torch.bfloat16)
    prepared = plan.prepare(LinearArgs(x, w, b, out=out), workspace=_workspace(plan))
    for call in range(4):
        _fill(gen, x, w, b)
        prepared()
        other = torch.empty_like(out)
        plan.prepare(LinearArgs(x, w, b, out=other), workspace=_workspace(plan))()  # direct
        torch.cuda.synchronize()
        assert torch.equal(out, other), call
    assert _replays(prepared)._exec is not None
