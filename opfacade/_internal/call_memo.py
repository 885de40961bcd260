"""Plan.run's memo of checked calls: the facts its checks read, mapped to the launch they allowed.

Every check run() makes (placement, shapes, dtypes, strides, alignment, overlap, the workspace's
size and device) is a function of each tensor's address, shape, strides, dtype and device, of the
workspace's address and size, of the stream handle and of the current device. Checking costs tens
of microseconds; reading the facts much less. So run() reads them and, when the same facts were
checked before on this thread, re-enqueues the launch built then.

torch tensors: the key holds their addresses, and the entry a ``TensorGuards`` (torch's C++
check of dtype, device, dispatch keys (the lazy negation bit among them), sizes and strides, the
one torch.compile guards tensors with), built from the checked call's tensors. Checking nine
tensors that way costs ~0.6 us where reading their facts in Python costs ~7 us. It also compares
requires_grad, so a change there only misses. Where ``TensorGuards`` is missing or fails its
self-test (it must tell apart dtype, sizes, strides and the negation bit), the facts are read in
Python instead.

An entry holds addresses, never the caller's objects: it keeps no tensor alive, and a hit launches
on exactly the addresses of the tensors passed in this call (they are part of the key). Only
types whose facts read exactly take this path: torch.Tensor and nn.Parameter (not other
subclasses: fake, functional and distributed tensors answer differently), cupy.ndarray, TensorView
and Workspace. Anything else (NumPy, JAX, DLPack producers, stream objects) gives no key, and
run() checks in full every time.
"""

from __future__ import annotations

import operator
import sys
import threading
from collections.abc import Callable

from .device import current_device, device_count
from .sku import Workspace
from .streams import current_cupy_stream, current_torch_stream
from .tensors import TensorView

__all__ = ["CallMemo", "call_key"]

_TORCH, _CUPY, _VIEW, _OTHER = 1, 2, 3, 4  # none is 0: `_KINDS.get(t) or ...` must work
_KINDS: dict[type, int] = {TensorView: _VIEW}
_TORCH_TYPES: set[type] = set()  # the common case, tested first
_DATA_PTR: Callable[[object], int] | None = None  # torch.Tensor.data_ptr, once torch is seen


def _kind_of(kind: type) -> int:
    """How the facts of an argument of type ``kind`` are read; decided once per type."""
    global _DATA_PTR
    found = _KINDS.get(kind)
    if found is None:
        found = _OTHER
        root = (kind.__module__ or "").split(".", 1)[0]
        if root == "torch":
            torch = sys.modules["torch"]  # the caller's tensor proves torch is imported
            if kind is torch.Tensor or kind is torch.nn.Parameter:
                found = _TORCH
                _TORCH_TYPES.add(kind)
                _DATA_PTR = torch.Tensor.data_ptr
        elif root == "cupy" and kind is sys.modules["cupy"].ndarray:
            found = _CUPY
        _KINDS[kind] = found
    return found


_read_current_device: Callable[[], int] | None = None


def _one_gpu() -> bool:
    """Whether this process sees exactly one GPU (CUDA_VISIBLE_DEVICES cannot change once CUDA
    is up): then every device tensor and the current device are device 0."""
    global _read_current_device
    if _read_current_device is None:
        _read_current_device = (lambda: 0) if device_count() == 1 else current_device
    return _read_current_device is not current_device


def _current_device_now() -> int:
    """The current device, read cheaply: always 0 with one GPU; otherwise CuPy asks the
    runtime."""
    if _read_current_device is None:
        _one_gpu()
    return _read_current_device()


# -- torch's C++ tensor guard ---------------------------------------------------------------------

_GUARD_UNTESTED = object()
_guard_class = _GUARD_UNTESTED


def _make_guard(tensor_guards, tensors):
    # None: every size and stride static, compared exactly (a per-dimension None would mean
    # "dynamic", i.e. not compared).
    return tensor_guards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)


def _tensor_guards():
    """torch's ``TensorGuards`` when it is there and tells apart what the checks tell apart
    (dtype, strides, sizes, the negation bit, same metadata elsewhere passing); else None."""
    global _guard_class
    if _guard_class is _GUARD_UNTESTED:
        _guard_class = None
        try:
            torch = sys.modules["torch"]
            from torch._C._dynamo.guards import TensorGuards

            a = torch.zeros(2, 3)
            guard = _make_guard(TensorGuards, [a])
            unit = torch.zeros(4, 1, 5)
            unit_guard = _make_guard(TensorGuards, [unit])
            if (guard.check(torch.zeros(2, 3)) and not guard.check(a.t().contiguous().t())
                    and not guard.check(torch.zeros(2, 3, dtype=torch.float64))
                    and not guard.check(torch.zeros(3, 2).t()) and not guard.check(a[:1])
                    and not guard.check(torch._neg_view(a))
                    and not unit_guard.check(torch.empty_strided((4, 1, 5), (5, 9, 1)))):
                _guard_class = TensorGuards
        except Exception:  # an older or newer torch without it: the facts are read in Python
            _guard_class = None
    return _guard_class


