"""The inference ops' memo of what a call selected (opfacade/torch/_guarded.py), on host tensors:
a repeat call with tensors of the same facts finds the entry, any changed fact misses, and what
would never hit is never stored."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import opfacade  # noqa: E402
from opfacade.torch._guarded import GuardedCalls, Selected  # noqa: E402


class _Plan:
    freed = False


def _selected(shape=(2, 3)) -> Selected:
    return Selected(_Plan(), shape, (shape[1], 1), torch.float32, torch.device("cpu"))


def _tensors():
    return torch.ones(2, 3), torch.ones(4, 3, dtype=torch.bfloat16)


def test_a_call_with_the_same_facts_finds_what_the_first_selected():
    calls, selected = GuardedCalls(), _selected()
    assert calls.find(_tensors(), ("relu",)) is None
    calls.remember(_tensors(), ("relu",), selected)
    assert calls.find(_tensors(), ("relu",)) is selected  # other objects, the same facts
    assert tuple(selected.empty().shape) == (2, 3)


@pytest.mark.parametrize("changed", [
    lambda a, b: (a.double(), b),                          # dtype
    lambda a, b: (a[:1], b),                               # shape
    lambda a, b: (a.t().contiguous().t(), b),              # strides
    lambda a, b: (a, b.clone().requires_grad_()),          # requires_grad
])
def test_any_changed_fact_misses(changed):
    calls = GuardedCalls()
    calls.remember(_tensors(), ("relu",), _selected())
    assert calls.find(changed(*_tensors()), ("relu",)) is None


def test_other_options_and_a_freed_plan_miss():
    calls, selected = GuardedCalls(), _selected()
    calls.remember(_tensors(), ("relu",), selected)
    assert calls.find(_tensors(), ("none",)) is None
    selected.plan.freed = True
    assert calls.find(_tensors(), ("relu",)) is None


def test_a_call_repeating_one_tensor_is_not_stored():
    # torch's guard fails every check with one tensor object in two places: such an entry
    # would only push useful ones out.
    calls = GuardedCalls()
    a = torch.ones(2, 3)
    calls.remember((a, a), (), _selected())
    assert len(calls) == 0


def test_it_keeps_the_newest_calls_up_to_its_capacity():
    calls = GuardedCalls(capacity=2)
    firsts = [_selected() for _ in range(3)]
    for rows, selected in zip((1, 2, 3), firsts, strict=True):
        calls.remember((torch.ones(rows, 3),), (), selected)
    assert len(calls) == 2
    assert calls.find((torch.ones(1, 3),), ()) is None
    assert calls.find((torch.ones(3, 3),), ()) is firsts[2]
    # Remembering a selection again replaces its entry rather than adding one.
    calls.remember((torch.ones(5, 3),), (), firsts[2])
    assert len(calls) == 2 and calls.find((torch.ones(3, 3),), ()) is None


def test_clear_caches_empties_it():
    calls = GuardedCalls()
    calls.remember(_tensors(), (), _selected())
    opfacade.clear_caches()
    assert len(calls) == 0
