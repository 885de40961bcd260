"""The cuDNN backend's graphs without a GPU, through its real build, cache and run paths with the
device, the handle and the frontend's build faked: only cuDNN's genuine "not supported" is cached
(as a decline); any other failure is typed, reported and built again next time; ``Plan.free``
and ``clear_caches`` release what was built; builds, hits, misses and fallbacks are logged; one
execution path, with the raw-pointer call or the public execute behind it. Real graphs are
test_sdpa_gpu.py."""

from __future__ import annotations

import contextlib
import ctypes
import logging

import pytest

import opfacade
from opfacade import ArchSku, LayoutMismatch, Plan, ReasonCode
from opfacade._backends.cudnn import graphs, limits, runtime
from opfacade._backends.cudnn import sdpa as cudnn_sdpa
from opfacade._internal.sku import Workspace
from opfacade._internal.tensors import TensorView, c_strides
from opfacade.contracts.sdpa import _bind_forward, dense_strides
from opfacade.errors import BackendUnavailable, BufferTooSmall, LaunchFailed, Unsupported
from opfacade.ops.sdpa import SdpaArgs, SdpaBackwardDescriptor, SdpaDescriptor
from opfacade.plan import Target
from opfacade.types import ElementKind

FORWARD_SKUS = cudnn_sdpa.SKUS["sdpa_forward"]
BACKWARD_SKUS = cudnn_sdpa.SKUS["sdpa_backward"]
COMMON = dict(batch=2, heads_q=4, heads_kv=2, seq_q=16, seq_kv=24, head_dim=64)
ON_DEVICE = Target(ArchSku.sm90, device=0)  # a selection that builds (on a faked device)


def forward(**kw):
    return SdpaDescriptor(**{**COMMON, "element": "bf16", **kw})


def backward(**kw):
    return SdpaBackwardDescriptor(**{**COMMON, "element": "bf16", **kw})


def sku(impls, qualifier=""):
    return next(i for i in impls if i.sku.element == "bf16"
                and i.sku.id.endswith("deterministic") == (qualifier == "deterministic"))


class FakeLaunch:
    """A built graph's launcher: records what reaches the graph; bind fixes the arguments."""

    def __init__(self, calls: list):
        self.calls = calls

    def bind(self, pointers, workspace, handle):
        return lambda: self.calls.append((list(pointers), workspace, handle))


def built_graph(names=("q", "k", "v", "out"), workspace_size=0, calls=None):
    return graphs.BuiltGraph(None, names, workspace_size, "fake", FakeLaunch(
        [] if calls is None else calls))


@pytest.fixture
def fresh_graphs(monkeypatch):
    """An empty graph cache in place of GRAPHS, and no SKU memo left over either way."""
    cache = graphs.GraphCache()
    monkeypatch.setattr(graphs, "GRAPHS", cache)
    cudnn_sdpa.clear()
    yield cache
    cudnn_sdpa.clear()