def _torch_facts(value) -> tuple:
    # get_device() is -1 on the host; is_neg(): a lazily negated view shares the rest.
    return (value.data_ptr(), value.shape, value.stride(), value.dtype, value.get_device(),
            value.is_neg())


# -- the key ---------------------------------------------------------------------------------------

def call_key(args: object, workspace: object, stream: object
             ) -> tuple[tuple, tuple] | tuple[None, None]:
    """(key, torch tensors): everything run()'s checks read from this call, except what the
    entry's guard checks on the returned torch tensors; (None, None) when something cannot be
    read exactly and cheaply (run() then checks in full). Reading raises nothing: an odd object
    gives no key, and the full checks raise the typed error."""
    try:
        values = args.__dict__
    except AttributeError:
        return None, None
    try:
        pattern = _torch_call_of(args, values)
    except Exception:
        return None, None
    if pattern is not None:
        return pattern.key(args, workspace, stream)
    return _mixed_key(args, values.values(), workspace, stream)


# -- the key of an all-torch call -----------------------------------------------------------------

class _TorchCall:
    """How to read a call whose arrays are all torch tensors, for one args type and one pattern
    of present and absent (None) fields: the tensors come out of one attrgetter and their
    addresses out of one map, both in C, and torch's guard checks the rest. Interned, so that a
    key can hold it."""

    __slots__ = ("tensors", "absent", "nones")
    _interned: dict[tuple, _TorchCall] = {}

    def __init__(self, present: tuple[str, ...], absent: tuple[str, ...]):
        _one_gpu()  # sets _read_current_device, which key() calls directly
        self.tensors = _getter(present)
        self.absent = _getter(absent) if absent else None
        self.nones = (None,) * len(absent)

    @classmethod
    def of(cls, args_type: type, present: tuple[str, ...], absent: tuple[str, ...]) -> _TorchCall:
        shape = (args_type, present, absent)
        found = cls._interned.get(shape)
        if found is None:
            found = cls._interned.setdefault(shape, cls(present, absent))
        return found

    def key(self, args: object, workspace: object, stream: object
            ) -> tuple[tuple, tuple] | tuple[None, None]:
        """(key, tensors to guard) when ``args`` (of this pattern's args type: the caller looked
        the pattern up by it) still has this pattern and the workspace and stream read exactly,
        else (None, None)."""
        try:
            if self.absent is not None and self.absent(args) != self.nones:
                return None, None
            tensors = self.tensors(args)
            if workspace is None:
                workspace_facts = None
            elif type(workspace) is Workspace:
                workspace_facts = (workspace.ptr, workspace.size, workspace.device)
            elif type(workspace) in _TORCH_TYPES:
                # Its size, contiguity and device are the guard's; its address is in the key.
                tensors += (workspace,)
                workspace_facts = "tensor"
            else:
                return None, None
            # Tensor.data_ptr on a non-tensor raises; a subclass reads, and fails the guard.
            addresses = tuple(map(_DATA_PTR, tensors))
            if type(stream) is int and stream >= 0:
                handle = stream
            elif stream is None:
                # With one GPU the tensors' device is 0 (host tensors fail the guard's device).
                device = 0 if _one_gpu() else tensors[0].get_device()
                if device < 0:
                    return None, None  # host tensors on a GPU plan: the full path says why
                handle = current_torch_stream(device)
            else:
                return None, None  # a stream object: the full path resolves it
        except Exception:  # a tensor without storage, a torch without CUDA: the full path
            return None, None
        return (self, _read_current_device(), addresses, workspace_facts, handle), tensors


def _getter(names: tuple[str, ...]) -> Callable[[object], tuple]:
    """attrgetter that always returns a tuple (a single name would return the bare value)."""
    get = operator.attrgetter(*names)
    return get if len(names) > 1 else (lambda obj: (get(obj),))


def _torch_call_of(args: object, values: dict) -> _TorchCall | None:
    """The all-torch pattern of ``args``, or None when some array is not a plain torch tensor
    (or torch's guard is unavailable)."""
    present, absent = [], []
    for name, value in values.items():
        if value is None:
            absent.append(name)
        elif (_KINDS.get(type(value)) or _kind_of(type(value))) == _TORCH:
            present.append(name)
        else:
            return None
    if not present or _tensor_guards() is None:
        return None
    return _TorchCall.of(type(args), tuple(present), tuple(absent))


# -- the key of any other call ---------------------------------------------------------------------

