"""One thread-safe, bounded cache whose misses are built outside its lock.

Plans and cuBLASLt recipes take a while to build (selection, the heuristic), so building under
the lock would serialise unrelated misses. Two threads missing the same key may both build; the
first to store wins and both get its value. (cuDNN graphs are built under their own cache's lock
instead: a cold build takes about a second, and racing builders would waste it.)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from .log import LOG

__all__ = ["BuildOnceLRU"]

V = TypeVar("V")


class BuildOnceLRU(Generic[V]):
    """Key -> value, least recently used evicted past ``capacity``. ``usable(value)`` False
    (a freed plan, say) counts as a miss. ``name`` labels its hits and misses in the log."""

    def __init__(self, name: str, capacity: int,
                 usable: Callable[[V], bool] = lambda value: True):
        self.name = name
        self._capacity = capacity
        self._usable = usable
        self._items: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], V]) -> V:
        with self._lock:
            value = self._items.get(key)
            if value is not None and self._usable(value):
                self._items.move_to_end(key)
                LOG.debug("%s cache hit: %s", self.name, key)
                return value
        LOG.debug("%s cache miss: %s", self.name, key)
        built = build()  # outside the lock
        with self._lock:
            value = self._items.get(key)
            if value is None or not self._usable(value):  # check again: another thread may have won
                value = self._items[key] = built
                while len(self._items) > self._capacity:
                    self._items.popitem(last=False)
            return value

    def peek(self, key: Hashable) -> V | None:
        """The value under ``key`` when it is there and usable, read without the lock, the log
        or a reordering: a hot path's hit (a miss goes through ``get``). Raises TypeError for
        an unhashable key."""
        value = self._items.get(key)
        return value if value is not None and self._usable(value) else None

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def discard(self, matches: Callable[[Hashable], bool]) -> None:
        """Drops every entry whose key ``matches`` (what a freed plan held, say)."""
        with self._lock:
            for key in [key for key in self._items if matches(key)]:
                del self._items[key]

    def __len__(self) -> int:
        return len(self._items)
