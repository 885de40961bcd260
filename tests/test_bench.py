"""The bench's rows without a GPU: which contestants are suspected of timing their host, what a
CUDA-graph re-timing may conclude (and when its figures are rejected as implausible), how the
rows say it, and that a failed capture leaves the process timing the default stream."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest

from opfacade._bench import common, graph_timing
from opfacade._bench.common import BenchRow, Timings, format_rows

# -- rows ----------------------------------------------------------------------------------------

def test_a_host_bound_row_names_the_contestant_and_reads_the_graph_times():
    timings = Timings(gpu_ms={"ours": 0.12, "torch autograd": 0.22},
                      host_ms={"ours": 0.01, "torch autograd": 0.25},
                      graph_ms={"ours": 0.118, "torch autograd": 0.140},
                      host_bound=["torch autograd"])
    row = timings.row("linear", "bwd 64x8192x8192", lambda ms: f"{1 / ms:.1f} per ms")
    assert row.ours_ms == 0.12 and row.peers_ms == {"torch autograd": 0.22}
    assert row.host_bound == ["torch autograd"] and row.graph_ms["ours"] == 0.118
    assert row.figure == f"{1 / 0.118:.1f} per ms"  # the GPU's figure, not the host's
    assert "host-bound: torch autograd (host 0.250 ms per call >= GPU 0.140 ms)" in row.notes
    table = format_rows([row])
    assert "HOST-BOUND: torch autograd" in table and f"torch autograd {0.140 / 0.118:.2f}x" in table


def test_a_row_nobody_is_host_bound_in_keeps_the_burst_times():
    timings = Timings(gpu_ms={"ours": 1.0, "peer": 2.0}, host_ms={"ours": 0.01, "peer": 0.02},
                      graph_ms={}, host_bound=[])
    row = timings.row("alibi", "forward", lambda ms: f"{ms:.1f} ms", notes="n")
    assert row.notes == "n" and not row.host_bound and row.figure == "1.0 ms"
    assert "HOST-BOUND" not in format_rows([row])


def test_graph_ratios_name_a_peer_that_was_not_captured_and_a_row_without_ours_has_none():
    captured = Timings(gpu_ms={"ours": 0.1, "a": 0.3, "b": 0.2},
                       host_ms={"ours": 0.01, "a": 0.3, "b": 0.15},
                       graph_ms={"ours": 0.1, "a": 0.12}, host_bound=["a", "b"],
                       graph_notes="b not captured in a CUDA graph (RuntimeError: x)")
    row = captured.row("sdpa_backward", "tiny", str)
    assert "a 1.20x, b not captured" in format_rows([row])
    assert "b (host 0.150 ms per call, burst 0.200 ms)" in row.notes
    assert "b not captured in a CUDA graph (RuntimeError: x)" in row.notes
    without = Timings(gpu_ms={"ours": 0.1, "a": 0.1}, host_ms={"ours": 0.2, "a": 0.01},
                      graph_ms={}, host_bound=["ours"], graph_notes="ours not captured (x)")
    assert "no CUDA-graph figures (see notes)" in format_rows([without.row("op", "c", str)])


# -- suspects and what the graph re-timing concludes ----------------------------------------------

def test_a_suspect_is_a_contestant_whose_host_time_reaches_half_its_burst_time():
    gpu = {"ours": 0.12, "autograd": 0.35, "gemms": 0.11, "edge": 0.2}
    host = {"ours": 0.05, "autograd": 0.26, "gemms": 0.039, "edge": 0.1}
    assert common.suspects(gpu, host) == ["autograd", "edge"]


def test_a_graph_far_below_a_suspects_burst_is_the_correction_the_graphs_are_for():
    """The issue's row: torch autograd's burst (0.347 ms) is its host; its graph (0.13 ms) is the
    GPU's, and it is host-bound; ours (not a suspect) replays at its burst time."""
    gpu = {"ours": 0.12, "torch autograd": 0.347, "gemms": 0.111}
    host = {"ours": 0.050, "torch autograd": 0.261, "gemms": 0.039}
    graph = {"ours": 0.118, "torch autograd": 0.128, "gemms": 0.110}
    timings = common.judge(gpu, host, graph, {})
    assert timings.host_bound == ["torch autograd"] and timings.graph_ms == graph
    row = timings.row("linear", "bwd", lambda ms: f"{ms:.3f}")
    assert row.figure == "0.118" and "torch autograd 1.08x" in format_rows([row])