@pytest.fixture
def frontend(monkeypatch, fresh_graphs):
    """The real build (GraphCache -> _build -> declare -> finish) with the device, the handle and
    the declaration faked: ``frontend.outcome`` is what finish() returns or raises."""
    pytest.importorskip("cudnn")
    if runtime.available() is not None:
        pytest.skip(runtime.available())

    class Frontend:
        outcome: object = None
        finished = 0

        def finish(self):
            self.finished += 1
            if isinstance(self.outcome, BaseException):
                raise self.outcome
            return self.outcome

    fake = Frontend()
    monkeypatch.setattr(graphs, "on_device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(runtime, "handle_for", lambda device: None)
    monkeypatch.setattr(runtime, "bind_build_stream", lambda handle: None)  # no handle to bind
    monkeypatch.setattr(graphs, "declare_forward", lambda desc, handle, variant: fake)
    monkeypatch.setattr(graphs, "declare_backward", lambda desc, handle, variant: fake)
    return fake


def cudnn_version() -> str:
    return f"cuDNN {limits.format_version(runtime.backend_version())}"


def bound_views(desc, base=1 << 32):
    """Bound forward args of fake device tensors, 16 MiB apart from ``base``, in bhsd order."""

    def view(index, shape, element=desc.element):
        return TensorView(base + index * (1 << 24), shape, c_strides(shape), element, 0, "cupy",
                          None)

    args = SdpaArgs(view(0, desc.q_shape), view(1, desc.k_shape), view(2, desc.v_shape),
                    view(3, desc.o_shape),
                    view(4, desc.stats_shape, ElementKind.f32) if desc.save_stats else None,
                    view(5, desc.bias_shape) if desc.bias else None)
    return args, _bind_forward(desc, args)


# ----------------------------------------------------------------------------- the build order


def test_build_in_order_runs_the_frontends_steps_in_the_fixed_order_and_stops_at_a_decline():
    class Cudnn:
        class heur_mode:  # noqa: N801 - the frontend's name
            A, FALLBACK = "A", "FALLBACK"

    class Graph:
        def __init__(self, refuse_at=None):
            self.steps, self.refuse_at = [], refuse_at

        def __getattr__(self, step):
            def call(*args):
                self.steps.append((step, *args))
                if step == self.refuse_at:
                    raise RuntimeError(f"{step}: not supported")
            return call

    graph = Graph()
    assert graphs.build_in_order(graph, Cudnn) is graph
    assert graph.steps == [("validate",), ("build_operation_graph",),
                           ("create_execution_plans", ["A", "FALLBACK"]), ("check_support",),
                           ("build_plans",)]
    refusing = Graph(refuse_at="check_support")
    with pytest.raises(RuntimeError, match="check_support: not supported"):
        graphs.build_in_order(refusing, Cudnn)
    assert [step[0] for step in refusing.steps][-1] == "check_support"


# ----------------------------------------------------------------------------- what is cached


def test_not_supported_is_built_once_and_cached_as_a_decline(frontend):
    """The frontend's "not supported" from any build step is a Declined naming cuDNN's version:
    selection reports it as a reason, a run raises Unsupported, and neither builds again."""
    import cudnn

    frontend.outcome = cudnn.cudnnGraphNotSupportedError("no engine for this graph")
    desc = forward(save_stats=True, seq_q=48)
    impl = sku(FORWARD_SKUS)
    unfit = impl.unfit_on(desc, ON_DEVICE)
    assert unfit.code is ReasonCode.feature_unsupported
    assert unfit.detail == f"{cudnn_version()}: no engine for this graph"
    assert impl.unfit_on(desc, ON_DEVICE) == unfit
    with pytest.raises(Unsupported, match="no engine for this graph"):
        impl.launch(desc, bound_views(desc)[1], Workspace(1 << 40, 4096, 0), 0)
    assert frontend.finished == 1 and len(graphs.GRAPHS) == 1  # the decline is cached
    # Without a device the same problem is viable pending graph support, with an estimate.
    assert impl.unfit_on(desc, Target(ArchSku.sm90)) is None
    assert impl.workspace_size_on(desc, Target(ArchSku.sm90)) == 0


def test_other_build_failures_are_not_cached_and_surface_typed(frontend):
    """Out of memory (or any error but "not supported") is a build_failed verdict at selection
    and LaunchFailed at run time, naming cuDNN's version and the error; nothing is cached, so
    every selection and run tries again, and one that succeeds is cached as usual."""
    frontend.outcome = RuntimeError("CUDNN_STATUS_ALLOC_FAILED: out of memory")
    desc = forward(save_stats=True, bias="1hqk")
    impl = sku(FORWARD_SKUS)
    message = (f"{cudnn_version()} failed to build the forward graph on cuda:0: RuntimeError: "
               "CUDNN_STATUS_ALLOC_FAILED: out of memory")
    unfit = impl.unfit_on(desc, ON_DEVICE)
    assert unfit.code is ReasonCode.build_failed and unfit.detail == message
    assert impl.unfit_on(desc, ON_DEVICE).code is ReasonCode.build_failed
    assert frontend.finished == 2 and len(graphs.GRAPHS) == 0
    _, bound = bound_views(desc)
    with pytest.raises(LaunchFailed, match="out of memory") as caught:
        impl.launch(desc, bound, Workspace(1 << 40, 4096, 0), 0)
    assert str(caught.value) == message and not isinstance(caught.value, Unsupported)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert frontend.finished == 3
    # The memory is back: the next selection builds, and what it built is kept.
    frontend.outcome = built_graph(workspace_size=512)
    assert impl.unfit_on(desc, ON_DEVICE) is None
    assert impl.workspace_size_on(desc, ON_DEVICE) == 512
    assert frontend.finished == 4 and len(graphs.GRAPHS) == 1


def test_our_own_errors_in_a_build_are_not_declines(frontend, monkeypatch):
    """BackendUnavailable is a NotImplementedError, as the frontend's python validator's
    declines are: it must still surface as itself, uncached."""

    def no_cupy(device):
        raise BackendUnavailable("CuPy failed to import, so no GPU can be used: test")

    monkeypatch.setattr(graphs, "on_device", no_cupy)
    desc = backward()
    impl = sku(BACKWARD_SKUS)
    unfit = impl.unfit_on(desc, ON_DEVICE)
    assert unfit.code is ReasonCode.backend_unavailable and "CuPy failed" in unfit.detail
    with pytest.raises(BackendUnavailable):
        graphs.backward_graph(desc, 0, deterministic=False)
    assert len(graphs.GRAPHS) == 0


def test_the_cache_builds_once_per_key_and_stores_no_failure():
    builds = []

    def build(key):
        builds.append(key)
        if key.device == 1:
            raise LaunchFailed("cuDNN 9.19.0 failed to build: out of memory")
        return graphs.Declined("not supported") if key.variant else built_graph()

    cache = graphs.GraphCache(capacity=3, build=build)
    desc = backward()
    key = graphs.GraphKey("backward", desc, 0, False)
    assert cache.get(key) is cache.get(key) and builds == [key]
    assert isinstance(cache.get(key._replace(variant=True)), graphs.Declined)
    for _ in range(2):
        with pytest.raises(LaunchFailed):
            cache.get(key._replace(device=1))
    assert len(cache) == 2 and builds.count(key._replace(device=1)) == 2
    for seq in (32, 40):  # past the capacity the oldest goes first
        cache.get(key._replace(desc=backward(seq_q=seq)))
    assert len(cache) == 3
    cache.get(key)
    assert builds.count(key) == 2


# ----------------------------------------------------------------------------- releasing


def test_free_releases_the_graphs_built_for_its_problem(frontend):
    """Plan.free drops its SKU's graphs for its problem (every device) and the SKU's memo of
    them; other problems' and other SKUs' graphs stay."""
    frontend.outcome = built_graph()
    desc, other = forward(), forward(seq_q=32)
    impl = sku(FORWARD_SKUS)
    for d in (desc, other):
        assert impl.unfit_on(d, ON_DEVICE) is None
    impl._graph_for_run(desc, 0)
    plan = Plan.select(desc, arch="sm90")
    assert plan._impl is impl
    plan.free()
    keys = {(key.desc, key.device) for key in graphs.GRAPHS._entries}
    assert keys == {(other, 0)}
    assert impl._graphs.get(desc, 0) is None
    # The deterministic backward's plan leaves the default backward's graph alone.
    grad = backward()
    for qualifier in ("", "deterministic"):
        assert sku(BACKWARD_SKUS, qualifier).unfit_on(grad, ON_DEVICE) is None
    Plan.select(grad, {"deterministic": True}, arch="sm90").free()
    assert {(k.desc, k.variant) for k in graphs.GRAPHS._entries if k.desc == grad} == \
        {(grad, False)}
    assert frontend.finished == 4


def test_clear_caches_drops_graphs_declines_and_memos(frontend):
    import cudnn

    impl = sku(FORWARD_SKUS)
    frontend.outcome = built_graph()
    impl._graph_for_run(forward(), 0)
    frontend.outcome = cudnn.cudnnGraphNotSupportedError("no")
    impl.unfit_on(forward(seq_q=32), ON_DEVICE)
    assert len(graphs.GRAPHS) == 2
    opfacade.clear_caches()
    assert len(graphs.GRAPHS) == 0 and impl._graphs.get(forward(), 0) is None
    impl.unfit_on(forward(seq_q=32), ON_DEVICE)
    assert frontend.finished == 3  # built again after the clear


def test_builds_hits_and_misses_are_logged_at_debug(frontend, caplog):
    frontend.outcome = built_graph()
    impl = sku(FORWARD_SKUS)
    with caplog.at_level(logging.DEBUG, logger="opfacade"):
        impl.unfit_on(forward(), ON_DEVICE)
        impl.unfit_on(forward(), ON_DEVICE)
        frontend.outcome = RuntimeError("out of memory")
        impl.unfit_on(forward(seq_q=32), ON_DEVICE)
    text = caplog.text
    assert "cuDNN graph cache miss: forward graph on cuda:0" in text
    assert "cuDNN graph cache hit: forward graph on cuda:0" in text
    assert "ms: cuDNN forward graph on cuda:0" in text  # the build, with its milliseconds
    assert "build failed after" in text and "RuntimeError: out of memory" in text


# ----------------------------------------------------------------------------- executing


class _FakeLowered:
    def __init__(self):
        self.calls = []

    def _execute_with_raw_ptrs(self, address, n, workspace, handle, index):
        self.calls.append((list((ctypes.c_void_p * n).from_address(address)), workspace,
                           handle, index))


class _FakeGraph:
    def __init__(self, order, raw=True, deserialized=False):
        self.selected_engine = None
        self._plan_index = None if deserialized else 0
        self._plans = [] if deserialized else ["the built plan"]
        self._lowered_graph = _FakeLowered() if raw else object()
        self._order = order
        self.executed = []

    def _variant_pack_uids(self):
        return list(self._order)

    def _materialize_backend_plan(self, index):
        return type("Config", (), {"cpp_index": 3})()

    def execute(self, pack, workspace, handle=None):
        self.executed.append((pack, workspace, handle))


def test_launcher_uses_the_raw_pointer_call_and_logs_each_fall_back(monkeypatch, caplog):
    handle = type("Handle", (), {"backend_handle": 77})()
    fake = _FakeGraph((1, 2, 4))
    launch = graphs._Launcher(fake, (1, 2, 4))
    assert launch.raw
    pointers = [0x1000, 0x2000, 0x4000]
    with caplog.at_level(logging.DEBUG, logger="opfacade"):
        launch.bind(pointers, 0x9000, handle)()
        assert "public" not in caplog.text
        monkeypatch.setattr(graphs, "EXECUTE_PATH", "public")
        launch.bind(pointers, 0x9000, handle)()
    assert fake._lowered_graph.calls == [(pointers, 0x9000, 77, 3)]
    assert fake.executed == [({1: 0x1000, 2: 0x2000, 4: 0x4000}, 0x9000, handle)]
    assert "public graph.execute: EXECUTE_PATH is 'public'" in caplog.text
    monkeypatch.setattr(graphs, "EXECUTE_PATH", "auto")
    # A graph whose operand list is not exactly ours, or without the raw entry: public path.
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="opfacade"):
        for graph in (_FakeGraph((1, 2, 4, 9)), _FakeGraph((1, 2, 4), raw=False)):
            launcher = graphs._Launcher(graph, (1, 2, 4))
            assert not launcher.raw
            launcher.bind(pointers, 0, handle)()
            assert graph.executed
        broken = _FakeGraph((1, 2, 4))
        del broken._plan_index  # the frontend's private surface moved
        assert not graphs._Launcher(broken, (1, 2, 4)).raw
    # A graph the plan store deserialized has no plan list: the loaded plan runs (index -1).
    loaded = _FakeGraph((1, 2, 4), deserialized=True)
    graphs._Launcher(loaded, (1, 2, 4)).bind(pointers, 0, handle)()
    assert loaded._lowered_graph.calls == [(pointers, 0, 77, -1)] and not loaded.executed
    assert "operand UIDs (1, 2, 4, 9) are not the graph's (1, 2, 4)" in caplog.text
    assert "no raw-pointer entry point" in caplog.text
    assert "raw-pointer entry point is unreachable: AttributeError" in caplog.text


