"""Plan.run's memo of checked calls: the facts its checks read, mapped to the launch they allowed.

Every check run() makes (placement, shapes, dtypes, strides, alignment, overlap, the workspace's
size and device) is a function of each tensor's address, shape, strides, dtype and device, of the
workspace's address and size, of the stream handle and of the current device. Reading those facts
costs about half a microsecond per torch tensor; checking them costs tens. So run() reads them and,
when the same facts were checked before on this thread, re-enqueues the launch built then.

An entry holds addresses, never the caller's objects: it keeps no tensor alive, and a hit launches
on exactly the addresses of the tensors passed in this call (they are part of the key). Only facts
read from types whose reads are exact take this path: torch.Tensor and nn.Parameter (not other
subclasses: fake, functional and distributed tensors answer differently), cupy.ndarray, TensorView
and Workspace. Anything else (NumPy, JAX, DLPack producers, stream objects) returns no key, and
run() checks in full every time.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from .device import current_device, device_count
from .sku import Workspace
from .tensors import TensorView

__all__ = ["CallMemo", "call_key"]

_TORCH, _CUPY, _VIEW, _OTHER = 1, 2, 3, 4  # none is 0: `_KINDS.get(t) or ...` must work
_KINDS: dict[type, int] = {TensorView: _VIEW}
_TORCH_TYPES: set[type] = set()  # the common case, tested first


def _kind_of(kind: type) -> int:
    """How the facts of an argument of type ``kind`` are read; decided once per type."""
    found = _KINDS.get(kind)
    if found is None:
        found = _OTHER
        root = (kind.__module__ or "").split(".", 1)[0]
        if root == "torch":
            torch = sys.modules["torch"]  # the caller's tensor proves torch is imported
            if kind is torch.Tensor or kind is torch.nn.Parameter:
                found = _TORCH
                _TORCH_TYPES.add(kind)
        elif root == "cupy" and kind is sys.modules["cupy"].ndarray:
            found = _CUPY
        _KINDS[kind] = found
    return found


_read_current_device: Callable[[], int] | None = None


def _current_device_now() -> int:
    """The current device, read cheaply: a process that sees one GPU is always on device 0
    (CUDA_VISIBLE_DEVICES cannot change once CUDA is up); otherwise CuPy asks the runtime."""
    global _read_current_device
    if _read_current_device is None:
        _read_current_device = (lambda: 0) if device_count() == 1 else current_device
    return _read_current_device()


def _current_torch_stream(device: int) -> int:
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def _current_cupy_stream(device: int) -> int:
    return sys.modules["cupy"].cuda.get_current_stream(device).ptr


def call_key(args: object, workspace: object, stream: object) -> tuple | None:
    """Everything run()'s checks read from this call, or None when something cannot be read
    exactly and cheaply (run() then checks in full). Reading raises nothing: an odd object makes
    the key None, and the full checks raise the typed error."""
    try:
        values = args.__dict__.values()
    except AttributeError:
        return None
    owners = 0  # bit 1: torch, bit 2: CuPy; stream=None needs exactly one of them
    try:
        # The current device: a launch built with one current may not run with another.
        facts: list = [type(args), _current_device_now()]
        append = facts.append
        for value in values:
            kind = type(value)
            if kind in _TORCH_TYPES:
                # get_device() is -1 on the host; is_neg(): a lazily negated view shares the rest.
                append((value.data_ptr(), value.shape, value.stride(), value.dtype,
                        value.get_device(), value.is_neg()))
                owners |= 1
                continue
            if value is None:
                append(None)
                continue
            kind = _KINDS.get(kind) or _kind_of(kind)
            if kind == _TORCH:
                append((value.data_ptr(), value.shape, value.stride(), value.dtype,
                        value.get_device(), value.is_neg()))
                owners |= 1
            elif kind == _CUPY:
                append((value.data.ptr, value.shape, value.strides, value.dtype,
                        value.data.device_id))
                owners |= 2
            elif kind == _VIEW and stream is not None:  # else the view's package picks the stream
                append((value.ptr, value.shape, value.strides, value.element, value.device,
                        value.package, value.readonly))
            else:
                return None
        workspace_facts = _workspace_facts(workspace)
        if workspace_facts is False:
            return None
        append(workspace_facts)
        if type(stream) is int and stream >= 0:
            append(stream)
        elif stream is None and owners in (1, 2):
            device = next(fact[4] for fact in facts[2:] if fact is not None)
            if device < 0:
                return None  # host tensors on a GPU plan: the full path says why
            append(_current_torch_stream(device) if owners == 1 else _current_cupy_stream(device))
        else:
            return None  # a stream object, torch and CuPy together: the full path resolves it
    except Exception:  # a tensor without storage, a torch without CUDA: the full path says why
        return None
    return tuple(facts)


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


class CallMemo:
    """Per-thread map from call_key to a launch; bounded (full: it starts over, no LRU upkeep).

    Per thread because a launch holds this thread's library handles.
    """

    CAPACITY = 256

    def __init__(self) -> None:
        self._local = threading.local()

    def table(self) -> dict[tuple, Callable[[], None]]:
        try:
            return self._local.calls
        except AttributeError:
            self._local.calls = {}
            self._local.last = (None, None)
            return self._local.calls

    def launch_for(self, key: tuple, checked: Callable[[], Callable[[], None]]
                   ) -> Callable[[], None]:
        """The launch stored for ``key``, or ``checked()``'s (stored). The thread's last key is
        compared first: a loop repeating one call skips hashing the key."""
        local = self._local
        try:
            last_key, last_launch = local.last
        except AttributeError:
            self.table()
            last_key, last_launch = None, None
        if last_key == key:
            return last_launch
        table = local.calls
        launch = table.get(key)
        if launch is None:
            launch = checked()
            if len(table) >= self.CAPACITY:
                table.clear()
            table[key] = launch
        local.last = (key, launch)
        return launch

    def clear(self) -> None:
        """Forgets this thread's entries (other threads' go with the plan)."""
        self._local = threading.local()
