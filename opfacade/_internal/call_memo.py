"""Plan.run's memo of checked calls: the facts its checks read, mapped to the launch they allowed.

Every check run() makes (placement, shapes, dtypes, strides, alignment, overlap, the workspace's
size and device) is a function of each tensor's address, shape, strides, dtype and device, of the
workspace's address and size, of the stream handle and of the current device. Checking costs tens
of microseconds; reading the facts much less. So run() reads them (``call_keys.py``: the key, and
for torch tensors the guard an entry checks) and, when the same facts were checked before on this
thread, re-enqueues the launch built then.

An entry holds addresses, never the caller's objects: it keeps no tensor alive, and a hit launches
on exactly the addresses of the tensors passed in this call (they are part of the key).

A call of an all-torch pattern whose addresses are new (a training step's fresh activations)
but whose tensors pass the guard of a call checked before is not checked again in full: the
checks that read addresses are the argument alignments and which arguments share memory with an
output, and ``Retarget`` compares exactly those with the checked call's (each address the same
modulo 256 bytes; every output's span meeting the same arguments, at the same relative offsets)
before re-pointing that call's views and preparing the launch. Anything else differing, it says
no, and run() checks the call in full.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .call_keys import ArgumentReader, TorchCall
from .retarget import Checked

__all__ = ["CallMemo"]

# -- the memo -------------------------------------------------------------------------------------

class CallMemo:
    """Per-thread map from a call's key to (launch, guard); bounded (full: it starts over, no LRU
    upkeep). Per thread because a launch holds this thread's library handles. Each thread also
    remembers the all-torch pattern of the last call per args type, so a repeated call reads its
    key without looking at each field's type.

    ``checked(args, workspace, stream)`` checks a call in full and returns its ``Checked``
    (launch, retarget), holding no user object; it raises the typed error for a bad call.
    ``reader`` reads the keys (a fresh ``ArgumentReader`` by default: two memos share nothing).
    Each thread also keeps, per all-torch pattern, device and stream, the last few checked
    calls' guards and retargets (``RETARGETS`` of them), for calls at new addresses; and, per
    key, the launches of up to ``SHADOWED`` earlier calls at the same addresses whose tensors
    differ in what the guard checks (a view with requires_grad set, another shape in a reused
    buffer). Calls alternating between those find their own launch again, and with it its count
    towards a CUDA-graph capture (graph_replay), instead of replacing each other's.
    """

    CAPACITY = 256
    RETARGETS = 4
    SHADOWED = 3

    def __init__(self, checked: Callable[[object, object, object], Checked],
                 reader: ArgumentReader | None = None) -> None:
        self._checked = checked
        self.reader = ArgumentReader() if reader is None else reader
        self._local = threading.local()

    def _state(self) -> tuple[dict, dict, dict, dict]:
        """This thread's (table, patterns, retargets, shadowed)."""
        try:
            return self._local.state
        except AttributeError:
            self._local.state = ({}, {}, {}, {})
            return self._local.state

    def table(self) -> dict[tuple, tuple]:
        return self._state()[0]

    def launch_for(self, args: object, workspace: object, stream: object
                   ) -> Callable[[], None] | None:
        """The launch stored for this call's key whose guard passes its tensors; else, for an
        all-torch call without a workspace, a checked call's with the same guard re-pointed
        (Retarget); else the call checked in full, stored with a guard built from its tensors.
        None when the call has no key (run() then checks in full)."""
        try:
            table, patterns, retargets, shadowed = self._local.state
        except AttributeError:
            table, patterns, retargets, shadowed = self._state()
        pattern = patterns.get(type(args))
        key = None
        if pattern is not None:
            key, tensors = pattern.key(args, workspace, stream)
        if key is None:
            key, tensors = self.reader.call_key(args, workspace, stream)
            if key is None:
                return None
            if type(key[0]) is TorchCall:
                patterns[type(args)] = key[0]
        entry = table.get(key)
        if entry is not None:
            if entry[1] is None or entry[1].check(*tensors):
                return entry[0]
            launch = self._shadowed_launch(table, shadowed, key, entry, tensors)
            if launch is not None:
                return launch
        # The key of an all-torch call without its addresses: (pattern, device, stream).
        family = ((key[0], key[1], key[4]) if type(key[0]) is TorchCall and workspace is None
                  else None)
        if family is not None:
            for guard, retarget in retargets.get(family, ()):
                if guard.check(*tensors):
                    launch = retarget(dict(zip(key[0].names, key[2], strict=True)))
                    if launch is not None:
                        self._store(table, shadowed, key, launch, guard)
                        return launch
        checked = self._checked(args, workspace, stream)  # a bad call raises: nothing is stored
        guard = self.reader.guard(tensors)
        if guard is False:
            return checked.launch
        self._store(table, shadowed, key, checked.launch, guard)
        if family is not None and guard is not None and checked.retarget is not None:
            known = retargets.setdefault(family, [])
            known.insert(0, (guard, checked.retarget))
            del known[self.RETARGETS:]
        return checked.launch

    @staticmethod
    def _shadowed_launch(table: dict, shadowed: dict, key: tuple, entry: tuple, tensors: tuple
                         ) -> Callable[[], None] | None:
        """The launch of an earlier call at these addresses whose guard passes ``tensors``, made
        the key's entry again (``entry``, whose guard failed, shadowed in its place); else
        None."""
        earlier = shadowed.get(key, ())
        for i, (launch, guard) in enumerate(earlier):
            if guard.check(*tensors):
                shadowed[key] = (entry, *earlier[:i], *earlier[i + 1:])
                table[key] = (launch, guard)
                return launch
        return None

    def _store(self, table: dict, shadowed: dict, key: tuple, launch: Callable[[], None],
               guard) -> None:
        if len(table) >= self.CAPACITY:
            table.clear()
            shadowed.clear()
        previous = table.get(key)
        if previous is not None and previous[1] is not None and guard is not None:
            # A call at the same addresses that the entry's guard refused: both kept.
            shadowed[key] = (previous, *shadowed.get(key, ()))[:self.SHADOWED]
        table[key] = (launch, guard)