def test_a_graph_below_half_the_burst_of_a_contestant_not_host_bound_is_implausible():
    """The first H100 run with graphs: our 64x8192x8192 forward at 0.023 ms (370 TFLOP/s) where
    every burst says 0.051 ms and reading the weight alone takes 0.04 ms. Such a row keeps its
    burst figures, marks its suspects and says why."""
    gpu = {"ours": 0.051, "addmm_act": 0.051, "unfused": 0.059}
    host = {"ours": 0.017, "addmm_act": 0.023, "unfused": 0.042}
    graph = {"ours": 0.023, "addmm_act": 0.050, "unfused": 0.052}
    assert set(common.implausible(gpu, graph, ["unfused"])) == {"ours"}
    timings = common.judge(gpu, host, graph, {})
    assert timings.graph_ms == {} and timings.host_bound == ["unfused"]
    row = timings.row("linear", "fwd", lambda ms: f"{ms:.3f}")
    assert row.figure == "0.051"  # the burst, not the implausible graph time
    assert "graph timing implausible" in row.notes and "ours 0.023 ms per call" in row.notes
    assert "no CUDA-graph figures" in format_rows([row])


def test_a_suspect_that_could_not_be_captured_stays_marked_and_the_others_are_judged():
    gpu = {"ours": 0.12, "autograd": 0.35, "raw": 0.2}
    host = {"ours": 0.05, "autograd": 0.26, "raw": 0.15}
    timings = common.judge(gpu, host, {"ours": 0.118, "autograd": 0.15},
                           {"raw": "RuntimeError: x"})
    assert timings.host_bound == ["autograd", "raw"]
    assert "raw not captured in a CUDA graph (RuntimeError: x)" in timings.graph_notes


def test_suspects_that_a_graph_clears_leave_the_burst_figures():
    gpu, host = {"ours": 0.1, "peer": 0.1}, {"ours": 0.06, "peer": 0.01}
    timings = common.judge(gpu, host, {"ours": 0.09, "peer": 0.1}, {})
    assert timings.host_bound == [] and timings.graph_ms == {}


@pytest.fixture
def fake_timing(monkeypatch):
    """time_contestants on fixed burst and host times, recording what goes to the graphs."""
    calls = {}

    def install(gpu, host_us, graph=None, failed=None):
        def bursts(fns, reps, settle=None):
            if settle is not None:
                calls["burst settle"] = settle
            return dict(gpu)

        monkeypatch.setattr(common, "time_interleaved", bursts)
        monkeypatch.setattr(common, "host_us_interleaved",
                            lambda f, calls, rounds: dict(host_us))

        def graphs(fns, makers, counts, reps, settle=None):
            calls.update(fns=fns, makers=makers, counts=counts, reps=reps, settle=settle)
            return dict(graph or {}), dict(failed or {})

        monkeypatch.setattr(graph_timing, "time_in_cuda_graphs", graphs)
        return calls

    return install


def test_a_row_with_a_suspect_times_every_contestant_from_graphs(fake_timing):
    calls = fake_timing({"ours": 0.12, "autograd": 0.35, "gemms": 0.11},
                        {"ours": 50.0, "autograd": 260.0, "gemms": 39.0},
                        {"ours": 0.118, "autograd": 0.15, "gemms": 0.11})
    fns = {"ours": None, "autograd": None, "gemms": None}
    timings = common.time_contestants(fns, 7, makers={"autograd": "maker"})
    assert calls["fns"] is fns and calls["makers"] == {"autograd": "maker"}
    assert calls["counts"] == {"ours": 41, "autograd": 14, "gemms": 45}  # ~BURST_MS each
    assert timings.host_bound == ["autograd"] and timings.graph_ms["ours"] == 0.118


def test_a_settle_reaches_the_bursts_and_the_graph_replays(fake_timing):
    calls = fake_timing({"ours": 0.12, "peer": 0.35}, {"ours": 50.0, "peer": 260.0},
                        {"ours": 0.118, "peer": 0.15})
    settle = object()
    common.time_contestants({"ours": None, "peer": None}, 7, settle=settle)
    assert calls["burst settle"] is settle and calls["settle"] is settle


def test_graph_capture_counts_are_bounded():
    assert common.burst_calls(0.001) == common.MAX_BURST_CALLS == 400
    assert common.burst_calls(0.0) == 400 and common.burst_calls(60.0) == 1


def test_nobody_near_its_burst_time_means_no_graphs(fake_timing):
    calls = fake_timing({"ours": 1.0, "peer": 2.0}, {"ours": 10.0, "peer": 30.0})
    timings = common.time_contestants({"ours": None, "peer": None})
    assert timings.host_bound == [] and timings.graph_ms == {} and not calls


