"""examples/gpt.py at a small size: two deterministic training runs give the same bits (losses
and weights), and the first step's gradients of the f32 model match the same model in pure
torch float64."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

SMALL = dict(layers=2, width=128, heads=4, heads_kv=2, seq=128, vocab=512, batch=2)


@pytest.fixture
def gpt(gpt_example):
    return gpt_example


def test_two_deterministic_runs_are_bitwise_equal(gpt):
    import torch

    config = gpt.Config(**SMALL)
    losses, weights, _ = gpt.train(config, steps=6, warmup=0)
    again, weights_again, _ = gpt.train(config, steps=6, warmup=0)
    assert losses == again
    assert all(torch.equal(weights[name], weights_again[name]) for name in weights)
    assert losses[-1] < losses[0]  # it learns something


def test_first_step_gradients_match_torch_float64(gpt):
    errors = gpt.gradient_check(gpt.Config(**SMALL))
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-4, (worst, errors[worst])


def test_training_replayed_from_cuda_graphs_follows_eager_training(gpt):
    """The model and its loss under torch.compile(mode="reduce-overhead"): forward and backward
    of our ops replayed from CUDA graphs, nothing skipped, the losses those of eager training
    (inductor fuses the glue differently, so within bf16 rounding, not bitwise)."""
    from torch._dynamo.utils import counters

    config = gpt.Config(**SMALL)
    data = list(gpt.batches(config, 8, seed=1))
    counters.clear()
    graphed = gpt.Trainer(config, "opfacade", False, "reduce-overhead").steps(data)
    assert not counters["inductor"].get("cudagraph_skips"), dict(counters["inductor"])
    eager = gpt.Trainer(config, "opfacade", False).steps(data)
    for step, (a, b) in enumerate(zip(graphed, eager, strict=True)):
        assert abs(float(a) - float(b)) < 2e-2 * abs(float(b)), (step, float(a), float(b))


def test_deterministic_model_replayed_from_cuda_graphs_repeats_bitwise(gpt):
    """The deterministic model under torch.compile(mode="reduce-overhead") and
    torch.use_deterministic_algorithms: nothing skipped from the graphs, and two trainings from
    the same seed give the same losses, bit for bit."""
    from torch._dynamo.utils import counters

    config = gpt.Config(**SMALL)
    data = list(gpt.batches(config, 6, seed=1))
    counters.clear()
    first = gpt.Trainer(config, "opfacade", True, "reduce-overhead").steps(data)
    assert not counters["inductor"].get("cudagraph_skips"), dict(counters["inductor"])
    again = gpt.Trainer(config, "opfacade", True, "reduce-overhead").steps(data)
    assert [float(v) for v in first] == [float(v) for v in again]
    assert float(first[-1]) < float(first[0])