def _mixed_key(args: object, values, workspace: object, stream: object
               ) -> tuple[tuple, tuple] | tuple[None, None]:
    """call_key for calls with CuPy arrays or TensorViews (torch tensors among them are keyed
    by address and guarded), or for any call when torch's guard is unavailable."""
    guards = _guard_class  # resolved at the first torch tensor
    tensors: list = []
    owners = 0  # bit 1: torch, bit 2: CuPy; stream=None needs exactly one of them
    try:
        # The current device: a launch built with one current may not run with another.
        facts: list = [type(args), _current_device_now()]
        append = facts.append
        for value in values:
            kind = type(value)
            if kind not in _TORCH_TYPES:
                if value is None:
                    append(None)
                    continue
                kind = _KINDS.get(kind) or _kind_of(kind)
                if kind != _TORCH:
                    if kind == _CUPY:
                        append((value.data.ptr, value.shape, value.strides, value.dtype,
                                value.data.device_id))
                        owners |= 2
                    elif kind == _VIEW and stream is not None:  # else its package picks the stream
                        append((value.ptr, value.shape, value.strides, value.element,
                                value.device, value.package, value.readonly))
                    else:
                        return None, None
                    continue
            owners |= 1
            if guards is _GUARD_UNTESTED:
                guards = _tensor_guards()
            if guards is None:
                append(_torch_facts(value))
            else:
                append(value.data_ptr())
                tensors.append(value)
        workspace_facts = _workspace_facts(workspace)
        if workspace_facts is False:
            return None, None
        append(workspace_facts)
        if type(stream) is int and stream >= 0:
            append(stream)
        elif stream is None and owners == 1:
            device = (tensors[0] if tensors else next(
                v for v in values if type(v) in _TORCH_TYPES)).get_device()
            if device < 0:
                return None, None  # host tensors on a GPU plan: the full path says why
            append(current_torch_stream(device))
        elif stream is None and owners == 2:
            device = next(fact[4] for fact in facts[2:] if type(fact) is tuple)
            append(current_cupy_stream(device))
        else:
            return None, None  # a stream object, torch and CuPy together: the full path
    except Exception:  # a tensor without storage, a torch without CUDA: the full path says why
        return None, None
    return tuple(facts), tuple(tensors)


def _workspace_facts(workspace: object):
    """The workspace's part of the key; False when it cannot be read exactly. Scratch needs only
    where it starts, how many bytes it has, where it lives and that it is one block."""
    if workspace is None:
        return None
    if type(workspace) is Workspace:
        return ("workspace", workspace.ptr, workspace.size, workspace.device)
    kind = _KINDS.get(type(workspace)) or _kind_of(type(workspace))
    if kind == _TORCH:
        return (workspace.data_ptr(), workspace.nbytes, workspace.get_device(),
                workspace.is_contiguous())
    if kind == _CUPY:
        return (workspace.data.ptr, workspace.nbytes, workspace.data.device_id,
                workspace.flags.c_contiguous)
    return False


# -- the memo -------------------------------------------------------------------------------------

class CallMemo:
    """Per-thread map from call_key to (launch, guard); bounded (full: it starts over, no LRU
    upkeep). Per thread because a launch holds this thread's library handles. Each thread also
    remembers the all-torch pattern of the last call per args type, so a repeated call reads its
    key without looking at each field's type.

    ``checked(args, workspace, stream)`` checks a call in full and returns its launch, holding no
    user object; it raises the typed error for a bad call.
    """

    CAPACITY = 256

    def __init__(self, checked: Callable[[object, object, object], Callable[[], None]]) -> None:
        self._checked = checked
        self._local = threading.local()

    def _state(self) -> tuple[dict, dict]:
        """This thread's (table, patterns)."""
        try:
            return self._local.state
        except AttributeError:
            self._local.state = ({}, {})
            return self._local.state

    def table(self) -> dict[tuple, tuple]:
        return self._state()[0]

    def launch_for(self, args: object, workspace: object, stream: object
                   ) -> Callable[[], None] | None:
        """The launch stored for this call's key whose guard passes its tensors, else the
        checked call's, stored with a guard built from them; None when the call has no key
        (run() then checks in full)."""
        try:
            table, patterns = self._local.state
        except AttributeError:
            table, patterns = self._state()
        pattern = patterns.get(type(args))
        key = None
        if pattern is not None:
            key, tensors = pattern.key(args, workspace, stream)
        if key is None:
            key, tensors = call_key(args, workspace, stream)
            if key is None:
                return None
            if type(key[0]) is _TorchCall:
                patterns[type(args)] = key[0]
        entry = table.get(key)
        if entry is not None and (entry[1] is None or entry[1].check(*tensors)):
            return entry[0]
        launch = self._checked(args, workspace, stream)  # a bad call raises: nothing is stored
        if not all(type(t) in _TORCH_TYPES for t in tensors):
            return launch  # a torch subclass passed the full checks: launch it, remember nothing
        guard = _make_guard(_guard_class, tensors) if tensors else None
        if len(table) >= self.CAPACITY:
            table.clear()
        table[key] = (launch, guard)
        return launch
