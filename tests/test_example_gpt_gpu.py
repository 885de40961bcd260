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
