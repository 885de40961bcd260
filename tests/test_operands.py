"""The functional forms' cheap reading of their arrays (opfacade/_internal/operands.py): plain
torch tensors by four attribute reads once wrap has met their type, everything else wrapped;
the two kinds of facts never collide; outputs come out with the strides asked for."""

from __future__ import annotations

import numpy as np
import pytest

from opfacade._internal import operands
from opfacade._internal.tensors import PLAIN_TORCH_TYPES, wrap
from opfacade.types import ElementKind

torch = pytest.importorskip("torch")


def test_plain_torch_tensors_are_read_without_wrapping_once_enrolled():
    t = torch.zeros(2, 3, 5)[:, :, 1:4]
    wrap(t, "t")  # enrols torch.Tensor
    assert torch.Tensor in PLAIN_TORCH_TYPES
    assert operands.facts(t, "t") == (t.shape, (15, 5, 1), torch.float32, -1)
    assert operands.is_plain_torch(operands.facts(t, "t"))
    assert operands.device_of(operands.facts(t, "t")) == "cpu"

    class Tagged(torch.Tensor):  # a subclass answers attribute reads its own way: wrapped
        pass

    tagged = torch.zeros(2, 3).as_subclass(Tagged)
    wrap(tagged, "tagged")
    assert Tagged not in PLAIN_TORCH_TYPES
    assert not operands.is_plain_torch(operands.facts(tagged, "tagged"))


def test_facts_of_other_arrays_are_wrapped_and_never_equal_torchs():
    a = np.zeros((2, 3), np.float32)
    found = operands.facts(a, "a")
    assert found == ((2, 3), (3, 1), ElementKind.f32, None, "numpy")
    assert found != operands.facts(torch.from_numpy(a), "a")
    assert operands.device_of(found) == "cpu"


@pytest.mark.parametrize("like", [torch.zeros(1), np.zeros(1, np.float32)],
                         ids=["torch", "numpy"])
def test_outputs_have_the_strides_asked_for(like):
    like_facts = operands.facts(like, "like")
    plain = operands.allocate(like, like_facts, (2, 3, 4), ElementKind.f32, None)
    assert tuple(plain.shape) == (2, 3, 4)
    bshd = operands.allocate(like, like_facts, (2, 3, 4, 5), ElementKind.f32, None,
                             strides=(60, 5, 15, 1))  # [B, H, S, D] stored [B, S, H, D]
    strides = (bshd.stride() if isinstance(bshd, torch.Tensor)
               else tuple(s // 4 for s in bshd.strides))
    assert tuple(bshd.shape) == (2, 3, 4, 5) and strides == (60, 5, 15, 1)


def test_outputs_skip_the_deterministic_fill_and_restore_torchs_switch():
    # Under torch.use_deterministic_algorithms(True) torch fills every empty tensor; outputs
    # that opfacade's kernels write in full are allocated with that fill switched off, for that
    # allocation only.
    from torch.overrides import TorchFunctionMode

    switch = []

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.empty, torch.empty_strided):
                switch.append(torch.utils.deterministic.fill_uninitialized_memory)
            return func(*args, **(kwargs or {}))

    like = torch.zeros(2, 3)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        with Watch():
            out = operands.allocate(like, operands.facts(like, "like"), (4, 6),
                                    ElementKind.f32, None, (1, 4))
        assert switch == [False] and torch.utils.deterministic.fill_uninitialized_memory
        assert out.stride() == (1, 4)
        with pytest.raises(RuntimeError):  # a failed allocation restores the switch too
            operands.allocate(like, operands.facts(like, "like"), (-1,), ElementKind.f32, None)
        assert torch.utils.deterministic.fill_uninitialized_memory
        torch.use_deterministic_algorithms(False)
        with Watch():
            operands.allocate(like, operands.facts(like, "like"), (4,), ElementKind.f32, None)
        assert switch == [False, True]  # off deterministic mode, nothing is switched
    finally:
        torch.use_deterministic_algorithms(before)
