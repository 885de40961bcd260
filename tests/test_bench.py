"""The bench's rows without a GPU: a host-bound contestant is named, its row carries the CUDA-graph
replay times, and the table prints the replay ratios beside the burst ratios."""

from __future__ import annotations

from opfacade._bench import common
from opfacade._bench.common import BenchRow, Timings, format_rows


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


def test_a_contestant_that_could_not_be_captured_is_reported():
    timings = Timings(gpu_ms={"ours": 0.1, "peer": 0.1}, host_ms={"ours": 0.2, "peer": 0.01},
                      graph_ms={}, host_bound=["ours"],
                      why_not_captured="not timed from a CUDA graph: RuntimeError: x")
    row = timings.row("sdpa_forward", "tiny", str)
    assert "not timed from a CUDA graph" in row.notes
    assert "not captured" in format_rows([row])
    assert isinstance(row, BenchRow)


def test_a_contestant_near_its_burst_time_is_timed_from_graphs_and_judged_by_them(monkeypatch):
    """Burst times hide a host-bound contestant (its burst is its host time); the graph replay
    shows the GPU's time, and host >= that marks it. One that cannot be captured is marked too."""
    fns = {"ours": None, "autograd": None, "gemms": None, "raw": None}
    monkeypatch.setattr(common, "time_interleaved",
                        lambda f, reps: {"ours": 0.12, "autograd": 0.35, "gemms": 0.11,
                                         "raw": 0.2})
    monkeypatch.setattr(common, "host_us_interleaved",
                        lambda f, calls, rounds: {"ours": 50.0, "autograd": 260.0, "gemms": 39.0,
                                                  "raw": 150.0})
    captured = {}

    def graphs(f, gpu, reps, stream):
        captured.update(f)
        return {"ours": 0.118, "autograd": 0.15, "gemms": 0.11}, {"raw": "RuntimeError: x"}

    monkeypatch.setattr(common, "time_in_cuda_graphs", graphs)
    monkeypatch.setattr(common, "RETIME_IN_GRAPHS", True)
    timings = common.time_contestants(fns, graph_fns={"autograd": "captured form"})
    assert captured["autograd"] == "captured form"
    assert timings.host_bound == ["autograd", "raw"]
    assert "raw not captured in a CUDA graph (RuntimeError: x)" in timings.why_not_captured
    row = timings.row("linear", "bwd", str)
    assert row.graph_ms["ours"] == 0.118 and "autograd (host 0.260 ms" in row.notes


def test_nobody_near_its_burst_time_means_no_graphs(monkeypatch):
    monkeypatch.setattr(common, "time_interleaved", lambda f, reps: {"ours": 1.0, "peer": 2.0})
    monkeypatch.setattr(common, "host_us_interleaved",
                        lambda f, calls, rounds: {"ours": 10.0, "peer": 30.0})
    monkeypatch.setattr(common, "time_in_cuda_graphs", lambda *a: (_ for _ in ()).throw(
        AssertionError("no graph should be captured")))
    timings = common.time_contestants({"ours": None, "peer": None})
    assert timings.host_bound == [] and timings.graph_ms == {}


def test_by_default_a_suspect_row_is_marked_without_graphs(monkeypatch):
    monkeypatch.setattr(common, "time_interleaved", lambda f, reps: {"ours": 0.12, "auto": 0.35})
    monkeypatch.setattr(common, "host_us_interleaved",
                        lambda f, calls, rounds: {"ours": 10.0, "auto": 260.0})
    monkeypatch.setattr(common, "time_in_cuda_graphs", lambda *a: (_ for _ in ()).throw(
        AssertionError("graphs are opt-in")))
    timings = common.time_contestants({"ours": None, "auto": None})
    assert timings.host_bound == ["auto"] and timings.graph_ms == {}
    row = timings.row("linear", "bwd", str)
    assert "auto (host 0.260 ms per call, burst 0.350 ms)" in row.notes
    assert "opfacade bench --graphs" in row.notes and "not captured" in format_rows([row])