def test_launch_binds_the_stream_and_passes_pointers_in_uid_order(monkeypatch, fresh_graphs):
    """The SKU's run path with the graph, handle and device faked: what reaches the graph."""
    desc = forward(save_stats=True, bias="1hqk")
    impl = sku(FORWARD_SKUS)
    calls = []
    answer = {"graph": built_graph(("q", "k", "v", "out", "stats", "bias"), 4096, calls)}
    monkeypatch.setattr(graphs, "GRAPHS", graphs.GraphCache(build=lambda key: answer["graph"]))
    monkeypatch.setattr(runtime, "handle_for", lambda device: f"handle{device}")
    monkeypatch.setattr(runtime, "stream_setter",
                        lambda: lambda handle, stream: calls.append(stream))
    monkeypatch.setattr(cudnn_sdpa, "current_device", lambda: 0)
    base = 1 << 32
    args, bound = bound_views(desc, base)
    impl.check_args(desc, bound)
    workspace = Workspace(base + (6 << 24), 4096, 0)
    impl.launch(desc, bound, workspace, stream=77)
    expected = [77, ([base + i * (1 << 24) for i in range(6)], base + (6 << 24), "handle0")]
    assert calls == expected
    calls.clear()
    prepared = impl.prepared(desc, bound, workspace, stream=77)
    prepared()
    prepared()
    assert calls == expected * 2
    with pytest.raises(BufferTooSmall, match="needs 4096"):
        impl.launch(desc, bound, Workspace(base + (6 << 24), 4095, 0), stream=77)
    misaligned = SdpaArgs(**{**vars(args), "q": TensorView(
        base + 8, desc.q_shape, c_strides(desc.q_shape), desc.element, 0, "cupy", None)})
    with pytest.raises(LayoutMismatch, match="q must be 16-byte aligned"):
        impl.check_args(desc, _bind_forward(desc, misaligned))
    bshd = dense_strides("bshd", *desc.q_shape)
    transposed = SdpaArgs(**{**vars(args), "q": TensorView(
        base, desc.q_shape, bshd, desc.element, 0, "cupy", None)})
    with pytest.raises(LayoutMismatch, match="q must have the dense bhsd strides"):
        impl.check_args(desc, _bind_forward(desc, transposed))
    other = forward(save_stats=True, bias="1hqk", scale=0.5)  # not yet cached for a run
    answer["graph"] = graphs.Declined("cuDNN 9.19.0: not supported")
    with pytest.raises(Unsupported, match="cuDNN 9.19.0: not supported"):
        impl.launch(other, bound, Workspace(base, 4096, 0), stream=0)


