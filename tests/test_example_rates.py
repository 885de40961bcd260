"""examples/gpt.py's tokens/s report without a GPU: each backend's rate is the median of its
interleaved runs, each compiled model runs once (default mode, then CUDA graphs), and the spread
holds every backend's extremes."""

from __future__ import annotations


def test_rates_are_medians_of_interleaved_runs(gpt_example, monkeypatch):
    gpt = gpt_example
    order, rates = [], iter([10.0, 20.0, 30.0, 13.0, 22.0, 31.0, 11.0, 26.0, 35.0, 50.0, 45.0,
                                  60.0, 64.0])

    def train(config, backend="opfacade", steps=50, deterministic=True, compile_mode=None,
              warmup=3):
        order.append((backend, deterministic, compile_mode))
        return [], {}, next(rates)

    monkeypatch.setattr(gpt, "train", train)
    found = gpt.measured_rates(gpt.Config(), steps=50, rounds=3)
    assert order[:3] == [("opfacade", True, None), ("opfacade", False, None),
                         ("torch", False, None)]
    assert order[3:6] == order[:3]
    assert order[-4:] == [("torch", False, "default"), ("opfacade", False, "default"),
                          ("torch", False, "reduce-overhead"),
                          ("opfacade", False, "reduce-overhead")]
    assert found["opfacade deterministic"] == 11.0 and found["opfacade"] == 22.0
    assert found["torch eager"] == 31.0 and found["torch.compile"] == 50.0
    assert found["spread"]["opfacade"] == [20.0, 26.0]
    assert found["spread"]["torch.compile"] == [50.0, 50.0]
    assert found["opfacade + torch.compile"] == 45.0
    assert found["torch.compile, CUDA graphs"] == 60.0
    assert found["opfacade + torch.compile, CUDA graphs"] == 64.0
