"""The bench's sustained figures (_bench/sustained.py) without a GPU: a fake CuPy's events time
the sampled calls, a fake NVML reading answers the samples; the row's note and table line."""

from __future__ import annotations

import sys
import time
import types

import pytest

from opfacade._bench import sustained
from opfacade._bench.common import BenchRow, format_rows


@pytest.fixture
def fake_cupy(monkeypatch):
    """Events whose elapsed time is 2 ms per call recorded between them."""
    calls = {"n": 0}

    class Event:
        def record(self, stream):
            self.at = calls["n"]

        def synchronize(self):
            pass

    cuda = types.SimpleNamespace(Event=Event, Stream=types.SimpleNamespace(null=0),
                                 get_elapsed_time=lambda a, b: 2.0 * (b.at - a.at))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(sustained, "_UNSAMPLED_S", 0.01)
    monkeypatch.setattr(sustained, "_SAMPLE_EVERY_S", 0.001)
    return calls


def test_each_contestant_alone_gives_its_time_per_call_clock_and_cap(fake_cupy, monkeypatch):
    readings = {"ours": {"sm_clock_mhz": 1860, "power_draw_w": 698.0, "clock_event_reasons": 4},
                "peer": {"sm_clock_mhz": 1980, "power_draw_w": 555.0, "clock_event_reasons": 0}}
    running = {"name": None}
    monkeypatch.setattr(sustained, "device_state", lambda device: readings[running["name"]])

    def contestant(name):
        def call():  # a call that takes host time, so the reader samples while calls run
            running["name"] = name
            fake_cupy["n"] += 1
            time.sleep(0.001)
        return call

    results = sustained.time_sustained({"ours": contestant("ours"), "peer": contestant("peer")},
                                       seconds=0.05)
    assert results["ours"].ms == pytest.approx(2.0) and results["peer"].ms == pytest.approx(2.0)
    assert fake_cupy["n"] == 2 * (1 + 5 + 1 + 25)  # timed once, 10 ms unsampled, once, 50 ms
    assert results["ours"].sm_clock_mhz == 1860 and results["ours"].power_capped
    assert results["peer"].power_w == 555.0 and not results["peer"].power_capped
    note = sustained.sustained_note(results)
    assert note.startswith("sustained (each alone, back to back for 1 s): ours 2.000 ms at SM "
                           "1860 MHz, 698 W, power-capped; peer 2.000 ms at SM 1980 MHz, 555 W")
    assert note.endswith("(1.00x)")


def test_without_nvml_the_times_stand_alone(fake_cupy, monkeypatch):
    monkeypatch.setattr(sustained, "device_state", lambda device: None)

    def call():
        fake_cupy["n"] += 1

    result = sustained.time_sustained({"ours": call}, seconds=0.02)["ours"]
    assert result.sm_clock_mhz is None and result.power_w is None and not result.power_capped
    assert sustained.sustained_note({"ours": result}).endswith("ours 2.000 ms")


def test_a_row_with_sustained_figures_prints_their_ratios():
    row = BenchRow("varlen_attention_forward", "f32 dense d128", 3.04, "45 TFLOP/s",
                   {"torch sdpa f32": 3.035, "cudnn f32": 5.2},
                   sustained_ms={"ours": 3.2, "torch sdpa f32": 3.06})
    table = format_rows([row])
    assert "SUSTAINED (each alone)" in table and "torch sdpa f32 0.96x" in table
    assert "cudnn f32" not in table.splitlines()[-1]  # not timed alone: no ratio invented
    assert "SUSTAINED" not in format_rows([BenchRow("x", "y", 1.0, "f", {"p": 1.0})])


def test_the_run_is_sized_by_gpu_time_not_the_hosts_clock(fake_cupy):
    # A call the host queues in no time but the GPU runs for 2 ms: 0.2 s of GPU time is 100
    # calls, however fast the host issues them; a tiny kernel stops at _MOST_CALLS.
    def call():
        fake_cupy["n"] += 1

    assert sustained._calls_lasting(call, 0.2) == 100
    assert sustained._calls_lasting(call, 1e6) == sustained._MOST_CALLS


def test_the_varlen_benchs_f32_rows_carry_the_sustained_figures(monkeypatch):
    from opfacade._bench import varlen_attention as bench
    from opfacade._bench.common import Timings

    monkeypatch.setattr(bench, "_timings", lambda fns, reps, makers: Timings(
        {"ours": 3.04, "torch sdpa f32": 3.035}, {"ours": 0.05, "torch sdpa f32": 0.1}, {}, []))
    alone = {"ours": sustained.Sustained(3.2, 1860.0, 698.0, True),
             "torch sdpa f32": sustained.Sustained(3.06, 1980.0, 555.0, False)}
    asked = []
    monkeypatch.setattr(bench, "time_sustained", lambda fns: asked.append(set(fns)) or alone)
    fns = {"ours": lambda: None, "torch sdpa f32": lambda: None}
    row = bench._row("varlen_attention_forward", "f32 dense d128", fns, {}, 3, 1e12, ["n"],
                     sustained=True)
    assert asked == [set(fns)]
    assert row.sustained_ms == {"ours": 3.2, "torch sdpa f32": 3.06}
    assert row.notes.startswith("n; sustained (each alone")
    assert "torch sdpa f32 3.060 ms at SM 1980 MHz, 555 W (0.96x)" in row.notes
    plain = bench._row("varlen_attention_forward", "bf16", fns, {}, 3, 1e12, [])
    assert plain.sustained_ms == {} and len(asked) == 1  # the bf16 rows are not timed alone