def test_a_run_off_its_device_makes_the_device_current_around_the_launch(monkeypatch,
                                                                         fresh_graphs, caplog):
    desc = forward(save_stats=True, bias="1hqk")
    impl = sku(FORWARD_SKUS)
    calls = []
    built = built_graph(("q", "k", "v", "out", "stats", "bias"), 0, calls)
    monkeypatch.setattr(graphs, "GRAPHS", graphs.GraphCache(build=lambda key: built))
    monkeypatch.setattr(runtime, "handle_for", lambda device: f"handle{device}")
    monkeypatch.setattr(runtime, "stream_setter",
                        lambda: lambda handle, stream: calls.append(stream))
    monkeypatch.setattr(cudnn_sdpa, "current_device", lambda: 1)

    @contextlib.contextmanager
    def on_device(device):
        calls.append(("enter", device))
        yield
        calls.append(("exit", device))

    monkeypatch.setattr(cudnn_sdpa, "on_device", on_device)
    _, bound = bound_views(desc)
    with caplog.at_level(logging.DEBUG, logger="opfacade"):
        prepared = impl.prepared(desc, bound, Workspace.empty(), stream=5)
    assert "not the current device" in caplog.text
    prepared()
    # The stream is bound inside the switch too: stream 0 means the current device's.
    assert calls[0] == ("enter", 0) and calls[1] == 5 and calls[3] == ("exit", 0)
    assert calls[2][2] == "handle0"


def test_selection_builds_only_the_backward_it_returns(frontend):
    """Ranked from data first: the first viable cuDNN SKU is built, those below it are not, and
    a SKU the preference rules out (the default backward under deterministic=True) is never
    built."""
    from opfacade._internal.selection import NOT_BUILT, rank
    from opfacade._registry import op_named
    from opfacade.types import PlanPreference

    frontend.outcome = built_graph(("q", "k", "v", "out", "grad_out", "stats", "grad_q",
                                    "grad_k", "grad_v"))
    grad, op = backward(), op_named("sdpa_backward")
    report, winner = rank(op, grad, PlanPreference(), ON_DEVICE)
    assert winner is sku(BACKWARD_SKUS) and frontend.finished == 1
    unbuilt = next(v for v in report.verdicts if v.sku.id == sku(BACKWARD_SKUS,
                                                                 "deterministic").sku.id)
    assert NOT_BUILT in unbuilt.detail
    report, winner = rank(op, backward(seq_q=32), PlanPreference(deterministic=True), ON_DEVICE)
    assert winner is sku(BACKWARD_SKUS, "deterministic") and frontend.finished == 2
