"""What a torch op's repeat call selected, found by torch's C++ tensor guard instead of by
reading the tensors' facts in Python.

A functional form finds its plan by the facts of its tensors (shape, strides, dtype, device of
each, read in Python and hashed): about 1 us a tensor on the lent hosts. The inference ops
(``sdpa_inference``, ``linear_inference``) are called once per layer per step with tensors whose
facts repeat, so each keeps its last few distinct calls here: a ``TensorGuards`` built from the
call's tensors (the guard torch.compile checks tensors with: dtype, device, dispatch keys, sizes,
strides, requires_grad; ``_internal/call_memo.py`` self-tests it before use) with the call's other
arguments, mapped to what they selected (a plan, its output's allocation). A call that passes a
guard selects what that call selected: the plan depends on nothing else.

An entry holds no tensor (a guard keeps sizes and strides, not the tensors), and a plan that has
been freed is a miss. Calls whose tensors repeat one object (``sdpa(x, x, x)``) are never
stored, as a guard fails every check with one tensor in two places; they take the full path.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from .._internal.call_memo import torch_guards
from .._internal.memory import torch_empty
from ..caches import on_clear

__all__ = ["GuardedCalls", "Selected"]

# torch's guard, or None where it is missing or fails its self-test (then every call selects).
_TENSOR_GUARDS, _WHY_NOT = torch_guards(torch)


class Selected(NamedTuple):
    """What a call selects: its plan, its output's shape, strides, dtype and device, and
    ``extra``, what else the op allocates by (sdpa's stats shape, say)."""

    plan: Any
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    extra: Any = None

    def empty(self) -> torch.Tensor:
        """The output, uninitialised (and unfilled under deterministic algorithms: see
        torch_empty): the op's kernel writes every element."""
        return torch_empty(torch, self.shape, self.dtype, self.device, self.strides)


class GuardedCalls:
    """One op's last ``capacity`` distinct calls, newest first, each (guard, options, selected).

    ``find(tensors, options)`` returns what an earlier call with tensors passing its guard and
    equal ``options`` (the call's other arguments, hashable, and telling how many tensors it
    has: a guard checks exactly as many as it was built from) selected, else None; ``remember``
    stores a call's selection. Threads share it: the entries are one tuple, replaced whole.
    """

    __slots__ = ("_capacity", "_entries")

    def __init__(self, capacity: int = 8):
        self._capacity = capacity
        self._entries: tuple = ()
        on_clear(self.clear)  # opfacade.clear_caches() drops the plans held here too

    def find(self, tensors: tuple[torch.Tensor, ...], options: tuple) -> Selected | None:
        for guard, known, selected in self._entries:
            if known == options and guard.check(*tensors) and not selected.plan.freed:
                return selected
        return None

    def remember(self, tensors: tuple[torch.Tensor, ...], options: tuple,
                 selected: Selected) -> None:
        if _TENSOR_GUARDS is None or len({id(t) for t in tensors}) < len(tensors):
            return  # no guard here, or one that would never pass (see the module's docstring)
        guard = _TENSOR_GUARDS(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)
        kept = [entry for entry in self._entries if entry[2] is not selected]
        self._entries = ((guard, options, selected), *kept[:self._capacity - 1])

    def clear(self) -> None:
        self._entries = ()

    def __len__(self) -> int:
        return len(self._entries)

