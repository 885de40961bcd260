"""examples/gpt.py's tokens/s report without a GPU: every contestant is made and warmed before
any window is timed, the windows are taken in turn round by round on the same batches, and each
rate is the median of a contestant's windows, with its extremes as the spread."""

from __future__ import annotations


def test_rates_are_medians_of_windows_taken_in_turn(gpt_example, monkeypatch):
    gpt = gpt_example
    events = []
    names = list(gpt.CONTESTANTS)
    # Seconds of each contestant's 3 windows (2 s where not named), handed out round by round
    # in CONTESTANTS order.
    windows = {"opfacade deterministic": [1.0, 2.0, 4.0], "torch eager": [4.0, 2.0, 1.0],
               "torch.compile": [8.0, 2.0, 1.0],
               "opfacade + torch.compile, CUDA graphs": [4.0, 2.0, 8.0]}
    seconds = iter([windows.get(name, [2.0] * 3)[round_] for round_ in range(3)
                    for name in names])

    class FakeTrainer:
        def __init__(self, config, backend, deterministic, compile_mode=None, seed=0):
            self.spec = (backend, deterministic, compile_mode)
            events.append(("made", self.spec))

        def steps(self, batches):
            events.append(("warm", self.spec, len(batches)))
            return []

        def timed_steps(self, batches):
            events.append(("timed", self.spec, len(batches)))
            return [], next(seconds)

    monkeypatch.setattr(gpt, "Trainer", FakeTrainer)
    monkeypatch.setattr(gpt, "batches", lambda config, steps, seed: [(None, None)] * steps)
    config = gpt.Config(batch=2, seq=5)  # 10 tokens a step, 10 steps a window: 100 a window
    found = gpt.measured_rates(config, steps=10, rounds=3, warmup=4)

    specs = [gpt.CONTESTANTS[name] for name in names]
    n = len(specs)
    assert events[:n] == [("made", spec) for spec in specs]
    assert events[n:2 * n] == [("warm", spec, 4) for spec in specs]
    assert events[2 * n:] == [("timed", spec, 10) for spec in specs] * 3
    assert found["opfacade deterministic"] == 100 / 2.0  # windows of 1, 2, 4 s
    assert found["torch eager"] == 100 / 2.0  # 4, 2, 1 s
    assert found["torch.compile"] == 100 / 2.0  # 8, 2, 1 s
    assert found["spread"]["torch.compile"] == [100 / 8.0, 100 / 1.0]
    assert found["opfacade + torch.compile, CUDA graphs"] == 100 / 4.0  # 4, 2, 8 s
    assert set(found) == {*names, "spread"}
    assert {spec[2] for spec in specs} == {None, "default", "reduce-overhead"}
    # Both models with deterministic SKUs, eager and compiled, are among the contestants.
    assert {("opfacade", True, mode) for mode in (None, "default", "reduce-overhead")} <= {
        *specs}
