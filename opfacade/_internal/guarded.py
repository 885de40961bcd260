"""What a repeat call of plain torch tensors selected, found by torch's C++ tensor guard instead
of by reading the tensors' facts in Python.

A functional form finds its plan by the facts of its arrays (shape, strides, dtype and device of
each, read in Python and hashed): about 2.8 us for sdpa's three on a development host, where a
guard check of the same tensors takes 0.7 us. The sdpa and linear forms (and opfacade.torch's
ops, which share their code) keep each common call's selection here: a ``TensorGuards`` built
from the call's tensors (the guard torch.compile checks tensors with: dtype, device, dispatch
keys, sizes, strides, requires_grad; ``call_keys.torch_guards`` self-tests it before use) with
the call's other arguments, mapped to what they selected (a plan and its output's allocation). A
call that passes a guard selects what that call selected: the plan depends on nothing else, and
run() still checks every call through its own memo.

An entry holds no tensor (a guard keeps sizes and strides, not the tensors), and a plan that has
been freed is a miss. Calls whose tensors repeat one object (``sdpa(x, x, x)``) are never
stored, as a guard fails every check with one tensor in two places; they take the full path.
torch is not imported here: the first call that stores an entry was handed torch tensors.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, NamedTuple

from .call_keys import torch_guards
from .memory import torch_empty

__all__ = ["Allocation", "GuardedCalls", "Selected", "clear_all", "laid_out_as"]

_GUARDS: list = []  # [torch's TensorGuards, or None where it is missing or fails its self-test]
_EVERY: weakref.WeakSet = weakref.WeakSet()  # every GuardedCalls, for clear_all


def laid_out_as(tensor: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether ``tensor`` has exactly this shape and these strides. For dense strides the tensor
    is then dense too, and an output of this layout can be ``torch.empty_like(tensor)``, which
    parses no arguments (torch_empty's ``like``)."""
    return tuple(tensor.shape) == shape and tuple(tensor.stride()) == strides


class Allocation(NamedTuple):
    """How a guarded call allocates one of several outputs (a backward's gradients): its shape
    and dense strides, and ``like_input``: laid_out_as the call's input it is made for."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    like_input: bool

    @classmethod
    def of(cls, shape: tuple[int, ...], strides: tuple[int, ...], tensor: Any = None
           ) -> Allocation:
        return cls(shape, strides, tensor is not None and laid_out_as(tensor, shape, strides))

    def empty(self, tensor: Any, dtype: Any, device: Any) -> Any:
        """The output, uninitialised (as Selected.empty), like ``tensor`` when ``like_input``."""
        return torch_empty(sys.modules["torch"], self.shape, dtype, device, self.strides,
                           like=tensor if self.like_input else None)


class Selected(NamedTuple):
    """What a call selects: its plan, its output's shape, strides, torch dtype and device,
    ``extra``, what else the op allocates by (sdpa's stats shape and dtype, say), and
    ``like_first``: the output has exactly the first tensor's shape, strides and dtype, and
    that tensor is dense (sdpa's out where Dv = D and q is not a view into packed QKV)."""

    plan: Any
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: Any
    device: Any
    extra: Any = None
    like_first: bool = False

    def empty(self, first: Any = None) -> Any:
        """The output, uninitialised (and unfilled under deterministic algorithms: see
        torch_empty): the op's kernel writes every element. ``first``: the call's first tensor,
        allocated like when ``like_first`` (the guard that found this entry passed it with the
        same shape, strides and dtype)."""
        return torch_empty(sys.modules["torch"], self.shape, self.dtype, self.device,
                           self.strides, like=first if self.like_first else None)


class GuardedCalls:
    """One op's last ``capacity`` distinct calls, newest first, each (guard, tensor count,
    options, selected).

    ``find(tensors, options)`` returns what an earlier call with as many tensors, passing its
    guard, and equal ``options`` (the call's other arguments) selected, else None; ``remember``
    stores a call's selection. The count is compared first because a guard checks exactly as
    many tensors as it was built from and raises TypeError on any other number (linear's
    backward passes its aux only when there is one). Threads share it: the entries are one
    tuple, replaced whole.
    """

    __slots__ = ("__weakref__", "_capacity", "_entries")

    def __init__(self, capacity: int = 8):
        self._capacity = capacity
        self._entries: tuple = ()
        _EVERY.add(self)

    def find(self, tensors: tuple, options: tuple) -> Selected | None:
        count = len(tensors)
        for guard, known_count, known, selected in self._entries:
            if (known_count == count and known == options and guard.check(*tensors)
                    and not selected.plan.freed):
                return selected
        return None

    def remember(self, tensors: tuple, options: tuple, selected: Selected) -> None:
        if not _GUARDS:
            _GUARDS.append(torch_guards(sys.modules["torch"])[0])
        guards = _GUARDS[0]
        if guards is None or len({id(t) for t in tensors}) < len(tensors):
            return  # no guard here, or one that would never pass (see the module's docstring)
        guard = guards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)
        kept = [entry for entry in self._entries if entry[3] is not selected]
        self._entries = ((guard, len(tensors), options, selected), *kept[:self._capacity - 1])

    def clear(self) -> None:
        self._entries = ()

    def __len__(self) -> int:
        return len(self._entries)


def clear_all() -> None:
    """Empties every GuardedCalls (opfacade.clear_caches)."""
    for calls in list(_EVERY):
        calls.clear()
