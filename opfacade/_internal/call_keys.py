"""What run()'s memo (``call_memo.py``) keys a call by, and the guard its entry checks.

torch tensors: the key holds their addresses, and the entry a ``TensorGuards`` (torch's C++
check of dtype, device, dispatch keys (the lazy negation bit among them), sizes, strides and
requires_grad, the one torch.compile guards tensors with), built from the checked call's tensors.
Checking nine tensors that way costs ~0.6 us where reading their facts in Python costs ~7 us.
``TensorGuards`` is private torch API: it is used only when it passes a self-test (it must tell
apart dtype, sizes, strides and the negation bit), and otherwise, or when asked
(``ArgumentReader(use_torch_guards=False)``), the facts are read through torch's public API
(``data_ptr``, ``shape``, ``stride()``, ``dtype``, ``get_device()``, ``is_neg()``,
``requires_grad``) and put in the key. Both ways a call hits and misses on the same facts, except
that the guard also compares dispatch keys (an inference-mode tensor then only misses).

Only types whose facts read exactly are keyed: torch.Tensor and nn.Parameter (not other
subclasses: fake, functional and distributed tensors answer differently), cupy.ndarray, TensorView
and Workspace. Anything else (NumPy, JAX, DLPack producers, stream objects) gives no key, and
run() checks in full every time.

What the reading learns (each argument type's kind, whether the guard serves, the all-torch
patterns, the current-device and current-stream readers) is held by an ``ArgumentReader``; each
``CallMemo`` owns one, so that two memos share nothing and a test can build a fresh one.
"""

from __future__ import annotations

import operator
import sys
import threading
from collections.abc import Callable

from ..errors import Unsupported
from .device import DEVICES, Devices
from .log import LOG
from .sku import Workspace
from .streams import current_cupy_stream, torch_stream_reader
from .tensors import TensorView, plain_torch_types

__all__ = ["ArgumentReader", "TorchCall", "torch_guards"]

_TORCH, _CUPY, _VIEW, _OTHER = 1, 2, 3, 4  # none is 0: `kinds.get(t) or ...` must work
_UNTESTED = object()  # the guard's verdict before the reader has seen torch


# -- torch's C++ tensor guard ---------------------------------------------------------------------

def _make_guard(tensor_guards, tensors):
    # None: every size and stride static, compared exactly (a per-dimension None would mean
    # "dynamic", i.e. not compared).
    return tensor_guards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)


def torch_guards(torch) -> tuple[type | None, str]:
    """(torch's ``TensorGuards``, "") when this torch has it and it passes the self-test, else
    (None, why not).

    The self-test runs on a thread of its own: torch's dispatch state is per thread, and a new
    thread has the default one. Asked on the caller's thread, the first call would decide for
    the process under whatever its caller had switched on: inside a TorchDispatchMode's
    redispatch (torch.library.opcheck's schema check, say), the Negative key is excluded and the
    lazily negated view the test makes is not told apart, so the guard was refused for good."""
    try:
        from torch._C._dynamo.guards import TensorGuards
    except Exception as error:  # an older or newer torch without it
        return None, f"torch has no torch._C._dynamo.guards.TensorGuards ({error})"
    try:
        passed = _on_a_new_thread(lambda: _guards_pass_self_test(torch, TensorGuards))
    except Exception as error:  # a changed signature, say
        return None, f"torch's TensorGuards failed its self-test: {type(error).__name__}: {error}"
    if not passed:
        return None, "torch's TensorGuards failed its self-test (it let a changed fact pass)"
    return TensorGuards, ""


