"""The bench's timing on a GPU: the settle (common.settle_by_copying) runs on the device before
the bursts and before the CUDA graph replays of a host-bound row."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("timing", ["bursts", "graph replays"])
def test_the_settle_copies_on_the_device_before_the_timed_work(timing):
    torch = pytest.importorskip("torch")
    from opfacade._bench import common, graph_timing

    x = torch.zeros(1 << 16, device="cuda")
    settle = common.settle_by_copying(torch, 1 << 20)
    destination, (source,) = settle.func.__self__, settle.args
    source.fill_(7)
    destination.zero_()
    calls = {"add": lambda: x.add_(1)}
    if timing == "bursts":
        times = common.time_interleaved(calls, reps=2, warmup=1, settle=settle)
    else:
        times, failed = graph_timing.time_in_cuda_graphs(calls, {}, {"add": 3}, 2, settle)
        assert failed == {}
    torch.cuda.synchronize()
    assert times["add"] > 0
    assert destination.numel() == 1 << 20 and bool((destination == 7).all())


def test_the_bench_reads_the_clocks_and_power_it_runs_under():
    from opfacade._bench.device_state import device_state

    state = device_state(0)
    assert state is not None, "NVML should answer on a GPU host"
    assert 0 < state["sm_clock_mhz"] <= state["sm_clock_max_mhz"]
    assert state["memory_clock_max_mhz"] > 0 and state["power_limit_w"] > 50
    assert 0 < state["temperature_c"] < 110 and state["clock_event_reasons"] is not None


def test_a_contestant_timed_alone_gives_a_time_and_its_clock():
    torch = pytest.importorskip("torch")
    from opfacade._bench.sustained import time_sustained

    x = torch.zeros(1 << 24, device="cuda")
    result = time_sustained({"ours": lambda: x.add_(1)}, seconds=0.2)["ours"]
    torch.cuda.synchronize()
    assert 0 < result.ms < 10 and result.sm_clock_mhz and result.sm_clock_mhz > 0
    assert float(x[0]) >= 1