def test_with_graphs_off_a_suspect_row_is_marked_without_graphs(fake_timing, monkeypatch):
    calls = fake_timing({"ours": 0.12, "auto": 0.35}, {"ours": 10.0, "auto": 260.0})
    monkeypatch.setattr(common, "RETIME_IN_GRAPHS", False)
    timings = common.time_contestants({"ours": None, "auto": None})
    assert not calls and timings.host_bound == ["auto"] and timings.graph_ms == {}
    row = timings.row("linear", "bwd", str)
    assert "auto (host 0.260 ms per call, burst 0.350 ms)" in row.notes
    assert "not timed again from CUDA graphs" in row.notes


def test_graphs_are_on_by_default():
    assert common.RETIME_IN_GRAPHS is True


@pytest.mark.parametrize(("work", "calls", "fine"), [
    (None, 98, True), (98, 98, True), (294, 98, True), (1, 1, True),
    (3, 98, False), (0, 4, False), (150, 98, False)])
def test_a_graph_must_hold_the_same_work_for_every_call(work, calls, fine):
    assert (graph_timing.work_count_problem(work, calls) is None) is fine


def test_work_nodes_are_kernels_copies_and_memsets_counted_into_child_graphs():
    kinds = types.SimpleNamespace(CU_GRAPH_NODE_TYPE_KERNEL=0, CU_GRAPH_NODE_TYPE_MEMCPY=1,
                                  CU_GRAPH_NODE_TYPE_MEMSET=2, CU_GRAPH_NODE_TYPE_GRAPH=5,
                                  CU_GRAPH_NODE_TYPE_EVENT_RECORD=7)
    graphs = {"top": [("k", 0), ("copy", 1), ("child", 5), ("event", 7)],
              "child": [("k2", 0), ("set", 2)]}
    ok = 0

    def get_nodes(graph, count):
        nodes = graphs[graph]
        return ok, nodes[:count], len(nodes)

    driver = types.SimpleNamespace(
        CUresult=types.SimpleNamespace(CUDA_SUCCESS=ok), CUgraphNodeType=kinds,
        cuGraphGetNodes=get_nodes, cuGraphNodeGetType=lambda node: (ok, node[1]),
        cuGraphChildGraphNodeGetGraph=lambda node: (ok, node[0]))
    assert graph_timing._count(driver, "top") == (5, 4)
    driver.cuGraphNodeGetType = lambda node: (1, None)
    assert graph_timing._count(driver, "top") == (None, None)


# -- capturing, on a fake torch whose captures can fail the ways a GPU's do -----------------------

class _Stream:
    def __init__(self, name: str):
        self.name, self.capturing, self.cuda_stream = name, False, id(self)

    def __repr__(self) -> str:
        return self.name


class _Graph:
    def __init__(self, cuda, fails_to_end: str | None):
        self.cuda, self.fails_to_end, self.ended, self.stream = cuda, fails_to_end, False, None

    def capture_begin(self, pool, capture_error_mode):
        assert capture_error_mode == "thread_local"
        self.stream = self.cuda.current
        self.stream.capturing = True

    def capture_end(self):
        if self.cuda.current is not self.stream:
            raise RuntimeError("Capture must end on the same stream it began on.")
        if self.fails_to_end == "stuck":  # refused without ending anything
            raise RuntimeError("refused")
        self.stream.capturing = False
        if self.fails_to_end == "invalidated":  # the driver ends it, torch raises before the pool
            raise RuntimeError("operation failed due to a previous error during capture")
        self.ended = True

    def pool(self):
        if not self.ended:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return (1, 0)

    def reset(self):
        self.cuda.log.append("reset")

    def replay(self):
        self.cuda.log.append(f"replay on {self.cuda.current}")


class _Cuda:
    """torch.cuda as capture uses it; the graphs it makes end their captures as told."""

    def __init__(self, fails_to_end: str | None = None):
        self.default = self.current = _Stream("default")
        self.fails_to_end, self.log = fails_to_end, []

    def CUDAGraph(self):  # torch's name; without keep_graph, nodes go uncounted
        return _Graph(self, self.fails_to_end)

    def Stream(self):
        return _Stream("capture")

    def current_stream(self):
        return self.current

    def default_stream(self):
        return self.default

    def set_stream(self, stream):
        self.current = stream

    @contextlib.contextmanager
    def stream(self, stream):
        before, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = before

    def is_current_stream_capturing(self):
        return self.current.capturing

    def synchronize(self):
        if self.default.capturing:
            raise RuntimeError("operation not permitted when stream is capturing")

    def graph_pool_handle(self):
        return (0, 7)

    def current_device(self):
        return 0

    def empty_cache(self):
        self.log.append("empty_cache")


