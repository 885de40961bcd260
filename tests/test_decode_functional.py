"""The decode_attention and kv_append functional forms on the host (NumPy arrays select the
float64 reference plan): their results against the reference called directly, and their plans
found by each call's facts, so that a repeat call builds no descriptor while a call that differs
in anything the descriptor reads builds its own."""

from __future__ import annotations

import numpy as np
import pytest

from opfacade._backends.reference import decode_attention as reference_decode
from opfacade.ops import decode_attention as decode_module
from opfacade.ops import kv_append as append_module
from opfacade.ops.decode_attention import decode_attention
from opfacade.ops.kv_append import kv_append


def _problem(seed=0, batch=2, heads_q=4, heads_kv=2, dim=16, capacity=32):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, 1, heads_q, dim))
    k, v = (rng.standard_normal((batch, capacity, heads_kv, dim)) for _ in range(2))
    return q, k, v, np.array([5, capacity], dtype=np.int32)[:batch]


@pytest.fixture
def descriptors(monkeypatch) -> list:
    """The descriptors the two functional forms build, in order."""
    built = []
    for module in (decode_module, append_module):
        original = module._descriptor

        def counting(*args, original=original):
            built.append(original(*args))
            return built[-1]

        monkeypatch.setattr(module, "_descriptor", counting)
    return built


def test_the_functional_decode_matches_the_reference():
    q, k, v, lens = _problem()
    out, lse = decode_attention(q, k, v, lens, scale=0.3, window_left=4, return_lse=True)
    want, want_lse = reference_decode(q, k, v, lens, scale=0.3, window_left=4)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(lse, want_lse)


def test_a_repeat_call_builds_no_descriptor_and_any_new_fact_does(descriptors):
    q, k, v, lens = _problem(seed=1, capacity=48)
    decode_attention(q, k, v, lens)
    decode_attention(q.copy(), k, v, lens)  # other arrays, the same facts
    assert len(descriptors) == 1
    for change in (dict(scale=0.5), dict(window_left=3), dict(return_lse=True)):
        decode_attention(q, k, v, lens, **change)
    decode_attention(q[:, :, :2], k, v, lens)  # fewer query heads
    assert [d.scale for d in descriptors[1:2]] == [0.5]
    assert descriptors[2].window.left == 3 and descriptors[3].save_lse
    assert descriptors[4].heads_q == 2 and len(descriptors) == 5


def test_kv_append_finds_its_plan_by_the_facts_too(descriptors):
    q, k, v, lens = _problem(seed=2, capacity=40)
    new = np.ones((2, 1, 2, 16))
    kv_append(new, new, k, v, lens)
    kv_append(new * 2, new, k, v, lens)
    assert len(descriptors) == 1 and descriptors[0].max_seq == 40
    assert (k[0, 4] == 2).all() and (v[1, 39] == 1).all()
    kv_append(np.ones((2, 2, 2, 16)), np.ones((2, 2, 2, 16)), k, v, lens)  # two new tokens
    assert len(descriptors) == 2 and descriptors[1].q_len == 2


def test_a_bad_first_call_is_refused_and_remembers_nothing(descriptors):
    q, k, v, lens = _problem(seed=3)
    with pytest.raises(Exception, match="q must be 4-D"):
        decode_attention(q[0], k, v, lens)
    assert descriptors == []
