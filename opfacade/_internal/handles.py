"""Library handles per (thread, device): what cuBLASLt and cuDNN both need.

A handle is created on a thread's first use on a device and destroyed when the thread's table
dies, never at interpreter exit (the driver may be gone by then; the process is ending anyway).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

H = TypeVar("H")


def _destroy_all(handles: dict, destroy: Callable[[int, object], None]) -> None:
    for device, handle in list(handles.items()):
        with contextlib.suppress(Exception):
            destroy(device, handle)
    handles.clear()


class _Table:
    __slots__ = ("handles", "__weakref__")

    def __init__(self, destroy: Callable[[int, object], None]):
        self.handles: dict[int, object] = {}
        weakref.finalize(self, _destroy_all, self.handles, destroy).atexit = False


class PerThreadHandles(Generic[H]):
    """``get(device)``: this thread's handle for ``device``, made by ``create(device)``."""

    def __init__(self, create: Callable[[int], H], destroy: Callable[[int, H], None]):
        self._create = create
        self._destroy = destroy
        self._local = threading.local()

    def get(self, device: int) -> H:
        table = getattr(self._local, "table", None)
        if table is None:
            table = self._local.table = _Table(self._destroy)
        handle = table.handles.get(device)
        if handle is None:
            handle = table.handles[device] = self._create(device)
        return handle