def _torch(cuda: _Cuda):
    released = []
    private = types.SimpleNamespace(
        _cuda_endAllocateToPool=lambda device, pool: released.append(("end", pool)),
        _cuda_releasePool=lambda device, pool: released.append(("release", pool)))
    return types.SimpleNamespace(cuda=cuda, _C=private), released


def _call_failing_in_capture(cuda):
    def call():
        if cuda.current.capturing:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
    return call


@pytest.mark.parametrize("fails_to_end", [None, "invalidated"])
def test_a_call_failing_inside_the_capture_leaves_the_default_stream_current(fails_to_end):
    cuda = _Cuda(fails_to_end)
    torch, released = _torch(cuda)
    with pytest.raises(graph_timing.CaptureFailed, match="not permitted when stream is capturing"):
        graph_timing.capture(torch, lambda stream: _call_failing_in_capture(cuda), 8)
    assert cuda.current is cuda.default and not cuda.default.capturing
    assert "reset" in cuda.log
    # The pool is given back here only when torch's capture_end could not do it.
    assert released == ([] if fails_to_end is None else [("end", (0, 7)), ("release", (0, 7))])


def test_an_invalidated_capture_that_fails_to_end_leaves_the_default_stream_current():
    """What torch.cuda.graph gets wrong: its exit raises from capture_end before it restores the
    stream, and every later launch of the process goes to the capture stream."""
    cuda = _Cuda("invalidated")
    torch, released = _torch(cuda)
    with pytest.raises(graph_timing.CaptureFailed, match="previous error during capture"):
        graph_timing.capture(torch, lambda stream: (lambda: None), 4)
    assert cuda.current is cuda.default and released[-1] == ("release", (0, 7))


def test_a_capture_that_cannot_be_ended_stops_the_bench(monkeypatch):
    cuda = _Cuda("stuck")
    torch, _ = _torch(cuda)
    ended_in_driver = []
    monkeypatch.setattr(graph_timing, "_end_capture_in_driver", ended_in_driver.append)
    with pytest.raises(RuntimeError, match="still underway"):
        graph_timing.capture(torch, lambda stream: _call_failing_in_capture(cuda), 4)
    assert ended_in_driver and cuda.current is cuda.default


def test_a_capture_runs_the_maker_on_its_own_stream_and_warms_up_there_first():
    cuda = _Cuda()
    torch, _ = _torch(cuda)
    seen = []

    def make(stream):
        assert cuda.current is stream and stream is not cuda.default
        return lambda: seen.append((cuda.current.name, cuda.current.capturing))

    captured = graph_timing.capture(torch, make, 5)
    assert captured.calls == 5 and captured.nodes is None and cuda.current is cuda.default
    captured.call()  # kept alive with the graph
    assert seen[:-1] == [("capture", False)] * graph_timing.WARMUP_CALLS + [("capture", True)] * 5


def test_graphs_are_timed_on_the_default_stream_and_released(monkeypatch):
    cuda = _Cuda()
    torch, _ = _torch(cuda)

    class Event:
        def __init__(self, enable_timing):
            self.at = None

        def record(self, stream):
            assert stream is cuda.default
            self.at = len(cuda.log)

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return 2.0

    cuda.Event = Event
    monkeypatch.setitem(sys.modules, "torch", torch)
    times, failed = graph_timing.time_in_cuda_graphs(
        {"ours": lambda: None, "bad": _call_failing_in_capture(cuda)}, {}, {"ours": 4, "bad": 4},
        reps=30)
    assert times == {"ours": 0.5} and "not permitted" in failed["bad"]
    assert cuda.log.count("replay on default") == 2 * graph_timing.MAX_REPLAY_ROUNDS
    assert cuda.log[-2:] == ["reset", "empty_cache"]
    cuda.current = _Stream("elsewhere")
    with pytest.raises(RuntimeError, match="default stream"):
        graph_timing.replay_ms(torch, {}, 1)


# -- the probe -----------------------------------------------------------------------------------