def _on_a_new_thread(function: Callable[[], bool]) -> bool:
    """``function()`` run on a new thread (so in torch's default dispatch state), its exception
    raised here."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append((True, function()))
        except Exception as error:  # raised on the caller's thread below
            outcome.append((False, error))

    thread = threading.Thread(target=run, name="opfacade-guard-self-test")
    thread.start()
    thread.join()
    finished, value = outcome[0]
    if not finished:
        raise value
    return value


def _guards_pass_self_test(torch, tensor_guards) -> bool:
    """Whether guards tell apart what run()'s checks tell apart (dtype, sizes, strides, a unit
    dimension's stride too, the lazy negation bit) and pass the same metadata elsewhere. Builds
    its tensors with public torch calls only."""
    a = torch.zeros(2, 3)
    guard = _make_guard(tensor_guards, [a])
    unit_guard = _make_guard(tensor_guards, [torch.zeros(4, 1, 5)])
    # .imag of a conjugated complex tensor is a lazily negated view; of a plain one, it is not.
    imag_guard = _make_guard(tensor_guards, [torch.zeros(2, 3, dtype=torch.complex64).imag])
    negated = torch.zeros(2, 3, dtype=torch.complex64).conj().imag
    return (guard.check(torch.zeros(2, 3)) and not guard.check(a.t().contiguous().t())
            and not guard.check(torch.zeros(2, 3, dtype=torch.float64))
            and not guard.check(torch.zeros(3, 2).t()) and not guard.check(a[:1])
            and not unit_guard.check(torch.empty_strided((4, 1, 5), (5, 9, 1)))
            and imag_guard.check(torch.zeros(2, 3, dtype=torch.complex64).imag)
            and negated.is_neg() and not imag_guard.check(negated))


def _torch_facts(value) -> tuple:
    # get_device() is -1 on the host; is_neg(): a lazily negated view shares the rest;
    # requires_grad: the guard compares it, so the key does too.
    return (value.data_ptr(), value.shape, value.stride(), value.dtype, value.get_device(),
            value.is_neg(), value.requires_grad)


# -- the reader -----------------------------------------------------------------------------------

class ArgumentReader:
    """Reads run()'s key from a call, and owns everything the reading learns on the way: each
    argument type's kind (decided once per type), torch's guard (or its absence), the all-torch
    patterns (interned: a key holds one), and the readers of the current device and stream.

    Args:
        use_torch_guards: None (the default) guards torch tensors with ``TensorGuards`` when it
            passes its self-test, else reads their facts through torch's public API (logged at
            DEBUG); False always reads them through the public API; True needs the guard.
        devices: where the current device is read (the process's ``DEVICES``).
        torch_stream: torch's current stream on a device; by default torch's own reader, bound
            when the first torch tensor is read.
        cupy_stream: CuPy's current stream on a device.

    Raises:
        Unsupported: ``use_torch_guards=True`` and this torch's guard is missing or fails.
    """

    def __init__(self, *, use_torch_guards: bool | None = None, devices: Devices | None = None,
                 torch_stream: Callable[[int], int] | None = None,
                 cupy_stream: Callable[[int], int] | None = None) -> None:
        self._kinds: dict[type, int] = {TensorView: _VIEW}
        self.torch_types: set[type] = set()  # the common case, tested first
        self._patterns: dict[tuple, TorchCall] = {}
        self._devices = DEVICES if devices is None else devices
        self._current_device: Callable[[], int] | None = None  # set at the first key read
        self._one_gpu = False
        self._torch_stream = torch_stream
        self._cupy_stream = current_cupy_stream if cupy_stream is None else cupy_stream
        self._data_ptr: Callable[[object], int] | None = None  # set once torch is seen
        self.guards: type | None | object = None if use_torch_guards is False else _UNTESTED
        if use_torch_guards:
            import torch

            self.guards, why = torch_guards(torch)
            if self.guards is None:
                raise Unsupported(f"use_torch_guards=True, but {why}")

    @property
    def uses_torch_guards(self) -> bool | None:
        """Whether torch tensors are guarded by ``TensorGuards``; None until torch is seen."""
        return None if self.guards is _UNTESTED else self.guards is not None

    # -- what an argument is --------------------------------------------------------------------
    def _kind_of(self, kind: type) -> int:
        """How the facts of an argument of type ``kind`` are read; decided once per type."""
        found = self._kinds.get(kind)
        if found is None:
            found = _OTHER
            root = (kind.__module__ or "").split(".", 1)[0]
            if root == "torch":
                torch = sys.modules["torch"]  # the caller's tensor proves torch is imported
                if kind in plain_torch_types(torch):
                    self._see_torch(torch)
                    found = _TORCH
                    self.torch_types.add(kind)
            elif root == "cupy" and kind is sys.modules["cupy"].ndarray:
                found = _CUPY
            self._kinds[kind] = found
        return found

    def _see_torch(self, torch) -> None:
        """Decides, once, how torch tensors are read. ``_data_ptr`` is set last: until then
        another thread decides too (to the same answer)."""
        if self._data_ptr is not None:
            return
        if self.guards is _UNTESTED:
            guards, why = torch_guards(torch)
            if guards is None:
                LOG.debug("%s: run()'s memo reads torch tensors' facts through torch's public "
                          "API instead", why)
            self.guards = guards
        if self._torch_stream is None:
            self._torch_stream = torch_stream_reader(torch)
        self._data_ptr = torch.Tensor.data_ptr

    def _read_devices(self) -> None:
        devices = self._devices
        self._one_gpu = devices.count() == 1
        self._current_device = devices.current_reader()

    # -- the key --------------------------------------------------------------------------------
    def call_key(self, args: object, workspace: object, stream: object
                 ) -> tuple[tuple, tuple] | tuple[None, None]:
        """(key, torch tensors): everything run()'s checks read from this call, except what the
        entry's guard checks on the returned torch tensors; (None, None) when something cannot
        be read exactly and cheaply (run() then checks in full). Reading raises nothing: an odd
        object gives no key, and the full checks raise the typed error."""
        try:
            values = args.__dict__
        except AttributeError:
            return None, None
        try:
            if self._current_device is None:
                self._read_devices()
            pattern = self._torch_call_of(args, values)
        except Exception:
            return None, None
        if pattern is not None:
            return pattern.key(args, workspace, stream)
        return self._mixed_key(args, values.values(), workspace, stream)

    def _torch_call_of(self, args: object, values: dict) -> TorchCall | None:
        """The all-torch pattern of ``args``, or None when some array is not a plain torch
        tensor (or torch's guard is not used)."""
        kinds, kind_of = self._kinds, self._kind_of
        present, absent = [], []
        for name, value in values.items():
            if value is None:
                absent.append(name)
            elif (kinds.get(type(value)) or kind_of(type(value))) == _TORCH:
                present.append(name)
            else:
                return None
        if not present or self.guards is None:
            return None
        shape = (type(args), tuple(present), tuple(absent))
        found = self._patterns.get(shape)
        if found is None:
            found = self._patterns.setdefault(shape, TorchCall(self, shape[1], shape[2]))
        return found

    def _mixed_key(self, args: object, values, workspace: object, stream: object
                   ) -> tuple[tuple, tuple] | tuple[None, None]:
        """call_key for calls with CuPy arrays or TensorViews (torch tensors among them are
        keyed by address and guarded), or for any call when torch's guard is not used."""
        kinds, kind_of, torch_types = self._kinds, self._kind_of, self.torch_types
        guards = self.guards  # decided at the first torch tensor
        tensors: list = []
        owners = 0  # bit 1: torch, bit 2: CuPy; stream=None needs exactly one of them
        try:
            # The current device: a launch built with one current may not run with another.
            facts: list = [type(args), self._current_device()]
            append = facts.append
            for value in values:
                kind = type(value)
                if kind not in torch_types:
                    if value is None:
                        append(None)
                        continue
                    kind = kinds.get(kind) or kind_of(kind)
                    if kind != _TORCH:
                        if kind == _CUPY:
                            append((value.data.ptr, value.shape, value.strides, value.dtype,
                                    value.data.device_id))
                            owners |= 2
                        elif kind == _VIEW and stream is not None:  # else its package decides
                            append((value.ptr, value.shape, value.strides, value.element,
                                    value.device, value.package, value.readonly))
                        else:
                            return None, None
                        continue
                owners |= 1
                if guards is _UNTESTED:
                    guards = self.guards
                if guards is None:
                    append(_torch_facts(value))
                else:
                    append(value.data_ptr())
                    tensors.append(value)
            workspace_facts = self._workspace_facts(workspace)
            if workspace_facts is False:
                return None, None
            append(workspace_facts)
            if type(stream) is int and stream >= 0:
                append(stream)
            elif stream is None and owners == 1:
                device = (tensors[0] if tensors else next(
                    v for v in values if type(v) in torch_types)).get_device()
                if device < 0:
                    return None, None  # host tensors on a GPU plan: the full path says why
                append(self._torch_stream(device))
            elif stream is None and owners == 2:
                device = next(fact[4] for fact in facts[2:] if type(fact) is tuple)
                append(self._cupy_stream(device))
            else:
                return None, None  # a stream object, torch and CuPy together: the full path
        except Exception:  # a tensor without storage, a torch without CUDA: the full path
            return None, None
        return tuple(facts), tuple(tensors)

    def _workspace_facts(self, workspace: object):
        """The workspace's part of the key; False when it cannot be read exactly. Scratch needs
        only where it starts, how many bytes it has, where it lives and that it is one block."""
        if workspace is None:
            return None
        if type(workspace) is Workspace:
            return ("workspace", workspace.ptr, workspace.size, workspace.device)
        kind = self._kinds.get(type(workspace)) or self._kind_of(type(workspace))
        if kind == _TORCH:
            return (workspace.data_ptr(), workspace.nbytes, workspace.get_device(),
                    workspace.is_contiguous())
        if kind == _CUPY:
            return (workspace.data.ptr, workspace.nbytes, workspace.data.device_id,
                    workspace.flags.c_contiguous)
        return False

    def guard(self, tensors: tuple):
        """The entry's guard for a checked call's torch tensors: None when there are none;
        False when one is not a plain torch tensor (a subclass passed the full checks: launch it,
        remember nothing); a _DistinctGuard when one tensor is passed twice."""
        if not tensors:
            return None
        torch_types = self.torch_types
        if not all(type(t) in torch_types for t in tensors):
            return False
        distinct = _distinct(tensors)
        if len(distinct) < len(tensors):
            return _DistinctGuard(_make_guard(self.guards, distinct), len(distinct))
        return _make_guard(self.guards, tensors)


def _distinct(tensors: tuple) -> tuple:
    """The tensors without repeats of the same object, in order."""
    seen: set[int] = set()
    return tuple(t for t in tensors if not (id(t) in seen or seen.add(id(t))))


class _DistinctGuard:
    """A guard over each distinct tensor once. torch's TensorGuards fails a check in which one
    tensor object fills two places (sdpa(x, x, x), k_new passed as v_new), so such a call would
    be checked in full every time; the key's addresses already say which places share memory.
    A call whose objects repeat differently (two views at one address now one object) fails on
    the count and is checked in full once."""

    __slots__ = ("_count", "_guard")

    def __init__(self, guard, count: int):
        self._guard, self._count = guard, count

    def check(self, *tensors) -> bool:
        distinct = _distinct(tensors)
        return len(distinct) == self._count and self._guard.check(*distinct)


# -- the key of an all-torch call -----------------------------------------------------------------

class TorchCall:
    """How to read a call whose arrays are all torch tensors, for one args type and one pattern
    of present and absent (None) fields: the tensors come out of one attrgetter and their
    addresses out of one map, both in C, and torch's guard checks the rest. What the reading
    calls is bound here once, from its reader."""

    __slots__ = ("names", "tensors", "absent", "nones", "data_ptr", "torch_types", "one_gpu",
                 "current_device", "torch_stream")

    def __init__(self, reader: ArgumentReader, present: tuple[str, ...],
                 absent: tuple[str, ...]):
        self.names = present
        self.tensors = _getter(present)
        self.absent = _getter(absent) if absent else None
        self.nones = (None,) * len(absent)
        self.data_ptr = reader._data_ptr
        self.torch_types = reader.torch_types
        self.one_gpu = reader._one_gpu
        self.current_device = reader._current_device
        self.torch_stream = reader._torch_stream

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
            elif type(workspace) in self.torch_types:
                # Its size, contiguity and device are the guard's; its address is in the key.
                tensors += (workspace,)
                workspace_facts = "tensor"
            else:
                return None, None
            # Tensor.data_ptr on a non-tensor raises; a subclass reads, and fails the guard.
            addresses = tuple(map(self.data_ptr, tensors))
            if type(stream) is int and stream >= 0:
                handle = stream
            elif stream is None:
                # With one GPU the tensors' device is 0 (host tensors fail the guard's device).
                device = 0 if self.one_gpu else tensors[0].get_device()
                if device < 0:
                    return None, None  # host tensors on a GPU plan: the full path says why
                handle = self.torch_stream(device)
            else:
                return None, None  # a stream object: the full path resolves it
        except Exception:  # a tensor without storage, a torch without CUDA: the full path
            return None, None
        return (self, self.current_device(), addresses, workspace_facts, handle), tensors


def _getter(names: tuple[str, ...]) -> Callable[[object], tuple]:
    """attrgetter that always returns a tuple (a single name would return the bare value)."""
    get = operator.attrgetter(*names)
    return get if len(names) > 1 else (lambda obj: (get(obj),))