def test_the_graph_probe_imports_without_a_gpu_and_asks_for_its_output_path():
    path = Path(__file__).parents[1] / "scripts" / "bench_graph_probe.py"
    spec = importlib.util.spec_from_file_location("bench_graph_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([]) == 2


def test_rows_are_plain_data_for_the_json_record():
    row = BenchRow("linear", "c", 1.0, "f", {"p": 2.0}, host_ms={"ours": 0.1},
                   graph_ms={"ours": 0.9}, host_bound=["p"])
    assert set(vars(row)) == {"op", "case", "ours_ms", "figure", "peers_ms", "notes", "host_ms",
                              "graph_ms", "host_bound", "sustained_ms"}


def test_first_untimed_leaves_out_each_batchs_first_call(monkeypatch):
    # A call that is slow only as the first after a wait on the GPU (the host's wake-up): each
    # batch's figure counts it, unless its first call runs before the clock starts.
    import time

    waited = [False]
    runtime = types.SimpleNamespace(deviceSynchronize=lambda: waited.__setitem__(0, True))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(
        cuda=types.SimpleNamespace(runtime=runtime)))
    calls = []

    def step():
        calls.append(waited[0])
        if waited[0]:
            waited[0] = False
            time.sleep(0.004)

    batch = common.host_us_interleaved({"step": step}, calls=4, rounds=3)["step"]
    steady = common.host_us_interleaved({"step": step}, calls=4, rounds=3,
                                        first_untimed=True)["step"]
    assert batch >= 1000 > steady  # 4 ms over 4 calls, against calls that do nothing
    assert len(calls) == 2 * 4 + 3 * 4 + 3 * 5  # warm-ups, then the batches


def test_the_step_host_note_times_the_replay_floor_among_the_calls_it_is_the_floor_of(
        monkeypatch):
    # The floor is interleaved with run() and the step (the same batches, the same host state)
    # and reported from the batches that leave each first call out, as the step's own figure.
    timed = []

    def interleaved(fns, calls, rounds=7, first_untimed=False):
        timed.append((sorted(fns), first_untimed))
        return {"run": 9.0 + first_untimed, "step": 5.0 + first_untimed,
                "floor": 4.0 + first_untimed}

    monkeypatch.setattr(common, "host_us_interleaved", interleaved)
    note = common.step_host_note(lambda: None, lambda: None, lambda: None)
    assert timed == [(["floor", "run", "step"], False), (["floor", "run", "step"], True)]
    assert note.endswith("prepared step() 6.0 us, one graph replay of a kernel that does "
                         "nothing 5.0 us")
    assert "nothing" not in common.step_host_note(lambda: None, lambda: None)


# -- the host rows' torch training forward -------------------------------------------------------
@pytest.mark.parametrize("choice", [1, 2, 3])
def test_the_torch_training_forward_is_the_aten_op_of_torchs_choice_with_its_logsumexp(
        monkeypatch, choice):
    """Each backend F.sdpa may pick for inputs that require grad maps to the aten forward its
    training graph calls, with the logsumexp asked for (compute_log_sumexp where the op has it),
    and the call passes q, k, v through unchanged."""
    torch = pytest.importorskip("torch")
    from opfacade._bench import host

    seen = []
    monkeypatch.setattr(torch, "_fused_sdp_choice", lambda *t: seen.append(t) or choice)
    q, k, v = (torch.randn(1, 1, 8, 8) for _ in range(3))
    name, call = host.torch_training_forward(q, k, v)
    assert all(t.requires_grad for t in seen[0])  # torch's choice for a training call
    op = getattr(torch.ops.aten, name.removeprefix("aten.")).default
    outputs = [r.name for r in op._schema.returns]
    assert outputs[1] in ("logsumexp", "log_sumexp")
    arguments = [a.name for a in op._schema.arguments]
    _, extra = host._TRAINING_FORWARDS[choice]
    bound = dict(zip(arguments[3:], extra, strict=False))
    assert bound.get("compute_log_sumexp", True) is True and bound.get("attn_bias") is None
    calls = []
    monkeypatch.setattr(type(op), "__call__", lambda self, *a: calls.append(a))
    call()
    assert calls[0][:3] == (q, k, v) and calls[0][3:] == extra


def test_the_math_backend_has_no_training_forward(monkeypatch):
    torch = pytest.importorskip("torch")
    from opfacade._bench import host

    monkeypatch.setattr(torch, "_fused_sdp_choice", lambda *t: 0)
    q = torch.randn(1, 1, 8, 8)
    assert host.torch_training_forward(q, q, q) == (None, None)


# -- the host rows' floor: torch's own cuDNN ops in a Python autograd.Function -------------------
def test_the_python_floor_is_offered_only_where_torch_picks_cudnn(monkeypatch):
    torch = pytest.importorskip("torch")
    from opfacade._bench import python_floor

    monkeypatch.setattr(torch, "_fused_sdp_choice", lambda *t: 2)  # memory-efficient
    q = torch.randn(1, 1, 8, 8)
    assert python_floor.cudnn_sdpa_in_python_function(q, q, q) is None


def test_the_python_floor_passes_torchs_cudnn_ops_what_their_schemas_name(monkeypatch):
    """The Function's forward asks the cuDNN forward for its logsumexp (no bias, no dropout, not
    causal) and hands its backward exactly the saved tensors and sizes its schema names."""
    torch = pytest.importorskip("torch")
    from opfacade._bench import python_floor

    aten = torch.ops.aten
    forward_op = aten._scaled_dot_product_cudnn_attention.default
    backward_op = aten._scaled_dot_product_cudnn_attention_backward.default
    q, k, v = (torch.randn(1, 1, 8, 8, requires_grad=True) for _ in range(3))
    g = torch.randn(1, 1, 8, 8)
    made = {name: torch.randn(1) for name in ("lse", "cum_q", "cum_k", "seed", "offset")}
    calls = {}

    def call(self, *args):
        calls[self] = args
        if self is forward_op:
            return (args[0] * 2, made["lse"], made["cum_q"], made["cum_k"], 8, 9, made["seed"],
                    made["offset"], torch.empty(0))
        return tuple(t * 3 for t in args[1:4])

    monkeypatch.setattr(torch, "_fused_sdp_choice", lambda *t: 3)
    floor = python_floor.cudnn_sdpa_in_python_function(q, k, v)
    monkeypatch.setattr(type(forward_op), "__call__", call)
    out = floor(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), g)
    names = [a.name for a in forward_op._schema.arguments if not a.kwarg_only]  # scale: default
    bound = dict(zip(names, calls[forward_op], strict=True))
    assert bound["attn_bias"] is None and bound["compute_log_sumexp"] is True
    assert bound["dropout_p"] == 0.0 and bound["is_causal"] is False
    names = [a.name for a in backward_op._schema.arguments if not a.kwarg_only]
    bound = dict(zip(names, calls[backward_op], strict=True))
    assert bound["grad_out"] is g and torch.equal(bound["out"], out)
    assert all(bound[n] is t for n, t in (("query", q), ("key", k), ("value", v)))
    assert bound["logsumexp"] is made["lse"] and bound["philox_seed"] is made["seed"]
    assert bound["philox_offset"] is made["offset"] and bound["attn_bias"] is None
    assert bound["cum_seq_q"] is made["cum_q"] and bound["cum_seq_k"] is made["cum_k"]
    assert (bound["max_q"], bound["max_k"]) == (8, 9)
    assert bound["dropout_p"] == 0.0 and bound["is_causal"] is False
    assert all(torch.equal(grad, t.detach() * 3) for grad, t in zip(grads, (q, k, v), strict=True))


@pytest.mark.parametrize("settled", [False, True], ids=["plain", "settled"])
def test_a_settle_runs_before_every_burst_and_its_untimed_first_call(monkeypatch, settled):
    """time_interleaved's order of work on the device, on fake CUDA events (1 ms a burst): each
    burst is the untimed call then the timed calls, and a settle goes before each of those."""
    done: list[str] = []

    class Event:
        def record(self, stream):
            done.append("record")

        def synchronize(self):
            pass

    cuda = types.SimpleNamespace(Event=Event, Stream=types.SimpleNamespace(null=None),
                                 get_elapsed_time=lambda start, stop: 1.0)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(common, "burst_calls", lambda ms: 2)
    fns = {name: (lambda n=name: done.append(n)) for name in ("ours", "peer")}
    settle = (lambda: done.append("settle")) if settled else None
    times = common.time_interleaved(fns, reps=2, warmup=1, settle=settle)
    assert times == {"ours": 0.5, "peer": 0.5}  # 1 ms over a burst of 2 calls
    first = ["settle"] if settled else []
    assert done == ["ours", "record", "ours", "record",  # each one's warm-up, then a timed call
                    "peer", "record", "peer", "record",
                    *first, "ours", "record", "ours", "ours", "record",
                    *first, "peer", "record", "peer", "peer", "record",
                    *first, "peer", "record", "peer", "peer", "record",  # the order rotates
                    *first, "ours", "record", "ours", "ours", "record"]
